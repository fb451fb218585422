"""TRL ``GRPOConfig`` fields that touch sampling, scoring or advantages: each is honoured or refused.

envhub plays its own episodes and computes its own advantages (the estimate stage), then hands
TRL's loss per-token advantages. A TRL field that only shaped TRL's own rollouts or advantages
would therefore be silently ignored; :func:`check_inherited` refuses such a field when it is set
to anything but its default, with a one-line error naming what envhub does instead. The fields
TRL's loss reads (:data:`HONOURED`) act on envhub's advantages as they do on TRL's.
"""

from __future__ import annotations

from typing import Any

#: Inherited fields that work as in TRL, and how (for the docs and the tests).
HONOURED: dict[str, str] = {
    "beta": "TRL's loss adds beta x its KL to the reference model (which REINFORCE++ then reads too)",
    "num_iterations": "TRL reuses each generation batch that many times, with envhub's advantages",
    "epsilon": "TRL's lower clip of the importance ratio",
    "epsilon_high": "TRL's upper clip of the importance ratio",
    "delta": "TRL's two-sided clip of the ratio",
    "loss_type": "TRL's loss aggregation over envhub's per-token advantages",
    "importance_sampling_level": "TRL's token or sequence ratio (ratio_type='segment' is envhub's per-turn one)",
    "top_entropy_quantile": "TRL's loss keeps only the highest-entropy model tokens",
    "entropy_coef": "TRL's entropy bonus over the model tokens",
    "off_policy_mask_threshold": "TRL's mask of sequences too far off-policy",
    "use_bias_correction_kl": "TRL's importance-corrected KL (with beta > 0)",
    "sync_ref_model": "TRL's reference-model sync (with beta > 0)",
    "temperature": "sampling and scoring temperature",
    "top_p": "sampling",
    "top_k": "sampling",
    "scale_rewards": "'group' is advantage_norm='mean_std', 'none' is advantage_norm='mean' (grpo, gigpo, step_reinforce)",
}

#: Inherited fields envhub cannot honour: field -> (TRL's default, what envhub does instead).
REFUSED: dict[str, tuple[Any, str]] = {
    "reward_weights": (
        None,
        "envhub's reward is the environment's; weigh GiGPO's levels with episode_reward_weight and step_reward_weight",
    ),
    "multi_objective_aggregation": (
        "sum_then_normalize",
        "envhub's reward is the environment's, one objective; its estimator normalises it (advantage_norm)",
    ),
    "mask_truncated_completions": (
        False,
        "set unfinished_replies='invalid' to refuse a reply cut off at max_turn_tokens (with format_penalty)",
    ),
    "use_liger_kernel": (False, "envhub's per-token advantages go through TRL's own loss"),
    "min_p": (None, "envhub's generators sample with temperature, top_p and top_k; pass others in generator_kwargs"),
    "repetition_penalty": (1.0, "envhub's generators sample with temperature, top_p and top_k; pass others in generator_kwargs"),
    "generation_kwargs": (None, "envhub's generators take their options from generator_kwargs"),
}

#: Estimators whose advantages ``advantage_norm`` (hence ``scale_rewards``) shapes, and what the
#: others do instead.
NORMALISING = ("grpo", "gigpo", "step_reinforce")
OWN_SCALING = {
    "rloo": "subtracts the other members' mean return and never divides by a std",
    "reinforce++": "whitens its token returns over the batch",
    "ppo": "whitens its GAE advantages over the batch",
}


def check_inherited(config: Any) -> None:
    """Refuse inherited TRL fields envhub would ignore, and map ``scale_rewards`` onto
    ``advantage_norm`` (and back, so that TRL's own logged reward statistics agree).

    Raises:
        ValueError: naming the field and what envhub does instead.
    """
    for name, (default, instead) in REFUSED.items():
        value = getattr(config, name, default)
        if value != default:
            raise ValueError(f"{name}={value!r} is TRL's and would be ignored here: {instead}")
    scale = {True: "group", False: "none"}.get(config.scale_rewards, config.scale_rewards)
    if scale not in ("group", "none", "batch"):
        raise ValueError(f"scale_rewards must be 'group', 'none' or 'batch', got {config.scale_rewards!r}")
    if scale == "batch":
        raise ValueError(
            "scale_rewards='batch' (TRL's group mean over the batch's std) is not an envhub normalisation; set "
            "advantage_norm ('mean' or 'mean_std') and advantage_norm_scope ('group', 'env' or 'batch') instead"
        )
    estimator = config.advantage_estimator
    if scale == "none":
        if estimator not in NORMALISING:
            raise ValueError(
                f"scale_rewards='none' does not apply to advantage_estimator={estimator!r}, which "
                f"{OWN_SCALING.get(estimator, 'scales its advantages itself')}; leave scale_rewards at 'group'"
            )
        config.advantage_norm = "mean"
    config.scale_rewards = "none" if config.advantage_norm == "mean" else "group"
