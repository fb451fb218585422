"""``EnvGRPOConfig``: TRL's ``GRPOConfig`` plus what a multi-turn environment run needs.

Fields are grouped as follows.

Environment:
    ``env_id``, ``env_kwargs``, ``max_turns``, ``num_train_seeds``; ``envs`` (a mix of
    environments, :mod:`envhub_trl.mix`) instead of ``env_id``; ``curriculum``
    (:mod:`envhub_trl.curriculum`).
Prompt settings (:class:`envhub.prompts.PromptSettings`, whose defaults and rules they take):
    ``prompt``, a mapping of them, or each as a flat field of its own name (an alias):
    ``instructions``, ``system_prompt``, ``action_format``, ``show_legal_actions``, ``show_turns``,
    ``max_prompt_tokens``, ``history_turns``, ``format_penalty``, ``unfinished_replies``.
    :meth:`EnvGRPOConfig.prompt_settings` is the run's value, which every manager, the evaluation
    and each checkpoint (``envhub.json``) receive.
Batches:
    ``groups_per_step`` (env groups per generation batch), ``group_size`` (= ``num_generations``,
    members per group, all reset with one seed), ``sample_layout``.
Generation:
    ``generator`` (``hf``, ``vllm`` or ``vllm-server``), ``vllm_server_url``, ``generator_kwargs``,
    ``max_turn_tokens``; temperature, top-p and top-k are TRL's own fields, used both to sample and
    to score.
Rollouts:
    ``rollout_mode`` (``lockstep``, ``continuous`` or ``async``), ``max_staleness`` (alias
    ``async_generation_ratio``, ROLL's name) and ``importance_sampling_cap`` (:mod:`envhub_trl.async_rollout`).
Advantages:
    ``advantage_estimator`` (any name registered in :mod:`envhub_trl.estimators`: ``grpo``,
    ``gigpo``, ``rloo``, ``step_reinforce``), and, under ROLL's names, ``episode_reward_weight``,
    ``step_reward_weight`` (GiGPO's ω; ``step_advantage_weight`` is an alias) and
    ``step_reward_gamma`` (γ; alias ``step_gamma``); ``advantage_norm`` (``mean`` or ``mean_std``) and
    ``advantage_norm_scope`` (``group``, ``env`` or ``batch``).
Group filtering:
    ``filter_tied_groups`` (drop groups whose returns all tie), ``keep_group_fraction`` (keep the
    top fraction of groups by return std, as RAGEN's StarPO-S).
Failing environments:
    ``max_env_error_rate`` (an env that raises ends its episode alone, which is left out of the
    batch; the run stops when more of a batch's episodes fail), ``nonfinite_rewards`` (``refuse``
    or ``drop`` NaN and infinite rewards).
Evaluation:
    ``eval_episodes`` and ``eval_seed_offset``: the held-out seeds of ``EnvGRPOTrainer.evaluate_env``;
    ``eval_sampled`` (also the sampled policy, not only the greedy one); ``eval_max_invalid_streak``
    (the model's episodes end after that many invalid replies in a row); ``keep_best_on_validation``
    with ``validation_steps``, ``validation_episodes`` and ``validation_seed_offset`` (end with the
    policy that did best on validation seeds, :mod:`envhub_trl.selection`).
TRL's own fields:
    those TRL's loss reads (``beta``, ``num_iterations``, ``epsilon``, ``epsilon_high``, ``delta``,
    ``loss_type``, ``importance_sampling_level``, ``top_entropy_quantile``...) act on envhub's
    advantages; ``scale_rewards`` ``'none'`` is ``advantage_norm='mean'``; those envhub would
    ignore (``reward_weights``, ``mask_truncated_completions``, ``scale_rewards='batch'``...) are
    refused when set (:mod:`envhub_trl.inherited`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from trl import GRPOConfig

from envhub_trl.curriculum import Curriculum
from envhub_trl.estimators import ESTIMATORS, NORM_SCOPES, STEP_ANCHORS, EstimatorSettings
from envhub_trl.generators import BACKENDS
from envhub_trl.inherited import check_inherited
from envhub_trl.mix import EnvEntry, parse_envs

from envhub.executors import EXECUTORS
from envhub.bounds import AT_LEAST_ONE, NON_NEGATIVE, Bounds, check_bounds
from envhub.prompts import PROMPT_BOUNDS, PromptSettings
from envhub.settings import LAYOUTS, EnvSettings, TrainedOn

NORMS = ("mean", "mean_std", "relative")
ROLLOUT_MODES = ("lockstep", "continuous", "async")
RATIO_TYPES = ("token", "segment")
#: The prompt settings' defaults, which the flat prompt fields below take (declared once, in PromptSettings).
PROMPT_DEFAULTS = PromptSettings()

POSITIVE = Bounds(low=0, low_open=True)
UNIT = Bounds(low=0, high=1)

#: Every numeric field of :class:`EnvGRPOConfig`, its own and the TRL/transformers fields a run
#: reads, with the values it accepts: checked once, in ``__post_init__``, before anything loads
#: (:mod:`envhub.bounds`). The prompt settings' bounds are :class:`~envhub.prompts.PromptSettings`'
#: own (:data:`~envhub.prompts.PROMPT_BOUNDS`), declared there once.
FIELD_BOUNDS: dict[str, Bounds] = {
    **PROMPT_BOUNDS,
    # Environment
    "max_turns": AT_LEAST_ONE,
    "num_train_seeds": AT_LEAST_ONE,
    # Batches (group_size is num_generations after the alias is resolved; GRPO compares members of a group)
    "groups_per_step": AT_LEAST_ONE,
    "group_size": Bounds(low=2),
    "per_device_train_batch_size": AT_LEAST_ONE,
    "gradient_accumulation_steps": AT_LEAST_ONE,
    "generation_batch_size": AT_LEAST_ONE,
    "steps_per_generation": AT_LEAST_ONE,
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
    "env_step_timeout": POSITIVE,
    # Advantages and losses
    "episode_reward_weight": NON_NEGATIVE,
    "step_reward_weight": NON_NEGATIVE,
    "step_reward_gamma": UNIT,
    "kl_coef": NON_NEGATIVE,
    "action_entropy_coef": NON_NEGATIVE,
    "gamma": UNIT,
    "lam": UNIT,
    "vf_coef": NON_NEGATIVE,
    "cliprange_value": POSITIVE,
    "keep_group_fraction": Bounds(low=0, high=1, low_open=True),
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


def _served(generator: str) -> bool:
    """Whether the generator backend plays on a server at ``vllm_server_url``."""
    found = BACKENDS.get(generator)
    return found is not None and found.needs_server_url


@dataclass
class EnvGRPOConfig(GRPOConfig):
    """Configuration of :class:`~envhub_trl.trainer.EnvGRPOTrainer` (see the module docstring for the groups).

    Any ``GRPOConfig`` field works too; ``num_generations`` is the group size, and
    ``generation_batch_size`` is set from ``groups_per_step * group_size`` unless given.
    """

    env_id: str | None = field(
        default=None,
        metadata={"help": "The environment id to train on (see `envhub list`); None: frozenlake/FrozenLake-v0, or the first env of `envs`."},
    )
    envs: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "A mix of environments instead of env_id: env id -> {groups_per_step or weight, env_kwargs, max_turns, "
            "instructions, system_prompt, show_legal_actions}; each env group is one env (see envhub_trl.mix)."
        },
    )
    curriculum: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "A training curriculum: {horizon: {step: max_turns}, stages: [{env_kwargs, max_turns}], advance_at, window, env} "
            "(see envhub_trl.curriculum)."
        },
    )
    env_kwargs: dict[str, Any] | None = field(default=None, metadata={"help": "Keyword arguments for `envhub.make(env_id, ...)`."})
    prompt: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "The prompt settings as one mapping (envhub.prompts.PromptSettings: instructions, system_prompt, action_format, "
            "show_legal_actions, show_turns, max_prompt_tokens, history_turns, format_penalty, unfinished_replies); each is "
            "also a flat field of its own name."
        },
    )
    max_turns: int | None = field(default=None, metadata={"help": "Turn limit of every episode; None keeps the env's registered limit."})
    format_penalty: float = field(default=PROMPT_DEFAULTS.format_penalty, metadata={"help": "Added to the reward of every invalid reply (usually negative, e.g. -0.1)."})
    unfinished_replies: Literal["parse", "invalid"] = field(
        default=PROMPT_DEFAULTS.unfinished_replies,
        metadata={"help": "A reply cut off at max_turn_tokens before it ended its turn: 'parse' reads it like any other, 'invalid' refuses it (with format_penalty)."},
    )
    action_format: str | None = field(
        default=PROMPT_DEFAULTS.action_format,
        metadata={
            "help": "Reply format: `answer` (<answer>..</answer>), `think-answer`, `tool-call` (<tool_call>{json}</tool_call>, "
            "checked against a tool env's schemas), `tool-calls` (up to 4 per reply) or a plugin's; None: each env's own "
            "(`tool-call` for tool envs, `answer` otherwise)."
        },
    )
    system_prompt: str | None = field(default=PROMPT_DEFAULTS.system_prompt, metadata={"help": "Text put before the environment's instructions in the system message."})
    instructions: str | None = field(
        default=PROMPT_DEFAULTS.instructions, metadata={"help": "Replaces the environment's own instructions in the system message (a short prompt for small models)."}
    )
    show_legal_actions: bool = field(default=PROMPT_DEFAULTS.show_legal_actions, metadata={"help": "List the legal actions in every user message."})
    show_turns: bool = field(
        default=PROMPT_DEFAULTS.show_turns,
        metadata={
            "help": "Start every user message with the turn count ('Turn 2 of 8; 7 actions left.'). A tiny model trained from "
            "scratch can fit the expert's moves from the turn number alone and never learn to read its observation."
        },
    )
    max_prompt_tokens: int | None = field(
        default=PROMPT_DEFAULTS.max_prompt_tokens, metadata={"help": "Context budget in tokens: an episode whose next prompt is longer ends, truncated."}
    )
    num_train_seeds: int = field(
        default=100_000, metadata={"help": "Training groups reset with seeds 0 .. num_train_seeds - 1 (the trainer's dataset)."}
    )
    groups_per_step: int | None = field(
        default=None,
        metadata={"help": "Env groups per generation batch; sets generation_batch_size = groups_per_step * group_size."},
    )
    group_size: int | None = field(
        default=None, metadata={"help": "Members per env group, all reset with one seed; an alias of num_generations."}
    )
    sample_layout: str = field(
        default="trajectory",
        metadata={
            "help": "`trajectory`: one sample per episode, turns concatenated, environment tokens masked out of the loss. "
            "`step`: one sample per turn, its prompt showing the last `history_turns` turns (verl-agent's layout; "
            "bounded context for long episodes). A micro-batch then holds the turns of per_device_train_batch_size episodes."
        },
    )
    history_turns: int = field(default=PROMPT_DEFAULTS.history_turns, metadata={"help": "In the step layout, how many earlier turns each prompt shows."})
    generator: str = field(
        default="hf",
        metadata={
            "help": "`hf` (transformers generate on the training model), `vllm` (in-process vLLM) or `vllm-server` "
            "(a `vllm serve` server at vllm_server_url, started with VLLM_SERVER_DEV_MODE=1); vLLM weights are synced "
            "after every optimizer step."
        },
    )
    vllm_server_url: str | None = field(
        default=None, metadata={"help": "The `vllm serve` server of generator='vllm-server', e.g. http://127.0.0.1:8000."}
    )
    generator_kwargs: dict[str, Any] | None = field(
        default=None, metadata={"help": "Keyword arguments for the generator (e.g. vLLM's gpu_memory_utilization)."}
    )
    max_turn_tokens: int = field(default=64, metadata={"help": "The longest reply, in tokens, per turn."})
    env_executor: str = field(
        default="inprocess",
        metadata={"help": "Where training envs run: `inprocess` (cannot preempt a hung env), `process` or `ray` (workers with a step deadline)."},
    )
    rollout_mode: str = field(
        default="lockstep",
        metadata={
            "help": "`lockstep`: every turn, all running episodes generate as one batch, then step as one batch. `continuous`: "
            "each env's next prompt is generated as soon as it has stepped, and each env steps as soon as its reply is done "
            "(vLLM: its own continuous batching). `async`: continuous, in a thread that plays the next generation batches "
            "while the current one trains, at most max_staleness weight versions behind (see envhub_trl.async_rollout)."
        },
    )
    max_staleness: int = field(
        default=1, metadata={"help": "rollout_mode=async: how many weight versions a generation batch may lag the weights it trains (TRL's name)."}
    )
    async_generation_ratio: int | None = field(default=None, metadata={"help": "Alias of max_staleness (ROLL's name)."})
    importance_sampling_cap: float = field(
        default=2.0,
        metadata={"help": "rollout_mode=async: the truncation of the per-token importance weights pi_current / pi_sampled that correct for the lag."},
    )
    env_workers: int = field(default=2, metadata={"help": "Worker processes or actors of env_executor process/ray."})
    env_step_timeout: float | None = field(
        default=300.0, metadata={"help": "Seconds an env's reset or step may take in a process/ray worker before its episode ends with a time-out."}
    )
    advantage_estimator: str = field(
        default="gigpo",
        metadata={
            "help": "A registered estimator: `grpo` (episode level), `gigpo` (episode + step level), `rloo`, `step_reinforce`, "
            "`reinforce++` (token-level KL-shaped returns, whitened over the batch), `ppo` (per-turn GAE from a value head)."
        },
    )
    episode_reward_weight: float = field(default=1.0, metadata={"help": "The weight of GiGPO's episode-level advantage (ROLL's name)."})
    step_reward_weight: float = field(default=1.0, metadata={"help": "ω: the weight of GiGPO's step-level advantage (ROLL's name)."})
    step_reward_gamma: float = field(default=0.95, metadata={"help": "γ: the discount of per-turn returns (GiGPO, step_reinforce; ROLL's name)."})
    action_entropy_coef: float = field(
        default=0.0,
        metadata={
            "help": "An entropy bonus on each turn's choice between its legal actions alone: the loss less this times "
            "the entropy of the policy's distribution over the legal actions' first tokens, renormalised, at the token "
            "where the reply's action begins (not the whole vocabulary, not the reply format's tokens), weighted as the "
            "policy loss weighs that token (summed over the micro-batch's choices, divided by its model tokens). Keeps the "
            "moves' distribution from saturating on a marginal before the policy learns to read its observation "
            "(docs/results-rl-alone.md). Envs that do not list their legal actions get no bonus."
        },
    )
    step_anchor: str = field(
        default="state",
        metadata={
            "help": "GiGPO's step-level groups: 'state' (the turns of one env group made in the same state_key, the paper's) or "
            "'context' (the turns of the whole batch made from the same policy input: a memoryless policy's turns from one "
            "observation anchor together across env groups)."
        },
    )
    ratio_type: str = field(
        default="token",
        metadata={
            "help": "`token`: TRL's per-token importance ratio (or `importance_sampling_level`'s). `segment` (ROLL's): one "
            "ratio per turn, the geometric mean of its token ratios, clipped per turn (GSPO's sequence ratio, turn by turn)."
        },
    )
    kl_coef: float = field(
        default=0.01,
        metadata={"help": "REINFORCE++: the weight of the per-token KL penalty to the reference model folded into the reward (OpenRLHF's init_kl_coef)."},
    )
    gamma: float = field(default=1.0, metadata={"help": "PPO: the discount per turn in GAE (γ)."})
    lam: float = field(default=0.95, metadata={"help": "PPO: GAE's λ."})
    vf_coef: float = field(default=0.1, metadata={"help": "PPO: the weight of the value loss beside the policy loss (TRL's PPO name)."})
    cliprange_value: float = field(default=0.2, metadata={"help": "PPO: how far a value may move from its old value before the value loss clips it."})
    step_advantage_weight: float | None = field(default=None, metadata={"help": "Alias of step_reward_weight."})
    step_gamma: float | None = field(default=None, metadata={"help": "Alias of step_reward_gamma."})
    advantage_norm: str = field(
        default="mean_std",
        metadata={"help": "`mean` (subtract the group mean), `mean_std` (also divide by the group std) or `relative` (divide by the group mean, at least 0.1)."},
    )
    advantage_norm_scope: str | None = field(
        default=None,
        metadata={
            "help": "Where advantages are normalised: `group` (each env group), `env` (all groups of one env of a mix, as ROLL's "
            "per-tag and AgentRL's per-task normalisation), `batch`; None: each estimator's own (group for grpo, gigpo and rloo; "
            "batch for step_reinforce, reinforce++ and ppo)."
        },
    )
    filter_tied_groups: bool = field(
        default=False, metadata={"help": "Drop (mask out of the loss) groups whose members' returns all tie."}
    )
    keep_group_fraction: float = field(
        default=1.0, metadata={"help": "Keep this top fraction of groups by return std (RAGEN's StarPO-S); 1.0 keeps all."}
    )
    max_env_error_rate: float = field(
        default=0.5,
        metadata={
            "help": "An env that raises (at reset or in a step) ends its own episode, which is left out of the batch; the run "
            "stops when more than this share of a batch's episodes failed, naming the env's exception."
        },
    )
    nonfinite_rewards: Literal["refuse", "drop"] = field(
        default="refuse",
        metadata={
            "help": "A NaN or infinite reward: `refuse` stops the run naming the env and the episode; `drop` leaves such "
            "episodes out of the batch and counts them (env/nonfinite_reward_episodes)."
        },
    )
    eval_episodes: int = field(default=128, metadata={"help": "Held-out episodes of `evaluate_env` (one seed each, greedy)."})
    eval_seed_offset: int = field(
        default=1_000_000_000, metadata={"help": "Held-out seeds are eval_seed_offset .. + eval_episodes - 1; keep them above num_train_seeds."}
    )
    eval_pass_k: int | None = field(
        default=None,
        metadata={
            "help": "Also measure pass@k on the held-out seeds at each stage: k episodes per seed, sampled as in training; the "
            "share of seeds one of them solves (None: not measured)."
        },
    )
    eval_sampled: bool = field(
        default=False,
        metadata={
            "help": "Also evaluate the policy sampled as in training (at temperature), beside the greedy one: a second "
            "held-out pass of eval_episodes at every evaluation."
        },
    )
    keep_best_on_validation: bool = field(
        default=False,
        metadata={
            "help": "Measure greedy success on validation seeds at the start of RL, every validation_steps steps and at the end, and "
            "end the run with the policy that scored best (as transformers' load_best_model_at_end with an eval set): RL then "
            "cannot end below its start on those seeds (envhub_trl.selection)."
        },
    )
    validation_steps: int = field(default=10, metadata={"help": "Optimizer steps between validations (keep_best_on_validation)."})
    validation_episodes: int = field(default=256, metadata={"help": "Validation episodes (one seed each, greedy) of keep_best_on_validation."})
    validation_seed_offset: int = field(
        default=500_000_000,
        metadata={"help": "Validation seeds are validation_seed_offset .. + validation_episodes - 1: apart from the training and held-out seeds."},
    )
    eval_max_invalid_streak: int | None = field(
        default=3,
        metadata={
            "help": "Held-out evaluation ends a model's episode after this many invalid replies in a row (a failure, counted in "
            "invalid_end_rate); an untrained model would otherwise play every turn to the limit at max_turn_tokens a reply. "
            "None plays every episode to its turn limit. Reference policies always play to the limit."
        },
    )

    def prompt_settings(self) -> PromptSettings:
        """What the model sees in this run, as saved with every checkpoint (``envhub.json``)."""
        return PromptSettings(
            instructions=self.instructions,
            system_prompt=self.system_prompt,
            action_format=self.action_format,
            show_legal_actions=self.show_legal_actions,
            show_turns=self.show_turns,
            max_prompt_tokens=self.max_prompt_tokens,
            history_turns=self.history_turns,
            format_penalty=self.format_penalty,
            unfinished_replies=self.unfinished_replies,
        )

    def env_entries(self) -> list[EnvEntry]:
        """The run's environments, each with its groups per generation batch and its own settings
        (one entry without ``envs``)."""
        return list(self._entries)

    def env_settings(self, entry: EnvEntry | None = None) -> EnvSettings:
        """How training plays one env of the run (default: the first), as one value: its env
        kwargs, its turn limit (else the run's), the run's layout and reply budget, and the run's
        prompt settings with the env's own overrides. Held-out evaluation adds its invalid streak
        (``eval_max_invalid_streak``) to the model's episodes; training plays every turn."""
        entry = entry if entry is not None else self._entries[0]
        return EnvSettings(
            entry.env_id,
            env_kwargs=dict(entry.env_kwargs),
            max_turns=entry.max_turns if entry.max_turns is not None else self.max_turns,
            layout=self.sample_layout,
            prompt=self.prompt_settings().replace(**entry.prompt),
            max_reply_tokens=self.max_turn_tokens,
        )

    def curriculum_schedule(self) -> Curriculum | None:
        """The parsed ``curriculum`` (None without one)."""
        return None if self.curriculum is None else Curriculum.from_mapping(self.curriculum, [e.env_id for e in self._entries])

    def trained_on(self) -> TrainedOn:
        """Each env's settings and the held-out evaluation of this run, as a checkpoint records them."""
        return TrainedOn(
            {e.env_id: self.env_settings(e) for e in self._entries},
            held_out={
                "seed_offset": self.eval_seed_offset, "episodes": self.eval_episodes,
                "max_invalid_streak": self.eval_max_invalid_streak, "generator": self.generator,
            },
        )

    def estimator_settings(self) -> EstimatorSettings:
        """What the advantage estimators read (:mod:`envhub_trl.estimators`)."""
        return EstimatorSettings(
            episode_reward_weight=self.episode_reward_weight,
            step_reward_weight=self.step_reward_weight,
            step_reward_gamma=self.step_reward_gamma,
            step_anchor=self.step_anchor,
            norm=self.advantage_norm,
            norm_scope=self.advantage_norm_scope,
            kl_coef=self.kl_coef,
            gamma=self.gamma,
            lam=self.lam,
        )

    def check_envs(self) -> None:
        """Make (and close) each env of the run with its ``env_kwargs`` and turn limit, so that a
        setting the env refuses stops the run before a model loads, naming the setting; otherwise
        every episode would fail on its own and the first evaluation would report 0%.

        Raises:
            ValueError: naming the env, its ``env_kwargs`` and the env's own reason.
        """
        for entry in self._entries:
            settings = self.env_settings(entry)
            try:
                settings.make().close()
            except (TypeError, ValueError) as exc:
                given = ", ".join(f"{key}={value!r}" for key, value in settings.env_kwargs.items()) or "none"
                raise ValueError(f"{entry.env_id} refuses its env_kwargs ({given}): {exc}") from exc

    def _pick_device_defaults(self) -> None:
        """CPU or accelerator, and bf16 or fp32, from the machine when the config leaves them unset.

        Without this, TRL's default ``bf16=True`` stops a CPU-only machine with "Your setup doesn't
        support bf16/gpu"; bf16 autocast on a CPU would also be slower than fp32 for small models.
        """
        import torch

        accelerator = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
        accelerator = accelerator or torch.backends.mps.is_available()
        if not accelerator:
            self.use_cpu = True
        if self.bf16 is None and not self.fp16:
            self.bf16 = bool(not self.use_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported())

    def _parse_envs(self) -> None:
        """Check ``env_id``/``envs`` and set ``_entries`` (and ``groups_per_step`` for a mix)."""
        if self.envs is None:
            self.env_id = self.env_id or "frozenlake/FrozenLake-v0"
            groups = self.groups_per_step or 0
            self._entries = [EnvEntry(self.env_id, groups, dict(self.env_kwargs or {}), None, {})]
            return
        if self.env_kwargs:
            raise ValueError("env_kwargs is for a single env_id; with envs, give each env its env_kwargs")
        self._entries, self.groups_per_step = parse_envs(self.envs, self.groups_per_step)
        if self.env_id is not None and self.env_id not in self.envs:
            raise ValueError(f"set env_id or envs, not both (env_id {self.env_id!r} is not one of envs)")
        self.env_id = self._entries[0].env_id

    def _apply_prompt(self) -> None:
        """Copy the ``prompt`` mapping onto the flat prompt fields (its aliases), refusing a key
        that is not a prompt setting and a setting given both ways with two values."""
        names = [f.name for f in dataclasses.fields(PromptSettings)]
        unknown = sorted(set(self.prompt) - set(names))
        if unknown:
            raise ValueError(f"prompt: unknown prompt settings {unknown}; known: {names}")
        for name, value in self.prompt.items():
            flat = getattr(self, name)
            if flat != getattr(PROMPT_DEFAULTS, name) and flat != value:
                raise ValueError(f"{name} is set twice, {flat!r} as a field and {value!r} under prompt; set one of them")
            setattr(self, name, value)

    def __post_init__(self) -> None:
        self._parse_envs()
        if self.prompt is not None:
            self._apply_prompt()
        if self.group_size is not None:
            self.num_generations = self.group_size
        self.group_size = self.num_generations
        if self.advantage_estimator not in ESTIMATORS:
            raise ValueError(f"advantage_estimator must be one of {sorted(ESTIMATORS)}, got {self.advantage_estimator!r}")
        for alias, name in (
            ("step_advantage_weight", "step_reward_weight"), ("step_gamma", "step_reward_gamma"), ("async_generation_ratio", "max_staleness")
        ):
            value = getattr(self, alias)
            if value is not None:
                if getattr(self, name) != EnvGRPOConfig.__dataclass_fields__[name].default and getattr(self, name) != value:
                    raise ValueError(f"{alias} is an alias of {name}; set one of them, not both ({value} and {getattr(self, name)})")
                setattr(self, name, value)
            setattr(self, alias, getattr(self, name))
        check_bounds(self, FIELD_BOUNDS)  # before any value is used: one rule per field, in FIELD_BOUNDS
        self.prompt_settings()  # the prompt settings' other rules (PromptSettings checks them)
        if self.rollout_mode not in ROLLOUT_MODES:
            raise ValueError(f"rollout_mode must be one of {ROLLOUT_MODES}, got {self.rollout_mode!r}")
        if self.rollout_mode == "async" and (_served(self.generator) or self.curriculum is not None):
            raise ValueError("rollout_mode='async' plays with the hf or vllm generator and without a curriculum (its stage moves with training steps)")
        if self.ratio_type not in RATIO_TYPES:
            raise ValueError(f"ratio_type must be one of {RATIO_TYPES}, got {self.ratio_type!r}")
        if self.ratio_type == "segment" and (self.importance_sampling_level != "token" or self.use_liger_kernel):
            raise ValueError(
                "ratio_type='segment' makes its own per-turn ratio: leave importance_sampling_level at 'token' and use_liger_kernel off"
            )
        if self.advantage_norm not in NORMS:
            raise ValueError(f"advantage_norm must be one of {NORMS}, got {self.advantage_norm!r}")
        if self.step_anchor not in STEP_ANCHORS:
            raise ValueError(f"step_anchor must be one of {STEP_ANCHORS}, got {self.step_anchor!r}")
        if self.advantage_norm_scope is not None and self.advantage_norm_scope not in NORM_SCOPES:
            raise ValueError(f"advantage_norm_scope must be one of {NORM_SCOPES} (or unset), got {self.advantage_norm_scope!r}")
        check_inherited(self)  # a TRL field envhub would ignore is refused; scale_rewards maps onto advantage_norm
        self.curriculum_schedule()  # a bad curriculum fails here, naming its field
        if self.env_executor not in EXECUTORS:
            raise ValueError(f"env_executor must be one of {', '.join(EXECUTORS)}; got {self.env_executor!r}")
        if self.generator not in BACKENDS:
            raise ValueError(f"generator must be one of {tuple(sorted(BACKENDS))} (the registered backends), got {self.generator!r}")
        if self.sample_layout not in LAYOUTS:
            raise ValueError(f"sample_layout must be one of {LAYOUTS}, got {self.sample_layout!r}")
        if _served(self.generator) != (self.vllm_server_url is not None):
            raise ValueError(
                "generator='vllm-server' needs vllm_server_url (and vllm_server_url needs generator='vllm-server'); "
                f"got generator={self.generator!r}, vllm_server_url={self.vllm_server_url!r}"
            )
        if self.eval_seed_offset < self.num_train_seeds:
            raise ValueError(
                f"eval_seed_offset ({self.eval_seed_offset}) overlaps the training seeds 0..{self.num_train_seeds - 1}; "
                "raise eval_seed_offset or lower num_train_seeds"
            )
        if self.keep_best_on_validation:
            validation = range(self.validation_seed_offset, self.validation_seed_offset + self.validation_episodes)
            held_out = range(self.eval_seed_offset, self.eval_seed_offset + self.eval_episodes)
            if validation.start < self.num_train_seeds or (validation.start < held_out.stop and held_out.start < validation.stop):
                raise ValueError(
                    f"validation seeds {validation.start}..{validation.stop - 1} overlap the training seeds 0..{self.num_train_seeds - 1} "
                    f"or the held-out seeds {held_out.start}..{held_out.stop - 1}; move validation_seed_offset"
                )
        if self.use_vllm:
            raise ValueError("use_vllm is TRL's own single-turn generator; set generator='vllm' for multi-turn rollouts instead")
        if self.groups_per_step is not None:
            if self.generation_batch_size is not None or self.steps_per_generation is not None:
                raise ValueError("set groups_per_step or generation_batch_size/steps_per_generation, not both")
            batch = self.groups_per_step * self.num_generations
            if batch % self.per_device_train_batch_size:
                raise ValueError(
                    f"groups_per_step x group_size = {batch} episodes is not divisible by per_device_train_batch_size="
                    f"{self.per_device_train_batch_size}; pick a per_device_train_batch_size that divides {batch}"
                )
            self.generation_batch_size = batch
        self._pick_device_defaults()
        super().__post_init__()
        if self.max_completion_length is not None and self.max_completion_length < self.max_turn_tokens:
            raise ValueError(
                f"max_completion_length ({self.max_completion_length}) is below max_turn_tokens ({self.max_turn_tokens}); "
                "raise max_completion_length (it bounds a whole episode's completion tokens)"
            )
