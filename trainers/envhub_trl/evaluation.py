"""Success of a model on held-out seeds: one episode per seed, greedy or sampled."""

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
    sampling: SamplingParams | None = None,
    **manager_kwargs: Any,
) -> dict[str, float]:
    """Play one episode per seed of ``seeds`` and return :func:`envhub.rollout.batch_metrics`.

    Args:
        generator: samples the replies (greedily).
        tokenizer: the model's tokenizer.
        env_id: the environment.
        seeds: one episode per seed.
        sampling: how replies are sampled; None plays greedily with replies of up to 64 tokens.
        **manager_kwargs: rendering and episode settings for :class:`~envhub.manager.EnvGroupManager`
            (``EnvGRPOConfig.manager_kwargs()`` gives a training run's).
    """
    manager = EnvGroupManager(env_id, len(seeds), 1, tokenizer=tokenizer, **manager_kwargs)
    with manager:
        trajectories = rollout(manager, generator, sampling or SamplingParams(temperature=0.0), seeds=list(seeds))
    return batch_metrics(trajectories)


def held_out_seeds(offset: int, count: int) -> list[int]:
    """The held-out evaluation seeds ``offset .. offset + count - 1`` (training seeds lie below ``offset``)."""
    return list(range(offset, offset + count))
