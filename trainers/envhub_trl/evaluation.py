"""Success of a model on held-out seeds: one episode per seed, greedy or sampled."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from envhub.generation import Generator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.rollout import batch_metrics, rollout
from envhub.settings import EnvSettings


#: Seconds between two progress lines where stderr is a file or a pipe.
PROGRESS_EVERY_S = 10.0


class LineProgress:
    """Progress over ``total`` episodes as whole lines (episodes done, seconds elapsed), for a
    stream that is a file or a pipe: click's bar shows only its label there, so a long evaluation
    in a log looked stuck. A line at the start, at most one every ``every_s`` seconds, and one at
    the end.

    The same ``update``/context-manager interface as a click progress bar.
    """

    def __init__(self, label: str, total: int, file: IO[str], every_s: float = PROGRESS_EVERY_S):
        self.label, self.total, self.file, self.every_s = label, total, file, every_s
        self.done = 0
        self.started = self.shown = time.monotonic()

    def _line(self) -> None:
        print(f"{self.label}: {self.done}/{self.total} episodes, {time.monotonic() - self.started:.0f} s", file=self.file, flush=True)
        self.shown = time.monotonic()

    def __enter__(self) -> LineProgress:
        self.started = time.monotonic()
        self._line()
        return self

    def update(self, n: int) -> None:
        """Count ``n`` more finished episodes (0: none finished this turn); write a line if
        ``every_s`` has passed since the last, so that a slow batch still shows it is alive."""
        self.done += n
        if self.done < self.total and time.monotonic() - self.shown >= self.every_s:
            self._line()

    def __exit__(self, *exc_info: Any) -> None:
        if exc_info[0] is None:
            self._line()


def progress_bar(label: str, total: int) -> Any:
    """Progress over ``total`` episodes on stderr (stdout may carry a table or JSON): click's bar
    on a terminal, :class:`LineProgress` lines on a file or a pipe."""
    import click

    if not sys.stderr.isatty():
        return LineProgress(label, total, sys.stderr)
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
    settings: EnvSettings,
    seeds: Sequence[int],
    sampling: SamplingParams | None = None,
    label: str | None = None,
    members: int = 1,
) -> dict[str, float]:
    """Play one episode per seed of ``seeds`` (``members`` per seed) and return
    :func:`envhub.rollout.batch_metrics`; with ``members`` > 1 also ``pass_at_k``, the share of
    seeds that any of their ``members`` episodes solved (pass@k with k = ``members``).

    Args:
        generator: samples the replies (greedily).
        tokenizer: the model's tokenizer.
        settings: the environment and how it is played (``EnvGRPOConfig.env_settings()`` gives a
            training run's).
        seeds: one episode per seed.
        sampling: how replies are sampled; None plays greedily with replies of up to 64 tokens.
        label: show a progress bar with this label on stderr (None: none).
        members: episodes per seed, all reset with that seed (sampled apart by ``sampling``).
    """
    manager = EnvGroupManager.from_settings(settings, len(seeds), members, tokenizer=tokenizer)
    bar = progress_bar(label, len(seeds) * members) if label else contextlib.nullcontext()
    with manager, bar as shown:
        on_turn = finished_counter(shown) if label else None
        trajectories = rollout(manager, generator, sampling or SamplingParams(temperature=0.0), seeds=list(seeds), on_turn=on_turn)
    metrics = batch_metrics(trajectories)
    if members > 1:
        solved: dict[int, bool] = {}
        for trajectory in trajectories:
            solved[trajectory.group_id] = solved.get(trajectory.group_id, False) or bool(trajectory.success)
        metrics["pass_at_k"] = sum(solved.values()) / len(solved)
    return metrics


def held_out_seeds(offset: int, count: int) -> list[int]:
    """The held-out evaluation seeds ``offset .. offset + count - 1`` (training seeds lie below ``offset``)."""
    return list(range(offset, offset + count))


def reference_figures(
    settings: EnvSettings,
    seeds: Sequence[int],
    *,
    seed: int,
    tokenizer: Any | None = None,
    play: Callable[[Generator], float] | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[dict[str, float], Any]:
    """The reference policies on ``seeds`` (the scale of a results table, see
    :func:`envhub.baselines.reference_policies`) and the open-loop search behind one of them (None
    where the env has no finite action list), for ``envhub train`` and ``envhub eval`` alike.

    Args:
        settings: the environment as the evaluation played it.
        seeds: the evaluation's seeds.
        seed: seeds the random policy.
        tokenizer: for a ``play`` whose manager has one.
        play: a model-free generator's success rate on ``seeds`` (a trainer's evaluation, under
            the training prompt settings); None: :func:`envhub.baselines.policy_success_rate`.
        say: given a line on how long the open-loop search took (None: silent).
    """
    from envhub.baselines import best_open_loop, reference_policies
    from envhub.error import PolicyError

    searched = time.perf_counter()
    try:
        open_loop = best_open_loop(settings.env_id, seeds, settings.max_turns, settings.env_kwargs)
    except PolicyError:
        open_loop = None
    else:
        if say is not None:
            how = "exhaustive" if open_loop.exhaustive else f"beam of {open_loop.beam_width}"
            say(f"open-loop search: {open_loop.joint_states} joint states ({how}) in {time.perf_counter() - searched:.1f}s")
    references = reference_policies(settings, seeds, seed=seed, tokenizer=tokenizer, open_loop=open_loop, play=play)
    return references, open_loop
