"""What the trainer adds to TRL's inputs for its own loss terms, from a generation batch the stages of
:mod:`envhub_trl.pipeline` have taken through ``spread``: each completion token's turn (the per-turn
importance ratio, ``ratio_type="segment"``), PPO's critic targets, and the choice points where a turn
chose between its legal actions with the entropy of that choice (``action_entropy_coef``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from envhub_trl.critic import value_positions

if TYPE_CHECKING:
    from envhub_trl.pipeline import GenerationBatch


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
