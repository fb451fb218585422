"""PPO's critic: a value head on the policy's trunk, and what the trainer needs around it.

Why a head on the trunk rather than a separate critic model: the value of a turn is read from the
same forward pass that scores the policy (the final hidden state at the turn's last prompt
token), so PPO costs one linear layer and a second loss term over GRPO, not a second model's
memory, forward and backward; the tiny and 135M models envhub trains on CPUs could not afford a
second copy. The price is that value and policy gradients share the trunk (``vf_coef`` weighs
them), as in the PPO of RL4LMs, TRL's old ``AutoModelForCausalLMWithValueHead`` and verl-agent's
shared-backbone option.

The head is a ``Linear(hidden_size, 1)`` kept beside the model, not inside it, so that every
checkpoint stays a plain Hugging Face model that vLLM and ``envhub eval`` load unchanged; it is
saved next to it as ``value_head.safetensors``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from envhub.trajectory import Sample

#: The critic's file in a checkpoint folder.
VALUE_HEAD_FILE = "value_head.safetensors"


class ValueHead(nn.Module):
    """``V(s) = w . h + b`` on the trunk's final hidden state ``h``; starts at 0 everywhere."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)

    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, str(Path(folder) / VALUE_HEAD_FILE))

    def load(self, folder: str | Path) -> bool:
        """Load the head saved in ``folder``; False when it holds none."""
        from safetensors.torch import load_file

        path = Path(folder) / VALUE_HEAD_FILE
        if not path.exists():
            return False
        self.load_state_dict(load_file(str(path), device=str(self.linear.weight.device)))
        return True


def final_norm(model: Any) -> nn.Module:
    """The module whose output is the trunk's final hidden state (a decoder's last norm), through
    PEFT and DDP wrappers.

    Raises:
        ValueError: for a model without one where envhub knows to look.
    """
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module  # DDP
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()  # PEFT
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    for name in ("norm", "final_layernorm", "ln_f"):
        module = getattr(decoder, name, None)
        if isinstance(module, nn.Module):
            return module
    raise ValueError(f"ppo's value head needs the final norm of {type(model).__name__}'s decoder (norm, final_layernorm or ln_f)")


@contextlib.contextmanager
def captured_hidden_states(model: Any) -> Iterator[list[torch.Tensor]]:
    """Within the block, every forward pass of ``model`` appends its final hidden states
    ``(batch, length, hidden)`` to the yielded list (gradients kept)."""
    captured: list[torch.Tensor] = []
    handle = final_norm(model).register_forward_hook(lambda module, inputs, output: captured.append(output))
    try:
        yield captured
    finally:
        handle.remove()


def turn_starts(samples: Sequence[Sample]) -> list[dict[int, int]]:
    """Per row, the completion index of each turn's first model token (``{turn: index}``); none for
    padding rows. The turn's value is read one position earlier: its last prompt token."""
    starts = []
    for sample in samples:
        row: dict[int, int] = {}
        if sample.trajectory_index >= 0:
            for j, (turn, model_token) in enumerate(zip(sample.turn_ids, sample.env_mask)):
                if model_token and turn not in row:
                    row[int(turn)] = j
        starts.append(row)
    return starts


def value_positions(starts: Sequence[dict[int, int]], prompt_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where to read each row's turn values in the (left-padded prompt + completion) sequence:
    ``(positions, mask)``, each ``(rows, most turns in a row)``, turns in order."""
    most = max((len(row) for row in starts), default=0) or 1
    positions = np.zeros((len(starts), most), dtype=np.int64)
    mask = np.zeros((len(starts), most), dtype=np.float32)
    for i, row in enumerate(starts):
        for k, turn in enumerate(sorted(row)):
            positions[i, k] = prompt_width + row[turn] - 1
            mask[i, k] = 1.0
    return torch.from_numpy(positions), torch.from_numpy(mask)


def read_values(head: ValueHead, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The head's values at ``positions`` (``(rows, k)``) of ``hidden`` (``(rows, length, size)``)."""
    index = positions.to(hidden.device).unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    return head(torch.gather(hidden, 1, index))


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float) -> torch.Tensor:
    """PPO's clipped value loss, ``0.5 max((V - R)^2, (V_clip - R)^2)`` with ``V_clip`` the old
    value plus the change clipped to ``[-clip, clip]``, averaged over the masked turns."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    loss = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return (loss * mask).sum() / mask.sum().clamp(min=1.0)
