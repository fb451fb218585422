"""The trainer's stages, as plain functions over one frozen generation-batch value.

One generation batch goes through them in order, each returning a new :class:`GenerationBatch`
with its own fields filled::

    play      a manager and a generator                     -> this process's episodes
    gather    this process's episodes + every process's   -> episodes, turns, keep (group filter)
    to_rows   the episodes as TRL rows (either layout)      -> rows, samples, columns
    score     the model's per-token quantities             -> turns' logps / ref_logps / values
    estimate  the registered estimator                      -> per-turn (or per-token) advantages
    spread    the advantages over each row's model tokens   -> advantages (rows x completion width)

``play`` makes the episodes the batch is built from. The model's forward passes (old and
reference log-probs, the critic's values) happen in the trainer between ``to_rows`` and
``score``, and the stages take their results as numpy arrays. Nothing here imports TRL or
``transformers.Trainer``, so every stage is tested with batches built by hand
(``tests/test_pipeline.py``); :mod:`envhub_trl.trl_bridge` is where the batch meets TRL.

Several processes: ``gather`` and ``score`` take a ``collect`` callable (``accelerate``'s
``gather_object``; the identity on one process) and ``to_rows`` a ``most_rows`` one (the largest
row count of any process), so that each process holds the whole batch's episodes and its own rows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from envhub.generation import Generator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.rollout import RolloutStats, rollout
from envhub.settings import LAYOUTS
from envhub.trajectory import Sample, Trajectory, batch_columns, to_samples
from envhub_trl.advantages import select_groups
from envhub_trl.critic import turn_starts, value_positions
from envhub_trl.diagnostics import learning_signal
from envhub_trl.estimators import EstimatorSettings, TurnBatch
from envhub_trl.metrics import rollout_metrics
from envhub_trl.rollout_batch import (
    check_has_turns,
    screen,
    set_aside,
    spread_token_values,
    token_advantages,
    token_order,
    turn_advantages,
    turn_token_values,
    without_stop_strings,
)

#: ``collect(local_list) -> the concatenation of every process's lists`` (one process: the identity).
Collect = Callable[[list[Any]], list[Any]]


def _alone(values: list[Any]) -> list[Any]:
    return list(values)


def _same(count: int) -> int:
    return count


@dataclasses.dataclass(frozen=True, eq=False)
class GenerationBatch:
    """One generation batch, as far as the stages have taken it.

    Attributes:
        local: this process's episodes, with global group ids and indices (``gather``).
        episodes: every process's episodes, in batch order (episode ``i`` has index ``i``).
        turns: ``episodes`` flattened to one entry per turn; after ``score``, with the model's
            per-token and per-turn quantities.
        keep: per episode, whether the group filter kept it (it reads returns alone); False on
            episodes set aside.
        aside: per episode, whether it was set aside (:func:`~envhub_trl.rollout_batch.screen`:
            its env failed, or its reward was not finite): it stays in ``episodes`` without its
            turns, in an env group of its own, and its rows are masked.
        rows: this process's TRL input rows (the dataset's, or one per turn in the step layout).
        samples: the token sample of each row (``trajectory_index`` -1 on padding rows).
        columns: what TRL's ``rollout_func`` returns for ``rows``: :func:`~envhub.trajectory.batch_columns`
            with ``env_mask`` 0 on dropped groups and padding, and ``episode_return``.
        token_starts: after ``score``: where each ``(episode, turn)``'s model tokens start in
            ``turns.token_turn``'s order.
        estimate: after ``estimate``: the estimator's output (``advantages`` per turn, or
            ``token_advantages``; 0 on dropped groups) and ``keep``.
        advantages: after ``spread``: ``(rows, completion width)``, each model token's advantage.
    """

    local: tuple[Trajectory, ...]
    episodes: tuple[Trajectory, ...]
    turns: TurnBatch
    keep: np.ndarray
    aside: np.ndarray
    rows: tuple[dict[str, Any], ...] = ()
    samples: tuple[Sample, ...] = ()
    columns: Mapping[str, list[Any]] | None = None
    token_starts: Mapping[tuple[int, int], int] | None = None
    estimate: Mapping[str, np.ndarray] | None = None
    advantages: np.ndarray | None = None

    @property
    def row_keep(self) -> list[bool]:
        """Per row, whether its episode counts (False on padding and on dropped groups)."""
        return [bool(self.keep[s.trajectory_index]) if s.trajectory_index >= 0 else False for s in self.samples]

    @property
    def played(self) -> list[Trajectory]:
        """The episodes that count: those not set aside."""
        return [episode for episode, aside in zip(self.episodes, self.aside) if not aside]

    @property
    def turn_starts(self) -> list[dict[int, int]]:
        """Per row, where each turn's model tokens start (:func:`~envhub_trl.critic.turn_starts`)."""
        return turn_starts(self.samples)


