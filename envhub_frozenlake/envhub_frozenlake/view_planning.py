"""The best move on a random FrozenLake map for a player who sees only the ``local`` view.

The full-map expert (:mod:`envhub_frozenlake.planning`) knows every tile, so its moves depend on
tiles the local view never shows: a model that imitates it learns the average of its moves over
the maps that look alike, and tops out near what a memoryless rule wins (about 73% of 4x4 maps in
8 turns). The expert here knows only what the player has seen: the tiles next to every position
it stood on. Its belief is the set of maps ``generate_random_map`` can draw (each inner tile a hole
with probability ``1 - p``, kept when a path exists) that agree with those tiles, and it plays the
move that maximises the chance of reaching the goal in the turns left under that belief (about
97% of 4x4 maps in 8 turns). Every move it makes is a function of what the observations showed,
so a model that reads and remembers its views can imitate it exactly.

Exact, by enumerating the maps: random maps of side 4 (16,384 boards) at most.
"""

from __future__ import annotations

import functools

import numpy as np

#: Move deltas in :attr:`FrozenLakeTextEnv.action_names` order (Left, Down, Right, Up).
DELTAS = ((0, -1), (1, 0), (0, 1), (-1, 0))
#: The largest side whose maps are enumerated (2 ** (side * side - 2) boards).
MAX_SIZE = 4
#: The most turns ahead the expert plans: with more left it plays as if it had this many. On 4x4
#: maps the optimum is 96.7% in 8 turns, 98.6% in 10 and 99.6% in 12, and planning ahead costs
#: seconds and memory that grow fast with the horizon (12 turns: 440,000 memoised values, 14 s).
PLAN_HORIZON = 10


def _has_path(hole: np.ndarray) -> bool:
    size = hole.shape[0]
    seen, stack = {(0, 0)}, [(0, 0)]
    while stack:
        r, c = stack.pop()
        if (r, c) == (size - 1, size - 1):
            return True
        for dr, dc in DELTAS:
            q = (r + dr, c + dc)
            if 0 <= q[0] < size and 0 <= q[1] < size and q not in seen and not hole[q]:
                seen.add(q)
                stack.append(q)
    return False


