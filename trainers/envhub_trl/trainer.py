"""``EnvGRPOTrainer``: TRL's GRPO trainer on multi-turn envhub environments, with GRPO or GiGPO advantages.

How a generation batch is made (this class wraps ``GRPOTrainer._generate_and_score_completions``):

1. The dataset is a column of env seeds; TRL's sampler repeats each row ``num_generations`` times
   in a row, so each run of equal seeds is one env group.
2. Play: :class:`~envhub.manager.EnvGroupManager` resets each env group's ``group_size`` members
   with the group's seed (hence one initial state) and plays every episode with the generator.
   The batch's groups take the run's envs in order (``envs:``, :mod:`envhub_trl.mix`: each group
   is one env); a curriculum (:mod:`envhub_trl.curriculum`) sets the current stage's env
   arguments and turn limit.
3. Gather: the episodes of every process are gathered (a group may straddle processes); the
   group filter, which reads returns alone, marks dropped groups.
4. The episodes become TRL rows, handed to TRL through its ``rollout_func`` hook: in the
   ``trajectory`` layout one row per episode, whose environment tokens carry ``env_mask`` 0 (TRL's
   ``tool_mask``: out of the loss); in the ``step`` layout one row per turn (its windowed prompt
   and its reply), padded with masked rows to a size TRL can split evenly. Rows of dropped groups
   are masked too.
5. Score: TRL scores the rows as usual (old and reference log-probs, metrics, the completions
   log); an estimator that needs per-token quantities (``reinforce++``: the policy's and the
   reference model's log-probs) gets them here, gathered into the batch's token order.
6. Estimate: the registered estimator (:mod:`envhub_trl.estimators`) turns the batch into
   per-turn (or per-token) advantages, which replace TRL's sequence-level ones: each turn's
   tokens get that turn's advantage, environment tokens none.
7. Loss: TRL's clipped policy-gradient loss over those per-token advantages, with a per-token
   importance ratio or, with ``ratio_type="segment"``, one per turn.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOTrainer

from envhub.chat import stop_token_ids
from envhub.generation import Generator, SamplingParams
from envhub.executors import make_executor
from envhub.manager import EnvGroupManager
from envhub.registration import spec
from envhub.rollout import RolloutStats, Sample, Trajectory, batch_columns, rollout
from envhub_trl.advantages import select_groups
from envhub_trl.async_rollout import AsyncRollouts, staleness_metrics, truncated_importance_weights
from envhub_trl.config import EnvGRPOConfig
from envhub_trl.curriculum import CurriculumState
from envhub_trl.critic import ValueHead, captured_hidden_states, clipped_value_loss, final_norm, read_values, turn_starts, value_positions
from envhub_trl.estimators import NEEDS, TurnBatch
from envhub_trl.evaluation import evaluate_generator, held_out_seeds
from envhub_trl.generators import backend, capabilities_of
from envhub_trl.metrics import rollout_metrics
from envhub_trl.mix import EnvEntry, group_env_ids
from envhub_trl import run_state
from envhub_trl.rollout_batch import (
    check_has_turns,
    episode_return,
    segment_mean,
    spread_token_values,
    token_advantages,
    token_order,
    turn_advantages,
    turn_token_values,
)


def seed_dataset(num_seeds: int) -> Dataset:
    """The trainer's dataset: one row per training seed (``env_seed``), with a ``prompt`` TRL logs."""
    seeds = list(range(num_seeds))
    return Dataset.from_dict({"prompt": [f"env seed {s}" for s in seeds], "env_seed": seeds})


