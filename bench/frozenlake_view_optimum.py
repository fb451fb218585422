"""The best success any policy can reach on 4x4 FrozenLake random maps when it sees only the
``local`` view (its position and the four tiles one step away), with the whole episode in memory.

The full-map expert wins every map, but its moves depend on tiles the local view never shows, so
a model that imitates it learns the average of its moves over the maps that look alike. This
script measures how much is learnable from the view: it enumerates every map ``generate_random_map``
can draw (each of the 14 inner tiles a hole with probability 1 - p, kept when a path exists), and
solves the belief MDP exactly (the belief is the set of maps consistent with every tile seen so far:
``envhub_frozenlake.view_planning``, whose expert the env plays with ``expert="view"``).
It also plays a memoryless rule (step Right or Down onto ice, else the first open tile) on
validation seeds, as what a policy that reads only the current view gets.

Usage: python bench/frozenlake_view_optimum.py [--turns 8] [--p 0.8] [--episodes 1000]
Writes bench/results/frozenlake_view_optimum.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import envhub
from envhub_frozenlake.view_planning import ViewPlanner

def view_optimum(turns: int, p: float) -> tuple[float, int]:
    """(the optimal success probability under the local view, the number of possible maps)."""
    planner = ViewPlanner(4, p)
    return planner.success_probability(turns), len(planner.hole)


def view_expert(turns: int, episodes: int, offset: int = 500_000_000) -> float:
    """Success of the env's own view expert (``expert="view"``) on validation seeds."""
    env = envhub.make("frozenlake/FrozenLakeNotSlippery-v0", view="local", expert="view", max_turns=turns)
    wins = 0
    for seed in range(offset, offset + episodes):
        env.reset(seed=seed)
        done, info = False, {}
        while not done:
            *_, terminated, truncated, info = env.step(env.expert_action())
            done = terminated or truncated
        wins += bool(info.get("success"))
    return wins / episodes


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
    played = view_expert(args.turns, args.episodes)
    figures = {
        "turns": args.turns, "p": args.p, "maps": count, "local_view_optimum": optimum,
        "memoryless_rule_validation": rule, "view_expert_validation": played, "validation_episodes": args.episodes, "full_map_expert": 1.0,
        "seconds": time.perf_counter() - started,
    }
    print(f"4x4 FrozenLake, {args.turns} turns, p={args.p}: {count} possible maps")
    print(f"  best policy on the local view (whole episode remembered): {optimum:.1%}")
    print(f"  memoryless rule on {args.episodes} validation seeds: {rule:.1%}")
    print(f"  the view expert (expert='view') on the same seeds: {played:.1%}")
    print("  full-map expert: 100%")
    out = Path(__file__).parent / "results" / "frozenlake_view_optimum.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