def play(
    manager: EnvGroupManager, generator: Generator, sampling: SamplingParams, *, seeds: Sequence[int] | None = None, mode: str = "lockstep"
) -> tuple[list[Trajectory], RolloutStats]:
    """This process's episodes: one per slot of ``manager``, its groups reset with ``seeds``,
    played with ``generator`` (``mode``: ``"lockstep"`` or ``"continuous"``, as
    :func:`envhub.rollout.rollout`); and the rollout's statistics."""
    stats = RolloutStats()
    return rollout(manager, generator, sampling, seeds=seeds, mode=mode, stats=stats), stats


def gather(
    local: Sequence[Trajectory],
    *,
    group_size: int,
    process_index: int = 0,
    collect: Collect = _alone,
    drop_tied: bool = False,
    keep_fraction: float = 1.0,
    max_error_rate: float = 0.5,
    nonfinite_rewards: str = "refuse",
) -> GenerationBatch:
    """The batch of this process's played episodes: each gets its global index and env group (a
    group may straddle processes), every process's episodes are gathered, those whose env failed
    (or, with ``nonfinite_rewards="drop"``, whose reward was not finite) are set aside
    (:func:`~envhub_trl.rollout_batch.screen`; their group goes on with the members left, as a
    smaller group: one left alone, or tied, gets advantage 0 and is dropped with ``drop_tied``),
    and the group filter (RAGEN's, :func:`~envhub_trl.advantages.select_groups`) marks the groups
    it drops.

    Raises:
        envhub_trl.rollout_batch.RolloutError: for an episode without a turn whose env did not fail,
            or more failed episodes than ``max_error_rate`` allows.
        envhub.error.NonFiniteReward: for a NaN or infinite reward, with ``nonfinite_rewards="refuse"``.
    """
    for trajectory in local:
        check_has_turns(trajectory)
    offset = process_index * len(local)
    own = [dataclasses.replace(t, group_id=(offset + i) // group_size, index=offset + i) for i, t in enumerate(local)]
    episodes: list[Trajectory] = collect(own)
    aside = screen(episodes, max_error_rate=max_error_rate, nonfinite_rewards=nonfinite_rewards)
    episodes = [set_aside(t, len(episodes) + i) if out else t for i, (t, out) in enumerate(zip(episodes, aside))]
    turns = TurnBatch.from_trajectories(episodes)
    keep = select_groups(turns.returns, turns.traj_groups, drop_tied=drop_tied, keep_fraction=keep_fraction) & ~aside
    return GenerationBatch(local=tuple(own), episodes=tuple(episodes), turns=turns, keep=keep, aside=aside)


def to_rows(
    batch: GenerationBatch,
    inputs: Sequence[dict[str, Any]],
    *,
    layout: str,
    decode: Callable[[list[int]], str] | None = None,
    row_multiple: int = 1,
    most_rows: Callable[[int], int] = _same,
    untrained_stops: Sequence[str] = (),
) -> GenerationBatch:
    """The batch as TRL rows: in the ``trajectory`` layout ``inputs`` themselves (one per episode),
    in the ``step`` layout one per sample of each episode (one per turn; one for an episode played in
    the trajectory layout, as an agent's folded session is), its ``prompt`` the decoded prompt, padded with
    masked rows (``trajectory_index`` -1) to ``most_rows(len)`` (the most any process has)
    rounded up to ``row_multiple`` (TRL groups and splits rows evenly). A set-aside episode's row
    (trajectory layout) is such a masked row; in the step layout it has none. The loss mask leaves
    out each reply's closing stop string among ``untrained_stops`` (``train_stop_strings``).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    played = [t for t in batch.local if not batch.aside[t.index]]
    if layout == "trajectory":
        filler = _filler([t.sample() for t in played[:1]])
        rows, samples = list(inputs), [filler if batch.aside[t.index] else t.sample() for t in batch.local]
    else:
        rows, samples = [], []
        for i, trajectory in enumerate(batch.local):
            for sample in [] if batch.aside[trajectory.index] else to_samples([trajectory]):
                samples.append(sample)
                rows.append({**inputs[i], "prompt": decode(sample.prompt_ids) if decode is not None else ""})
        target = -(-max(most_rows(len(samples)), 1) // row_multiple) * row_multiple  # a row at least: TRL trains no empty batch
        filler, first_row = _filler(samples), rows[0] if rows else {**inputs[0], "prompt": ""}
        for _ in range(target - len(samples)):
            samples.append(filler)
            rows.append(dict(first_row))  # TRL writes the rollout's extra columns into each row
    batch = dataclasses.replace(batch, rows=tuple(rows), samples=tuple(samples))
    columns = batch_columns(samples)
    if untrained_stops and decode is not None:
        columns["env_mask"] = without_stop_strings(samples, untrained_stops, decode)
    columns["env_mask"] = [mask if kept else [0] * len(mask) for mask, kept in zip(columns["env_mask"], batch.row_keep)]
    columns["episode_return"] = [batch.episodes[s.trajectory_index].episode_return if s.trajectory_index >= 0 else None for s in samples]
    return dataclasses.replace(batch, columns=columns)


def _filler(samples: Sequence[Sample]) -> Sample:
    """A masked row (``trajectory_index`` -1, ``env_mask`` 0, turn 0 throughout): the first of
    ``samples`` masked, or one token each of prompt and completion when there is none."""
    if samples:
        width = len(samples[0].env_mask)
        return dataclasses.replace(samples[0], env_mask=[0] * width, turn_ids=[0] * width, trajectory_index=-1)
    return Sample(prompt_ids=[0], completion_ids=[0], env_mask=[0], logprobs=[0.0], turn_ids=[0], group_id=-1, trajectory_index=-1)


def score(
    batch: GenerationBatch,
    *,
    logps: np.ndarray | None = None,
    ref_logps: np.ndarray | None = None,
    values: np.ndarray | None = None,
    collect: Collect = _alone,
) -> GenerationBatch:
    """The batch with the model's quantities in ``turns``' order, gathered over processes.

    Args:
        logps: ``(rows, width)``, the policy's log-prob of each completion token.
        ref_logps: ``(rows, width)``, the reference model's.
        values: ``(rows, most turns in a row)``, the critic's value of each row's turns, in turn
            order (read at :func:`~envhub_trl.critic.value_positions`).
    """
    token_scores = {name: value for name, value in (("logps", logps), ("ref_logps", ref_logps)) if value is not None}
    samples = batch.samples
    local: dict[tuple[int, int], dict[str, Any]] = {}
    for name, value in token_scores.items():
        for key, entries in turn_token_values(samples, value).items():
            local.setdefault(key, {})[name] = entries
    if values is not None:
        for row, starts_of_row in enumerate(batch.turn_starts):
            for k, turn in enumerate(sorted(starts_of_row)):
                local.setdefault((samples[row].trajectory_index, turn), {})["values"] = float(values[row, k])
    gathered = dict(collect(list(local.items())))
    turn_counts = [t.num_turns for t in batch.episodes]
    first = next(iter(token_scores), None)
    lengths = {key: len(entry[first]) for key, entry in gathered.items() if first in entry} if first else {}
    token_turn, starts = token_order(turn_counts, lengths)
    ordered = sorted((key for key in gathered if key in lengths), key=starts.__getitem__)
    fields = {name: np.concatenate([gathered[key][name] for key in ordered] or [np.zeros(0)]) for name in token_scores}
    if values is not None:
        fields["values"] = np.array([gathered.get((g, k), {}).get("values", 0.0) for g, n in enumerate(turn_counts) for k in range(n)])
    return dataclasses.replace(batch, turns=batch.turns.with_scores(token_turn, **fields), token_starts=starts)


def estimate(batch: GenerationBatch, estimator: str, settings: EstimatorSettings | None = None) -> GenerationBatch:
    """The batch with ``estimator``'s advantages (:func:`~envhub_trl.rollout_batch.turn_advantages`;
    0 on dropped groups)."""
    return dataclasses.replace(batch, estimate=turn_advantages(batch.turns, estimator, settings, keep=batch.keep))


def spread(batch: GenerationBatch, width: int) -> GenerationBatch:
    """The batch with each row's per-token advantages, ``(rows, width)``: each turn's advantage on
    its model tokens (or the estimator's per-token ones where it gives them); 0 past a row's end.
    Environment tokens and padding rows stay out of the loss through their ``env_mask`` 0."""
    result = batch.estimate
    if "token_advantages" in result:
        advantages = spread_token_values(batch.samples, result["token_advantages"], batch.token_starts, width)
    else:
        per_episode = np.split(result["advantages"], np.cumsum([t.num_turns for t in batch.episodes])[:-1])
        row_turns = [per_episode[s.trajectory_index] if s.trajectory_index >= 0 else np.zeros(1) for s in batch.samples]
        advantages = token_advantages(batch.samples, row_turns, width)
    return dataclasses.replace(batch, advantages=advantages)


def action_offset(completion_ids: Sequence[int], action: str, decode: Callable[[list[int]], str]) -> int | None:
    """The index in ``completion_ids`` of the token that begins ``action``'s spelling: its first
    occurrence after the reply's first ``>`` (the end of an ``<answer>`` tag), else its first
    occurrence; None when the reply does not spell it."""
    pieces = [decode([token]) for token in completion_ids]
    text = "".join(pieces)
    begin = text.find(action, text.find(">") + 1)
    if begin < 0:
        begin = text.find(action)
    if begin < 0:
        return None
    position = 0
    for k, piece in enumerate(pieces):
        if position + len(piece) > begin:
            return k
        position += len(piece)
    return None


def first_tokens(tokenizer: Any) -> Callable[[str], int | None]:
    """``action -> the first token of its spelling`` (cached): where a choice point
    (:func:`choice_points`) reads an action's probability."""

    @functools.lru_cache(maxsize=None)
    def first(action: str) -> int | None:
        ids = tokenizer.encode(action, add_special_tokens=False)
        return int(ids[0]) if ids else None

    return first


def choice_points(
    batch: GenerationBatch, prompt_width: int, first_token: Callable[[str], int | None], decode: Callable[[list[int]], str]
) -> dict[str, torch.Tensor]:
    """Where each turn chose between its legal actions, for an entropy bonus on that choice alone
    (``action_entropy_coef``): per row and turn, the position in the (left-padded prompt +
    completion) sequence whose hidden state predicts the first token of the reply's action, and the
    distinct first tokens of the turn's legal actions (``first_token`` of each), padded, with a mask.

    A turn makes no choice point when its reply named no legal action, its env does not list its
    legal actions, the legal actions all begin with one token, or the reply spells its action's
    first token otherwise than ``first_token`` does (a context-dependent tokenisation). Legal
    actions that share a first token count as one choice.

    Returns:
        ``choice_positions`` ``(rows, k)``, ``choice_tokens`` ``(rows, k, m)`` and ``choice_mask``
        ``(rows, k, m)`` (1 on a real token; a choice point is a ``k`` slot with any).
    """
    rows: list[list[tuple[int, list[int]]]] = []
    for sample, starts in zip(batch.samples, batch.turn_starts):
        points = []
        for turn_index, start in sorted(starts.items()):
            turn = batch.episodes[sample.trajectory_index].turns[turn_index]
            if not turn.action_is_valid or not turn.action or not turn.valid_actions:
                continue
            tokens = list(dict.fromkeys(t for t in map(first_token, turn.valid_actions) if t is not None))
            offset = action_offset(turn.completion_ids, turn.action, decode)
            if len(tokens) < 2 or offset is None or turn.completion_ids[offset] != first_token(turn.action):
                continue
            points.append((prompt_width + start + offset - 1, tokens))
        rows.append(points)
    k = max(map(len, rows), default=0) or 1
    m = max((len(tokens) for points in rows for _, tokens in points), default=0) or 1
    positions = torch.zeros(len(rows), k, dtype=torch.long)
    tokens = torch.zeros(len(rows), k, m, dtype=torch.long)
    mask = torch.zeros(len(rows), k, m)
    for row, points in enumerate(rows):
        for j, (position, ids) in enumerate(points):
            positions[row, j] = position
            tokens[row, j, : len(ids)] = torch.tensor(ids)
            mask[row, j, : len(ids)] = 1.0
    return {"choice_positions": positions, "choice_tokens": tokens, "choice_mask": mask}


def turn_id_matrix(batch: GenerationBatch, width: int) -> np.ndarray:
    """``(rows, width)``: the turn of each completion token (0 past a row's end), for the loss's
    per-turn importance ratio (``ratio_type="segment"``)."""
    turn_ids = np.zeros((len(batch.samples), width), dtype=np.int64)
    for row, sample in enumerate(batch.samples):
        turn_ids[row, : len(sample.turn_ids)] = sample.turn_ids
    return turn_ids


def critic_targets(batch: GenerationBatch, prompt_width: int) -> dict[str, torch.Tensor]:
    """What PPO's value loss reads, per row and turn: where the turn's value is read in the
    (left-padded prompt + completion) sequence, its old value, its GAE return, and a mask (0 on
    padding and on dropped groups). Needs ``score``'s values and ``estimate``'s ``returns``."""
    starts = batch.turn_starts
    turns, returns = batch.turns, batch.estimate["returns"]
    positions, mask = value_positions(starts, prompt_width)
    first_turn = np.cumsum([0] + [int(n) for n in np.bincount(turns.traj_index, minlength=turns.num_episodes)])
    old, targets = torch.zeros(mask.shape), torch.zeros(mask.shape)
    for row, starts_of_row in enumerate(starts):
        for k, turn in enumerate(sorted(starts_of_row)):
            index = first_turn[batch.samples[row].trajectory_index] + turn
            old[row, k], targets[row, k] = float(turns.values[index]), float(returns[index])
    mask = mask * torch.tensor([float(kept) for kept in batch.row_keep]).unsqueeze(1)
    return {"value_positions": positions, "value_mask": mask, "old_values": old, "value_returns": targets}


def row_advantage_means(batch: GenerationBatch) -> list[float]:
    """Per row, the mean advantage over its model tokens (0 for a row without one): what the
    completions log shows."""
    means = []
    for row, sample in enumerate(batch.samples):
        mask = np.asarray(sample.env_mask, dtype=bool)
        means.append(float(batch.advantages[row, : len(mask)][mask].mean()) if mask.any() else 0.0)
    return means


def estimate_metrics(batch: GenerationBatch) -> dict[str, float]:
    """What the estimate stage logs besides the env metrics: REINFORCE++'s mean KL (``env/kl``),
    PPO's mean value and return (``critic/...``)."""
    result, out = batch.estimate, {}
    if "kl" in result:
        out["env/kl"] = float(np.mean(result["kl"])) if len(result["kl"]) else 0.0
    if "returns" in result and batch.turns.values is not None:
        out["critic/values_mean"] = float(np.mean(batch.turns.values))
        out["critic/returns_mean"] = float(np.mean(result["returns"]))
    return out


def signal_metrics(batch: GenerationBatch, gamma: float = 0.95) -> dict[str, float]:
    """The batch's ``diag/`` metrics: why a run learns or stalls (:func:`~envhub_trl.diagnostics.learning_signal`)."""
    return learning_signal(batch.played, batch.estimate.get("advantages"), gamma, batch=batch.turns)


def env_metrics(batch: GenerationBatch, per_env: bool = False) -> dict[str, float]:
    """The batch's ``env/`` metrics (:func:`~envhub_trl.metrics.rollout_metrics`) over the episodes
    played to their end, with the share of the batch's episodes whose env failed
    (``env/error_rate``) and the count of those set aside for a non-finite reward
    (``env/nonfinite_reward_episodes``)."""
    failed = sum(t.error is not None for t in batch.episodes)
    out = {"env/error_rate": failed / len(batch.episodes), "env/nonfinite_reward_episodes": float(batch.aside.sum() - failed)}
    if batch.played:
        played = ~batch.aside
        out.update(rollout_metrics(batch.played, batch.estimate["keep"][played], batch.estimate.get("anchor_size"), per_env=per_env))
    return out


def choice_entropies(head: Any, hidden: torch.Tensor, inputs: dict[str, Any], temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The entropy of each choice point's distribution over its legal first tokens
    (:func:`choice_points`), renormalised: the output layer ``head`` applied to
    the final hidden states ``(rows, length, size)`` at the points alone, for those tokens alone.
    Returns ``(entropies, points)``, each ``(rows, k)``; ``points`` marks the real choice points."""
    positions, tokens, mask = inputs["choice_positions"], inputs["choice_tokens"], inputs["choice_mask"]
    states = torch.gather(hidden, 1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # (rows, k, size)
    logits = torch.einsum("rkh,rkmh->rkm", states, head.weight[tokens].to(states.dtype))
    if getattr(head, "bias", None) is not None:
        logits = logits + head.bias[tokens]
    logits = (logits.float() / temperature).masked_fill(mask == 0, float("-inf"))
    points = mask.sum(-1) > 0
    logp = torch.log_softmax(logits.masked_fill(~points.unsqueeze(-1), 0.0), -1)
    entropy = -(logp.exp() * logp.masked_fill(mask == 0, 0.0)).sum(-1)
    return entropy, points


def entropy_bonus(entropy: torch.Tensor, floor: float | None = None) -> torch.Tensor:
    """What ``action_entropy_coef`` rewards at each choice point: its entropy, or with a ``floor``
    ``min(entropy - floor, 0)``, which pulls a point's entropy up to the floor and leaves a point
    above it alone (no gradient there)."""
    return entropy if floor is None else (entropy - floor).clamp(max=0.0)