class EnvGRPOTrainer(GRPOTrainer):
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
    ):
        if args is None:
            args = EnvGRPOConfig(output_dir="envhub-grpo")
        if not isinstance(args, EnvGRPOConfig):
            raise TypeError(f"EnvGRPOTrainer needs an EnvGRPOConfig, got {type(args).__name__}")
        for entry in args.env_entries():
            spec(entry.env_id)  # an unknown id fails here, with suggestions
        if train_dataset is None:
            train_dataset = seed_dataset(args.num_train_seeds)
        elif "env_seed" not in train_dataset.column_names:
            raise ValueError("train_dataset needs an env_seed column (one reset seed per row)")
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
                rollout_func=self._rollout,
            )
        self._managers: dict[str, tuple[EnvGroupManager, Any]] = {}  # owner ("main", "async") -> (manager, its key)
        self._async: AsyncRollouts | None = None  # rollout_mode="async": the producer thread
        self._async_batches = 0  # generation batches taken from it
        self._generator_lock = threading.Lock()  # the producer and evaluation never sample on one engine at once
        schedule = args.curriculum_schedule()
        self.curriculum: CurriculumState | None = CurriculumState(schedule) if schedule is not None else None
        self._curriculum_restored = False
        self._generator: Generator | None = generator
        self._synced_step = -1
        self._batch_seeds: list[int] = []
        self._columns: dict[str, list[Any]] | None = None
        self._reference: Any | None = None  # the frozen reference copy REINFORCE++ reads (see _reference_logps)
        self._loss_inputs: dict[str, Any] | None = None  # the micro-batch under the loss, for ratio_type="segment"
        self.value_head: ValueHead | None = None  # PPO's critic (envhub_trl.critic), beside the model
        if "values" in NEEDS[args.advantage_estimator]:
            unwrapped = self.accelerator.unwrap_model(self.model)
            final_norm(unwrapped)  # an architecture without a known final norm fails here, not mid-run
            self.value_head = ValueHead(unwrapped.config.get_text_config().hidden_size).to(self.accelerator.device)
            self.add_callback(_ZeroCriticGradients(self.value_head))
            if self.accelerator.num_processes > 1:
                self.add_callback(_AverageCriticGradients(self.value_head))

    # ------------------------------------------------------------------ generation

    @property
    def _manager(self) -> EnvGroupManager | None:
        """The manager training batches play through (the main thread's)."""
        return self._managers.get("main", (None, None))[0]

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

    def _build_generator(self, model: Any) -> Generator:
        """``args.generator``'s registered backend, built for this model and run."""
        chosen = backend(self.args.generator)
        generator = chosen.build(model, self.processing_class, self.args, **dict(self.args.generator_kwargs or {}))
        if chosen.in_sync_when_built:
            self._synced_step = self.state.global_step  # it starts from the current weights
        return generator

    def _manager_for(self, seeds: list[int], group_size: int, owner: str = "main") -> tuple[EnvGroupManager, list[int]]:
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
        kwargs = self.args.mix_manager_kwargs([entry for entry in entries if entry.env_id in partition])
        key = (tuple(partition.items()), size, repr(kwargs))
        manager, known = self._managers.get(owner, (None, None))
        if manager is None or known != key:
            if manager is not None:
                manager.close()
            executor = make_executor(self.args.env_executor, self.args.env_workers, self.args.env_step_timeout)
            manager = EnvGroupManager(partition, None, size, seed=self.args.seed, tokenizer=self.processing_class, executor=executor, **kwargs)
            self._managers[owner] = (manager, key)
        return manager, seeds[::size]

    def _sampling(self, batch: int | None = None) -> SamplingParams:
        """Training's sampling, seeded by the step (or, for the async producer, by its batch index)."""
        index = self.accelerator.process_index
        position = [self.state.global_step, index, self._step] if batch is None else [batch, index, 1 << 20]
        seed = np.random.SeedSequence([self.args.seed, *position])
        return SamplingParams(
            max_new_tokens=self.args.max_turn_tokens,
            temperature=self.args.temperature,
            top_p=self.args.top_p,
            top_k=self.args.top_k or 0,
            seed=int(seed.generate_state(1)[0] & 0x3FFFFFFF),
        )

    def _rollout(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, list[Any]]:
        """TRL's ``rollout_func``: the rows this batch's episodes became (played before TRL asks)."""
        columns = self._columns
        self._columns = None
        if columns is None or len(columns["prompt_ids"]) != len(prompts):
            raise RuntimeError("EnvGRPOTrainer plays its episodes in _generate_and_score_completions; rows must carry env_seed")
        return columns

    # ------------------------------------------------------------------ advantages

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._batch_seeds = [int(row["env_seed"]) for row in inputs]
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        self._restore_curriculum()
        staleness = None
        if self.args.rollout_mode == "async" and mode == "train":
            trajectories, stats, staleness = self._async_batch(len(inputs), group_size)
        else:
            manager, reset_seeds = self._manager_for(self._batch_seeds, group_size)
            stats = RolloutStats()
            play_mode = "lockstep" if self.args.rollout_mode == "lockstep" else "continuous"
            with self._generator_lock:
                trajectories = rollout(manager, self.generator, self._sampling(), seeds=reset_seeds, mode=play_mode, stats=stats)
        for name, value in stats.metrics().items():
            self._metrics[mode][name].append(value)
        for trajectory in trajectories:
            check_has_turns(trajectory)

        # Gather: every process's episodes (a group may straddle processes).
        offset = self.accelerator.process_index * len(trajectories)
        local = [
            dataclasses.replace(t, group_id=(offset + i) // group_size, index=offset + i) for i, t in enumerate(trajectories)
        ]
        everyone: list[Trajectory] = gather_object(local)
        batch = TurnBatch.from_trajectories(everyone)
        # The group filter reads returns alone, so dropped groups are masked before TRL scores.
        keep = select_groups(
            batch.returns, batch.traj_groups, drop_tied=self.args.filter_tied_groups, keep_fraction=self.args.keep_group_fraction
        )

        if self.args.sample_layout == "trajectory":
            rows, samples = list(inputs), [t.sample() for t in local]
        else:
            rows, samples = self._step_rows(inputs, local, mode)
        columns = batch_columns(samples)
        row_keep = [bool(keep[s.trajectory_index]) if s.trajectory_index >= 0 else False for s in samples]
        columns["env_mask"] = [mask if kept else [0] * len(mask) for mask, kept in zip(columns["env_mask"], row_keep)]
        columns["episode_return"] = [
            everyone[s.trajectory_index].episode_return if s.trajectory_index >= 0 else None for s in samples
        ]
        self._columns = columns
        # Score: TRL's old and reference log-probs; then what the estimator needs besides.
        output = super()._generate_and_score_completions(rows)
        width = output["completion_ids"].shape[1]
        # Each row's turns and where their model tokens start: where PPO's values are read.
        value_rows = turn_starts(samples) if self.value_head is not None else None
        needs = NEEDS[self.args.advantage_estimator]
        if needs:
            batch, starts = self._with_scores(batch, everyone, samples, output, needs, value_rows)

        # Estimate, then spread over the tokens the loss reads.
        result = turn_advantages(batch, self.args.advantage_estimator, self.args.estimator_settings(), keep=keep)
        if "token_advantages" in result:
            advantages = spread_token_values(samples, result["token_advantages"], starts, width)
            self._metrics[mode]["env/kl"].append(float(np.mean(result["kl"])) if len(result["kl"]) else 0.0)
        else:
            per_episode = np.split(result["advantages"], np.cumsum([t.num_turns for t in everyone])[:-1])
            row_turns = [per_episode[s.trajectory_index] if s.trajectory_index >= 0 else np.zeros(1) for s in samples]
            advantages = token_advantages(samples, row_turns, width)
        output["advantages"] = torch.tensor(advantages, dtype=torch.float32, device=self.accelerator.device)
        if staleness is not None:
            self._correct_for_lag(output, staleness, mode)
        if self.value_head is not None:
            self._critic_targets(output, samples, value_rows, batch, result["returns"], row_keep)
            self._metrics[mode]["critic/values_mean"].append(float(np.mean(batch.values)))
            self._metrics[mode]["critic/returns_mean"].append(float(np.mean(result["returns"])))
        if self.args.ratio_type == "segment":
            turn_ids = np.zeros((len(samples), width), dtype=np.int64)
            for row, sample in enumerate(samples):
                turn_ids[row, : len(sample.turn_ids)] = sample.turn_ids
            output["turn_ids"] = torch.tensor(turn_ids, device=self.accelerator.device)
        self._log_token_advantages(samples, advantages)
        per_env = len(self.args.env_entries()) > 1
        for name, value in rollout_metrics(everyone, result["keep"], result.get("anchor_size"), per_env=per_env).items():
            self._metrics[mode][name].append(value)
        if self.curriculum is not None and mode == "train":
            self._advance_curriculum(everyone, mode)
        return output

    # ------------------------------------------------------------------ async rollouts

    def _async_batch(self, rows: int, group_size: int) -> tuple[list[Trajectory], RolloutStats, int]:
        """The next generation batch from the producer thread (started on the first call): post
        the current weights as this batch's version, take the batch, return it with its staleness."""
        model = self.accelerator.unwrap_model(self.model)
        if self._async is None:
            self._async = self._start_async(model, rows, group_size)
        batch = self._async_batches
        self._async_batches += 1
        self._async.post_weights(batch, {name: tensor.detach().clone() for name, tensor in model.state_dict().items()})
        trajectories, stats, version = self._async.take(batch)
        return trajectories, stats, batch - version

    def _start_async(self, model: Any, rows: int, group_size: int) -> AsyncRollouts:
        """The producer: its own generator (HF: a copy of the model; vLLM: the engine, which only
        it touches while training runs) and its own manager; batch ``b``'s groups are seeded from
        ``(seed, b)``, the same on every process, each process playing its rows' share."""
        generator = self.generator
        sync = capabilities_of(generator).weight_sync
        if sync == "shared":
            # It samples with the trained model object, which trains meanwhile: the producer gets a
            # fresh model of the same config with the weights, not a deepcopy (a copy would carry
            # whatever the trainer has patched onto the training model at this moment).
            copy_of_model = type(model)(model.config).to(model.device, model.dtype).eval().requires_grad_(False)
            copy_of_model.load_state_dict(model.state_dict())
            copy_of_model.generation_config = copy.deepcopy(model.generation_config)
            generator = generator.with_model(copy_of_model)
            load = copy_of_model.load_state_dict
        elif sync == "local":
            # vLLM's engine (only the producer touches it while training runs), or a generator the
            # caller gave that takes the posted weights.
            load = lambda snapshot: generator.load_weights(_Snapshot(snapshot))  # noqa: E731
        else:
            load = lambda snapshot: None  # noqa: E731  (its weights never change)
        groups = self.args.generation_batch_size // group_size
        offset = self.accelerator.process_index * rows

        def play(batch: int) -> tuple[list[Trajectory], RolloutStats]:
            rng = np.random.default_rng([self.args.seed, 0xA5, batch])
            seeds = np.repeat(rng.integers(0, self.args.num_train_seeds, groups), group_size)[offset : offset + rows].tolist()
            manager, reset_seeds = self._manager_for(seeds, group_size, owner="async")
            stats = RolloutStats()
            with self._generator_lock:
                trajectories = rollout(manager, generator, self._sampling(batch), seeds=reset_seeds, mode="continuous", stats=stats)
            return trajectories, stats

        def load_locked(snapshot: Any) -> None:
            with self._generator_lock:
                load(snapshot)

        self.add_callback(_StopAsync(self))
        # A resumed run's producer goes on from the batch the checkpoint had reached (run_state).
        return AsyncRollouts(play, load_locked, self.args.max_staleness, first_batch=self._async_batches)

    def _correct_for_lag(self, output: dict[str, Any], staleness: int, mode: str) -> None:
        """Truncated importance sampling for an async batch: each model token's advantage times
        ``min(pi_current / pi_sampled, importance_sampling_cap)`` (the weight is detached and
        non-negative, so this equals weighting TRL's clipped per-token loss, as its vLLM
        importance-sampling correction does); logs the weights and the staleness."""
        old = output.get("old_per_token_logps")
        if old is None:
            input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            with torch.no_grad():
                old = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention, output["completion_ids"].shape[1], batch_size=self.args.per_device_train_batch_size
                )[0]
        mask = output["completion_mask"] * output["tool_mask"] if "tool_mask" in output else output["completion_mask"]
        weights, stats = truncated_importance_weights(old.float(), output["sampling_per_token_logps"].float(), mask.float(), self.args.importance_sampling_cap)
        output["advantages"] = output["advantages"] * weights.to(output["advantages"].dtype)
        for name, value in stats.items():
            self._metrics[mode][f"rollout/importance_weight_{name}"].append(value)
        for name, value in staleness_metrics([staleness] * len(output["completion_ids"]), self.args.max_staleness).items():
            self._metrics[mode][name].append(value)

    def _restore_curriculum(self) -> None:
        """On a run resumed from a checkpoint without envhub's run state (:mod:`envhub_trl.run_state`
        restores the stage and its window), start the curriculum at the last stage its log
        recorded (its window of recent success starts afresh)."""
        if self.curriculum is None or self._curriculum_restored:
            return
        self._curriculum_restored = True
        logged = [entry["curriculum/stage"] for entry in self.state.log_history if "curriculum/stage" in entry]
        if logged:
            self.curriculum.stage = int(round(logged[-1]))

    def _advance_curriculum(self, trajectories: list[Trajectory], mode: str) -> None:
        """Feed the batch's training success of the stage env to the curriculum; log where it is."""
        curriculum = self.curriculum
        schedule = curriculum.curriculum
        if schedule.stages:
            self._metrics[mode]["curriculum/stage"].append(float(curriculum.stage))  # the stage this batch played
            ours = [t.success for t in trajectories if t.env_id == schedule.env]
            if ours and curriculum.observe(float(np.mean(ours))):
                stage = schedule.stages[curriculum.stage]
                if self.accelerator.is_main_process:
                    print(
                        f"curriculum: stage {curriculum.stage + 1} of {len(schedule.stages)} ({schedule.env}, {stage}) from step "
                        f"{self.state.global_step + 1}: training success reached {schedule.advance_at:g} over {schedule.window} batches",
                        file=sys.stderr,
                        flush=True,
                    )
        turns = schedule.max_turns_at(self.state.global_step)
        if turns is not None:
            self._metrics[mode]["curriculum/max_turns"].append(float(turns))

    def _with_scores(
        self,
        batch: TurnBatch,
        everyone: list[Trajectory],
        samples: list[Sample],
        output: dict[str, Any],
        needs: tuple[str, ...],
        value_rows: list[dict[int, int]] | None,
    ) -> tuple[TurnBatch, dict[tuple[int, int], int]]:
        """The score stage's quantities for an estimator that needs them (``needs``: ``logps`` and
        ``ref_logps`` per model token, ``values`` per turn, read where ``value_rows`` says:
        :func:`~envhub_trl.critic.turn_starts`): read off TRL's scoring where it computed them,
        else computed here without gradients; gathered over processes into ``batch``'s order.
        Returns the batch with them, and where each (episode, turn)'s tokens start
        (:func:`token_order`)."""
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        width = output["completion_ids"].shape[1]
        batch_size = self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size
        token_scores, values = {}, None
        with torch.no_grad():
            logps = output.get("old_per_token_logps")
            if "values" in needs or ("logps" in needs and logps is None):
                capture = captured_hidden_states(self.model) if "values" in needs else contextlib.nullcontext([])
                with capture as hidden:
                    fresh, _, _ = self._get_per_token_logps_and_entropies(self.model, input_ids, attention, width, batch_size=batch_size)
                logps = fresh if logps is None else logps
                if "values" in needs:
                    positions, _ = value_positions(value_rows, output["prompt_ids"].shape[1])
                    values = read_values(self.value_head, torch.cat(hidden), positions).float().cpu().numpy()
            if "logps" in needs:
                token_scores["logps"] = logps
            if "ref_logps" in needs:
                ref = output.get("ref_per_token_logps")
                token_scores["ref_logps"] = ref if ref is not None else self._reference_logps(input_ids, attention, width, batch_size)
        local: dict[tuple[int, int], dict[str, Any]] = {}
        for name, value in token_scores.items():
            for key, entries in turn_token_values(samples, value.float().cpu().numpy()).items():
                local.setdefault(key, {})[name] = entries
        if values is not None:
            for row, starts_of_row in enumerate(value_rows):
                for k, turn in enumerate(sorted(starts_of_row)):
                    local.setdefault((samples[row].trajectory_index, turn), {})["values"] = float(values[row, k])
        gathered = dict(gather_object(list(local.items())))
        turn_counts = [t.num_turns for t in everyone]
        first = next(iter(token_scores), None)
        lengths = {key: len(entry[first]) for key, entry in gathered.items() if first in entry} if first else {}
        token_turn, starts = token_order(turn_counts, lengths)
        ordered = sorted((key for key in gathered if key in lengths), key=starts.__getitem__)
        fields = {name: np.concatenate([gathered[key][name] for key in ordered] or [np.zeros(0)]) for name in token_scores}
        if values is not None:
            fields["values"] = np.array([gathered.get((g, k), {}).get("values", 0.0) for g, n in enumerate(turn_counts) for k in range(n)])
        return batch.with_scores(token_turn, **fields), starts

    def _critic_targets(
        self,
        output: dict[str, Any],
        samples: list[Sample],
        starts: list[dict[int, int]],
        batch: TurnBatch,
        returns: np.ndarray,
        row_keep: list[bool],
    ) -> None:
        """Put what PPO's value loss reads into ``output``: where each row's turn values are read
        (``starts``: :func:`~envhub_trl.critic.turn_starts`), their old values and GAE returns, and a
        mask (0 on padding and on dropped groups)."""
        positions, mask = value_positions(starts, output["prompt_ids"].shape[1])
        first_turn = np.cumsum([0] + [int(n) for n in np.bincount(batch.traj_index, minlength=batch.num_episodes)])
        old, targets = torch.zeros(mask.shape), torch.zeros(mask.shape)
        for row, starts_of_row in enumerate(starts):
            for k, turn in enumerate(sorted(starts_of_row)):
                index = first_turn[samples[row].trajectory_index] + turn
                old[row, k], targets[row, k] = float(batch.values[index]), float(returns[index])
        mask = mask * torch.tensor([float(kept) for kept in row_keep]).unsqueeze(1)
        device = self.accelerator.device
        output.update(value_positions=positions.to(device), value_mask=mask.to(device), old_values=old.to(device), value_returns=targets.to(device))

    def _reference_logps(self, input_ids: torch.Tensor, attention: torch.Tensor, width: int, batch_size: int) -> torch.Tensor:
        """Per-token log-probs of the reference model: TRL's own where it made one (``beta`` > 0),
        the base model under a PEFT adapter, else a frozen copy of the policy taken when RL first
        needs it (after any warm start; on a resumed run, the checkpoint's weights)."""
        model = self.accelerator.unwrap_model(self.model)
        if self.ref_model is not None:
            reference = self.ref_model
        elif hasattr(model, "disable_adapter") and hasattr(model, "peft_config"):
            with model.disable_adapter():
                return self._get_per_token_logps_and_entropies(self.model, input_ids, attention, width, batch_size=batch_size)[0]
        else:
            if self._reference is None:
                self._reference = copy.deepcopy(model).eval().requires_grad_(False)
            reference = self._reference
        return self._get_per_token_logps_and_entropies(reference, input_ids, attention, width, batch_size=batch_size)[0]

    def _step_rows(
        self, inputs: list[dict[str, Any]], trajectories: list[Trajectory], mode: str
    ) -> tuple[list[dict[str, Any]], list[Sample]]:
        """The step layout's rows: one per turn of ``trajectories`` (global indices), padded with
        masked rows (``trajectory_index`` -1).

        Every process gets the same number of rows (TRL gathers rewards row by row), a multiple
        of ``num_generations`` (TRL groups rewards) and, in training, of ``steps_per_generation``
        (TRL splits the batch into that many equal micro-batches).
        """
        rows, samples = [], []
        for i, trajectory in enumerate(trajectories):
            for sample in trajectory.step_samples():
                samples.append(sample)
                rows.append({**inputs[i], "prompt": self.processing_class.decode(sample.prompt_ids)})
        group = self.num_generations if mode == "train" else self.num_generations_eval
        multiple = math.lcm(group, self.args.steps_per_generation if mode == "train" else 1)
        most = int(self.accelerator.gather(torch.tensor([len(samples)], device=self.accelerator.device)).max())
        target = -(-most // multiple) * multiple
        filler = samples[0]
        for _ in range(target - len(samples)):
            samples.append(dataclasses.replace(filler, env_mask=[0] * len(filler.env_mask), trajectory_index=-1))
            rows.append(dict(rows[0]))  # TRL writes the rollout's extra columns into each row
        return rows, samples

    def _log_token_advantages(self, samples: list[Sample], advantages: np.ndarray) -> None:
        """Put the advantages the loss uses in TRL's completions log (mean over each row's model tokens)."""
        means = []
        for row, sample in enumerate(samples):
            mask = np.asarray(sample.env_mask, dtype=bool)
            means.append(float(advantages[row, : len(mask)][mask].mean()) if mask.any() else 0.0)
        means = gather_object(means)
        logged = self._logs["advantages"]
        for back, value in enumerate(reversed(means), start=1):
            if back <= len(logged):
                logged[-back] = value

    # ------------------------------------------------------------------ loss

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
        """TRL's loss; with ``ratio_type="segment"`` its importance ratio is one per turn (see
        :meth:`_get_per_token_logps_and_entropies`)."""
        self._loss_inputs = inputs if self.args.ratio_type == "segment" else None
        try:
            if self.value_head is None:
                return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
            with captured_hidden_states(model) as hidden:
                loss = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
            values = read_values(self.value_head, hidden[-1], inputs["value_positions"])
            value_loss = clipped_value_loss(values, inputs["old_values"], inputs["value_returns"], inputs["value_mask"], self.args.cliprange_value)
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["critic/value_loss"].append(float(value_loss.detach()))
            scale = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            return loss + self.args.vf_coef * value_loss / scale
        finally:
            self._loss_inputs = None

    def create_optimizer(self, model: Any = None) -> Any:
        """``transformers.Trainer``'s optimizer, with PPO's value head as one more parameter group
        (no weight decay)."""
        optimizer = super().create_optimizer(model)
        if self.value_head is not None:
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            if not any(id(p) in held for p in self.value_head.parameters()):
                optimizer.add_param_group({"params": list(self.value_head.parameters()), "weight_decay": 0.0})
        return optimizer

    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, *args: Any, **kwargs: Any) -> Any:
        """TRL's per-token log-probs; inside the loss with ``ratio_type="segment"``, each model token's
        log-prob ``lp`` becomes ``old + mean over its turn of (lp - old)``, so that TRL's token ratio
        ``exp(lp' - old)`` is the turn's ratio: the geometric mean of its token ratios, clipped per
        turn by TRL's clipping, its gradient shared by the turn's tokens (GSPO's sequence ratio, per
        turn). Environment tokens are left alone (they are out of the loss)."""
        logps, *rest = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        inputs = self._loss_inputs
        if inputs is not None and "turn_ids" in inputs:
            old = inputs.get("old_per_token_logps")
            old = logps.detach() if old is None else old
            mask = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
            logps = torch.where(mask.bool(), old + segment_mean(logps - old, inputs["turn_ids"], mask), logps)
        return (logps, *rest)

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

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """A Trainer checkpoint, with envhub's run state in it (:func:`envhub_trl.run_state.save`),
        written first so that the Trainer's own state file, written last, marks a complete folder."""
        run_state.save(self, Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}")
        super()._save_checkpoint(model, trial)

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        """Save as ``transformers.Trainer`` does (every checkpoint and ``save_model`` come here),
        plus ``envhub.json``: the prompt settings and env this model trains on, which ``envhub
        eval`` and ``envhub run --policy`` load so that it is evaluated on its own prompts."""
        super()._save(output_dir, state_dict)
        folder = output_dir if output_dir is not None else self.args.output_dir
        self.args.trained_on().save(folder)
        if self.value_head is not None:
            self.value_head.save(folder)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """Load a checkpoint as ``transformers.Trainer`` does, and PPO's value head with it (a
        checkpoint without one, say from a GRPO run, leaves the head as it starts, at 0)."""
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        if self.value_head is not None and not self.value_head.load(resume_from_checkpoint):
            warnings.warn(f"{resume_from_checkpoint} holds no value head; PPO's critic starts from 0", stacklevel=2)

    # ------------------------------------------------------------------ evaluation

    def evaluate_env(
        self,
        seeds: list[int] | None = None,
        greedy: bool = True,
        generator: Generator | None = None,
        label: str | None = None,
        env: EnvEntry | None = None,
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
        sampling = SamplingParams(
            max_new_tokens=args.max_turn_tokens,
            temperature=0.0 if greedy else args.temperature,
            top_p=args.top_p,
            top_k=args.top_k or 0,
            seed=args.seed,
        )
        env = env if env is not None else args.env_entries()[0]
        settings = args.eval_manager_kwargs_for(env, model=generator is None)
        with self._generator_lock:  # an async producer may be sampling on the same engine
            generator = generator if generator is not None else self.generator
            return evaluate_generator(generator, self.processing_class, env.env_id, seeds, sampling, label=label, **settings)


class _Snapshot:
    """A state dict posing as a model for a generator's ``load_weights(model)``."""

    def __init__(self, state: dict[str, torch.Tensor]):
        self._state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state


class _StopAsync(TrainerCallback):
    """Stops the async producer when training ends (it would otherwise play one batch too many)."""

    def __init__(self, trainer: EnvGRPOTrainer):
        self.trainer = trainer

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer._async is not None:
            self.trainer._async.close()
            self.trainer._async = None


class _ZeroCriticGradients(TrainerCallback):
    """Clear the value head's gradients after each optimizer step: the Trainer clears the model's
    alone, and the head lives beside it, so its gradients would otherwise sum over every step so far
    (and a resumed run, whose head starts with none, would train it differently)."""

    def __init__(self, head: ValueHead):
        self.head = head

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.head.zero_grad(set_to_none=True)


class _AverageCriticGradients(TrainerCallback):
    """With several processes, average the value head's gradients before each optimizer step (the
    head lives beside the DDP-wrapped model, so DDP does not do it)."""

    def __init__(self, head: ValueHead):
        self.head = head

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return
        world = torch.distributed.get_world_size()
        for parameter in self.head.parameters():
            if parameter.grad is not None:
                torch.distributed.all_reduce(parameter.grad)
                parameter.grad /= world
