"""The trainer's stages, as plain functions over one frozen generation-batch value, in the order they run.

One generation batch goes through them in order, each returning a new :class:`GenerationBatch`
with its own fields filled::

    play      a manager and a generator                     -> this process's episodes
    gather    this process's episodes + every process's   -> episodes, turns, keep (screen, group filter)
    to_rows   the episodes as TRL rows (either layout)      -> rows, samples, columns
    score     the model's per-token quantities             -> turns' logps / ref_logps / values
    estimate  the registered estimator                      -> per-turn (or per-token) advantages
    spread    the advantages over each row's model tokens   -> advantages (rows x completion width)

Each stage is followed by the helpers it is the first to use. ``play`` makes the episodes the batch is built
from. The model's forward passes (old and reference log-probs, the critic's values) happen in the
trainer between ``to_rows`` and ``score``, and the stages take their results as numpy arrays. The
advantages themselves are :mod:`envhub_trl.estimators`' (each names the formula it implements); what the
trainer adds to TRL's inputs for its own loss terms (choice points, critic targets, per-turn ids)
is in :mod:`envhub_trl.loss_inputs`, and what a step logs of a batch in :mod:`envhub_trl.metrics`.
Nothing here imports TRL or ``transformers.Trainer``, so every stage is tested with batches built by
hand (``tests/test_pipeline.py``); :mod:`envhub_trl.trl_bridge` is where the batch meets TRL.

In the trajectory layout a TRL row is one episode: the first prompt, then every reply and the
environment's tokens between them (``env_mask`` 0 on the latter, so they stay out of the loss); in
the step layout a row is one turn. Advantages are per turn and spread over each turn's tokens.

Several processes: ``gather`` and ``score`` take a ``collect`` callable (``accelerate``'s
``gather_object``; the identity on one process) and ``to_rows`` a ``most_rows`` one (the largest
row count of any process), so that each process holds the whole batch's episodes and its own rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from envhub.error import EnvhubError, NonFiniteReward
from envhub.generation import Generator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.rollout import RolloutStats, rollout
from envhub.settings import LAYOUTS
from envhub.trajectory import Sample, Trajectory, Turn, batch_columns, to_samples
from envhub_trl.advantages import select_groups
from envhub_trl.critic import turn_starts
from envhub_trl.estimators import EstimatorSettings, TurnBatch, turn_advantages


#: ``collect(local_list) -> the concatenation of every process's lists`` (one process: the identity).
Collect = Callable[[list[Any]], list[Any]]


def _alone(values: list[Any]) -> list[Any]:
    return list(values)


def _same(count: int) -> int:
    return count


#: What training does with an episode that has a NaN or infinite reward (``nonfinite_rewards``):
#: stop with an error naming it, or set it aside and count it.
NONFINITE_REWARDS = ("refuse", "drop")


class RolloutError(EnvhubError):
    """A batch cannot be trained on: an episode whose first prompt is over budget, or more of its
    episodes failed than the run allows (``max_env_error_rate``)."""


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
        aside: per episode, whether it was set aside (:func:`~envhub_trl.pipeline.screen`:
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
    tied_by: str = "return",
    keep_fraction: float = 1.0,
    variance_share: float = 1.0,
    max_error_rate: float = 0.5,
    nonfinite_rewards: str = "refuse",
) -> GenerationBatch:
    """The batch of this process's played episodes: each gets its global index and env group (a
    group may straddle processes), every process's episodes are gathered, those whose env failed
    (or, with ``nonfinite_rewards="drop"``, whose reward was not finite) are set aside
    (:func:`~envhub_trl.pipeline.screen`; their group goes on with the members left, as a
    smaller group: one left alone, or tied, gets advantage 0 and is dropped with ``drop_tied``),
    and the group filter (RAGEN's, :func:`~envhub_trl.advantages.select_groups`) marks the groups
    it drops. ``tied_by`` (``"return"`` or ``"success"``) says what ``drop_tied`` compares.

    Raises:
        envhub_trl.pipeline.RolloutError: for an episode without a turn whose env did not fail,
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
    keep = select_groups(
        turns.returns, turns.traj_groups, drop_tied=drop_tied, keep_fraction=keep_fraction, variance_share=variance_share,
        tie_values=None if tied_by == "return" else tie_values(episodes, tied_by),
    ) & ~aside
    return GenerationBatch(local=tuple(own), episodes=tuple(episodes), turns=turns, keep=keep, aside=aside)


#: What makes a group tied (``tied_by``): its members' returns, or their successes (DAPO's and
#: verl's ``filter_groups.metric: acc``: a group that differs by format penalties alone is tied).
TIED_BY = ("return", "success")


def tie_values(episodes: Sequence[Trajectory], tied_by: str = "return") -> np.ndarray:
    """Per episode, what ``tied_by`` compares within a group: its return, or 1.0 for a success."""
    if tied_by not in TIED_BY:
        raise ValueError(f"tied_by must be one of {TIED_BY}, got {tied_by!r}")
    if tied_by == "success":
        return np.array([float(t.success) for t in episodes], dtype=np.float64)
    return np.array([t.episode_return for t in episodes], dtype=np.float64)


def group_is_tied(group: Sequence[Trajectory], tied_by: str = "return", eps: float = 1e-8) -> bool:
    """Whether every member of ``group`` has the same return (or success): a group GRPO learns nothing from."""
    return bool(np.std(tie_values(group, tied_by)) <= eps)


@dataclasses.dataclass(frozen=True)
class Refill:
    """What :func:`refill_tied` did: the rounds of play it took (the first included), how many of
    the batch's groups were tied in the first round and how many are tied still, and the first
    round's success rate (the policy's own, before any group was chosen)."""

    rounds: int
    tied_first: int
    tied_left: int
    success_first: float


def refill_tied(
    first: Sequence[Trajectory], more: Iterator[Sequence[Trajectory]], *, group_size: int, rounds: int, tied_by: str = "return"
) -> tuple[list[Trajectory], Refill]:
    """DAPO's dynamic sampling: the tied groups of ``first`` replaced by untied ones played since.

    ``first`` holds whole groups of ``group_size`` episodes in order; ``more`` plays a further
    round of as many groups on new seeds each time it is advanced, up to ``rounds`` rounds in all.
    Each tied group of ``first`` (:func:`group_is_tied`), in order, takes the place of the next
    untied group of the later rounds; rounds stop once none is tied. Groups still tied after the last
    round keep their place (the caller drops them from the loss), so the batch's size never changes.
    """
    if len(first) % group_size:
        raise ValueError(f"dynamic sampling needs whole groups: {len(first)} episodes in groups of {group_size}")
    groups = [list(first[i : i + group_size]) for i in range(0, len(first), group_size)]
    tied = [i for i, group in enumerate(groups) if group_is_tied(group, tied_by)]
    tied_first, played = len(tied), 1
    while tied and played < rounds:
        episodes = next(more)
        played += 1
        for i in range(0, len(episodes) - group_size + 1, group_size):
            group = list(episodes[i : i + group_size])
            if tied and not group_is_tied(group, tied_by):
                groups[tied.pop(0)] = group
    success_first = float(np.mean([t.success for t in first])) if first else 0.0
    return [t for group in groups for t in group], Refill(rounds=played, tied_first=tied_first, tied_left=len(tied), success_first=success_first)


@dataclasses.dataclass(frozen=True)
class Retry:
    """What :func:`retry_unsolved` did: the further rounds it played, the groups no member of the
    first round solved, how many of those a further round solved, the further episodes played, and
    the wins it put into the batch."""

    rounds: int
    unsolved_first: int
    solved_later: int
    episodes: int
    wins_kept: int


def retry_unsolved(
    first: Sequence[Trajectory],
    play_round: Callable[[list[int]], Sequence[Trajectory]],
    *,
    group_size: int,
    rounds: int,
) -> tuple[list[Trajectory], Retry]:
    """Further plays of the levels that no member of their group solved, and their wins in the batch.

    Where the policy fails a level in every play, its group ties and teaches nothing; the level's
    rare win is what would. So, as Knapsack RL gives the hard prompts more of the rollout budget:
    round after round (at most ``rounds``), the groups of ``first`` still unsolved share out the
    slots of a whole batch, cycling, and ``play_round(slot_groups)`` plays them (``slot_groups``:
    for each of the batch's groups, in order, the group whose level its slot plays; ``group_size``
    episodes a slot). A round's wins for a group take the places of its failed first-round
    members, up to half the group (PODS's max-variance down-sampling: the group trained on is the
    one of largest reward variance the plays allow); every other further episode is left out.
    The batch keeps its size and its groups, so the loss costs what it did; a round costs a round
    of play. A slot takes only a group of the same env as the group it stands for in ``first``
    (a mix's envs keep their places), or, with none of that env unsolved, that same group.
    """
    if len(first) % group_size:
        raise ValueError(f"retrying unsolved groups needs whole groups: {len(first)} episodes in groups of {group_size}")
    groups = [list(first[i : i + group_size]) for i in range(0, len(first), group_size)]
    unsolved = [g for g, group in enumerate(groups) if not any(t.success for t in group)]
    unsolved_first, played, episodes, kept = len(unsolved), 0, 0, {g: 0 for g in unsolved}
    while unsolved and played < rounds:
        slots, taken = [], dict.fromkeys((groups[g][0].env_id for g in unsolved), 0)
        for slot, group in enumerate(groups):
            env_id = group[0].env_id
            same_env = [g for g in unsolved if groups[g][0].env_id == env_id]
            slots.append(same_env[taken[env_id] % len(same_env)] if same_env else slot)
            if same_env:
                taken[env_id] += 1
        further = list(play_round(slots))
        played, episodes = played + 1, episodes + len(further)
        for slot, g in enumerate(slots):
            for trajectory in further[slot * group_size : (slot + 1) * group_size]:
                if g in kept and trajectory.success and kept[g] < group_size // 2:
                    old = groups[g][kept[g]]
                    groups[g][kept[g]] = dataclasses.replace(trajectory, group_id=old.group_id, member=old.member, index=old.index)
                    kept[g] += 1
        unsolved = [g for g in unsolved if not kept[g]]
    solved_later = sum(1 for count in kept.values() if count)
    return [t for group in groups for t in group], Retry(
        rounds=played, unsolved_first=unsolved_first, solved_later=solved_later, episodes=episodes, wins_kept=sum(kept.values())
    )


def check_has_turns(trajectory: Trajectory) -> None:
    """Raise :class:`RolloutError` for an episode that ended without a single turn though its env
    did not fail (an env that failed ends only its own episode: :func:`screen` sets it aside)."""
    if not trajectory.turns and trajectory.error is None:
        advice = "; raise max_prompt_tokens: the first prompt is over budget" if trajectory.end_reason == "context" else ""
        raise RolloutError(
            f"episode {trajectory.index} of {trajectory.env_id} (seed {trajectory.seed}) ended before its first reply "
            f"({trajectory.end_reason}){advice}"
        )


def screen(episodes: Sequence[Trajectory], *, max_error_rate: float = 0.5, nonfinite_rewards: str = "refuse") -> np.ndarray:
    """Which episodes of a gathered batch are set aside, out of every statistic and of the loss:
    those whose env raised (they end there, recorded with the error, as ``envhub run`` records
    them), and with ``nonfinite_rewards="drop"`` those with a NaN or infinite reward.

    Raises:
        RolloutError: when more than ``max_error_rate`` of the batch's episodes failed, naming the
            first failure (env, seed and the env's exception).
        NonFiniteReward: with ``nonfinite_rewards="refuse"``, for the first episode with a NaN or
            infinite reward, naming the env, the episode and the turn.
    """
    if nonfinite_rewards not in NONFINITE_REWARDS:
        raise ValueError(f"nonfinite_rewards must be one of {NONFINITE_REWARDS}, got {nonfinite_rewards!r}")
    failed = np.array([t.error is not None for t in episodes], dtype=bool)
    if failed.mean() > max_error_rate:
        first = episodes[int(np.argmax(failed))]
        raise RolloutError(
            f"{failed.sum()} of {len(episodes)} episodes of the batch failed, more than max_env_error_rate={max_error_rate:g} allows; "
            f"e.g. {first.env_id} (seed {first.seed}): {first.error}"
        )
    nonfinite = np.array([not fail and nonfinite_turn(t) is not None for t, fail in zip(episodes, failed)], dtype=bool)
    if nonfinite.any() and nonfinite_rewards == "refuse":
        episode = episodes[int(np.argmax(nonfinite))]
        turn = nonfinite_turn(episode)
        raise NonFiniteReward(
            f"{episode.env_id} gave a non-finite reward ({turn.env_reward!r}) at turn {turn.index} of episode {episode.index} "
            f"(seed {episode.seed}); fix the env's reward, or set nonfinite_rewards: drop to leave such episodes out of training"
        )
    return failed | nonfinite


def nonfinite_turn(trajectory: Trajectory) -> Turn | None:
    """The first turn of ``trajectory`` whose reward is NaN or infinite, else None."""
    return next((turn for turn in trajectory.turns if not math.isfinite(turn.reward)), None)


def set_aside(trajectory: Trajectory, group: int) -> Trajectory:
    """``trajectory`` as a set-aside episode keeps its place in a batch: without its turns (so no
    turn of it enters an estimator) and in an env group of its own, ``group`` (so its return
    enters no other episode's statistics; :func:`~envhub_trl.estimators.scope_labels` gives it a
    set of its own in every scope)."""
    return dataclasses.replace(trajectory, turns=[], group_id=group)


def describe_aside(episodes: Sequence[Trajectory], aside: np.ndarray) -> str | None:
    """One line on the episodes of a batch that were set aside (None when none was): how many, and
    the first one's env, seed and error (or reward)."""
    if not aside.any():
        return None
    first = episodes[int(np.argmax(aside))]
    why = first.error if first.error is not None else "a non-finite reward"
    return f"{int(aside.sum())} of {len(episodes)} episodes of the batch were left out of training, e.g. {first.env_id} (seed {first.seed}): {why}"


def to_rows(
    batch: GenerationBatch,
    inputs: Sequence[dict[str, Any]],
    *,
    layout: str,
    decode: Callable[[list[int]], str] | None = None,
    row_multiple: int = 1,
    most_rows: Callable[[int], int] = _same,
    untrained_stops: Sequence[str] = (),
    train_invalid_stops: bool = False,
) -> GenerationBatch:
    """The batch as TRL rows: in the ``trajectory`` layout ``inputs`` themselves (one per episode),
    in the ``step`` layout one per sample of each episode (one per turn; one for an episode played in
    the trajectory layout, as an agent's folded session is), its ``prompt`` the decoded prompt, padded with
    masked rows (``trajectory_index`` -1) to ``most_rows(len)`` (the most any process has)
    rounded up to ``row_multiple`` (TRL groups and splits rows evenly). A set-aside episode's row
    (trajectory layout) is such a masked row; in the step layout it has none. The loss mask leaves
    out each reply's closing stop string among ``untrained_stops`` (``train_stop_strings``), but
    for the replies the env found invalid with ``train_invalid_stops`` (``train_invalid_stop_strings``).
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
        valid = (lambda key: batch.episodes[key[0]].turns[key[1]].action_is_valid) if train_invalid_stops else None
        columns["env_mask"] = without_stop_strings(samples, untrained_stops, decode, valid)
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


def _turn_spans(samples: Sequence[Sample]) -> Iterator[tuple[int, tuple[int, int], np.ndarray]]:
    """``(row, (trajectory_index, turn), positions)`` for each turn's model tokens in each row, in
    order; padding rows (``trajectory_index`` -1) are skipped."""
    for row, sample in enumerate(samples):
        if sample.trajectory_index < 0:
            continue
        mask = np.asarray(sample.env_mask, dtype=bool)
        turns = np.asarray(sample.turn_ids, dtype=np.int64)
        for turn in np.unique(turns[mask]):
            yield row, (sample.trajectory_index, int(turn)), np.flatnonzero(mask & (turns == turn))


def stop_string_start(completion_ids: Sequence[int], stop_strings: Sequence[str], decode: Callable[[list[int]], str]) -> int:
    """Where a reply's closing stop string begins, in tokens: the first of its trailing tokens that
    lie wholly in the stop string it ends with (``len(completion_ids)`` when it ends with none). A
    token that holds the end of the action and the start of the stop string is the action's."""
    ids = list(completion_ids)
    text = decode(ids)
    starts = [text.find(stop) for stop in stop_strings if stop in text]
    if not starts:
        return len(ids)
    start, k = min(starts), len(ids)
    while k > 0 and len(decode(ids[: k - 1])) >= start:
        k -= 1
    return k


def without_stop_strings(
    samples: Sequence[Sample], stop_strings: Sequence[str], decode: Callable[[list[int]], str],
    valid: Callable[[tuple[int, int]], bool] | None = None,
) -> list[list[int]]:
    """Each sample's ``env_mask`` with each reply's closing stop string (``</answer>``'s tokens) at 0:
    the reply format writes it, as ``reply_prefix`` writes the opening, so the policy loss leaves it
    out (``train_stop_strings``). With ``valid`` (``(trajectory_index, turn) -> the env took the
    reply's action``), an invalid reply keeps its stop string in the loss: there it is what the model
    wrote instead of a move. Padding rows keep their mask."""
    masks = [list(sample.env_mask) for sample in samples]
    for row, key, positions in _turn_spans(samples):
        if valid is not None and not valid(key):
            continue
        reply = [samples[row].completion_ids[p] for p in positions]
        for p in positions[stop_string_start(reply, stop_strings, decode) :]:
            masks[row][p] = 0
    return masks


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


def turn_token_values(samples: Sequence[Sample], values: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """Each turn's model-token entries of a per-row array (a score-stage quantity such as
    log-probs, ``values[row, j]`` for completion token ``j``), keyed by ``(trajectory_index,
    turn)`` in the order sampled; padding rows (``trajectory_index`` -1) are skipped."""
    return {key: np.asarray(values[row])[positions] for row, key, positions in _turn_spans(samples)}


def token_order(turn_counts: Sequence[int], lengths: dict[tuple[int, int], int]) -> tuple[np.ndarray, dict[tuple[int, int], int]]:
    """The batch's model tokens in :class:`TurnBatch` order (episode by episode, turn by turn).

    Args:
        turn_counts: each episode's number of turns, in batch order.
        lengths: the number of model tokens of each ``(episode, turn)`` (missing: none).

    Returns:
        ``token_turn`` (the batch-wide turn index of each token) and where each ``(episode, turn)``'s
        tokens start in it.
    """
    token_turn, starts, turn, position = [], {}, 0, 0
    for episode, count in enumerate(turn_counts):
        for k in range(count):
            n = lengths.get((episode, k), 0)
            starts[(episode, k)] = position
            token_turn.extend([turn] * n)
            position += n
            turn += 1
    return np.asarray(token_turn, dtype=np.int64), starts


def estimate(batch: GenerationBatch, estimator: str, settings: EstimatorSettings | None = None) -> GenerationBatch:
    """The batch with ``estimator``'s advantages (:func:`~envhub_trl.estimators.turn_advantages`;
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


def spread_token_values(samples: Sequence[Sample], flat: np.ndarray, starts: dict[tuple[int, int], int], width: int) -> np.ndarray:
    """Per-token values in :func:`token_order` back onto the rows: the inverse of
    :func:`turn_token_values`; environment tokens and padding get 0. Shape ``(len(samples), width)``."""
    out = np.zeros((len(samples), width))
    for row, key, positions in _turn_spans(samples):
        out[row, positions] = flat[starts[key] : starts[key] + len(positions)]
    return out


def token_advantages(samples: Sequence[Sample], turn_values: Sequence[np.ndarray], width: int) -> np.ndarray:
    """Spread per-turn values over tokens: ``out[i, j] = turn_values[i][samples[i].turn_ids[j]]``.

    Args:
        samples: samples of either layout (``turn_ids``: the turn of each completion token).
        turn_values: per sample, one value per turn of its episode.
        width: the padded completion length; positions past a sample's end get 0.

    Returns:
        Shape ``(len(samples), width)``.
    """
    out = np.zeros((len(samples), width))
    for row, (sample, values) in enumerate(zip(samples, turn_values)):
        turn_ids = np.asarray(sample.turn_ids, dtype=np.int64)
        out[row, : len(turn_ids)] = np.asarray(values)[turn_ids]
    return out
