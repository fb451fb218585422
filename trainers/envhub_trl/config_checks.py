"""The rules of :class:`~envhub_trl.config.EnvGRPOConfig`, in one place: its aliases resolved,
its bounds (:data:`FIELD_BOUNDS`), and the rules between fields, each error naming the field and
the fix. The config's ``__post_init__`` applies them in this module's order.

Aliases: each prompt setting may be given under ``prompt:`` or as a flat field of its own name;
``group_size`` is ``num_generations``; ``step_advantage_weight``, ``step_gamma`` and
``async_generation_ratio`` are ``step_reward_weight``, ``step_reward_gamma`` and ``max_staleness``
(ROLL's and older names). :func:`resolve_aliases` is the one place they are read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from envhub.bounds import AT_LEAST_ONE, NON_NEGATIVE, Bounds
from envhub.executors import EXECUTORS
from envhub.prompts import PROMPT_BOUNDS, PromptSettings
from envhub.settings import LAYOUTS
from envhub_trl.estimators import ESTIMATORS, NORM_SCOPES, STEP_ANCHORS
from envhub_trl.generators import BACKENDS
from envhub_trl.inherited import check_inherited
from envhub_trl.mix import EnvEntry, parse_envs
from envhub_trl.pipeline import TIED_BY
from envhub_trl.trackers import check_trackers

#: The prompt settings' defaults, which the config's flat prompt fields take (declared once, in PromptSettings).
PROMPT_DEFAULTS = PromptSettings()
#: ``alias: field`` of the config's other aliases.
ALIASES = {"step_advantage_weight": "step_reward_weight", "step_gamma": "step_reward_gamma", "async_generation_ratio": "max_staleness"}
NORMS = ("mean", "mean_std", "relative")
ROLLOUT_MODES = ("lockstep", "continuous", "async")
RATIO_TYPES = ("token", "segment")
POSITIVE = Bounds(low=0, low_open=True)
UNIT = Bounds(low=0, high=1)

#: Every numeric field of :class:`EnvGRPOConfig`, its own and the TRL/transformers fields a run
#: reads, with the values it accepts: checked once, by :func:`check_rules`, before anything loads
#: (:mod:`envhub.bounds`). The prompt settings' bounds are :class:`~envhub.prompts.PromptSettings`'
#: own (:data:`~envhub.prompts.PROMPT_BOUNDS`), declared there once.
FIELD_BOUNDS: dict[str, Bounds] = {
    **PROMPT_BOUNDS,
    # Environment
    "max_turns": AT_LEAST_ONE,
    "max_invalid_streak": AT_LEAST_ONE,
    "num_train_seeds": AT_LEAST_ONE,
    # Batches (group_size is num_generations after the alias is resolved; GRPO compares members of a group)
    "groups_per_step": AT_LEAST_ONE,
    "group_size": Bounds(low=2),
    "per_device_train_batch_size": AT_LEAST_ONE,
    "gradient_accumulation_steps": AT_LEAST_ONE,
    "generation_batch_size": AT_LEAST_ONE,
    "steps_per_generation": AT_LEAST_ONE,
    "max_forward_tokens": AT_LEAST_ONE,
    # Generation
    "max_turn_tokens": AT_LEAST_ONE,
    "max_completion_length": AT_LEAST_ONE,
    "temperature": POSITIVE,
    "top_p": Bounds(low=0, high=1, low_open=True),
    "top_k": NON_NEGATIVE,
    "min_p": UNIT,
    "repetition_penalty": POSITIVE,
    # Rollouts
    "max_staleness": NON_NEGATIVE,
    "importance_sampling_cap": Bounds(low=1),
    "env_workers": AT_LEAST_ONE,
    "agent_processes": NON_NEGATIVE,
    "env_step_timeout": POSITIVE,
    # Advantages and losses
    "episode_reward_weight": NON_NEGATIVE,
    "step_reward_weight": NON_NEGATIVE,
    "positive_advantage_weight": NON_NEGATIVE,
    "step_reward_gamma": UNIT,
    "kl_coef": NON_NEGATIVE,
    "action_entropy_coef": NON_NEGATIVE,
    "action_entropy_floor": POSITIVE,
    "gamma": UNIT,
    "lam": UNIT,
    "vf_coef": NON_NEGATIVE,
    "cliprange_value": POSITIVE,
    "keep_group_fraction": Bounds(low=0, high=1, low_open=True),
    "keep_group_variance_share": Bounds(low=0, high=1, low_open=True),
    "dynamic_sampling_rounds": AT_LEAST_ONE,
    "retry_unsolved_rounds": NON_NEGATIVE,
    "self_imitation_coef": NON_NEGATIVE,
    "self_imitation_memory": AT_LEAST_ONE,
    "self_imitation_rows": AT_LEAST_ONE,
    "max_env_error_rate": UNIT,
    "beta": NON_NEGATIVE,
    "epsilon": NON_NEGATIVE,
    "epsilon_high": NON_NEGATIVE,
    "num_iterations": AT_LEAST_ONE,
    # Optimisation and schedule
    "learning_rate": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE,
    "max_grad_norm": NON_NEGATIVE,
    "warmup_steps": NON_NEGATIVE,
    "num_train_epochs": POSITIVE,
    "max_steps": Bounds(low=1, also=(-1,), meaning="train for num_train_epochs instead"),
    "logging_steps": POSITIVE,
    "save_steps": POSITIVE,
    "eval_steps": POSITIVE,
    # Evaluation and seeds
    "eval_episodes": AT_LEAST_ONE,
    "eval_seed_offset": NON_NEGATIVE,
    "eval_max_invalid_streak": AT_LEAST_ONE,
    "eval_pass_k": Bounds(low=2),
    "validation_steps": AT_LEAST_ONE,
    "validation_episodes": AT_LEAST_ONE,
    "validation_seed_offset": NON_NEGATIVE,
    "seed": NON_NEGATIVE,
}


def served(generator: str) -> bool:
    """Whether the generator backend plays on a server at ``vllm_server_url``."""
    found = BACKENDS.get(generator)
    return found is not None and found.needs_server_url



def resolve_aliases(config: Any) -> list[EnvEntry]:
    """Resolve ``config``'s aliases in place (see the module docstring) and return its env entries.

    Raises:
        ValueError: for a setting given under both names with two values, or a bad ``envs``.
    """
    entries = _parse_envs(config)
    if config.prompt is not None:
        _apply_prompt(config)
    if config.group_size is not None:
        config.num_generations = config.group_size
    config.group_size = config.num_generations
    if config.advantage_estimator not in ESTIMATORS:
        raise ValueError(f"advantage_estimator must be one of {sorted(ESTIMATORS)}, got {config.advantage_estimator!r}")
    for alias, name in ALIASES.items():
        value = getattr(config, alias)
        if value is not None:
            default = type(config).__dataclass_fields__[name].default
            if getattr(config, name) != default and getattr(config, name) != value:
                raise ValueError(f"{alias} is an alias of {name}; set one of them, not both ({value} and {getattr(config, name)})")
            setattr(config, name, value)
        setattr(config, alias, getattr(config, name))
    return entries


def _parse_envs(config: Any) -> list[EnvEntry]:
    """Check ``env_id``/``envs`` and return the entries (setting ``groups_per_step`` for a mix)."""
    if config.envs is None:
        config.env_id = config.env_id or "frozenlake/FrozenLake-v0"
        groups = config.groups_per_step or 0
        return [EnvEntry(config.env_id, groups, dict(config.env_kwargs or {}), None, {})]
    if config.env_kwargs:
        raise ValueError("env_kwargs is for a single env_id; with envs, give each env its env_kwargs")
    entries, config.groups_per_step = parse_envs(config.envs, config.groups_per_step)
    if config.env_id is not None and config.env_id not in config.envs:
        raise ValueError(f"set env_id or envs, not both (env_id {config.env_id!r} is not one of envs)")
    config.env_id = entries[0].env_id
    return entries


def _apply_prompt(config: Any) -> None:
    """Copy the ``prompt`` mapping onto the flat prompt fields (its aliases), refusing a key
    that is not a prompt setting and a setting given both ways with two values."""
    names = [f.name for f in dataclasses.fields(PromptSettings)]
    unknown = sorted(set(config.prompt) - set(names))
    if unknown:
        raise ValueError(f"prompt: unknown prompt settings {unknown}; known: {names}")
    for name, value in config.prompt.items():
        flat = getattr(config, name)
        if name == "stop_strings":  # a list, None (the field's default) or a tuple (the settings')
            flat, value = tuple([flat] if isinstance(flat, str) else flat or ()), [value] if isinstance(value, str) else list(value or ())
            if flat and flat != tuple(value):
                raise ValueError(f"{name} is set twice, {list(flat)!r} as a field and {value!r} under prompt; set one of them")
        elif flat != getattr(PROMPT_DEFAULTS, name) and flat != value:
            raise ValueError(f"{name} is set twice, {flat!r} as a field and {value!r} under prompt; set one of them")
        setattr(config, name, value)


def check_rules(config: Any) -> None:
    """The rules between fields, and the choices each field takes, once the bounds hold.

    Raises:
        ValueError: naming the field and the fix.
    """
    c = config
    if c.rollout_mode not in ROLLOUT_MODES:
        raise ValueError(f"rollout_mode must be one of {ROLLOUT_MODES}, got {c.rollout_mode!r}")
    if c.rollout_mode == "async" and (served(c.generator) or c.curriculum is not None):
        raise ValueError("rollout_mode='async' plays with the hf or vllm generator and without a curriculum (its stage moves with training steps)")
    if c.tied_by not in TIED_BY:
        raise ValueError(f"tied_by must be one of {TIED_BY}, got {c.tied_by!r}")
    if c.dynamic_sampling_rounds > 1 and c.rollout_mode == "async":
        raise ValueError("dynamic_sampling_rounds replays a batch's tied groups before training on it; rollout_mode='async' plays ahead: use one of them")
    if c.retry_unsolved_rounds and c.rollout_mode == "async":
        raise ValueError("retry_unsolved_rounds replays a batch's unsolved groups before training on it; rollout_mode='async' plays ahead: use one of them")
    if c.retry_unsolved_rounds and c.dynamic_sampling_rounds > 1:
        raise ValueError("retry_unsolved_rounds and dynamic_sampling_rounds both replay a batch's groups (the same levels, or new ones): use one of them")
    if c.ratio_type not in RATIO_TYPES:
        raise ValueError(f"ratio_type must be one of {RATIO_TYPES}, got {c.ratio_type!r}")
    if c.ratio_type == "segment" and (c.importance_sampling_level != "token" or c.use_liger_kernel):
        raise ValueError("ratio_type='segment' makes its own per-turn ratio: leave importance_sampling_level at 'token' and use_liger_kernel off")
    if c.max_forward_tokens is not None and c.use_liger_kernel:
        raise ValueError("max_forward_tokens chunks the loss's log-probs, which use_liger_kernel's fused loss does not compute: use one of them")
    if c.share_prompt_forward and (c.gradient_checkpointing or c.use_liger_kernel):
        raise ValueError(
            "share_prompt_forward scores the rows in two passes, so it does not combine with gradient_checkpointing (on by "
            "default: set it false) or use_liger_kernel"
        )
    if c.eval_env_id is not None and c.envs is not None:
        raise ValueError("eval_env_id names the env a single-env run is evaluated on; a mix (envs) evaluates each of its envs")
    if c.eval_env_kwargs is not None and c.eval_env_id is None:
        raise ValueError("eval_env_kwargs are the keyword arguments of eval_env_id: set eval_env_id too")
    if c.advantage_norm not in NORMS:
        raise ValueError(f"advantage_norm must be one of {NORMS}, got {c.advantage_norm!r}")
    if c.step_anchor not in STEP_ANCHORS:
        raise ValueError(f"step_anchor must be one of {STEP_ANCHORS}, got {c.step_anchor!r}")
    if c.advantage_norm_scope is not None and c.advantage_norm_scope not in NORM_SCOPES:
        raise ValueError(f"advantage_norm_scope must be one of {NORM_SCOPES} (or unset), got {c.advantage_norm_scope!r}")
    check_inherited(c)  # a TRL field envhub would ignore is refused; scale_rewards maps onto advantage_norm
    c.curriculum_schedule()  # a bad curriculum fails here, naming its field
    if c.env_executor not in EXECUTORS:
        raise ValueError(f"env_executor must be one of {', '.join(EXECUTORS)}; got {c.env_executor!r}")
    if c.generator not in BACKENDS:
        raise ValueError(f"generator must be one of {tuple(sorted(BACKENDS))} (the registered backends), got {c.generator!r}")
    if c.sample_layout not in LAYOUTS:
        raise ValueError(f"sample_layout must be one of {LAYOUTS}, got {c.sample_layout!r}")
    if served(c.generator) != (c.vllm_server_url is not None):
        raise ValueError(
            "generator='vllm-server' needs vllm_server_url (and vllm_server_url needs generator='vllm-server'); "
            f"got generator={c.generator!r}, vllm_server_url={c.vllm_server_url!r}"
        )
    if c.action_entropy_floor is not None and not c.action_entropy_coef:
        raise ValueError("action_entropy_floor sets where action_entropy_coef's bonus acts: set action_entropy_coef > 0 too")
    _check_seeds(c)
    check_trackers(c.report_to)  # a tracker that is not installed fails here, not once the model has loaded
    if c.use_vllm:
        raise ValueError("use_vllm is TRL's own single-turn generator; set generator='vllm' for multi-turn rollouts instead")


def _check_seeds(c: Any) -> None:
    """Training, held-out and validation seeds must not overlap."""
    if c.eval_seed_offset < c.num_train_seeds:
        raise ValueError(
            f"eval_seed_offset ({c.eval_seed_offset}) overlaps the training seeds 0..{c.num_train_seeds - 1}; "
            "raise eval_seed_offset or lower num_train_seeds"
        )
    if c.keep_best_on_validation:
        validation = range(c.validation_seed_offset, c.validation_seed_offset + c.validation_episodes)
        held_out = range(c.eval_seed_offset, c.eval_seed_offset + c.eval_episodes)
        if validation.start < c.num_train_seeds or (validation.start < held_out.stop and held_out.start < validation.stop):
            raise ValueError(
                f"validation seeds {validation.start}..{validation.stop - 1} overlap the training seeds 0..{c.num_train_seeds - 1} "
                f"or the held-out seeds {held_out.start}..{held_out.stop - 1}; move validation_seed_offset"
            )


def set_generation_batch(c: Any) -> None:
    """``generation_batch_size = groups_per_step * group_size`` when ``groups_per_step`` is given."""
    if c.groups_per_step is None:
        return
    if c.generation_batch_size is not None or c.steps_per_generation is not None:
        raise ValueError("set groups_per_step or generation_batch_size/steps_per_generation, not both")
    batch = c.groups_per_step * c.num_generations
    if batch % c.per_device_train_batch_size:
        raise ValueError(
            f"groups_per_step x group_size = {batch} episodes is not divisible by per_device_train_batch_size="
            f"{c.per_device_train_batch_size}; pick a per_device_train_batch_size that divides {batch}"
        )
    c.generation_batch_size = batch


def check_whole_groups(c: Any) -> None:
    """Dynamic sampling and the retries of unsolved groups replay a process's groups whole, so each
    process's share of the generation batch must hold whole groups (known once TRL has set the batch from the processes)."""
    rows = c.generation_batch_size // c.world_size
    replaying = "dynamic_sampling_rounds" if c.dynamic_sampling_rounds > 1 else "retry_unsolved_rounds" if c.retry_unsolved_rounds else None
    if replaying and rows % c.num_generations:
        raise ValueError(
            f"{replaying} replays whole groups on each process, and each of the {c.world_size} processes holds "
            f"{rows} episodes of the generation batch, not a multiple of group_size={c.num_generations}: make groups_per_step a "
            f"multiple of the number of processes"
        )


def pick_device_defaults(c: Any) -> None:
    """CPU or accelerator, and bf16 or fp32, from the machine when the config leaves them unset.

    Without this, TRL's default ``bf16=True`` stops a CPU-only machine with "Your setup doesn't
    support bf16/gpu"; bf16 autocast on a CPU would also be slower than fp32 for small models.
    """
    import torch

    accelerator = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    accelerator = accelerator or torch.backends.mps.is_available()
    if not accelerator:
        c.use_cpu = True
    if c.bf16 is None and not c.fp16:
        c.bf16 = bool(not c.use_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def check_completion_length(c: Any) -> None:
    """``max_completion_length`` bounds a whole episode's completion tokens: at least one reply's."""
    if c.max_completion_length is not None and c.max_completion_length < c.max_turn_tokens:
        raise ValueError(
            f"max_completion_length ({c.max_completion_length}) is below max_turn_tokens ({c.max_turn_tokens}); "
            "raise max_completion_length (it bounds a whole episode's completion tokens)"
        )
