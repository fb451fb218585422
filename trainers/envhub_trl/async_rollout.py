"""Off-policy rollouts with bounded staleness: generation batches played ahead of training.

``rollout_mode: async`` (ROLL's ``async_generation_ratio``, TRL's ``max_staleness``): a producer
thread plays generation batch ``b + 1 .. b + k`` while the trainer trains on batch ``b``, with its
own copy of the weights, refreshed at the trainer's step boundaries.

The staleness rule, and why:

- Weights are versioned by generation batch: the trainer posts version ``b`` (its weights when it
  asks for batch ``b``) before taking batch ``b``.
- The producer starts batch ``j`` only once version ``j - k`` or later has been posted, and loads
  the latest posted weights before it starts. So every batch is consumed at most ``k`` versions
  after the weights it was sampled with: the bound holds by construction, for every sample.
- A batch is handed over only when all its episodes have ended, so groups stay whole, and nothing
  that arrives late is dropped: a long or slow episode delays its batch (and, once ``k`` batches
  are ahead, the producer) instead of being discarded, so long-horizon episodes are not starved
  out of the training data (dropping late episodes would bias training towards short ones).
- With ``k = 0`` the producer plays each batch with the current weights while the trainer waits:
  lockstep's samples, through the thread.

Every token keeps the log-prob it was sampled with; the trainer corrects for the lag with
truncated importance sampling (:func:`truncated_importance_weights`).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from envhub.rollout import RolloutStats, Trajectory
from envhub_trl import pipeline
from envhub_trl.callbacks import StopAsync
from envhub_trl.generators import capabilities_of
from envhub_trl.lora import is_peft_model, merged_weights

if TYPE_CHECKING:
    from envhub_trl.trainer import EnvGRPOTrainer


def truncated_importance_weights(
    current_logps: torch.Tensor, sampled_logps: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token truncated importance weights ``min(pi_current / pi_sampled, cap)`` (1 where ``mask``
    is 0: padding and environment tokens), as TRL's vLLM importance-sampling correction
    (``token_truncate``) computes them; and their statistics over the masked tokens.

    ``current_logps`` are the scoring-time log-probs of the weights about to be trained,
    ``sampled_logps`` those the generator sampled each token with (older weights).
    """
    diff = torch.nan_to_num((current_logps - sampled_logps) * mask, nan=0.0)
    raw = torch.exp(diff)
    weights = torch.clamp(raw, max=cap)
    selected = mask.bool()
    if selected.any():
        stats = {
            "mean": float(raw[selected].mean()),
            "max": float(raw[selected].max()),
            "truncated_fraction": float((raw[selected] > cap).float().mean()),
        }
    else:
        stats = {"mean": 1.0, "max": 1.0, "truncated_fraction": 0.0}
    return weights, stats


def model_token_mask(output: dict[str, Any]) -> torch.Tensor:
    """The model tokens of TRL's scored batch: its completion mask, times its tool mask where the
    rows hold environment tokens."""
    mask = output["completion_mask"]
    return mask * output["tool_mask"] if "tool_mask" in output else mask


