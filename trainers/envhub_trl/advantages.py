"""Advantage estimators for multi-turn GRPO and GiGPO, as pure vectorised numpy functions.

Inputs are flat per-step arrays (one entry per turn of every trajectory in the batch) plus the env
group of each trajectory; nothing here knows about tokens or models, so every formula can be
checked by hand.

GRPO: each trajectory's return, normalised within its env group (the members that share one initial
state). GiGPO (Feng et al., 2025, "Group-in-Group Policy Optimization"): the same episode-level
advantage, plus ``step_weight`` times a step-level advantage: each step's discounted return,
normalised within its *anchor-state group* — the steps, of any member and any turn of the same env
group, taken from the same state (``state_key``). Anchor groups never span env groups, and an
anchor group of one step gets step advantage 0.

Standard deviations are the unbiased (n - 1) ones, as ``torch.std`` computes them in TRL and in
verl-agent; a group of one, or a group whose values all tie, gets advantage 0.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Norm = Literal["mean", "mean_std", "relative"]
#: The smallest group mean a ``"relative"`` normalisation divides by (see :func:`group_normalize`).
RELATIVE_FLOOR = 0.1


def group_normalize(
    values: np.ndarray, groups: np.ndarray, norm: Norm = "mean_std", eps: float = 1e-6, floor: float = RELATIVE_FLOOR
) -> np.ndarray:
    """Return ``values`` minus their group's mean, divided by the group's std when ``mean_std`` or by
    the group's mean when ``relative``.

    ``relative`` is the maximum-likelihood normalisation: with 0/1 rewards the group's mean is its
    success rate ``p``, and ``(r - p) / p`` makes the expected policy gradient that of
    ``log p`` (supervised learning's gradient on the successes) instead of ``p``'s. The
    std-normalised gradient is ``p``'s over ``sqrt(p (1 - p))``, so a group (or anchor state) the
    policy rarely solves pulls ``sqrt(p)`` times as hard as its successes deserve, and the moves
    already likely crowd out the rare right ones: the policy learns its moves' marginal and stops
    reading its input. Within one group ``relative`` and ``mean_std`` rank and space the members
    alike; they weigh groups differently. The mean is floored at ``floor`` (a group that never
    succeeds, whose mean is 0 or a format penalty's negative, is divided by ``floor``).

    Args:
        values: shape ``(n,)``.
        groups: shape ``(n,)``, any integer labels.
        norm: ``"mean"`` (subtract the mean), ``"mean_std"`` (also divide by std + eps) or
            ``"relative"`` (also divide by the mean, at least ``floor``).
        eps: added to the std.
        floor: the smallest divisor of ``relative``.

    Returns:
        Shape ``(n,)``; 0 for members of groups of size one.
    """
    if norm not in ("mean", "mean_std", "relative"):
        raise ValueError(f"norm must be 'mean', 'mean_std' or 'relative', got {norm!r}")
    values = np.asarray(values, dtype=np.float64)
    _, labels, counts = np.unique(groups, return_inverse=True, return_counts=True)
    mean = np.bincount(labels, weights=values) / counts
    centred = values - mean[labels]
    if norm == "mean_std":
        sq = np.bincount(labels, weights=centred**2)
        scale = np.sqrt(sq / np.maximum(counts - 1, 1))[labels] + eps
        centred = np.divide(centred, scale, out=np.zeros_like(centred), where=scale > 0)
    elif norm == "relative":
        centred = centred / np.maximum(mean, floor)[labels]
    return np.where(counts[labels] > 1, centred, 0.0)


def weigh_positive(advantages: np.ndarray, weight: float) -> np.ndarray:
    """Positive advantages times ``weight``, negative ones as they are (``positive_advantage_weight``,
    W-REINFORCE's λ); the same array where ``weight`` is 1."""
    advantages = np.asarray(advantages)
    return advantages if weight == 1.0 else np.where(advantages > 0, weight * advantages, advantages)


def grpo_advantages(returns: np.ndarray, groups: np.ndarray, norm: Norm = "mean_std", eps: float = 1e-6) -> np.ndarray:
    """Episode-level GRPO advantage of each trajectory: its return normalised within its env group.

    Args:
        returns: shape ``(n_traj,)``, the undiscounted return of each trajectory.
        groups: shape ``(n_traj,)``, the env group of each trajectory.
    """
    return group_normalize(returns, groups, norm, eps)


def discounted_returns(rewards: np.ndarray, traj_index: np.ndarray, step_index: np.ndarray, gamma: float) -> np.ndarray:
    """Return ``R_t = sum_{k >= t} gamma^(k - t) r_k`` within each trajectory, for every step.

    Steps may come in any order; ``step_index`` gives each step's turn number (0-based, contiguous
    within a trajectory). Computed as one matrix product over trajectories padded to the longest,
    so there is no Python loop over steps.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    _, traj = np.unique(traj_index, return_inverse=True)
    step_index = np.asarray(step_index)
    length = int(step_index.max()) + 1 if len(step_index) else 0
    padded = np.zeros((traj.max() + 1 if len(traj) else 0, length))
    padded[traj, step_index] = rewards
    offsets = np.arange(length)
    exponent = offsets[:, None] - offsets[None, :]  # k - t
    discount = np.where(exponent >= 0, float(gamma) ** np.maximum(exponent, 0), 0.0)
    return (padded @ discount)[traj, step_index]


def gigpo_advantages(
    rewards: np.ndarray,
    traj_index: np.ndarray,
    step_index: np.ndarray,
    traj_groups: np.ndarray,
    state_keys: np.ndarray,
    *,
    step_weight: float = 1.0,
    gamma: float = 0.95,
    norm: Norm = "mean_std",
    eps: float = 1e-6,
    anchor_groups: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """GiGPO's per-step advantage: episode-level plus ``step_weight`` x step-level.

    Args:
        rewards: shape ``(n_steps,)``, the reward of each step.
        traj_index: shape ``(n_steps,)``, which trajectory (0..n_traj-1) each step belongs to.
        step_index: shape ``(n_steps,)``, the step's turn number within its trajectory.
        traj_groups: shape ``(n_traj,)``, the env group of each trajectory.
        state_keys: shape ``(n_steps,)``, the ``state_key`` of the state each action was taken in.
        step_weight: ω, the weight of the step-level advantage.
        gamma: γ, the discount of the step returns.
        norm: ``"mean"``, ``"mean_std"`` or ``"relative"``, for both levels.
        anchor_groups: shape ``(n_steps,)``, the set each step's anchor lies in: steps anchor
            together when they share this label and their key. None: each step's env group
            (GiGPO's: the same state in two env groups stays two anchors).

    Returns:
        ``advantages`` (per step), ``episode`` (per trajectory), ``step`` (per step),
        ``anchor_size`` (per step: how many steps share its anchor group).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    traj_index = np.asarray(traj_index)
    traj_groups = np.asarray(traj_groups)
    returns = np.bincount(traj_index, weights=rewards, minlength=len(traj_groups))
    episode = grpo_advantages(returns, traj_groups, norm, eps)
    step_returns = discounted_returns(rewards, traj_index, step_index, gamma)
    step_groups = traj_groups[traj_index] if anchor_groups is None else np.asarray(anchor_groups)
    # An anchor is (env group, state key): the same state in two env groups stays two anchors.
    _, group_codes = np.unique(step_groups, return_inverse=True)
    _, key_codes = np.unique(np.asarray(state_keys, dtype=object).astype(str), return_inverse=True)
    anchors = group_codes.astype(np.int64) * (int(key_codes.max()) + 1 if len(key_codes) else 1) + key_codes
    step = group_normalize(step_returns, anchors, norm, eps)
    _, anchor_labels, anchor_counts = np.unique(anchors, return_inverse=True, return_counts=True)
    return {
        "advantages": episode[traj_index] + step_weight * step,
        "episode": episode,
        "step": step,
        "anchor_size": anchor_counts[anchor_labels],
        "step_returns": step_returns,
    }


def select_groups(
    returns: np.ndarray,
    groups: np.ndarray,
    *,
    drop_tied: bool = False,
    keep_fraction: float = 1.0,
    variance_share: float = 1.0,
    tie_values: np.ndarray | None = None,
    eps: float = 1e-8,
) -> np.ndarray:
    """Which trajectories a filtered batch keeps, group by group (RAGEN's StarPO-S filter and
    RAGEN-2's top-p filter by reward variance).

    Args:
        returns: shape ``(n_traj,)``, each trajectory's return.
        groups: shape ``(n_traj,)``, its env group.
        drop_tied: drop every group whose returns all tie (within ``eps``): they carry no
            episode-level signal. With ``tie_values`` (per trajectory, e.g. 1.0 for a success),
            those are compared instead.
        keep_fraction: keep the ``ceil(keep_fraction * n_groups)`` groups with the largest return
            std (ties broken by group label), after ``drop_tied``.
        variance_share: keep the groups of largest return variance that together hold this share
            of the batch's summed variance (top-p, as RAGEN-2's ``rollout_filter_strategy: top_p``
            over ``reward_variance`` and VAGEN's ``reward_variance_top_p``): groups are taken in
            order of variance (ties by label) while those taken hold less than the share, so a
            tied group goes once the share is below 1. A batch with no variance keeps every group.
            Applied beside the other two; no loss rescaling (RAGEN's ``filter_loss_scaling: none``).

    Returns:
        Shape ``(n_traj,)``, True for the trajectories of kept groups.
    """
    if not 0.0 < keep_fraction <= 1.0:
        raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction}")
    if not 0.0 < variance_share <= 1.0:
        raise ValueError(f"variance_share must be in (0, 1], got {variance_share}")
    labels_of, labels, counts = np.unique(groups, return_inverse=True, return_counts=True)

    def group_std(values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        mean = np.bincount(labels, weights=values) / counts
        return np.sqrt(np.bincount(labels, weights=(values - mean[labels]) ** 2) / counts)

    std = group_std(returns)
    keep = np.ones(len(labels_of), dtype=bool)
    if drop_tied:
        keep &= (std if tie_values is None else group_std(tie_values)) > eps
    # Both other filters keep a head of one ranking: by std (so by variance) descending, then label.
    order = np.lexsort((np.arange(len(labels_of)), -std))
    taken = len(labels_of)
    if keep_fraction < 1.0:
        taken = int(np.ceil(keep_fraction * len(labels_of)))
    variance = std[order] ** 2
    if variance_share < 1.0 and variance.sum() > 0.0:
        held_before = np.cumsum(variance) - variance  # nondecreasing: the groups taken are a head
        taken = min(taken, int(np.sum(held_before < variance_share * variance.sum())))
    keep[order[taken:]] = False
    return keep[labels]
