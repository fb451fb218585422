"""Reference policies: what a learned policy's success rate should be compared with.

On a set of seeds, :func:`reference_policies` reports the success rate of

- ``random policy``: a uniformly random legal action every turn;
- ``open-loop``: the best *fixed* action sequence for those seeds, the same sequence played on
  every seed whatever the observations say (:func:`best_open_loop`). It is what a policy that
  ignores its observations can reach, so a model that beats it reads its observations;
- ``expert``: the environment's oracle (``expert_action()``);
- ``optimal``: the physical limit, the mean over the seeds of the environment's
  ``optimal_success_probability()``, where the environment knows it.

A reference an environment cannot provide (no finite action list, no expert, no known limit) is
left out of the result rather than guessed.

The open-loop search plays each seed's episode exactly as the manager does: an action illegal in
some state is an invalid turn that leaves the state unchanged, and the turn limit truncates. It
grows action prefixes breadth first and keeps, per prefix, every seed's environment and outcome.
Prefixes whose *joint state* (over the seeds: each live episode's turn, count of valid moves and
``state_key``, or whether it ended in success or failure) is identical have identical futures, so
they are merged. A prefix that cannot reach the best number of successes already assured (its
successes plus its live episodes fall short of it) is dropped, which cannot change the result.
When more than ``beam_width`` joint states remain at a depth, the search keeps the best by
(successes so far, episodes still running, then the first sequence in the environment's action
order) and the result is marked non-exhaustive: a lower estimate of the best fixed sequence.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from envhub.core import TextEnv
from envhub.error import PolicyError
from envhub.generation import ExpertGenerator, Generator, RandomGenerator, SamplingParams
from envhub.settings import EnvSettings

#: Joint states kept per depth of the open-loop search before it turns into a beam search.
DEFAULT_BEAM_WIDTH = 4096

#: The names of the references, in the order tables list them.
REFERENCE_NAMES = ("random policy", "open-loop", "expert", "optimal")

# Per-seed state ids of the search: the two ends of an episode, then live states from 2 on.
_SUCCEEDED, _FAILED, _FIRST_LIVE = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class OpenLoopResult:
    """The best fixed action sequence found for a set of seeds.

    Each seed fixes the environment's randomness, its dynamics included, so a (seed, sequence)
    pair always plays out the same way. On stochastic dynamics (slippery FrozenLake) the best
    sequence for these seeds is therefore fitted to their noise too: ``success_rate`` is an
    optimistic (upper) estimate of what open-loop play reaches on fresh noise, the safe side for
    a baseline a learned policy is meant to beat.

    Attributes:
        actions: the sequence; shorter than the turn limit when every episode ends before it.
        successes: how many seeds it wins.
        num_seeds: how many seeds were searched.
        exhaustive: True when no joint state was dropped for the beam, so no fixed sequence does
            better on these seeds; False for a beam search (a lower estimate of the best).
        max_turns: the turn limit the episodes were played under.
        beam_width: the beam width the search ran with.
        joint_states: the joint states expanded, over all depths (the work done).
    """

    actions: tuple[str, ...]
    successes: int
    num_seeds: int
    exhaustive: bool
    max_turns: int
    beam_width: int
    joint_states: int

    @property
    def success_rate(self) -> float:
        """``successes / num_seeds``."""
        return self.successes / self.num_seeds

    def describe(self) -> str:
        """One line saying what the figure is, for tables and reports."""
        search = "exhaustive search" if self.exhaustive else f"beam search of width {self.beam_width}, a lower estimate"
        return (
            f"the best fixed sequence for these {self.num_seeds} seeds, {', '.join(self.actions) or '(none)'} "
            f"({search}, {self.max_turns} turns; on stochastic dynamics it is fitted to these seeds' noise, "
            "an upper estimate for fresh noise)"
        )


EnvSource = str | Callable[..., TextEnv]


def _builder(env: EnvSource, max_turns: int | None, env_kwargs: Mapping[str, Any] | None) -> Callable[[], TextEnv]:
    """A function making one environment from an id or a factory, with the turn limit applied."""
    kwargs = dict(env_kwargs or {})
    if isinstance(env, str):
        from envhub.registration import make

        return lambda: make(env, max_turns=max_turns, **kwargs)

    def build() -> TextEnv:
        made = env(**kwargs)
        if max_turns is not None:
            made.max_turns = max_turns
        return made

    return build


def _copies(env: TextEnv, count: int) -> list[TextEnv]:
    """``count`` independent copies of ``env`` (pickled once; deep copies where pickling fails)."""
    try:
        blob = pickle.dumps(env, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return [copy.deepcopy(env) for _ in range(count)]
    return [pickle.loads(blob) for _ in range(count)]


class _Layer:
    """One seed's live states at one depth of the search: an environment in each, by state id."""

    __slots__ = ("index", "states")

    def __init__(self) -> None:
        self.index: dict[tuple[int, str], int] = {}
        self.states: list[tuple[TextEnv, int]] = []

    def add(self, env: TextEnv, valid_moves: int, key: str) -> int:
        """The id of the state ``(valid_moves, key)``, keeping ``env`` if it is new."""
        found = self.index.get((valid_moves, key))
        if found is None:
            found = self.index[(valid_moves, key)] = _FIRST_LIVE + len(self.states)
            self.states.append((env, valid_moves))
        return found