def sampler_gap(current_logps: torch.Tensor, sampled_logps: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the generator's sampling log-probs are from the policy's over the masked tokens
    (``log_sampler_gap``): TRL's ``sampling/...`` metrics of its vLLM correction, for whatever
    generator played. Tokens without a sampling log-prob (NaN) are left out; no tokens, no metrics."""
    sampled = sampled_logps.float()
    diff = (current_logps.float() - sampled)[mask.bool() & ~torch.isnan(sampled)]
    if not diff.numel():
        return {}
    ratio = torch.exp(diff)
    return {
        "sampling/sampling_logp_difference/mean": float(diff.abs().mean()),
        "sampling/sampling_logp_difference/max": float(diff.abs().max()),
        "sampling/importance_sampling_ratio/min": float(ratio.min()),
        "sampling/importance_sampling_ratio/mean": float(ratio.mean()),
        "sampling/importance_sampling_ratio/max": float(ratio.max()),
    }


def staleness_metrics(staleness: list[int], bound: int) -> dict[str, float]:
    """``rollout/staleness_mean``, ``rollout/staleness_max`` and the histogram
    ``rollout/staleness/<s>`` (the share of samples ``s`` versions old, for ``s`` in ``0..bound``)."""
    values = np.asarray(staleness, dtype=np.int64)
    metrics = {"rollout/staleness_mean": float(values.mean()) if len(values) else 0.0,
               "rollout/staleness_max": float(values.max()) if len(values) else 0.0}
    for s in range(bound + 1):
        metrics[f"rollout/staleness/{s}"] = float((values == s).mean()) if len(values) else 0.0
    return metrics


class AsyncRollouts:
    """A producer thread that plays generation batches at most ``max_staleness`` versions ahead.

    Args:
        play: ``play(batch_index) -> (trajectories, stats)``: plays one generation batch with the
            producer's generator (called in the producer thread only).
        load_weights: ``load_weights(snapshot)``: gives the producer's generator a posted
            snapshot (called in the producer thread only, between batches).
        max_staleness: ``k``, the most versions a batch may lag the weights it is trained on.
        first_batch: the first generation batch to play (a resumed run's position); the weights
            the producer starts from are that batch's version.
    """

    def __init__(
        self,
        play: Callable[[int], tuple[list[Trajectory], RolloutStats]],
        load_weights: Callable[[Any], None],
        max_staleness: int,
        first_batch: int = 0,
    ):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if first_batch < 0:
            raise ValueError(f"first_batch must be >= 0, got {first_batch}")
        self.play = play
        self.load_weights = load_weights
        self.max_staleness = max_staleness
        self.first_batch = first_batch
        self._cond = threading.Condition()
        self._posted_version = first_batch  # the weights the producer starts from
        self._snapshot: Any = None
        self._ready: dict[int, tuple[list[Trajectory], RolloutStats, int]] = {}
        self._error: BaseException | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="envhub-async-rollouts", daemon=True)
        self._thread.start()

    def post_weights(self, version: int, snapshot: Any) -> None:
        """The trainer's weights at version ``version`` (taken when it asks for that batch)."""
        with self._cond:
            self._posted_version = version
            self._snapshot = snapshot
            self._cond.notify_all()

    def take(self, batch: int) -> tuple[list[Trajectory], RolloutStats, int]:
        """Wait for generation batch ``batch``; return its episodes, its rollout stats and the
        weight version it was sampled with.

        Raises:
            RuntimeError: when the producer failed (its error is the cause).
        """
        with self._cond:
            while batch not in self._ready and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise RuntimeError(f"the async rollout producer failed: {self._error}") from self._error
            return self._ready.pop(batch)

    def close(self) -> None:
        """Stop the producer after the batch it is playing (its result is dropped)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=600)

    def _run(self) -> None:
        batch, loaded = self.first_batch, self.first_batch
        try:
            while True:
                with self._cond:
                    # Start batch j only with weights of version >= j - k, and hold at most k + 1 batches.
                    while not self._stopped and (
                        self._posted_version < batch - self.max_staleness or len(self._ready) > self.max_staleness
                    ):
                        self._cond.wait()
                    if self._stopped:
                        return
                    snapshot, self._snapshot = self._snapshot, None
                    version = self._posted_version
                if snapshot is not None:
                    self.load_weights(snapshot)
                    loaded = version
                trajectories, stats = self.play(batch)
                with self._cond:
                    self._ready[batch] = (trajectories, stats, loaded)
                    self._cond.notify_all()
                batch += 1
        except BaseException as exc:  # handed to the trainer at its next take()
            with self._cond:
                self._error = exc
                self._cond.notify_all()


class _Snapshot:
    """A state dict posing as a model for a generator's ``load_weights(model)``."""

    def __init__(self, state: dict[str, torch.Tensor]):
        self._state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state


def start_producer(trainer: EnvGRPOTrainer, model: Any, rows: int, group_size: int) -> AsyncRollouts:
    """The producer of an :class:`~envhub_trl.trainer.EnvGRPOTrainer`: its own generator (HF: a
    copy of ``model``; vLLM: the engine, which only it touches while training runs) and its own
    manager; batch ``b``'s groups are seeded from ``(seed, b)``, the same on every process, each
    process playing its ``rows`` rows' share. It stops when training ends."""
    args = trainer.args
    generator = trainer.generator
    sync = capabilities_of(generator).weight_sync
    if sync == "shared":
        # It samples with the trained model object, which trains meanwhile: the producer gets a
        # fresh model of the same config with the weights, not a deepcopy (a copy would carry
        # whatever the trainer has patched onto the training model at this moment).
        # A LoRA model's copy is its plain base model, holding the merged weights the trainer posts.
        base = model.get_base_model() if is_peft_model(model) else model
        copy_of_model = type(base)(base.config).to(base.device, base.dtype).eval().requires_grad_(False)
        copy_of_model.load_state_dict(merged_weights(model))
        copy_of_model.generation_config = copy.deepcopy(base.generation_config)
        generator = generator.with_model(copy_of_model)
        load = copy_of_model.load_state_dict
    elif sync == "local":
        # vLLM's engine (only the producer touches it while training runs), or a generator the
        # caller gave that takes the posted weights.
        load = lambda snapshot: generator.load_weights(_Snapshot(snapshot))  # noqa: E731
    else:
        load = lambda snapshot: None  # noqa: E731  (its weights never change)
    groups = args.generation_batch_size // group_size
    offset = trainer.accelerator.process_index * rows

    def play(batch: int) -> tuple[list[Trajectory], RolloutStats]:
        rng = np.random.default_rng([args.seed, 0xA5, batch])
        seeds = np.repeat(rng.integers(0, args.num_train_seeds, groups), group_size)[offset : offset + rows].tolist()
        manager, reset_seeds = trainer.manager_for(seeds, group_size, owner="async")
        with trainer.generator_lock:
            return pipeline.play(manager, generator, trainer.training_sampling(batch), seeds=reset_seeds, mode="continuous")

    def load_locked(snapshot: Any) -> None:
        with trainer.generator_lock:
            load(snapshot)

    trainer.add_callback(StopAsync(trainer))
    # A resumed run's producer goes on from the batch the checkpoint had reached (run_state).
    return AsyncRollouts(play, load_locked, args.max_staleness, first_batch=trainer.async_batches)
