"""The turn loop: :func:`rollout` drives an :class:`~envhub.manager.EnvGroupManager` with a
generator until every episode of the batch has ended.

Two modes, with the same records:

- ``lockstep`` (the reference): every turn, all running episodes' prompts go to the generator as
  one batch, then all their envs step as one batch. Every episode waits for the slowest reply and
  the slowest env step of the turn.
- ``continuous``: each env's next prompt is submitted as soon as that env has stepped, and each
  env steps (in a thread) as soon as its reply is done, while the other requests keep generating,
  as continuous batching does. With a streaming generator (vLLM's engine, per engine step) no
  request waits for another's turn; a batch generator (HF) streams through
  :class:`~envhub.generation.BatchStream`, one batch per poll. A deterministic generator gives
  the same trajectories in both modes.

The records it returns live in :mod:`envhub.trajectory` and are re-exported here.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from envhub.generation import Generator, SamplingParams, StreamingGenerator, as_stream
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


#: The rollout modes of :func:`rollout` (the trainer adds ``async``, which plays in ``continuous``).
ROLLOUT_MODES = ("lockstep", "continuous")


@dataclasses.dataclass
class RolloutStats:
    """Where one rollout's time went.

    Attributes:
        seconds: wall-clock time from the reset to the last episode's end.
        turns: env steps taken (one per reply).
        generate_busy_s: time the generator was working (lockstep: in ``generate``; continuous:
            in polls with requests pending).
        env_busy_s: time at least one env step was in flight (resets excluded).
    """

    seconds: float = 0.0
    turns: int = 0
    generate_busy_s: float = 0.0
    env_busy_s: float = 0.0

    @property
    def turns_per_s(self) -> float:
        """Env turns per second of the rollout."""
        return self.turns / self.seconds if self.seconds > 0 else 0.0

    @property
    def generator_idle_fraction(self) -> float:
        """The share of the rollout the generator had nothing to do (waiting for envs)."""
        return max(0.0, 1.0 - self.generate_busy_s / self.seconds) if self.seconds > 0 else 0.0

    @property
    def env_idle_fraction(self) -> float:
        """The share of the rollout no env was stepping (waiting for the generator)."""
        return max(0.0, 1.0 - self.env_busy_s / self.seconds) if self.seconds > 0 else 0.0

    def metrics(self) -> dict[str, float]:
        """The figures trainers log: ``rollout/turns_per_s``, ``rollout/generator_idle_fraction``, ``rollout/env_idle_fraction``."""
        return {
            "rollout/turns_per_s": self.turns_per_s,
            "rollout/generator_idle_fraction": self.generator_idle_fraction,
            "rollout/env_idle_fraction": self.env_idle_fraction,
        }


def rollout(
    manager: EnvGroupManager,
    generator: Generator | StreamingGenerator,
    sampling: SamplingParams | None = None,
    *,
    epoch: int = 0,
    seeds: Sequence[int] | None = None,
    on_turn: Callable[[EnvGroupManager], Any] | None = None,
    on_reset: Callable[[EnvGroupManager], Any] | None = None,
    mode: str = "lockstep",
    stats: RolloutStats | None = None,
    env_threads: int = 8,
) -> list[Trajectory]:
    """Play one batch: reset ``manager``, then alternate generation and stepping until all episodes end.

    Args:
        manager: the environments.
        generator: completes the prompts.
        sampling: sampling settings (defaults of :class:`SamplingParams` if None). With a seed,
            each turn samples with ``seed + turn`` so that turns differ but reruns repeat.
        epoch: picks the group seeds from the manager's base seed (ignored when ``seeds`` is given).
        seeds: one reset seed per group, instead of the derived ones.
        on_turn: called after every turn with the manager (progress bars); in continuous mode,
            after every env step (the manager's ``last_states`` then hold that env's answer).
        on_reset: called once after the reset, before the first prompt, with the manager.
        mode: ``"lockstep"`` or ``"continuous"`` (see the module docstring). In continuous
            mode a seeded ``sampling`` gives each request the seed of its (slot, turn), so a
            streaming generator samples the same replies whatever the order requests finish in.
        stats: filled with where the time went (:class:`RolloutStats`), when given.
        env_threads: continuous mode, in-process envs: how many env steps may run at once (env
            steps that wait on I/O, a search or a tool, overlap; an executor with its own
            workers gets one batch of steps at a time, which it spreads over them).

    Returns:
        Every episode of the batch, in slot order (group by group).
    """
    if mode not in ROLLOUT_MODES:
        raise ValueError(f"mode must be one of {ROLLOUT_MODES}, got {mode!r}")
    sampling = sampling or SamplingParams()
    stats = stats if stats is not None else RolloutStats()
    manager.reset(epoch=epoch, seeds=seeds, expert_hints=bool(getattr(generator, "uses_expert", False)))
    if on_reset is not None:
        on_reset(manager)
    started_play = time.perf_counter()
    if mode == "continuous":
        _continuous(manager, as_stream(generator), sampling, on_turn, stats, env_threads)
    else:
        turn = 0
        while True:
            prompts = manager.prompts()
            if not prompts:
                break
            turn_sampling = sampling if sampling.seed is None else dataclasses.replace(sampling, seed=sampling.seed + turn)
            t0 = time.perf_counter()
            replies = generator.generate(prompts, turn_sampling)  # type: ignore[union-attr]
            t1 = time.perf_counter()
            manager.step(replies)
            stats.generate_busy_s += t1 - t0
            stats.env_busy_s += time.perf_counter() - t1
            stats.turns += len(prompts)
            turn += 1
            if on_turn is not None:
                on_turn(manager)
    stats.seconds += time.perf_counter() - started_play
    return manager.trajectories()


def request_sampling(sampling: SamplingParams, slot: int, turn: int) -> SamplingParams:
    """The sampling of one continuous-mode request: ``sampling`` with the seed of (slot, turn)."""
    if sampling.seed is None:
        return sampling
    seed = int(np.random.SeedSequence([sampling.seed, slot, turn]).generate_state(1)[0] & 0x7FFFFFFF)
    return dataclasses.replace(sampling, seed=seed)


class _Busy:
    """Counts env steps in flight across threads and the time at least one was."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.since = 0.0
        self.total = 0.0

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self.lock:
            if self.running == 0:
                self.since = time.perf_counter()
            self.running += 1
        try:
            return fn(*args)
        finally:
            with self.lock:
                self.running -= 1
                if self.running == 0:
                    self.total += time.perf_counter() - self.since


