"""Success of a model on held-out seeds: greedy episodes, one per seed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envhub.generation import Generator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.rollout import batch_metrics, rollout


def evaluate_generator(
    generator: Generator,
    tokenizer: Any,
    env_id: str,
    seeds: Sequence[int],
    *,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    max_turn_tokens: int = 64,
    max_prompt_tokens: int | None = None,
    action_format: str = "answer",
    system_prompt: str | None = None,
    show_legal_actions: bool = True,
) -> dict[str, float]:
    """Play one greedy episode per seed of ``seeds`` and return :func:`envhub.rollout.batch_metrics`."""
    manager = EnvGroupManager(
        env_id, len(seeds), 1, max_turns=max_turns, env_kwargs=env_kwargs, tokenizer=tokenizer,
        max_prompt_tokens=max_prompt_tokens, action_format=action_format, system_prompt=system_prompt,
        show_legal_actions=show_legal_actions,
    )
    with manager:
        trajectories = rollout(manager, generator, SamplingParams(max_new_tokens=max_turn_tokens, temperature=0.0), seeds=list(seeds))
    return batch_metrics(trajectories)


def held_out_seeds(offset: int, count: int) -> list[int]:
    """The held-out evaluation seeds ``offset .. offset + count - 1`` (training seeds lie below ``offset``)."""
    return list(range(offset, offset + count))
