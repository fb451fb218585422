"""Success of a model on held-out seeds: one episode per seed, greedy or sampled."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from envhub.generation import Generator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.rollout import batch_metrics, rollout


def progress_bar(label: str, total: int) -> Any:
    """A click progress bar over ``total`` episodes, on stderr (stdout may carry a table or JSON)."""
    import click

    return click.progressbar(length=total, label=label, file=sys.stderr)


def finished_counter(bar: Any) -> Callable[[EnvGroupManager], None]:
    """An ``on_turn`` callback that advances ``bar`` by the episodes finished since the last turn."""
    done = [0]

    def update(manager: EnvGroupManager) -> None:
        finished = manager.num_envs - manager.num_active
        bar.update(finished - done[0])
        done[0] = finished

    return update


def evaluate_generator(
    generator: Generator,
    tokenizer: Any,
    env_id: str,
    seeds: Sequence[int],
    sampling: SamplingParams | None = None,
    label: str | None = None,
    **manager_kwargs: Any,
) -> dict[str, float]:
    """Play one episode per seed of ``seeds`` and return :func:`envhub.rollout.batch_metrics`.

    Args:
        generator: samples the replies (greedily).
        tokenizer: the model's tokenizer.
        env_id: the environment.
        seeds: one episode per seed.
        sampling: how replies are sampled; None plays greedily with replies of up to 64 tokens.
        label: show a progress bar with this label on stderr (None: none).
        **manager_kwargs: rendering and episode settings for :class:`~envhub.manager.EnvGroupManager`
            (``EnvGRPOConfig.manager_kwargs()`` gives a training run's).
    """
    manager = EnvGroupManager(env_id, len(seeds), 1, tokenizer=tokenizer, **manager_kwargs)
    bar = progress_bar(label, len(seeds)) if label else contextlib.nullcontext()
    with manager, bar as shown:
        on_turn = finished_counter(shown) if label else None
        trajectories = rollout(manager, generator, sampling or SamplingParams(temperature=0.0), seeds=list(seeds), on_turn=on_turn)
    return batch_metrics(trajectories)


def held_out_seeds(offset: int, count: int) -> list[int]:
    """The held-out evaluation seeds ``offset .. offset + count - 1`` (training seeds lie below ``offset``)."""
    return list(range(offset, offset + count))