def _expand(layer: _Layer, ids: np.ndarray, actions: Sequence[str], following: _Layer) -> np.ndarray:
    """The transition table ``[state id, action] -> next state id`` for the live ``ids`` of a layer.

    Rows of states not in ``ids`` are left as failures; the search never reads them.
    """
    table = np.full((_FIRST_LIVE + len(layer.states), len(actions)), _FAILED, dtype=np.int32)
    table[_SUCCEEDED] = _SUCCEEDED
    for state in ids.tolist():
        env, valid_moves = layer.states[state - _FIRST_LIVE]
        # The state's own env plays the last action; the others play on copies.
        for column, (action, child) in enumerate(zip(actions, [*_copies(env, len(actions) - 1), env])):
            _, _, terminated, truncated, info = child.step(action)
            if terminated or truncated:
                table[state, column] = _SUCCEEDED if info["success"] else _FAILED
            else:
                table[state, column] = following.add(child, valid_moves + bool(info["action_is_valid"]), info["state_key"])
    return table


def best_open_loop(
    env: EnvSource,
    seeds: Sequence[int],
    max_turns: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    beam_width: int = DEFAULT_BEAM_WIDTH,
) -> OpenLoopResult:
    """Search the fixed action sequence that wins the most of ``seeds`` (see the module docstring).

    The actions are the union of ``valid_actions()`` at reset over the seeds, in first-seen order.
    Among equally good sequences the result is the shortest, then the first in that action order;
    the same seeds give the same result in any process.

    The merging of prefixes assumes an episode's future is fixed by its seed, turn, number of
    valid moves and ``state_key``: true of deterministic environments and of those, like
    FrozenLake, whose dynamics draw a fixed amount of randomness per move.

    Args:
        env: an environment id, or a factory called with ``env_kwargs`` that returns a ``TextEnv``.
        seeds: one episode per seed.
        max_turns: the turn limit; None keeps the environment's (as the manager does).
        env_kwargs: keyword arguments for ``envhub.make`` (or the factory).
        beam_width: the most joint states kept per depth (see :data:`DEFAULT_BEAM_WIDTH`).

    Raises:
        ValueError: with no seeds or a beam width below 1.
        PolicyError: when the environment has no finite action list, or no turn limit at all, or
            it raises (at reset or in a step): no sequence can be scored on it.
    """
    if not seeds:
        raise ValueError("best_open_loop needs at least one seed")
    if beam_width < 1:
        raise ValueError(f"beam_width must be at least 1, got {beam_width}")
    # The search makes and drops many short-lived copies; the cyclic collector scanning them
    # would double its time. Cycles among the dropped copies are collected once per depth.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _search(env, seeds, max_turns, env_kwargs, beam_width)
    except PolicyError:
        raise
    except Exception as exc:  # the env's own failure: as in a rollout, it ends what it was playing
        raise PolicyError(f"the open-loop search cannot play the environment: it raised {type(exc).__name__}: {exc}") from exc
    finally:
        if collecting:
            gc.enable()


