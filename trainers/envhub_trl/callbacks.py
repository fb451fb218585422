"""The trainer's callbacks: what must happen at ``transformers.Trainer``'s step and run boundaries."""

from __future__ import annotations

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
