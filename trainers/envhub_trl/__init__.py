"""envhub-trl: a multi-turn GRPO/GiGPO trainer on TRL, model-backed generators, a tiny test model,
and the ``train``/``eval``/``export-sft`` commands for envhub.

``EnvGRPOConfig`` and ``EnvGRPOTrainer`` are imported on first use, so that loading the plugin (every
``envhub`` command does) does not import TRL.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EnvGRPOConfig", "EnvGRPOTrainer"]


def __getattr__(name: str) -> Any:
    if name == "EnvGRPOConfig":
        from envhub_trl.config import EnvGRPOConfig

        return EnvGRPOConfig
    if name == "EnvGRPOTrainer":
        from envhub_trl.trainer import EnvGRPOTrainer

        return EnvGRPOTrainer
    raise AttributeError(f"module 'envhub_trl' has no attribute {name!r}")