def _continuous(
    manager: EnvGroupManager,
    stream: StreamingGenerator,
    sampling: SamplingParams,
    on_turn: Callable[[EnvGroupManager], Any] | None,
    stats: RolloutStats,
    env_threads: int,
) -> None:
    """The continuous turn loop: this thread owns the manager and the generator; env steps run in
    a thread pool and come back here to be recorded."""
    turns = {slot: 0 for slot in manager.active_slots()}
    for slot in turns:
        stream.submit(slot, manager.prompt_of(slot), request_sampling(sampling, slot, 0))
    per_slot = bool(getattr(manager.executor, "concurrent_steps", False))
    busy = _Busy()
    in_flight: dict[concurrent.futures.Future, tuple[list[int], list[Any]]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=env_threads if per_slot else 1, thread_name_prefix="envhub-env") as pool:

        def launch(slots: list[int], replies: list[Any]) -> None:
            in_flight[pool.submit(busy.run, manager.step_states, slots, replies)] = (slots, replies)

        while stream.pending() or in_flight:
            if stream.pending():
                t0 = time.perf_counter()
                finished = stream.poll()
                stats.generate_busy_s += time.perf_counter() - t0
                if per_slot:
                    for slot, completion in finished:
                        launch([slot], [completion])
                elif finished:
                    launch([slot for slot, _ in finished], [completion for _, completion in finished])
                done = [future for future in in_flight if future.done()]
            else:  # nothing to generate: wait for an env
                done, _ = concurrent.futures.wait(in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                slots, replies = in_flight.pop(future)
                manager.apply(slots, replies, future.result())
                stats.turns += len(slots)
                for slot in slots:
                    turns[slot] += 1
                    if manager.is_active(slot):
                        stream.submit(slot, manager.prompt_of(slot), request_sampling(sampling, slot, turns[slot]))
                if on_turn is not None:
                    on_turn(manager)
    stats.env_busy_s += busy.total
