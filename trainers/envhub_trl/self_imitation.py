"""Self-imitation: the policy's own wins on levels it does not always win, remembered and imitated.

RL's credit on a level the policy rarely wins comes from a single step's group, and is gone with
it; a network that must learn to read its observation from tokens turns such credit into a reading
slowly (docs/results-rl-alone.md). Self-imitation learning (SIL, Oh et al. 2018, "Self-Imitation
Learning"; the replay of one's own good episodes that ReST and RAFT make for LLMs) keeps those wins
and adds their log-likelihood to the objective at every step, so that each hard-won episode is a
demonstration for many steps, not an advantage for one. No oracle is involved: the demonstrations
are the policy's own sampled episodes that the environment rewarded.

What is remembered (:func:`imitation_rows`): the model tokens of the winning episodes of groups
that not every member won (a level every play wins teaches nothing the policy does not do
already): every token the model wrote, its reply's closing stop string included, which the
policy loss leaves out (``train_stop_strings``). Imitating the action alone pulled the tiny model's
replies off their format: on Sokoban they ran on past the move to the token limit within 20 steps,
78-96% of them invalid (docs/results-rl-alone.md); a win's whole reply is the format too.
The win's invalid replies stay out: they cost the win a turn and a penalty and moved nothing, and a
reply cut at the token limit is many unlikely tokens, whose summed log-likelihood outweighs every
move of the row's batch. On the Sokoban RL-alone config 5% of the remembered rows were such
replies and the term read 2.7 nats a row against the moves' 1.4: the imitation pulled the replies
off their format and stayed as uncertain as at the start (docs/results-rl-alone.md).
Environment tokens stay out. The memory keeps the latest ``capacity`` rows (:class:`WinMemory`),
each process its own; it is part of a checkpoint, so a resumed run imitates what the
uninterrupted one would. The term (:func:`imitation_loss`) is the negative log-likelihood of a
remembered reply, its tokens' summed, averaged over a sample of rows drawn each micro-step from a
seeded stream.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from envhub_trl.pipeline import GenerationBatch

#: A remembered row: prompt token ids, completion token ids, and the completion's loss mask.
Row = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def imitation_rows(batch: GenerationBatch) -> list[Row]:
    """This process's rows of ``batch`` (after ``to_rows``) that belong to a winning episode of a
    group not every member of which won, each with the model tokens of its valid replies as the
    mask (their closing stop strings in); invalid replies, rows of dropped groups, of set-aside
    episodes and padding rows are left out."""
    episodes = batch.episodes
    groups = np.array([t.group_id for t in episodes])
    won = np.array([bool(t.success) for t in episodes])
    all_won = {g: bool(won[groups == g].all()) for g in np.unique(groups)}
    rows = []
    for sample, kept in zip(batch.samples, batch.row_keep):
        episode = episodes[sample.trajectory_index] if sample.trajectory_index >= 0 else None
        if episode is None or not kept or not episode.success or all_won[episode.group_id]:
            continue
        mask = tuple(int(m and episode.turns[turn].action_is_valid) for m, turn in zip(sample.env_mask, sample.turn_ids))
        if any(mask):
            rows.append((tuple(sample.prompt_ids), tuple(sample.completion_ids), mask))
    return rows


class WinMemory:
    """The latest ``capacity`` rows of remembered wins, oldest first."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"self_imitation_memory must be at least 1, got {capacity}")
        self.rows: collections.deque[Row] = collections.deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: Sequence[Row]) -> None:
        self.rows.extend(rows)

    def sample(self, count: int, seed: Sequence[int]) -> list[Row]:
        """``count`` rows drawn uniformly with replacement, from the seed sequence ``seed`` (none
        when the memory is empty)."""
        if not self.rows:
            return []
        picks = np.random.default_rng(np.random.SeedSequence(list(seed))).integers(0, len(self.rows), count)
        return [self.rows[int(k)] for k in picks]

    def state(self) -> list[list[list[int]]]:
        return [[list(part) for part in row] for row in self.rows]

    def load(self, state: Sequence[Sequence[Sequence[int]]]) -> None:
        self.rows.clear()
        self.rows.extend((tuple(p), tuple(c), tuple(m)) for p, c, m in state)


def padded(rows: Sequence[Row], pad_id: int, device: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``rows`` as one batch: prompts left-padded and completions right-padded to the longest of
    each; returns ``(input_ids, attention_mask, loss_mask, prompt_width)``, the loss mask over the
    completion positions."""
    prompt_width = max(len(p) for p, _, _ in rows)
    completion_width = max(len(c) for _, c, _ in rows)
    ids = torch.full((len(rows), prompt_width + completion_width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    loss_mask = torch.zeros((len(rows), completion_width))
    for r, (prompt, completion, mask) in enumerate(rows):
        start = prompt_width - len(prompt)
        ids[r, start:prompt_width] = torch.tensor(prompt)
        ids[r, prompt_width : prompt_width + len(completion)] = torch.tensor(completion)
        attention[r, start : prompt_width + len(completion)] = 1
        loss_mask[r, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
    return ids.to(device), attention.to(device), loss_mask.to(device), prompt_width


def imitation_loss(model: Any, rows: Sequence[Row], pad_id: int, temperature: float = 1.0) -> torch.Tensor:
    """The negative log-likelihood of each row's reply (its masked completion tokens' summed) under
    ``model``, averaged over the rows (its logits divided by ``temperature``, as the policy loss reads
    them). SIL's term is ``log pi(a | s)`` for the action taken; a reply is that action, so its
    tokens' log-probabilities add. A mean over tokens would weigh a reply's move by one over its
    length: with a four-token closing tag that is near-certain already, the move's pull fell to a
    fifth of the coefficient's, and the trainer lagged the simulation that imitated the move alone.

    Rows drawn more than once (the draw is with replacement, and a policy wins a common view with
    the same move again and again) run once, weighted by their count, and the head scores only the
    replies' positions (``logits_to_keep``): the same sum, up to the order of its floating-point
    additions, for a fraction of the forward and backward passes."""
    device = next(model.parameters()).device
    counts = collections.Counter(rows)
    distinct = list(counts)
    ids, attention, loss_mask, prompt_width = padded(distinct, pad_id, device)
    replies = ids.shape[1] - prompt_width
    logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=replies + 1).logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, prompt_width:, None])[..., 0]
    weight = torch.tensor([counts[row] for row in distinct], dtype=logp.dtype, device=device)
    return -((logp * loss_mask).sum(-1) * weight).sum() / max(len(rows), 1)
