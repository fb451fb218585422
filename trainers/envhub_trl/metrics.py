"""The environment metrics a training step logs through TRL (``env/...`` keys).

They are the signals RAGEN watches for the "echo trap": success and return rising or collapsing,
invalid replies, turns and reply length, and the reward spread within groups (near 0 means GRPO
has nothing to learn from). TRL itself logs the policy entropy (``entropy``) and the trainer the
gradient norm (``grad_norm``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from envhub.trajectory import Trajectory, batch_metrics
from envhub_trl.diagnostics import learning_signal

if TYPE_CHECKING:
    from envhub_trl.pipeline import GenerationBatch


#: The metrics logged per env of a mix too, as ``env/<env id>/<name>``.
PER_ENV_METRICS = ("success_rate", "mean_return", "invalid_action_rate", "mean_turns", "truncated_rate")


def rollout_metrics(
    trajectories: Sequence[Trajectory], keep: np.ndarray, anchor_size: np.ndarray | None = None, per_env: bool = False
) -> dict[str, float]:
    """The ``env/`` metrics of one generation batch (every process's episodes, global group ids).

    Args:
        trajectories: the batch's episodes.
        keep: per trajectory, whether group filtering kept it.
        anchor_size: per turn, the size of its GiGPO anchor group (None for GRPO).
        per_env: also log :data:`PER_ENV_METRICS` per env id (``env/<id>/success_rate``...), for
            a run on a mix of envs.
    """
    metrics = batch_metrics(trajectories)
    out = {
        "env/success_rate": metrics["success_rate"],
        "env/mean_return": metrics["mean_return"],
        "env/invalid_action_rate": metrics["invalid_action_rate"],
        "env/mean_turns": metrics["mean_turns"],
        "env/tokens_per_turn": metrics["mean_completion_tokens"],
        "env/reward_std_per_group": metrics["reward_std_per_group"],
        "env/zero_std_group_fraction": metrics["zero_std_group_fraction"],
        "env/truncated_rate": metrics["truncated_rate"],
        "env/invalid_end_rate": metrics["invalid_end_rate"],
        "env/kept_fraction": float(np.mean(keep)),
    }
    if per_env:
        for env_id in dict.fromkeys(t.env_id for t in trajectories):
            own = batch_metrics([t for t in trajectories if t.env_id == env_id])
            out.update({f"env/{env_id}/{name}": own[name] for name in PER_ENV_METRICS})
    if anchor_size is not None and len(anchor_size):
        out["env/anchor_size"] = float(np.mean(anchor_size))
        out["env/singleton_anchor_rate"] = float(np.mean(np.asarray(anchor_size) == 1))
    return out


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
