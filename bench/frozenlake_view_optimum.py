"""The best success any policy can reach on 4x4 FrozenLake random maps when it sees only the
``local`` view (its position and the four tiles one step away), with the whole episode in memory.

The full-map expert wins every map, but its moves depend on tiles the local view never shows, so
a model that imitates it learns the average of its moves over the maps that look alike. This
script measures how much is learnable from the view: it enumerates every map ``generate_random_map``
can draw (each of the 14 inner tiles a hole with probability 1 - p, kept when a path exists), and
solves the belief MDP exactly (the belief is the set of maps consistent with every tile seen so far).
It also plays a memoryless rule (step Right or Down onto ice, else the first open tile) on
validation seeds, as what a policy that reads only the current view gets.

Usage: python bench/frozenlake_view_optimum.py [--turns 8] [--p 0.8] [--episodes 1000]
Writes bench/results/frozenlake_view_optimum.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import numpy as np

import envhub

SIZE = 4
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
INNER = [(r, c) for r in range(SIZE) for c in range(SIZE) if (r, c) not in ((0, 0), (SIZE - 1, SIZE - 1))]


def _has_path(holes: frozenset) -> bool:
    seen, stack = {(0, 0)}, [(0, 0)]
    while stack:
        r, c = stack.pop()
        if (r, c) == (SIZE - 1, SIZE - 1):
            return True
        for dr, dc in MOVES.values():
            q = (r + dr, c + dc)
            if 0 <= q[0] < SIZE and 0 <= q[1] < SIZE and q not in seen and q not in holes:
                seen.add(q)
                stack.append(q)
    return False


def _neighbours(pos: tuple[int, int]) -> list[tuple[int, int]]:
    return [(pos[0] + dr, pos[1] + dc) for dr, dc in MOVES.values() if 0 <= pos[0] + dr < SIZE and 0 <= pos[1] + dc < SIZE]


def view_optimum(turns: int, p: float) -> tuple[float, int]:
    """(the optimal success probability under the local view, the number of possible maps)."""
    maps, weights = [], []
    for bits in range(1 << len(INNER)):
        holes = frozenset(INNER[i] for i in range(len(INNER)) if bits >> i & 1)
        if _has_path(holes):
            maps.append(holes)
            weights.append(p ** (len(INNER) - len(holes)) * (1 - p) ** len(holes))
    w = np.array(weights) / sum(weights)
    hole = np.zeros((len(maps), SIZE, SIZE), bool)
    for i, holes in enumerate(maps):
        for r, c in holes:
            hole[i, r, c] = True

    def split(indices: np.ndarray, pos: tuple[int, int]) -> list[np.ndarray]:
        """The maps consistent with what is seen from ``pos``, grouped by what is seen."""
        cells = _neighbours(pos)
        seen = hole[indices][:, [r for r, _ in cells], [c for _, c in cells]]
        groups: dict[bytes, list[int]] = {}
        for index, key in zip(indices, map(bytes, seen)):
            groups.setdefault(key, []).append(int(index))
        return [np.array(g) for g in groups.values()]

    @functools.lru_cache(maxsize=None)
    def value(pos: tuple[int, int], left: int, belief: tuple[int, ...]) -> float:
        if pos == (SIZE - 1, SIZE - 1):
            return 1.0
        if left == 0:
            return 0.0
        indices = np.array(belief)
        total, best = w[indices].sum(), 0.0
        for dr, dc in MOVES.values():
            q = (pos[0] + dr, pos[1] + dc)
            if not (0 <= q[0] < SIZE and 0 <= q[1] < SIZE):
                continue  # bumping into the edge wastes a turn: never better than standing still
            safe = indices[~hole[indices, q[0], q[1]]]
            if len(safe):
                best = max(best, sum(w[g].sum() / total * value(q, left - 1, tuple(g)) for g in split(safe, q)))
        return best

    start = split(np.arange(len(maps)), (0, 0))
    return float(sum(w[g].sum() * value((0, 0), turns, tuple(g)) for g in start)), len(maps)


def memoryless_rule(turns: int, episodes: int, offset: int = 500_000_000) -> float:
    """Success of 'Right or Down onto ice (or the goal), else the first open tile' on validation seeds."""
    env = envhub.make("frozenlake/FrozenLakeNotSlippery-v0", view="local", max_turns=turns)
    wins = 0
    for seed in range(offset, offset + episodes):
        observation, _ = env.reset(seed=seed)
        done, info = False, {}
        while not done:
            tiles = dict(part.rstrip(".").split(": ") for part in observation.splitlines()[-1].split(". "))
            goal = [a for a in ("Right", "Down") if tiles.get(a) == "goal"]
            open_ = [a for a in ("Right", "Down", "Up", "Left") if tiles.get(a) in ("ice", "goal")]
            observation, _, terminated, truncated, info = env.step((goal or open_ or ["Up"])[0])
            done = terminated or truncated
        wins += bool(info.get("success"))
    return wins / episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--p", type=float, default=0.8)
    parser.add_argument("--episodes", type=int, default=1000)
    args = parser.parse_args()
    started = time.perf_counter()
    optimum, count = view_optimum(args.turns, args.p)
    rule = memoryless_rule(args.turns, args.episodes)
    figures = {
        "turns": args.turns, "p": args.p, "maps": count, "local_view_optimum": optimum,
        "memoryless_rule_validation": rule, "validation_episodes": args.episodes, "full_map_expert": 1.0,
        "seconds": time.perf_counter() - started,
    }
    print(f"4x4 FrozenLake, {args.turns} turns, p={args.p}: {count} possible maps")
    print(f"  best policy on the local view (whole episode remembered): {optimum:.1%}")
    print(f"  memoryless rule on {args.episodes} validation seeds: {rule:.1%}")
    print("  full-map expert: 100%")
    out = Path(__file__).parent / "results" / "frozenlake_view_optimum.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