class ViewPlanner:
    """Bayes-optimal play from the tiles seen so far, for random maps of one ``size`` and ``p``.

    A belief is a frozenset of ``((row, col), is_hole)`` for every tile seen. Values are memoised
    per (position, turns left, belief), so a planner shared by every episode gets faster as it goes.
    """

    def __init__(self, size: int, p: float):
        if not 2 <= size <= MAX_SIZE:
            raise ValueError(f"the view expert enumerates every map, so it needs 2 <= size <= {MAX_SIZE}, got {size}")
        self.size = size
        inner = [(r, c) for r in range(size) for c in range(size) if (r, c) not in ((0, 0), (size - 1, size - 1))]
        holes, weights = [], []
        for bits in range(1 << len(inner)):
            hole = np.zeros((size, size), bool)
            for i, cell in enumerate(inner):
                hole[cell] = bool(bits >> i & 1)
            if _has_path(hole):
                holes.append(hole)
                count = int(hole.sum())
                weights.append(p ** (len(inner) - count) * (1 - p) ** count)
        self.hole = np.stack(holes)  # (maps, size, size)
        self.weight = np.array(weights) / sum(weights)
        self._value = functools.lru_cache(maxsize=None)(self._value_uncached)
        self._maps = functools.lru_cache(maxsize=None)(self._maps_uncached)

    # ------------------------------------------------------------------ beliefs

    def neighbours(self, pos: tuple[int, int]) -> list[tuple[int, int]]:
        return [(pos[0] + dr, pos[1] + dc) for dr, dc in DELTAS if 0 <= pos[0] + dr < self.size and 0 <= pos[1] + dc < self.size]

    def observe(self, belief: frozenset, pos: tuple[int, int], desc: tuple[str, ...]) -> frozenset:
        """``belief`` with the tiles next to ``pos`` on the map ``desc`` added (what the view shows there)."""
        return belief | {(q, desc[q[0]][q[1]] == "H") for q in self.neighbours(pos)}

    def _maps_uncached(self, belief: frozenset) -> np.ndarray:
        """Indices of the maps consistent with ``belief``."""
        keep = np.ones(len(self.hole), bool)
        for (r, c), is_hole in belief:
            keep &= self.hole[:, r, c] == is_hole
        return np.flatnonzero(keep)

    def _outcomes(self, belief: frozenset, pos: tuple[int, int]) -> list[tuple[float, frozenset]]:
        """What arriving at ``pos`` may show, as (probability, new belief) under ``belief``."""
        maps = self._maps(belief)
        unseen = [q for q in self.neighbours(pos) if not any(cell == q for cell, _ in belief)]
        if not unseen:
            return [(1.0, belief)]
        seen = self.hole[maps][:, [r for r, _ in unseen], [c for _, c in unseen]]
        weight = self.weight[maps]
        total = weight.sum()
        groups: dict[bytes, float] = {}
        for key, w in zip(map(bytes, seen), weight):
            groups[key] = groups.get(key, 0.0) + w
        return [
            (w / total, belief | {(q, bool(b)) for q, b in zip(unseen, key)})
            for key, w in groups.items()
        ]

    # ------------------------------------------------------------------ values

    def success_probability(self, turns: int) -> float:
        """The best success probability on a random map in ``turns`` turns, seeing only the local view."""
        return float(sum(prob * self._value((0, 0), turns, belief) for prob, belief in self._outcomes(frozenset(), (0, 0))))

    def _known(self, belief: frozenset, q: tuple[int, int]) -> bool | None:
        for cell, is_hole in belief:
            if cell == q:
                return is_hole
        return None

    def _target(self, pos: tuple[int, int], action: int) -> tuple[int, int]:
        return (pos[0] + DELTAS[action][0], pos[1] + DELTAS[action][1])

    def _value_uncached(self, pos: tuple[int, int], left: int, belief: frozenset) -> float:
        if pos == (self.size - 1, self.size - 1):
            return 1.0
        if left <= 0:
            return 0.0
        return max((self.action_value(pos, left, belief, a) for a in range(len(DELTAS))), default=0.0)

    def action_value(self, pos: tuple[int, int], left: int, belief: frozenset, action: int) -> float:
        """Success probability of ``action`` then optimal play, with ``left`` turns including this one."""
        q = self._target(pos, action)
        if not (0 <= q[0] < self.size and 0 <= q[1] < self.size):
            return self._value(pos, left - 1, belief)  # bumping into the edge wastes the turn
        if self._known(belief, q):
            return 0.0
        if q == (self.size - 1, self.size - 1):
            return 1.0
        return sum(prob * self._value(q, left - 1, after) for prob, after in self._outcomes(belief, q))

    def best_action(self, pos: tuple[int, int], left: int, belief: frozenset, tol: float = 1e-9) -> int:
        """The move with the best success probability in ``left`` turns; ties go to the move that
        succeeds as often in fewer turns (then fewer still), then to the first in Left, Down, Right, Up.
        A tile known to be a hole is never chosen while any other move exists. It plans at most
        :data:`PLAN_HORIZON` turns ahead, and that far when no move can reach the goal in ``left``
        turns: a hopeless state gets the move it would get with time to spare (which a model that
        does not see the turn count can imitate), not an arbitrary one."""
        left = min(left, PLAN_HORIZON)
        candidates = [a for a in range(len(DELTAS)) if not self._known(belief, self._target(pos, a))] or [0]
        if max(self.action_value(pos, left, belief, a) for a in candidates) == 0.0:
            left = PLAN_HORIZON  # no move reaches the goal in time: play the move it would with time to spare
        for k in range(max(left, 1), 0, -1):
            values = [self.action_value(pos, k, belief, a) for a in candidates]
            best = max(values)
            candidates = [a for a, v in zip(candidates, values) if v >= best - tol]
            if len(candidates) == 1:
                break
        return candidates[0]


@functools.lru_cache(maxsize=8)
def view_planner(size: int, p: float) -> ViewPlanner:
    """One planner per (size, p), shared by every env in the process."""
    return ViewPlanner(size, p)
