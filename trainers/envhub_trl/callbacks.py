"""The trainer's callbacks: what must happen at ``transformers.Trainer``'s step and run boundaries."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback

from envhub_trl.critic import ValueHead

if TYPE_CHECKING:
    from envhub_trl.trainer import EnvGRPOTrainer


class StopAsync(TrainerCallback):
    """Stops the async producer when training ends (it would otherwise play one batch too many)."""

    def __init__(self, trainer: EnvGRPOTrainer):
        self.trainer = trainer

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.stop_async()


class ZeroCriticGradients(TrainerCallback):
    """Clear the value head's gradients after each optimizer step: the Trainer clears the model's
    alone, and the head lives beside it, so its gradients would otherwise sum over every step so far
    (and a resumed run, whose head starts with none, would train it differently)."""

    def __init__(self, head: ValueHead):
        self.head = head

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.head.zero_grad(set_to_none=True)


class AverageCriticGradients(TrainerCallback):
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


def _clock(seconds: float) -> str:
    """``seconds`` as ``m:ss`` (``h:mm:ss`` from an hour)."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_line(step: int, total: int, metrics: Mapping[str, list[float]], step_seconds: float, eta_seconds: float) -> str:
    """One RL step in words: ``RL step 3/10: training success 25.0%, return 0.25, invalid replies
    12.5%, 4.1 s/step, ETA 0:29`` (a metric the step has not logged is left out). With
    ``retry_unsolved_rounds``, training success is the first round's, the policy's own, and the
    batch's (its kept wins in) follows it."""
    parts = [f"RL step {step}/{total}:"]
    shown = (("env/success_rate", "training success {:.1%}"), ("env/mean_return", "return {:.3g}"), ("env/invalid_action_rate", "invalid replies {:.1%}"))
    figures = [text.format(metrics[key][-1]) for key, text in shown if metrics.get(key)]
    if metrics.get("retry/success_first") and metrics.get("env/success_rate"):
        figures[0] = f"training success {metrics['retry/success_first'][-1]:.1%} ({metrics['env/success_rate'][-1]:.1%} with the retries' wins)"
    figures += [f"{step_seconds:.1f} s/step", f"ETA {_clock(eta_seconds)}"]
    return " ".join(parts) + " " + ", ".join(figures)


class StepProgress(TrainerCallback):
    """One line per RL step, wherever stderr goes (a terminal, a file, a pipe): the step, training
    success, return and invalid-reply rate of the batch it trained on, its seconds and the time left.

    The figures are those the step adds to TRL's next log line (read before that line averages and
    clears them), so they show at every step whatever ``logging_steps`` is.
    """

    def __init__(self, trainer: EnvGRPOTrainer, say: Callable[[str], None]):
        self.trainer, self.say = trainer, say
        self.began: float | None = None
        self.last = 0.0
        self.first_step = 0
        self.latest: dict[str, list[float]] = {}  # a step that trains on an earlier step's batch shows that batch

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.began = self.last = time.perf_counter()
        self.first_step = state.global_step  # a resumed run's steps before this process are not timed

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from envhub_trl.trl_bridge import pending_metrics

        now = time.perf_counter()
        step_seconds, self.last = now - self.last, now
        self.latest.update({k: v for k, v in pending_metrics(self.trainer).items() if v})
        if not state.is_world_process_zero:
            return
        done = max(1, state.global_step - self.first_step)
        eta = (now - (self.began or now)) / done * max(0, state.max_steps - state.global_step)
        self.say(progress_line(state.global_step, state.max_steps, self.latest, step_seconds, eta))
