"""``EnvGRPOTrainer``: TRL's GRPO trainer on multi-turn envhub environments, wired to envhub's stages.

The class is wiring: one generation batch (:meth:`EnvGRPOTrainer.generation_batch`) is played by
the manager and the generator, then goes through the plain stages of :mod:`envhub_trl.pipeline`
(gather, to rows, score, estimate, spread); :mod:`envhub_trl.trl_bridge` is where it meets TRL
(TRL's scoring of the rows, the model's log-probs, its metrics and loss). In order:

1. The dataset is a column of env seeds; TRL's sampler repeats each row ``num_generations`` times
   in a row, so each run of equal seeds is one env group.
2. Play: :class:`~envhub.manager.EnvGroupManager` resets each env group's ``group_size`` members
   with the group's seed and plays every episode with the generator; a mix (:mod:`envhub_trl.mix`)
   gives each group one env, a curriculum (:mod:`envhub_trl.curriculum`) the current stage's env
   arguments and turn limit; ``rollout_mode: async`` plays ahead in a producer thread.
3. Gather, to rows, score, estimate, spread: :mod:`envhub_trl.pipeline`.
4. Loss: TRL's clipped policy-gradient loss over the per-token advantages, with a per-token
   importance ratio or, with ``ratio_type="segment"``, one per turn; PPO adds its value loss.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from datasets import Dataset

from envhub.error import GeneratorOptionError
from envhub.generation import Generator, SamplingParams
from envhub.executors import make_executor
from envhub.manager import EnvGroupManager
from envhub.registration import spec
from envhub.rollout import RolloutStats, Trajectory
from envhub_trl import loss_inputs, metrics, pipeline, run_state
from envhub_trl.agent_rollouts import AgentRollouts
from envhub_trl.async_rollout import AsyncRollouts, model_token_mask, sampler_gap, staleness_metrics, start_producer, truncated_importance_weights
from envhub_trl.callbacks import AverageCriticGradients, ZeroCriticGradients
from envhub_trl.config import EnvGRPOConfig
from envhub_trl.curriculum import CurriculumState
from envhub_trl.critic import ValueHead, captured_hidden_states, clipped_value_loss, final_norm, read_values
from envhub_trl.estimators import NEEDS
from envhub_trl.evaluation import evaluate_generator, held_out_seeds
from envhub_trl.generators import backend, capabilities_of
from envhub_trl.lora import fold_adapter, merged_weights
from envhub_trl.mix import EnvEntry, group_env_ids
from envhub_trl.self_imitation import WinMemory, imitation_loss, imitation_rows
from envhub_trl.trl_bridge import TRLBridge, episode_return, loadable_reference


def seed_dataset(num_seeds: int) -> Dataset:
    """The trainer's dataset: one row per training seed (``env_seed``), with a ``prompt`` TRL logs."""
    seeds = list(range(num_seeds))
    return Dataset.from_dict({"prompt": [f"env seed {s}" for s in seeds], "env_seed": seeds})


