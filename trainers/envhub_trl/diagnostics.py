"""Why RL stalls: the learning-signal diagnostics a training step logs (``diag/...`` keys).

Success curves say *that* a run stalls; these say *why*. Each is computed from one generation batch
(its episodes and the advantages the estimator gave them), needs no model call, and is the same
for every estimator, so a GRPO run and a GiGPO run log comparable figures (the share of env groups
whose returns all tie, where GRPO's advantage is 0, is ``env/zero_std_group_fraction``,
:mod:`envhub_trl.metrics`):

- ``diag/anchor_return_std`` and ``diag/informative_anchor_rate``: GiGPO's step level. Over the
  turns whose anchor state (env group and ``state_key``) was visited at least twice, the mean
  spread of the discounted returns from it, and the fraction of those turns whose anchor's
  returns differ (a tied anchor gives step advantage 0). ``diag/repeated_anchor_rate``: the
  fraction of turns in such anchors at all (a singleton anchor has no step-level signal).
- ``diag/first_move_entropy``: per env group, the entropy (nats) of the first action its members
  took from their shared initial state; the mean over groups. It falls as the policy commits to
  a first move; 0 early in a run means exploration died at the first decision.
- ``diag/action_entropy``, ``diag/action_entropy_given_observation`` and
  ``diag/observation_action_information``: over the turns whose observation the batch shows at
  least :data:`MIN_OBSERVATION_COUNT` times, the entropy of the actions, their entropy given
  the observation the reply answered, and the difference, an estimate of the mutual information
  between what the policy sees and what it does. A policy that learns a fixed distribution of
  moves whatever it sees (a "fixed route" in a stochastic form) has information near 0 while its
  entropy falls; one that reads its observation has information near its action entropy.
- ``diag/advantage_abs_mean``: the mean absolute per-turn advantage (0 when nothing is learnt).
- ``diag/reply_cut_rate``: replies cut at ``max_turn_tokens`` (finish reason ``length``).

Entropies are estimates from the batch's samples, in nats: plug-in for the first move, Miller-Madow
corrected for the action entropies and the information (their plug-in bias is large when many
observations are each seen a few times).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from envhub.trajectory import Trajectory
from envhub_trl.advantages import discounted_returns
from envhub_trl.estimators import TurnBatch

#: The fewest turns from one observation for it to count in the action/observation information.
MIN_OBSERVATION_COUNT = 4


def entropy(counts: Iterable[int], corrected: bool = False) -> float:
    """The entropy (nats) of a distribution given by its sample counts: the plug-in estimate, or
    with ``corrected`` the Miller-Madow one (plus ``(bins seen - 1) / (2 n)``), which takes off
    most of the plug-in's downward bias at small counts."""
    values = np.asarray([c for c in counts if c > 0], dtype=np.float64)
    if values.sum() <= 0:
        return 0.0
    p = values / values.sum()
    plug_in = float(-(p * np.log(p)).sum())
    return plug_in + (len(values) - 1) / (2 * values.sum()) if corrected else plug_in


def _action(turn) -> str:
    """A turn's action as a label (an invalid reply counts as one action of its own)."""
    return turn.action if turn.action is not None and turn.action_is_valid else "<invalid>"


def learning_signal(
    episodes: Sequence[Trajectory], advantages: np.ndarray | None = None, gamma: float = 0.95, batch: TurnBatch | None = None
) -> dict[str, float]:
    """The ``diag/`` metrics of one generation batch (see the module docstring).

    Args:
        episodes: the batch's episodes, with their global group ids.
        batch: their per-turn arrays when already built (the pipeline's ``GenerationBatch.turns``);
            None: built here.
        advantages: the per-turn advantages the estimator gave (turns in episode order), or None.
        gamma: the discount of the step returns the anchor spread is measured on (GiGPO's γ).
    """
    out: dict[str, float] = {}
    turns = [(i, turn) for i, episode in enumerate(episodes) for turn in episode.turns]
    if not turns:
        return out
    # Env groups: the first move from the shared initial state.
    by_group: dict[int, list[Trajectory]] = defaultdict(list)
    for episode in episodes:
        by_group[episode.group_id].append(episode)
    first = [entropy(Counter(_action(e.turns[0]) for e in members if e.turns).values()) for members in by_group.values()]
    out["diag/first_move_entropy"] = float(np.mean(first))
    # Actions against observations, over the turns whose observation the batch shows at least
    # MIN_OBSERVATION_COUNT times, Miller-Madow corrected and capped at the marginal: an observation
    # seen once has conditional entropy 0 whatever the policy, so with many rare observations the
    # information comes out high (0.45 nats for a policy the probe finds exactly blind, over 400
    # turns; 0.01-0.10 over the observations seen 4 times or more, in simulation, against 0.7-0.8
    # for one that reads them).
    by_observation: dict[str, Counter] = defaultdict(Counter)
    for _, turn in turns:
        by_observation[turn.observation][_action(turn)] += 1
    seen = [c for c in by_observation.values() if sum(c.values()) >= MIN_OBSERVATION_COUNT]
    actions = sum(seen, Counter())
    counted = sum(actions.values())
    marginal = entropy(actions.values(), corrected=True)
    conditional = min(marginal, sum(sum(c.values()) / counted * entropy(c.values(), corrected=True) for c in seen)) if counted else 0.0
    out["diag/action_entropy"] = marginal
    out["diag/action_entropy_given_observation"] = conditional
    out["diag/observation_action_information"] = marginal - conditional
    # Anchor states (env group, state key): GiGPO's step-level groups, from the batch's per-turn arrays.
    turns_batch = batch if batch is not None else TurnBatch.from_trajectories(episodes)
    returns = discounted_returns(turns_batch.rewards, turns_batch.traj_index, turns_batch.step_index, gamma)
    keys = [f"{group}\x1f{key}" for group, key in zip(turns_batch.traj_groups[turns_batch.traj_index], turns_batch.state_keys)]
    _, anchor, sizes = np.unique(np.array(keys), return_inverse=True, return_counts=True)
    mean = np.bincount(anchor, weights=returns) / sizes
    spread = np.sqrt(np.bincount(anchor, weights=(returns - mean[anchor]) ** 2) / sizes)[anchor]  # population std per turn's anchor
    repeated = sizes[anchor] > 1
    out["diag/repeated_anchor_rate"] = float(np.mean(repeated))
    out["diag/anchor_return_std"] = float(np.mean(spread[repeated])) if repeated.any() else 0.0
    out["diag/informative_anchor_rate"] = float(np.mean(spread[repeated] > 1e-8)) if repeated.any() else 0.0
    if advantages is not None and len(advantages):
        out["diag/advantage_abs_mean"] = float(np.mean(np.abs(advantages)))
    out["diag/reply_cut_rate"] = float(np.mean([turn.finish_reason == "length" for _, turn in turns]))
    return out
