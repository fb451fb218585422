"""``EnvGRPOTrainer``: TRL's GRPO trainer on multi-turn envhub environments, with GRPO or GiGPO advantages.

How a generation batch is made (see ``GRPOTrainer._generate_and_score_completions``, which this
class wraps):

1. The dataset is a column of env seeds; TRL's sampler repeats each row ``num_generations`` times
   in a row, so each run of equal seeds is one env group. The batch's seeds are kept aside.
2. TRL calls the rollout function, which resets one environment per row with the row's seed
   (members of a group share it, hence their initial state) and plays every episode with the
   generator, through :class:`~envhub.manager.EnvGroupManager`. Each episode becomes one sample
   whose environment tokens carry ``env_mask`` 0 (TRL's ``tool_mask``: out of the loss).
3. TRL scores the samples (the reward function returns the episode return) and computes its own
   episode-level advantages; they are then replaced by per-token ones: the episodes of every
   process are gathered (a group may straddle processes), each turn's advantage is computed over
   the whole batch, and each turn's tokens get it. Group filtering masks dropped groups out.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from datasets import Dataset
from trl import GRPOTrainer

from envhub.generation import Generator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.registration import spec
from envhub.rollout import Sample, Trajectory, rollout, step_arrays
from envhub_trl.config import EnvGRPOConfig
from envhub_trl.evaluation import evaluate_generator, held_out_seeds
from envhub_trl.generators import HFGenerator, VLLMGenerator
from envhub_trl.metrics import rollout_metrics
from envhub_trl.rollout_batch import episode_return, token_advantages, trl_rollout_output, turn_advantages


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
        generator: a generator to sample with instead of ``args.generator`` (a
            ``VLLMServerGenerator``, say). It samples with whatever weights it holds: keeping them
            in step with the trained model is the caller's job.
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
        spec(args.env_id)  # an unknown id fails here, with suggestions
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
        self._manager: EnvGroupManager | None = None
        self._generator: Generator | None = generator
        self._synced_step = -1
        self._batch_seeds: list[int] = []
        self._batch: tuple[list[Trajectory], list[Sample]] | None = None

    # ------------------------------------------------------------------ generation

    @property
    def generator(self) -> Generator:
        """The generator of ``args.generator``, holding the current weights of the trained model."""
        model = self.accelerator.unwrap_model(self.model)
        kwargs = dict(self.args.generator_kwargs or {})
        if self._generator is None:
            if self.args.generator == "hf":
                self._generator = HFGenerator(model, self.processing_class, **kwargs)
            else:
                folder = Path(self.args.output_dir) / "vllm-initial-weights"
                model.save_pretrained(folder)
                self.processing_class.save_pretrained(folder)
                kwargs.setdefault("dtype", str(model.dtype).removeprefix("torch."))
                self._generator = VLLMGenerator(folder, seed=self.args.seed, **kwargs)
                self._synced_step = self.state.global_step
        if isinstance(self._generator, VLLMGenerator) and self._synced_step != self.state.global_step:
            # The engine keeps its own copy of the weights: refresh it once per optimizer step.
            self._generator.load_weights(model)
            self._synced_step = self.state.global_step
        return self._generator

    def _manager_for(self, num_rows: int) -> EnvGroupManager:
        # One manager "group" per row: rows of one env group share a seed, so they start alike;
        # the trainer's own group ids come from the row's place in the global batch.
        if self._manager is None or self._manager.num_groups != num_rows:
            self._manager = EnvGroupManager(
                self.args.env_id, num_rows, 1, seed=self.args.seed, tokenizer=self.processing_class, **self.args.manager_kwargs()
            )
        return self._manager

    def _sampling(self) -> SamplingParams:
        seed = np.random.SeedSequence([self.args.seed, self.state.global_step, self.accelerator.process_index, self._step])
        return SamplingParams(
            max_new_tokens=self.args.max_turn_tokens,
            temperature=self.args.temperature,
            top_p=self.args.top_p,
            top_k=self.args.top_k or 0,
            seed=int(seed.generate_state(1)[0] & 0x3FFFFFFF),
        )

    def _rollout(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, list[Any]]:
        """TRL's ``rollout_func``: play this process's rows and return them as samples."""
        if len(self._batch_seeds) != len(prompts):
            raise RuntimeError(f"{len(prompts)} prompts for {len(self._batch_seeds)} env seeds; rows must carry env_seed")
        trajectories = rollout(self._manager_for(len(prompts)), self.generator, self._sampling(), seeds=self._batch_seeds)
        output, samples = trl_rollout_output(trajectories)
        self._batch = (trajectories, samples)
        return output

    # ------------------------------------------------------------------ advantages

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._batch_seeds = [int(row["env_seed"]) for row in inputs]
        output = super()._generate_and_score_completions(inputs)
        trajectories, samples = self._batch
        self._batch = None
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        offset = self.accelerator.process_index * len(trajectories)
        local = [
            dataclasses.replace(t, group_id=(offset + i) // group_size, index=offset + i) for i, t in enumerate(trajectories)
        ]
        everyone: list[Trajectory] = gather_object(local)
        result = turn_advantages(
            step_arrays(everyone),
            self.args.advantage_estimator,
            step_weight=self.args.step_advantage_weight,
            gamma=self.args.step_gamma,
            norm=self.args.advantage_norm,
            drop_tied=self.args.filter_tied_groups,
            keep_fraction=self.args.keep_group_fraction,
        )
        bounds = np.cumsum([0] + [t.num_turns for t in everyone])
        per_turn = [result["advantages"][bounds[offset + i] : bounds[offset + i + 1]] for i in range(len(local))]
        device = self.accelerator.device
        width = output["completion_ids"].shape[1]
        output["advantages"] = torch.tensor(token_advantages(samples, per_turn, width), dtype=torch.float32, device=device)
        keep = torch.tensor(result["keep"][offset : offset + len(local)], device=device)
        if not result["keep"].all():  # decided on the global batch, so every process joins the gather below
            output["tool_mask"] = output["tool_mask"] * keep.unsqueeze(1).to(output["tool_mask"].dtype)
            loss_mask = output["completion_mask"] * output["tool_mask"]
            output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        for name, value in rollout_metrics(everyone, result["keep"], result.get("anchor_size")).items():
            self._metrics[mode][name].append(value)
        return output

    # ------------------------------------------------------------------ evaluation

    def evaluate_env(self, seeds: list[int] | None = None, greedy: bool = True) -> dict[str, float]:
        """Success of the current model on held-out seeds (``args.eval_episodes`` from
        ``args.eval_seed_offset`` by default), greedy or sampled as in training (seeded with
        ``args.seed``, so reruns repeat); returns :func:`envhub.rollout.batch_metrics`."""
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
        return evaluate_generator(self.generator, self.processing_class, args.env_id, seeds, sampling, **args.manager_kwargs())