class EnvGRPOTrainer(TRLBridge):
    """GRPO/GiGPO on an envhub environment; needs no dataset (prompts are env seeds).

    Args:
        model: a model id or path, or a ``PreTrainedModel``.
        args: the configuration (env, groups, estimator...); see :class:`EnvGRPOConfig`.
        processing_class: the tokenizer (with a chat template); loaded from ``model`` when None.
        train_dataset: rows with an ``env_seed`` column (and a ``prompt`` string); by default
            seeds ``0 .. args.num_train_seeds - 1``.
        callbacks: extra ``TrainerCallback`` objects.
        optimizers: ``(optimizer, scheduler)``, as for ``transformers.Trainer``.
        peft_config: a PEFT config to train an adapter.
        generator: a generator to sample with instead of ``args.generator``. Its capabilities
            (:func:`~envhub_trl.generators.capabilities_of`) say how it gets the trained weights:
            one with its own copy (a ``load_weights(model)`` method) gets them after every
            optimizer step; otherwise it samples with whatever weights it holds.
        agent: train a user's agent, ``agent(base_url, api_key, task) -> reward``, through an
            in-process proxy instead of the env, on ``tasks`` (row ``i`` is ``tasks[i]``; :mod:`envhub_trl.agent_rollouts`).
    """

    def __init__(
        self,
        model: Any,
        args: EnvGRPOConfig | None = None,
        processing_class: Any | None = None,
        train_dataset: Dataset | None = None,
        callbacks: list[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        peft_config: Any | None = None,
        generator: Generator | None = None,
        agent: Any | None = None, tasks: list[Any] | None = None,
    ):
        if args is None:
            args = EnvGRPOConfig(output_dir="envhub-grpo")
        if not isinstance(args, EnvGRPOConfig):
            raise TypeError(f"EnvGRPOTrainer needs an EnvGRPOConfig, got {type(args).__name__}")
        for env_id in [entry.env_id for entry in args.env_entries()] + ([args.eval_env_id] if args.eval_env_id else []):
            spec(env_id)  # an unknown id fails here, with suggestions
        if train_dataset is None:
            train_dataset = seed_dataset(args.num_train_seeds if agent is None else len(tasks or ()))
        elif "env_seed" not in train_dataset.column_names:
            raise ValueError("train_dataset needs an env_seed column (one reset seed per row)")
        loadable_reference(model, args, peft_config)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="You are using 'rollout_func'")
            super().__init__(
                model=model,
                reward_funcs=[episode_return],
                args=args,
                train_dataset=train_dataset,
                processing_class=processing_class,
                callbacks=callbacks,
                optimizers=optimizers,
                peft_config=peft_config,
                rollout_func=self.rollout_columns,
            )
        if args.share_prompt_forward and self.accelerator.num_processes > 1:
            raise ValueError("share_prompt_forward runs the model twice before each backward pass, which DDP does not allow: use it on one process")
        if args.max_forward_tokens is not None and self.accelerator.num_processes > 1:
            raise ValueError("max_forward_tokens runs a backward pass per chunk, each of which DDP would reduce: use it on one process")
        #: What a checkpoint keeps of ``envhub train``'s run (:func:`envhub_trl.run_state.save` writes it;
        #: :class:`envhub_trl.run.TrainingRun` sets it); None for a trainer used from Python.
        self.run_record: dict[str, Any] | None = None
        self._managers: dict[str, tuple[EnvGroupManager, Any]] = {}  # owner ("main", "async") -> (manager, its key)
        self._async: AsyncRollouts | None = None  # rollout_mode="async": the producer thread
        self.async_batches = 0  # generation batches taken from it
        self.generator_lock = threading.Lock()  # the producer and evaluation never sample on one engine at once
        schedule = args.curriculum_schedule()
        self.curriculum: CurriculumState | None = CurriculumState(schedule) if schedule is not None else None
        self._generator: Generator | None = generator
        self._synced_step = -1
        self._batch_seeds: list[int] = []
        self.value_head: ValueHead | None = None  # PPO's critic (envhub_trl.critic), beside the model
        #: Self-imitation's remembered wins (envhub_trl.self_imitation); None when it is off.
        self.win_memory: WinMemory | None = WinMemory(args.self_imitation_memory) if args.self_imitation_coef else None
        self.agents = AgentRollouts(agent, tasks or [], processes=args.agent_processes).attach(self) if agent is not None else None
        if "values" in NEEDS[args.advantage_estimator]:
            unwrapped = self.accelerator.unwrap_model(self.model)
            final_norm(unwrapped)  # an architecture without a known final norm fails here, not mid-run
            self.value_head = ValueHead(unwrapped.config.get_text_config().hidden_size).to(self.accelerator.device)
            self.add_callback(ZeroCriticGradients(self.value_head))
            if self.accelerator.num_processes > 1:
                self.add_callback(AverageCriticGradients(self.value_head))

    # ------------------------------------------------------------------ generation

    @property
    def generator(self) -> Generator:
        """The generator of ``args.generator``, holding the current weights of the trained model.

        A generator with its own copy of the weights (weight sync ``local``: in-process vLLM) is
        refreshed once per optimizer step; with a server (``server``), only the main process sends
        the weights, and every process waits for it.
        """
        model = self.accelerator.unwrap_model(self.model)
        if self._generator is None:
            self._generator = self._build_generator(model)
        sync = capabilities_of(self._generator).weight_sync
        if sync in ("local", "server") and self._synced_step != self.state.global_step:
            if sync == "server":
                if self.accelerator.is_main_process:
                    self._generator.load_weights(model)
                self.accelerator.wait_for_everyone()
            else:
                self._generator.load_weights(model)
            self._synced_step = self.state.global_step
        return self._generator

    def weights_changed(self) -> None:
        """Say that the model's weights changed outside ``train()`` (a supervised warm start, a
        loaded checkpoint): a generator with its own copy of the weights gets them before it next
        samples. Within ``train()`` every optimizer step does this by itself."""
        self._synced_step = -1

    def warm_started(self) -> None:
        """Take a supervised warm start done on the model outside ``train()``: a LoRA adapter is
        folded into the base (RL's adapter starts at 0, its reference is the warm start), a
        generator with its own copy of the weights gets them, and a KL term (``beta`` > 0) holds
        RL near them rather than near the weights the run started from."""
        fold_adapter(self.accelerator.unwrap_model(self.model))
        self.weights_changed()
        self.reference_from_policy()

    def _build_generator(self, model: Any) -> Generator:
        """``args.generator``'s registered backend, built for this model and run."""
        chosen = backend(self.args.generator)
        options = dict(self.args.generator_kwargs or {})
        try:
            generator = chosen.build(model, self.processing_class, self.args, **options)
        except TypeError as exc:
            unknown = [name for name in options if f"unexpected keyword argument '{name}'" in str(exc)]
            if not unknown:
                raise
            raise GeneratorOptionError(
                f"generator_kwargs: the {self.args.generator} generator takes no {unknown[0]!r} (vLLM's share of memory is "
                "vllm_gpu_memory_utilization, which the other generators ignore)"
            ) from None
        if chosen.in_sync_when_built:
            self._synced_step = self.state.global_step  # it starts from the current weights
        return generator

    def manager_for(self, seeds: list[int], group_size: int, owner: str = "main") -> tuple[EnvGroupManager, list[int]]:
        """The manager for this process's rows of a generation batch (their env seeds, in order)
        and the seeds to reset its groups with.

        The global batch's groups take the run's envs in order (:func:`~envhub_trl.mix.group_env_ids`);
        this process holds rows ``process_index * len(seeds)`` on. When those rows are whole env
        groups (always on one process), the manager's groups are the env groups, ``group_size``
        members reset with one seed; a group that straddles two processes falls back to groups
        of one per row (the members still share their seed, hence their initial state). The
        curriculum's current stage and horizon shape what the manager plays. ``owner`` keeps one
        manager per thread that plays (the async producer has its own).
        """
        entries = self.args.env_entries()
        if self.curriculum is not None:
            entries = self.curriculum.entries(entries, self.state.global_step)
        env_of_group = group_env_ids(entries) if len(entries) > 1 else [entries[0].env_id]
        offset = self.accelerator.process_index * len(seeds)
        row_envs = [env_of_group[((offset + i) // group_size) % len(env_of_group)] for i in range(len(seeds))]
        whole = offset % group_size == 0 and len(seeds) % group_size == 0 and all(
            len(set(seeds[i : i + group_size])) == 1 for i in range(0, len(seeds), group_size)
        )
        size = group_size if whole else 1
        partition: dict[str, int] = {}
        for i in range(0, len(seeds), size):
            if row_envs[i] in partition and list(partition)[-1] != row_envs[i]:
                raise RuntimeError(f"the rows of env {row_envs[i]} are not contiguous in this process's batch")
            partition[row_envs[i]] = partition.get(row_envs[i], 0) + 1
        by_id = {entry.env_id: self.args.env_settings(entry) for entry in entries}
        groups = {by_id[env_id]: count for env_id, count in partition.items()}
        key = (tuple((repr(s), count) for s, count in groups.items()), size)
        manager, known = self._managers.get(owner, (None, None))
        if manager is None or known != key:
            if manager is not None:
                manager.close()
            executor = make_executor(self.args.env_executor, self.args.env_workers, self.args.env_step_timeout)
            manager = EnvGroupManager.from_settings(groups, None, size, seed=self.args.seed, tokenizer=self.processing_class, executor=executor)
            self._managers[owner] = (manager, key)
        return manager, seeds[::size]

    def training_sampling(self, batch: int | None = None, round: int = 0) -> SamplingParams:
        """Training's sampling, seeded by the step (or, for the async producer, by its batch index);
        ``round`` > 0: a further round of the step (dynamic sampling)."""
        index = self.accelerator.process_index
        position = [self.state.global_step, index, self.micro_step] if batch is None else [batch, index, 1 << 20]
        position += [round] if round else []
        seed = np.random.SeedSequence([self.args.seed, *position])
        return self.args.sampling(self.args.temperature, int(seed.generate_state(1)[0] & 0x3FFFFFFF))

    def _play_round(self, seeds: list[int], group_size: int, mode: str, round: int = 0) -> list[Trajectory]:
        """One round of episodes on ``seeds`` (the agents', or a manager's played by the generator),
        its rollout figures logged; ``round`` > 0 is a further round of the same step, sampled apart."""
        if self.agents is not None:
            trajectories, stats = self.agents.play(self, seeds, group_size, round=round)
        else:
            manager, reset_seeds = self.manager_for(seeds, group_size)
            play_mode = "lockstep" if self.args.rollout_mode == "lockstep" else "continuous"
            with self.generator_lock:
                trajectories, stats = pipeline.play(manager, self.generator, self.training_sampling(round=round), seeds=reset_seeds, mode=play_mode)
        self.log_metrics(mode, stats.metrics())
        return trajectories

    def _refill_tied(self, trajectories: list[Trajectory], inputs: list[dict[str, Any]], group_size: int) -> tuple[list[Trajectory], list[dict[str, Any]]]:
        """DAPO's dynamic sampling (:func:`~envhub_trl.pipeline.refill_tied`): this process's tied
        groups replaced by untied ones from further rounds on training seeds drawn from the step,
        so a resumed run draws the same; ``inputs`` relabelled with the seeds played. Logs
        ``dynamic/rounds``, ``dynamic/tied_first`` (the share of groups tied in the first round),
        ``dynamic/tied_left`` (dropped from the loss) and ``dynamic/success_first`` (the first
        round's success rate: ``env/`` figures are the filled batch's)."""
        args = self.args
        groups = len(trajectories) // group_size
        rng = np.random.default_rng(np.random.SeedSequence([args.seed, self.state.global_step, self.accelerator.process_index, 1 << 21]))

        def rounds() -> Iterator[list[Trajectory]]:
            for n in itertools.count(1):
                seeds = np.repeat(rng.integers(0, args.num_train_seeds, groups), group_size).tolist()
                yield self._play_round(seeds, group_size, "train", round=n)

        filled, refill = pipeline.refill_tied(trajectories, rounds(), group_size=group_size, rounds=args.dynamic_sampling_rounds, tied_by=args.tied_by)
        self.log_metrics("train", {"dynamic/rounds": float(refill.rounds), "dynamic/tied_first": refill.tied_first / max(groups, 1),
                                   "dynamic/tied_left": refill.tied_left / max(groups, 1), "dynamic/success_first": refill.success_first})
        inputs = [row if int(row["env_seed"]) == t.seed else {**row, "env_seed": t.seed, "prompt": f"env seed {t.seed}"} for row, t in zip(inputs, filled)]
        return filled, inputs

    def _retry_unsolved(self, trajectories: list[Trajectory], group_size: int) -> list[Trajectory]:
        """Further rounds on the levels no member of their group solved
        (:func:`~envhub_trl.pipeline.retry_unsolved`), each slot reset with the seed of the group
        it plays, each round sampled apart. Logs ``retry/rounds``, ``retry/unsolved_first`` (the
        share of groups no member of the first round solved), ``retry/solved_later`` (the share of
        those a further round solved), ``retry/episodes`` (further episodes played),
        ``retry/wins_kept`` and ``retry/success_first`` (the first round's success rate: ``env/``
        figures are the batch's, its kept wins included)."""
        seeds = [t.seed for t in trajectories[::group_size]]
        played = itertools.count(1)

        def play_round(slots: list[int]) -> list[Trajectory]:
            return self._play_round(np.repeat([seeds[g] for g in slots], group_size).tolist(), group_size, "train", round=next(played))

        filled, retry = pipeline.retry_unsolved(trajectories, play_round, group_size=group_size, rounds=self.args.retry_unsolved_rounds)
        groups = max(len(seeds), 1)
        self.log_metrics("train", {
            "retry/rounds": float(retry.rounds), "retry/unsolved_first": retry.unsolved_first / groups,
            "retry/solved_later": retry.solved_later / max(retry.unsolved_first, 1), "retry/episodes": float(retry.episodes),
            "retry/wins_kept": float(retry.wins_kept), "retry/success_first": float(np.mean([t.success for t in trajectories])),
        })
        return filled

    # ------------------------------------------------------------------ the stages

    def generation_batch(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """One generation batch through the stages (:mod:`envhub_trl.pipeline`), as TRL's loss reads it."""
        args, device = self.args, self.accelerator.device
        self._batch_seeds = [int(row["env_seed"]) for row in inputs]
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        if self.curriculum is not None:
            self.curriculum.restore_from_log(self.state.log_history)
        staleness = None
        if args.rollout_mode == "async" and mode == "train" and self.agents is None:
            trajectories, stats, staleness = self._async_batch(len(inputs), group_size)
            self.log_metrics(mode, stats.metrics())
        else:
            trajectories = self._play_round(self._batch_seeds, group_size, mode)
        refilling = mode == "train" and args.dynamic_sampling_rounds > 1
        if refilling:
            trajectories, inputs = self._refill_tied(trajectories, inputs, group_size)
        first_round = trajectories
        if mode == "train" and args.retry_unsolved_rounds:
            trajectories = self._retry_unsolved(trajectories, group_size)
        batch = pipeline.gather(
            trajectories, group_size=group_size, process_index=self.accelerator.process_index, collect=gather_object,
            drop_tied=args.filter_tied_groups or refilling, tied_by=args.tied_by, keep_fraction=args.keep_group_fraction,
            variance_share=args.keep_group_variance_share,
            max_error_rate=args.max_env_error_rate, nonfinite_rewards=args.nonfinite_rewards,
        )
        left_out = pipeline.describe_aside(batch.episodes, batch.aside)
        if left_out is not None and self.accelerator.is_main_process:
            print(f"step {self.state.global_step + 1}: {left_out}", file=sys.stderr, flush=True)
        multiple = math.lcm(group_size, args.steps_per_generation if mode == "train" else 1)
        batch = pipeline.to_rows(
            batch, inputs, layout=args.sample_layout if self.agents is None else "step",  # an agent's sessions: either layout
            decode=self.processing_class.decode, row_multiple=multiple, untrained_stops=args.untrained_stops(),
            train_invalid_stops=args.train_invalid_stop_strings,
            most_rows=lambda count: int(self.accelerator.gather(torch.tensor([count], device=device)).max()),  # over processes
        )
        if self.win_memory is not None and mode == "train":
            added = imitation_rows(batch)
            self.win_memory.add(added)
            self.log_metrics(mode, {"self_imitation/rows_added": float(len(added)), "self_imitation/memory": float(len(self.win_memory))})
        output = self.trl_score(batch)  # TRL's old and reference log-probs; then what the estimator needs besides
        gap = args.log_sampler_gap and mode == "train" and output.get("sampling_per_token_logps") is not None
        policy = self.policy_logps(output) if gap or staleness is not None else None  # one scoring for both
        if gap:
            self.log_metrics(mode, sampler_gap(policy, output["sampling_per_token_logps"], model_token_mask(output)))
        width = output["completion_ids"].shape[1]
        needs = NEEDS[args.advantage_estimator]
        if needs:
            starts = batch.turn_starts if self.value_head is not None else None
            scores = self.model_scores(output, needs, self.value_head, starts, logps=policy)  # policy: scored once above, if it was
            batch = pipeline.score(batch, **scores, collect=gather_object)
        batch = pipeline.spread(pipeline.estimate(batch, args.advantage_estimator, args.estimator_settings()), width)
        output["advantages"] = torch.tensor(batch.advantages, dtype=torch.float32, device=device)
        self.log_metrics(mode, metrics.estimate_metrics(batch))
        if staleness is not None:
            self._correct_for_lag(output, policy, staleness, mode)
        if self.value_head is not None:
            output.update({name: value.to(device) for name, value in loss_inputs.critic_targets(batch, output["prompt_ids"].shape[1]).items()})
        if args.ratio_type == "segment":
            output["turn_ids"] = torch.tensor(loss_inputs.turn_id_matrix(batch, width), device=device)
        if args.action_entropy_coef:
            points = loss_inputs.choice_points(batch, output["prompt_ids"].shape[1], self.first_token, self.processing_class.decode)
            output.update({name: value.to(device) for name, value in points.items()})
        self.log_row_advantages(metrics.row_advantage_means(batch))
        self.log_metrics(mode, metrics.env_metrics(batch, per_env=len(args.env_entries()) > 1))
        self.log_metrics(mode, metrics.signal_metrics(batch, args.step_reward_gamma))
        if self.curriculum is not None and mode == "train":
            # The policy's own episodes: the retries' kept wins would move the stage on early.
            played = batch.played if first_round is trajectories else [t for t in gather_object(list(first_round)) if t.error is None]
            stage_metrics, advanced = self.curriculum.batch_played(played, self.state.global_step)
            self.log_metrics(mode, stage_metrics)
            if advanced is not None and self.accelerator.is_main_process:
                print(advanced, file=sys.stderr, flush=True)
        return output

    # ------------------------------------------------------------------ async rollouts

    def stop_async(self) -> None:
        """Stop the async producer, if one runs (training ended: it would play one batch too many)."""
        if self._async is not None:
            self._async.close()
            self._async = None

    def _async_batch(self, rows: int, group_size: int) -> tuple[list[Trajectory], RolloutStats, int]:
        """The next generation batch from the producer thread (started on the first call): post
        the current weights as this batch's version, take the batch, return it with its staleness."""
        model = self.accelerator.unwrap_model(self.model)
        if self._async is None:
            self._async = start_producer(self, model, rows, group_size)
        batch = self.async_batches
        self.async_batches += 1
        # Under the base model's names, a LoRA model's adapters merged in: what a generator loads.
        self._async.post_weights(batch, {name: tensor.detach().clone() for name, tensor in merged_weights(model).items()})
        trajectories, stats, version = self._async.take(batch)
        return trajectories, stats, batch - version

    def policy_logps(self, output: dict[str, Any]) -> torch.Tensor:
        """The policy's per-token log-probs of a scored batch: TRL's old log-probs where it computed
        them, else a pass without gradients (the weights about to be trained)."""
        old = output.get("old_per_token_logps")
        if old is not None:
            return old
        with torch.no_grad():
            return self.token_logps(self.model, output, self.args.per_device_train_batch_size)

    def _correct_for_lag(self, output: dict[str, Any], policy: torch.Tensor, staleness: int, mode: str) -> None:
        """Truncated importance sampling for an async batch: each model token's advantage times
        ``min(pi_current / pi_sampled, importance_sampling_cap)`` (the weight is detached and
        non-negative, so this equals weighting TRL's clipped per-token loss, as its vLLM
        importance-sampling correction does); logs the weights and the staleness."""
        weights, stats = truncated_importance_weights(policy.float(), output["sampling_per_token_logps"].float(), model_token_mask(output).float(), self.args.importance_sampling_cap)
        output["advantages"] = output["advantages"] * weights.to(output["advantages"].dtype)
        self.log_metrics(mode, {f"rollout/importance_weight_{name}": value for name, value in stats.items()})
        self.log_metrics(mode, staleness_metrics([staleness] * len(output["completion_ids"]), self.args.max_staleness))

    # ------------------------------------------------------------------ loss

    def loss_reads_hidden_states(self) -> bool:
        """PPO's critic and the choices' entropy bonus read the final hidden states in the loss."""
        return self.value_head is not None or bool(self.args.action_entropy_coef)

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
        """TRL's loss; with ``ratio_type="segment"`` its importance ratio is one per turn
        (:meth:`~envhub_trl.trl_bridge.TRLBridge.loss_inputs`); PPO adds its clipped value loss."""
        choices = "choice_positions" in inputs
        imitating = self.win_memory is not None and self.model.training and len(self.win_memory) > 0
        with self.loss_inputs(inputs):
            if self.value_head is None and not choices:
                loss = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
                return loss + self.imitation_term(model) if imitating else loss
            with captured_hidden_states(model) as hidden:
                loss = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
            mode = "train" if self.model.training else "eval"
            scale = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            states = self.sequence_states(hidden)  # TRL may score the rows in chunks, and share their prompts' passes
            if self.value_head is not None:
                values = read_values(self.value_head, states, inputs["value_positions"])
                value_loss = clipped_value_loss(values, inputs["old_values"], inputs["value_returns"], inputs["value_mask"], self.args.cliprange_value)
                self.log_metrics(mode, {"critic/value_loss": float(value_loss.detach())})
                loss = loss + self.args.vf_coef * value_loss / scale
            if choices:
                head = self.accelerator.unwrap_model(model).get_output_embeddings()
                entropy, points = loss_inputs.choice_entropies(head, states, inputs, self.temperature)
                if points.any():
                    # Weighted as the policy loss weighs a token (over the micro-batch's model tokens), so
                    # the coefficient keeps its meaning against the advantage whatever the replies' length.
                    tokens = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
                    bonus = loss_inputs.entropy_bonus(entropy[points], self.args.action_entropy_floor)
                    below = {} if self.args.action_entropy_floor is None else {"policy/action_entropy_below_floor": float((bonus < 0).float().mean())}
                    self.log_metrics(mode, {"policy/action_entropy": float(entropy[points].mean().detach()), **below})
                    loss = loss - self.args.action_entropy_coef * bonus.sum() / tokens.sum().clamp(min=1.0) / scale
            return loss + (self.imitation_term(model) if imitating else 0.0)

    def imitation_term(self, model: Any) -> torch.Tensor:
        """Self-imitation's term of this micro-step's loss: ``self_imitation_coef`` times the negative
        log-likelihood of ``self_imitation_rows`` remembered rows, drawn from a stream seeded by the
        run's seed, TRL's micro-step and the process (so a resumed run draws the same), scaled as
        the Trainer scales the loss for gradient accumulation; logs ``self_imitation/nll`` and
        ``self_imitation/distinct_rows`` (the share of the drawn rows that are distinct: each runs once)."""
        args = self.args
        rows = self.win_memory.sample(args.self_imitation_rows, [args.seed, self.micro_step, self.accelerator.process_index, 1 << 22])
        pad = self.processing_class.pad_token_id if self.processing_class.pad_token_id is not None else 0
        nll = imitation_loss(model, rows, pad, self.temperature)
        self.log_metrics("train", {"self_imitation/nll": float(nll.detach()), "self_imitation/distinct_rows": len(set(rows)) / len(rows)})
        return args.self_imitation_coef * nll / self.current_gradient_accumulation_steps

    @functools.cached_property
    def first_token(self) -> Callable[[str], int | None]:
        """``action -> the first token of its spelling`` (:func:`~envhub_trl.loss_inputs.first_tokens`)."""
        return loss_inputs.first_tokens(self.processing_class)

    def create_optimizer(self, model: Any = None) -> Any:
        """``transformers.Trainer``'s optimizer, with PPO's value head as one more parameter group
        (no weight decay)."""
        optimizer = super().create_optimizer(model)
        if self.value_head is not None:
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            if not any(id(p) in held for p in self.value_head.parameters()):
                optimizer.add_param_group({"params": list(self.value_head.parameters()), "weight_decay": 0.0})
        if self.args.skip_zero_gradient_steps:
            skip_zero_gradient_steps(optimizer, lambda skipped: self.log_metrics("train", {"optimizer/skipped": float(skipped)}))
        return optimizer

    # ------------------------------------------------------------------ checkpoints

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """Train as ``transformers.Trainer`` does; ``resume_from_checkpoint`` (a ``checkpoint-N``
        folder, or True for the last in ``output_dir``; by default ``args.resume_from_checkpoint``)
        resumes the run exactly: the Trainer restores the weights, optimizer, schedule and RNG
        states, :func:`envhub_trl.run_state.restore` the rest of what the run's future depends on.

        Raises:
            envhub.error.ResumeError: for a path that is not a checkpoint, or True with none to take.
        """
        if resume_from_checkpoint is None:
            resume_from_checkpoint = self.args.resume_from_checkpoint
        checkpoint = run_state.resolve_resume(self.args.output_dir, resume_from_checkpoint)
        if checkpoint is not None:
            run_state.restore(self, checkpoint)
        return super().train(str(checkpoint) if checkpoint is not None else None, *args, **kwargs)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """Write no card: TRL writes its own into ``output_dir`` at every checkpoint, naming the
        base model "None" for a model that is not a hub id, and nothing of the env. ``envhub
        train`` writes the model's card, ``final/README.md``, from results.json instead
        (:mod:`envhub_trl.model_card`)."""

    def on_checkpoint(self, folder: Path) -> None:
        """envhub's run state (:func:`envhub_trl.run_state.save`) in every checkpoint."""
        run_state.save(self, folder)

    def on_save(self, folder: str) -> None:
        """Beside every saved model, ``envhub.json``: the prompt settings and env it trains on, which
        ``envhub eval`` and ``envhub run --policy`` load so that it is evaluated on its own prompts;
        and PPO's value head."""
        self.args.trained_on().save(folder)
        if self.value_head is not None:
            self.value_head.save(folder)

    def on_load(self, folder: str) -> None:
        """PPO's value head from a checkpoint (one without, say from a GRPO run, leaves the head as
        it starts, at 0)."""
        if self.value_head is not None and not self.value_head.load(folder):
            warnings.warn(f"{folder} holds no value head; PPO's critic starts from 0", stacklevel=3)

    # ------------------------------------------------------------------ evaluation

    def evaluate_env(
        self,
        seeds: list[int] | None = None,
        greedy: bool = True,
        generator: Generator | None = None,
        label: str | None = None,
        env: EnvEntry | None = None,
        pass_k: int = 1,
    ) -> dict[str, float]:
        """Success of the current model on held-out seeds (``args.eval_episodes`` from
        ``args.eval_seed_offset`` by default), greedy or sampled as in training (seeded with
        ``args.seed``, so reruns repeat); returns :func:`envhub.rollout.batch_metrics`.

        ``generator`` plays instead of the model (a reference policy on the same seeds); ``label``
        shows a progress bar on stderr; ``env`` picks an env of a mix (default: the first), played
        with its own settings (not the curriculum's)."""
        args = self.args
        if seeds is None:
            seeds = held_out_seeds(args.eval_seed_offset, args.eval_episodes)
        sampling = args.sampling(0.0 if greedy else args.temperature, args.seed)
        settings = args.held_out_settings(env)
        if generator is None:  # the model's episodes end after invalid replies in a row; a reference policy's do not
            settings = settings.replace(max_invalid_streak=args.eval_max_invalid_streak)
        with self.generator_lock:  # an async producer may be sampling on the same engine
            generator = generator if generator is not None else self.generator
            return evaluate_generator(generator, self.processing_class, settings, seeds, sampling, label=label, members=pass_k)


def skip_zero_gradient_steps(optimizer: torch.optim.Optimizer, on_step: Callable[[bool], None]) -> None:
    """Make ``optimizer.step`` do nothing where every gradient it holds is exactly zero (or none),
    calling ``on_step(skipped)`` at each step.

    A step whose batch kept no group (``filter_tied_groups``, dynamic sampling) has a zero
    gradient, and Adam still moves the weights by its moments (and counts the step in its bias
    correction): the last steps' gradients go on being applied with nothing to say they should.
    The gradients are read after the Trainer's all-reduce and clipping, so every process decides
    alike. A NaN is not zero, so a NaN gradient is not hidden here. The step stays a bound method,
    as torch's LR schedulers, which wrap it, require.
    """
    if getattr(optimizer.step, "skips_zero_gradients", False):
        return  # a second train() on the same trainer: already in place

    def step(self: torch.optim.Optimizer, closure: Any = None) -> Any:
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        skipped = not grads or not bool(torch.stack([g.ne(0).any() for g in grads]).any())
        on_step(skipped)
        return None if skipped else type(self).step(self, closure)

    step.skips_zero_gradients = True  # type: ignore[attr-defined]
    optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