def _search(
    env: EnvSource, seeds: Sequence[int], max_turns: int | None, env_kwargs: Mapping[str, Any] | None, beam_width: int
) -> OpenLoopResult:
    build = _builder(env, max_turns, env_kwargs)
    layers, actions = [], []
    for seed in seeds:
        made = build()
        if not made.searchable:
            raise PolicyError(f"{made.spec.id if made.spec else type(made).__name__} cannot be searched open-loop (searchable = False)")
        made.reset(seed=int(seed))
        legal = made.valid_actions()
        if legal is None:
            raise PolicyError(f"{made.spec.id if made.spec else type(made).__name__} has no finite action list; the open-loop search needs one")
        actions += [a for a in legal if a not in actions]
        layer = _Layer()
        layer.add(made, 0, "")
        layers.append(layer)
    limit = made.max_turns
    if limit is None:
        raise PolicyError("the environment has no turn limit; pass max_turns to bound the open-loop search")

    frontier = np.full((1, len(seeds)), _FIRST_LIVE, dtype=np.int32)
    history: list[tuple[np.ndarray, np.ndarray]] = []  # per depth: each kept prefix's parent and last action
    best = (-1, 0, 0, 0)  # successes, depth, parent, action of the best finished prefix
    exhaustive, expanded = True, 0
    for depth in range(1, limit + 1):
        expanded += len(frontier)
        children = np.empty((len(frontier) * len(actions), len(seeds)), dtype=np.int32)
        following = []
        for s, layer in enumerate(layers):
            column = frontier[:, s]
            following.append(_Layer())
            table = _expand(layer, np.unique(column[column >= _FIRST_LIVE]), actions, following[-1])
            children[:, s] = table[column].reshape(-1)
        layers = following
        gc.collect(1)
        successes = (children == _SUCCEEDED).sum(axis=1)
        live = (children >= _FIRST_LIVE).sum(axis=1)
        ended = np.flatnonzero(live == 0)
        if len(ended) and successes[ended].max() > best[0]:
            row = int(ended[np.argmax(successes[ended])])  # argmax: the first of equals
            best = (int(successes[row]), depth, row // len(actions), row % len(actions))
        assured = max(best[0], int(successes.max()))
        keep = np.flatnonzero((live > 0) & (successes + live >= assured))
        if not len(keep):
            break
        # Merge equal joint states, keeping the first prefix of each (the rows are in prefix order).
        rows = np.ascontiguousarray(children[keep]).view(np.dtype((np.void, children.itemsize * len(seeds))))
        _, first = np.unique(rows.ravel(), return_index=True)
        keep = keep[np.sort(first)]
        if len(keep) > beam_width:
            exhaustive = False
            order = np.lexsort((keep, -live[keep], -successes[keep]))[:beam_width]
            keep = keep[np.sort(order)]
        history.append((keep // len(actions), keep % len(actions)))
        frontier = children[keep]
        if depth == limit:  # an environment that does not truncate at its limit: stop here anyway
            row = int(np.argmax(successes[keep]))
            if successes[keep][row] > best[0]:
                best = (int(successes[keep][row]), depth, int(keep[row]) // len(actions), int(keep[row]) % len(actions))

    successes, depth, parent, action = best
    sequence = [actions[action]]
    for parents, moves in reversed(history[: depth - 1]):
        sequence.append(actions[int(moves[parent])])
        parent = int(parents[parent])
    return OpenLoopResult(tuple(reversed(sequence)), successes, len(seeds), exhaustive, limit, beam_width, expanded)


def optimal_success_rate(
    env: EnvSource, seeds: Sequence[int], max_turns: int | None = None, env_kwargs: Mapping[str, Any] | None = None
) -> float | None:
    """The mean over ``seeds`` of ``optimal_success_probability()`` at reset, or None where any
    episode does not know its limit (see :meth:`envhub.core.TextEnv.optimal_success_probability`)
    or its env raises at reset."""
    made = _builder(env, max_turns, env_kwargs)()
    values = []
    for seed in seeds:
        try:
            made.reset(seed=int(seed))
        except Exception:  # the env's own failure: no optimum to know
            return None
        value = made.optimal_success_probability()
        if value is None:
            return None
        values.append(float(value))
    return float(np.mean(values))


def policy_success_rate(
    env_id: str,
    seeds: Sequence[int],
    generator: Generator,
    max_turns: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> float:
    """The success rate of a model-free ``generator`` (random, expert) on one episode per seed,
    played by an :class:`~envhub.manager.EnvGroupManager` in text (no tokenizer, no context budget)."""
    from envhub.manager import EnvGroupManager
    from envhub.rollout import batch_metrics, rollout

    with EnvGroupManager(env_id, len(seeds), 1, max_turns=max_turns, env_kwargs=env_kwargs) as manager:
        trajectories = rollout(manager, generator, SamplingParams(temperature=0.0), seeds=list(seeds))
    return batch_metrics(trajectories)["success_rate"]


def reference_policies(
    settings: EnvSettings,
    seeds: Sequence[int],
    *,
    seed: int = 0,
    beam_width: int = DEFAULT_BEAM_WIDTH,
    tokenizer: Any | None = None,
    play: Callable[[Generator], float] | None = None,
    open_loop: OpenLoopResult | None = None,
) -> dict[str, float]:
    """The success rates of the reference policies on ``seeds``, in :data:`REFERENCE_NAMES` order.

    Args:
        settings: the environment (its env kwargs and turn limit; use the evaluation's own).
        seeds: one episode per seed, the seeds the learned policy is evaluated on.
        seed: seeds the random policy.
        beam_width: of the open-loop search.
        tokenizer: turns the random and expert replies into token ids (for a ``play`` whose
            manager has one, as a trainer's does); None: text only.
        play: returns the success rate of a model-free generator on ``seeds``; by default
            :func:`policy_success_rate`. A trainer passes its own evaluation, so that the
            references play under the training prompt settings.
        open_loop: an open-loop search already run on these seeds, to reuse.

    Returns:
        ``{"random policy": ..., "open-loop": ..., "expert": ..., "optimal": ...}``, leaving out
        what the environment cannot provide: the random policy and the open-loop search without a
        finite action list (the search also without a turn limit), the expert without an oracle,
        ``optimal`` where the limit is unknown.
    """
    env_id, max_turns, env_kwargs = settings.env_id, settings.max_turns, settings.env_kwargs
    if play is None:
        def play(generator: Generator) -> float:
            return policy_success_rate(env_id, seeds, generator, max_turns, env_kwargs)

    out: dict[str, float] = {}
    try:
        out["random policy"] = play(RandomGenerator(seed=seed, tokenizer=tokenizer))
    except PolicyError:
        pass
    if open_loop is None:
        try:
            open_loop = best_open_loop(env_id, seeds, max_turns, env_kwargs, beam_width)
        except PolicyError:
            pass
    if open_loop is not None:
        out["open-loop"] = open_loop.success_rate
    try:
        out["expert"] = play(ExpertGenerator(tokenizer))
    except PolicyError:
        pass
    optimal = optimal_success_rate(env_id, seeds, max_turns, env_kwargs)
    if optimal is not None:
        out["optimal"] = optimal
    return out


__all__ = [
    "DEFAULT_BEAM_WIDTH",
    "REFERENCE_NAMES",
    "OpenLoopResult",
    "best_open_loop",
    "optimal_success_rate",
    "policy_success_rate",
    "reference_policies",
]
