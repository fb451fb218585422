"""The environment metrics a training step logs through TRL (``env/...`` keys).

They are the signals RAGEN watches for the "echo trap": success and return rising or collapsing,
invalid replies, turns and reply length, and the reward spread within groups (near 0 means GRPO
has nothing to learn from). TRL itself logs the policy entropy (``entropy``) and the trainer the
gradient norm (``grad_norm``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envhub.trajectory import Trajectory, batch_metrics


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
