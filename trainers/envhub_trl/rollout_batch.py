"""The parts of :mod:`envhub_trl.pipeline`'s stages that work on one episode or one token: which
episodes the screen stage sets aside (failed envs, non-finite rewards), and how the estimate and
spread stages turn per-turn advantages into per-token ones.

TRL's ``GRPOTrainer`` takes one sample per row. In the trajectory layout a row is one episode: the
first prompt, then every reply and the environment's tokens between them (``env_mask`` 0 on the
latter, so they stay out of the loss); in the step layout a row is one turn. Advantages are
computed per turn by the estimators of :mod:`envhub_trl.estimators` and spread over each turn's
tokens. What TRL itself reads (the reward function, the per-turn ratio's segment mean) is in
:mod:`envhub_trl.trl_bridge`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from envhub.error import EnvhubError, NonFiniteReward
from envhub.trajectory import Sample, Trajectory, Turn
from envhub_trl.estimators import EstimatorSettings, TurnBatch, estimate

#: What training does with an episode that has a NaN or infinite reward (``nonfinite_rewards``):
#: stop with an error naming it, or set it aside and count it.
NONFINITE_REWARDS = ("refuse", "drop")


class RolloutError(EnvhubError):
    """A batch cannot be trained on: an episode whose first prompt is over budget, or more of its
    episodes failed than the run allows (``max_env_error_rate``)."""


def check_has_turns(trajectory: Trajectory) -> None:
    """Raise :class:`RolloutError` for an episode that ended without a single turn though its env
    did not fail (an env that failed ends only its own episode: :func:`screen` sets it aside)."""
    if not trajectory.turns and trajectory.error is None:
        advice = "; raise max_prompt_tokens: the first prompt is over budget" if trajectory.end_reason == "context" else ""
        raise RolloutError(
            f"episode {trajectory.index} of {trajectory.env_id} (seed {trajectory.seed}) ended before its first reply "
            f"({trajectory.end_reason}){advice}"
        )


def nonfinite_turn(trajectory: Trajectory) -> Turn | None:
    """The first turn of ``trajectory`` whose reward is NaN or infinite, else None."""
    return next((turn for turn in trajectory.turns if not math.isfinite(turn.reward)), None)


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


def turn_advantages(
    batch: TurnBatch,
    estimator: str,
    settings: EstimatorSettings | None = None,
    *,
    keep: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Each turn's (or model token's) advantage under the registered ``estimator``
    (:mod:`envhub_trl.estimators`), zero on the episodes the group filter dropped.

    ``keep`` is the group filter's verdict per episode (:func:`~envhub_trl.advantages.select_groups`,
    which the pipeline's screen stage applies); None keeps every episode.

    Returns:
        The estimator's output with ``advantages`` (or ``token_advantages``) set to 0 on the turns
        of dropped groups, and ``keep`` (per episode).
    """
    if keep is None:
        keep = np.ones(len(batch.returns), dtype=bool)
    out = dict(estimate(estimator, batch, settings))
    if "token_advantages" in out:
        out["token_advantages"] = np.where(keep[batch.traj_index[batch.token_turn]], out["token_advantages"], 0.0)
    else:
        out["advantages"] = np.where(keep[batch.traj_index], out["advantages"], 0.0)
    out["keep"] = keep
    return out


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


def without_stop_strings(samples: Sequence[Sample], stop_strings: Sequence[str], decode: Callable[[list[int]], str]) -> list[list[int]]:
    """Each sample's ``env_mask`` with each reply's closing stop string (``</answer>``'s tokens) at 0:
    the reply format writes it, as ``reply_prefix`` writes the opening, so the policy loss leaves it
    out (``train_stop_strings``). Padding rows keep their mask."""
    masks = [list(sample.env_mask) for sample in samples]
    for row, _, positions in _turn_spans(samples):
        reply = [samples[row].completion_ids[p] for p in positions]
        for p in positions[stop_string_start(reply, stop_strings, decode) :]:
            masks[row][p] = 0
    return masks
