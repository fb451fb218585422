"""The turn loop: :func:`rollout` drives an :class:`~envhub.manager.EnvGroupManager` with a
generator until every episode of the batch has ended.

The records it returns live in :mod:`envhub.trajectory` and are re-exported here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from envhub.generation import Generator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.trajectory import (  # noqa: F401  (re-exported: the records of a rollout)
    END_REASONS,
    Sample,
    Trajectory,
    Turn,
    batch_columns,
    batch_metrics,
    step_arrays,
    to_samples,
)


def rollout(
    manager: EnvGroupManager,
    generator: Generator,
    sampling: SamplingParams | None = None,
    *,
    epoch: int = 0,
    seeds: Sequence[int] | None = None,
    on_turn: Callable[[EnvGroupManager], Any] | None = None,
    on_reset: Callable[[EnvGroupManager], Any] | None = None,
) -> list[Trajectory]:
    """Play one batch: reset ``manager``, then alternate generation and stepping until all episodes end.

    Args:
        manager: the environments.
        generator: completes the prompts.
        sampling: sampling settings (defaults of :class:`SamplingParams` if None). With a seed,
            each turn samples with ``seed + turn`` so that turns differ but reruns repeat.
        epoch: picks the group seeds from the manager's base seed (ignored when ``seeds`` is given).
        seeds: one reset seed per group, instead of the derived ones.
        on_turn: called after every turn with the manager (progress bars).
        on_reset: called once after the reset, before the first prompt, with the manager.

    Returns:
        Every episode of the batch, in slot order (group by group).
    """
    sampling = sampling or SamplingParams()
    manager.reset(epoch=epoch, seeds=seeds, expert_hints=bool(getattr(generator, "uses_expert", False)))
    if on_reset is not None:
        on_reset(manager)
    turn = 0
    while True:
        prompts = manager.prompts()
        if not prompts:
            break
        turn_sampling = sampling if sampling.seed is None else dataclasses.replace(sampling, seed=sampling.seed + turn)
        manager.step(generator.generate(prompts, turn_sampling))
        turn += 1
        if on_turn is not None:
            on_turn(manager)
    return manager.trajectories()
