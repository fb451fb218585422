"""LoRA through PEFT: the ``lora`` mapping of a training config, and what a run does with an adapter.

With ``lora: {r: 16, alpha: 32}`` (flag ``--lora-r``) ``envhub train`` trains a low-rank adapter
instead of every weight:

- the warm start trains the adapter, then :func:`fold_adapter` adds it into the base weights and
  starts the adapter again from zero, so RL's reference (the adapter switched off, as TRL does
  with PEFT) is the warm-started policy, not the model before it;
- a vLLM generator receives the merged weights after every step (:func:`merged_weights`), under
  the base model's names, so vLLM serves the policy without knowing about adapters;
- the saved model is the merged one, which ``envhub eval --model OUT/final`` loads as any model.

``peft`` is imported only when a run asks for LoRA.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

#: PEFT's name for every linear layer but the output head.
ALL_LINEAR = "all-linear"


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """A LoRA adapter's shape: the ``lora`` mapping of a training config.

    Attributes:
        r: the adapter's rank.
        alpha: its scale numerator (the update is ``alpha / r * B @ A``).
        dropout: dropout on the adapter's input.
        target_modules: the modules that get an adapter: ``"all-linear"`` (every linear layer but
            the output head) or a list of module names (``[q_proj, v_proj]``).
    """

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = ALL_LINEAR

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"lora.r must be a positive integer, got {self.r!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or self.alpha <= 0:
            raise ValueError(f"lora.alpha must be a positive number, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        targets = self.target_modules
        if isinstance(targets, (list, tuple)):
            if not targets or not all(isinstance(t, str) and t for t in targets):
                raise ValueError(f"lora.target_modules must be {ALL_LINEAR!r} or a non-empty list of module names, got {targets!r}")
            object.__setattr__(self, "target_modules", tuple(targets))
        elif targets != ALL_LINEAR:
            raise ValueError(f"lora.target_modules must be {ALL_LINEAR!r} or a list of module names, got {targets!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> "LoraSettings | None":
        """From a config file's ``lora`` mapping (None: no LoRA); an unknown key is an error that
        lists the known ones."""
        from envhub_trl.config_file import settings_from_mapping

        return None if values is None else settings_from_mapping(cls, values, "lora")

    def record(self) -> dict[str, Any]:
        """The settings as a run records them (lists, not tuples, as YAML and JSON give them back)."""
        targets = self.target_modules
        return {**dataclasses.asdict(self), "target_modules": list(targets) if isinstance(targets, tuple) else targets}

    def peft_config(self) -> Any:
        """PEFT's ``LoraConfig`` for a causal language model."""
        try:
            from peft import LoraConfig
        except ImportError as exc:  # pragma: no cover - peft is installed with envhub-trl
            raise ImportError("lora needs the peft package: pip install peft") from exc
        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets, task_type="CAUSAL_LM")


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` carries PEFT adapters (a ``PeftModel``)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def _lora_layers(model: Any) -> Iterator[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    for name, module in model.get_base_model().named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def merged_weights(model: Any) -> dict[str, Any]:
    """``model``'s weights with its active adapters added in, under the base model's own names
    (``model.layers.0.self_attn.q_proj.weight``); ``model`` itself is left as it is. A model
    without adapters gives its state dict."""
    if not is_peft_model(model):
        return dict(model.state_dict())
    base = model.get_base_model()
    weights = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        weights[name.replace(".base_layer.", ".")] = tensor
    for name, layer in _lora_layers(model):
        weight = layer.base_layer.weight
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                weight = weight + layer.get_delta_weight(adapter)
        weights[f"{name}.weight"] = weight.detach()
    return weights


def fold_adapter(model: Any) -> None:
    """Add ``model``'s active adapters into its base weights and start them again from zero
    (``B = 0``, so the policy is unchanged): the base model, which PEFT's reference is, becomes
    the current policy. A model without adapters is left alone."""
    if not is_peft_model(model):
        return
    import torch

    with torch.no_grad():
        for _, layer in _lora_layers(model):
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    layer.base_layer.weight += layer.get_delta_weight(adapter)
                    layer.reset_lora_parameters(adapter, True)


def merged_model(model: Any) -> Any:
    """A plain model with ``model``'s adapters merged in (a copy; ``model`` keeps its adapters),
    to save for loading without PEFT. A model without adapters is returned as it is."""
    if not is_peft_model(model):
        return model
    import copy

    return copy.deepcopy(model).merge_and_unload()
