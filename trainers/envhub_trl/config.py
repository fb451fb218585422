"""``EnvGRPOConfig``: TRL's ``GRPOConfig`` plus what a multi-turn environment run needs.

Fields are grouped as follows.

Environment:
    ``env_id``, ``env_kwargs``, ``max_turns``, ``num_train_seeds``; ``envs`` (a mix of
    environments, :mod:`envhub_trl.mix`) instead of ``env_id``; ``curriculum``
    (:mod:`envhub_trl.curriculum`).
Prompt settings (:class:`envhub.prompts.PromptSettings`, whose defaults and rules they take):
    ``prompt``, a mapping of them, or each as a flat field of its own name (an alias):
    ``instructions``, ``system_prompt``, ``action_format``, ``show_legal_actions``, ``show_turns``,
    ``max_prompt_tokens``, ``history_turns``, ``format_penalty``, ``unfinished_replies``, ``reply_prefix``,
    ``stop_strings``.
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
    ``advantage_norm_scope`` (``group``, ``env`` or ``batch``); ``positive_advantage_weight``
    (W-REINFORCE's λ on positive advantages).
Group filtering:
    ``filter_tied_groups`` (drop groups whose returns all tie), ``keep_group_fraction`` (keep the
    top fraction of groups by return std, as RAGEN's StarPO-S), ``keep_group_variance_share`` (keep
    the groups that hold the top share of the batch's return variance, RAGEN-2's top-p filter);
    ``dynamic_sampling_rounds`` (DAPO's dynamic sampling: tied groups replaced by groups played on
    new seeds, up to that many rounds of play a batch) and ``tied_by`` (what a tied group ties on:
    ``return`` or ``success``); ``retry_unsolved_rounds`` (further rounds of play for the groups no
    member solved, their wins put in the places of failed members); ``self_imitation_coef``,
    ``self_imitation_memory`` and ``self_imitation_rows`` (the policy's remembered wins imitated,
    :mod:`envhub_trl.self_imitation`); ``skip_zero_gradient_steps`` (no optimiser step where the gradient is
    exactly zero, as where a step kept no group).
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

from dataclasses import dataclass, field
from typing import Any, Literal

from trl import GRPOConfig

from envhub.bounds import check_bounds
from envhub.generation import SamplingParams
from envhub.prompts import PromptSettings
from envhub.settings import EnvSettings, TrainedOn
from envhub_trl.config_checks import (  # noqa: F401  (FIELD_BOUNDS is read from here too)
    FIELD_BOUNDS,
    PROMPT_DEFAULTS,
    check_completion_length,
    check_rules,
    check_whole_groups,
    pick_device_defaults,
    resolve_aliases,
    set_generation_batch,
)
from envhub_trl.curriculum import Curriculum
from envhub_trl.estimators import EstimatorSettings
from envhub_trl.mix import EnvEntry


@dataclass
class EnvGRPOConfig(GRPOConfig):
    """Configuration of :class:`~envhub_trl.trainer.EnvGRPOTrainer` (see the module docstring for the groups).

    Any ``GRPOConfig`` field works too; ``num_generations`` is the group size, and ``generation_batch_size``
    is set from ``groups_per_step * group_size`` unless given."""

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
    eval_env_id: str | None = field(
        default=None,
        metadata={
            "help": "Held-out evaluation (every stage's, the validation selection's and the reference policies') plays this "
            "registered id instead of the training env, with the same prompt settings and turn limit: ALFWorld's unseen games "
            "(alfworld/ALFWorldEvalOutOfDistribution-v0) after training on its train split, as verl-agent reports. None: the "
            "training env's held-out seeds. Not with `envs` (a mix evaluates each of its envs)."
        },
    )
    eval_env_kwargs: dict[str, Any] | None = field(
        default=None, metadata={"help": "With `eval_env_id`: its keyword arguments for `envhub.make` (None: the training env's `env_kwargs`)."}
    )
    prompt: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "The prompt settings as one mapping (envhub.prompts.PromptSettings: instructions, system_prompt, action_format, "
            "show_legal_actions, show_turns, max_prompt_tokens, history_turns, format_penalty, unfinished_replies, reply_prefix, "
            "stop_strings); each is "
            "also a flat field of its own name."
        },
    )
    max_turns: int | None = field(default=None, metadata={"help": "Turn limit of every episode; None keeps the env's registered limit."})
    format_penalty: float = field(default=PROMPT_DEFAULTS.format_penalty, metadata={"help": "Added to the reward of every invalid reply (usually negative, e.g. -0.1)."})
    unfinished_replies: Literal["parse", "invalid"] = field(
        default=PROMPT_DEFAULTS.unfinished_replies,
        metadata={"help": "A reply cut off at max_turn_tokens before it ended its turn: 'parse' reads it like any other, 'invalid' refuses it (with format_penalty)."},
    )
    max_invalid_streak: int | None = field(
        default=None,
        metadata={
            "help": "A training episode ends after this many invalid replies in a row (truncated, end reason 'invalid'); "
            "None plays every training episode to its turn limit. Where most sampled replies are invalid (a long action "
            "space, a weak start), the turns after a streak teach little and cost the most."
        },
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
    reply_prefix: str = field(
        default=PROMPT_DEFAULTS.reply_prefix,
        metadata={
            "help": "Text written at the start of every reply for the model (an assistant prefill, e.g. '<answer>'): the prompt "
            "ends with it, so it is neither sampled nor trained, and the reply is read as the prefix plus what the model wrote."
        },
    )
    stop_strings: list[str] | None = field(
        default=None,
        metadata={
            "help": "A reply ends as soon as it holds one of these (kept in it), e.g. ['</answer>']; with reply_prefix '<answer>' "
            "the model samples only the action and the closing tag."
        },
    )
    train_stop_strings: bool = field(
        default=False,
        metadata={
            "help": "Train the closing stop string's tokens with the policy loss. By default they stay out of it: the reply "
            "format writes them, as reply_prefix writes the opening, and an advantage on them taught RL alone to play one "
            "marginal distribution of moves whatever it saw (docs/results-rl-alone.md). Replies that never close are trained whole."
        },
    )
    train_invalid_stop_strings: bool = field(
        default=False,
        metadata={
            "help": "With the closing stop string out of the loss (train_stop_strings false): train it in the replies the env "
            "found invalid. There the closing tag is what the model wrote instead of a move (an empty <answer></answer>), and "
            "the reply's penalty must reach it: left out, nothing held the model from closing its answer before any move, and "
            "RL alone on Sokoban drove 50-100% of replies invalid within 40 steps (docs/results-rl-alone.md)."
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
    agent_processes: int = field(
        default=0,
        metadata={
            "help": "With an agent (`envhub train --agent`): run its sessions in this many worker processes instead of threads "
            "of the trainer's, so the agents' client work (the openai SDK's, HTTP's) is spread over the cores and does not wait "
            "for the trainer's interpreter lock; an agent past its deadline is then stopped. 0: threads (the agent need not be "
            "importable by another process)."
        },
    )
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
    action_entropy_floor: float | None = field(
        default=None,
        metadata={
            "help": "With `action_entropy_coef`: the bonus acts only where a choice point's entropy is below this many nats, "
            "as `coef * min(entropy - floor, 0)`: a floor under the moves' entropy rather than a steady push towards "
            "uniform. A policy still choosing freely is left alone; one that has turned deterministic (every group "
            "then ties, and no gradient is left) keeps sampling other moves (docs/results-rl-alone.md). None: the "
            "bonus acts everywhere."
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
    max_forward_tokens: int | None = field(
        default=None,
        metadata={
            "help": "At most this many tokens (rows x padded width) in one forward pass of the model: the scoring passes run "
            "in chunks of rows that fit, and the loss runs its chunks without gradients, then each again with them, "
            "back-propagating what the loss sent its outputs (GradCache; envhub_trl.chunked_loss). The same gradient and "
            "metrics as one pass over the micro-batch, for one more forward pass; bounds the memory of a step-layout "
            "micro-batch, whose rows grow with the episodes' turns. Like verl's ppo_max_token_len_per_gpu, without "
            "changing the loss's normalisation. None: one pass per micro-batch (TRL's behaviour)."
        },
    )
    share_prompt_forward: bool = field(
        default=False,
        metadata={
            "help": "Score the loss's rows with one forward pass per distinct prompt: its key/value cache shared by the rows "
            "that begin with it, the replies run on top (envhub_trl.shared_prompts). The same log-probs (the gradient's "
            "sums in another order); in the step layout with little history, where the same prompt comes back in many "
            "rows, the trainer's step costs a fraction (docs/results-rl-alone.md). PPO's critic and "
            "action_entropy_coef read their hidden states off the second pass. Not with gradient checkpointing, Liger's "
            "loss or several processes."
        },
    )
    log_sampler_gap: bool = field(
        default=False,
        metadata={
            "help": "Score each training batch once more, without gradients, and log how far the generator's sampling "
            "log-probs are from the policy's: TRL's sampling/sampling_logp_difference/{mean,max} and "
            "sampling/importance_sampling_ratio/{min,mean,max} over the model tokens (TRL logs them only for its own "
            "vLLM). Near 0 and 1 when the generator samples the policy being trained; a gap means weights not synced, "
            "another dtype or another sampler. One more forward pass a step."
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
    positive_advantage_weight: float = field(
        default=1.0,
        metadata={
            "help": "The weight of positive advantages, negative ones keeping 1 (W-REINFORCE's λ, Zhu et al. 2025, who use 0.1; "
            "0 trains on failures alone): below 1, a losing move's mass goes to the other moves in their proportions instead "
            "of onto the move that won once (it did not keep FrozenLake's moves uncertain: docs/results-rl-alone.md). 1.0 leaves every estimator as it is."
        },
    )
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
    keep_group_variance_share: float = field(
        default=1.0,
        metadata={
            "help": "Keep the groups of largest return variance that together hold this share of the batch's summed "
            "variance (RAGEN-2's top-p filter; tied groups go once it is below 1); 1.0 keeps all."
        },
    )
    dynamic_sampling_rounds: int = field(
        default=1,
        metadata={
            "help": "DAPO's dynamic sampling (verl's filter_groups): play up to this many rounds a training batch, each tied "
            "group replaced by the next untied group of a round played on new training seeds; groups still tied after the "
            "last round are dropped from the loss. 1: off."
        },
    )
    retry_unsolved_rounds: int = field(
        default=0,
        metadata={
            "help": "Exploration where the policy fails (Knapsack RL's budget for hard prompts, PODS's down-sampling): for each "
            "training group that no member solved, up to this many further rounds of play on its level, each round a whole "
            "batch's episodes shared out over the groups still unsolved; a round's wins take the places of the group's failed "
            "members (up to half the group) and the other further episodes are left out, so the loss costs what it did. Needs "
            "an env that reports success. 0: off."
        },
    )
    self_imitation_coef: float = field(
        default=0.0,
        metadata={
            "help": "Self-imitation (SIL, Oh et al. 2018): this times the negative log-likelihood of the replies (their model "
            "tokens' summed; invalid replies left out) of remembered winning episodes (of groups that not every member won: the policy's own wins on "
            "levels it does not always win), averaged over self_imitation_rows of them drawn each micro-step, added to the "
            "loss. 0: off."
        },
    )
    self_imitation_memory: int = field(
        default=4096, metadata={"help": "Self-imitation: the rows (turns in the step layout) of wins remembered, the latest kept."}
    )
    self_imitation_rows: int = field(default=256, metadata={"help": "Self-imitation: remembered rows drawn for each micro-step's term."})
    tied_by: str = field(
        default="return",
        metadata={
            "help": "What a tied group ties on, for filter_tied_groups and dynamic_sampling_rounds: `return` (the episode "
            "returns) or `success` (a group that differs by format penalties alone is tied; verl's filter_groups.metric: acc)."
        },
    )
    skip_zero_gradient_steps: bool = field(
        default=False,
        metadata={
            "help": "Take no optimiser step where the step's gradient is exactly zero (a step whose groups were all dropped, "
            "by filter_tied_groups or dynamic_sampling_rounds): Adam's moments would otherwise move the weights on no data. "
            "The schedule still advances; logs optimizer/skipped."
        },
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
            reply_prefix=self.reply_prefix,
            stop_strings=self.stop_strings or (),
        )

    def sampling(self, temperature: float, seed: int | None) -> SamplingParams:
        """The run's sampling (reply budget, top-p, top-k) at ``temperature``, seeded with ``seed``."""
        return SamplingParams(max_new_tokens=self.max_turn_tokens, temperature=temperature, top_p=self.top_p, top_k=self.top_k or 0, seed=seed)

    def env_entries(self) -> list[EnvEntry]:
        """The run's environments, each with its groups per generation batch and its own settings
        (one entry without ``envs``)."""
        return list(self._entries)

    def untrained_stops(self) -> tuple[str, ...]:
        """The stop strings the policy loss leaves out (every env's; none with ``train_stop_strings``)."""
        stops = () if self.train_stop_strings else (s for entry in self._entries for s in self.env_settings(entry).prompt.stop_strings)
        return tuple(dict.fromkeys(stops))

    def env_settings(self, entry: EnvEntry | None = None) -> EnvSettings:
        """How training plays one env of the run (default: the first), as one value: its env
        kwargs, its turn limit (else the run's), the run's layout and reply budget, and the run's
        prompt settings with the env's own overrides, and the training episodes' invalid streak
        (``max_invalid_streak``). Held-out evaluation puts its own (``eval_max_invalid_streak``) on
        the model's episodes."""
        entry = entry if entry is not None else self._entries[0]
        return EnvSettings(
            entry.env_id,
            env_kwargs=dict(entry.env_kwargs),
            max_turns=entry.max_turns if entry.max_turns is not None else self.max_turns,
            layout=self.sample_layout,
            prompt=self.prompt_settings().replace(**entry.prompt),
            max_turn_tokens=self.max_turn_tokens,
            max_invalid_streak=self.max_invalid_streak,
        )

    def held_out_settings(self, entry: EnvEntry | None = None) -> EnvSettings:
        """How held-out evaluation plays one env of the run: :meth:`env_settings`, on ``eval_env_id``
        (with ``eval_env_kwargs``, else the training env's kwargs) when the run names one; every
        episode to its turn limit (evaluation sets the model's invalid streak itself)."""
        settings = self.env_settings(entry).replace(max_invalid_streak=None)
        if self.eval_env_id is None:
            return settings
        kwargs = settings.env_kwargs if self.eval_env_kwargs is None else dict(self.eval_env_kwargs)
        return settings.replace(env_id=self.eval_env_id, env_kwargs=kwargs)

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
                **({} if self.eval_env_id is None else {"env_id": self.eval_env_id, "env_kwargs": self.held_out_settings().env_kwargs}),
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
            positive_weight=self.positive_advantage_weight,
        )

    def check_envs(self) -> None:
        """Make (and close) each env of the run with its ``env_kwargs`` and turn limit: a setting the env
        refuses stops the run before a model loads (else every episode fails and evaluation reads 0%).

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

    def __post_init__(self) -> None:
        # The rules live in envhub_trl.config_checks; they run in this order, so that the first
        # error a user meets is the same whatever else is wrong.
        self._entries = resolve_aliases(self)
        check_bounds(self, FIELD_BOUNDS)  # before any value is used: one rule per field, in FIELD_BOUNDS
        self.prompt_settings()  # the prompt settings' other rules (PromptSettings checks them)
        check_rules(self)
        set_generation_batch(self)
        pick_device_defaults(self)
        super().__post_init__()
        check_whole_groups(self)
        check_completion_length(self)
