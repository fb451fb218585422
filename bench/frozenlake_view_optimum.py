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

And it measures the ceiling of a memoryless policy (one that sees the current view only, as a
prompt with no history does): imitating the view expert from the current view alone learns its most
frequent move in each view (counted over ``--train-episodes`` training maps); that policy, and the
best memoryless policy coordinate ascent finds from it on the training maps (every view, every
move, until no change gains), are played on the validation seeds and on the 256 held-out seeds of
the learning benchmark (from 1,000,000,000; nothing is chosen on them).

Usage: python bench/frozenlake_view_optimum.py [--turns 8] [--p 0.8] [--episodes 1000] [--train-episodes 4096]
Writes bench/results/frozenlake_view_optimum.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import envhub
from envhub_frozenlake.env import TILE_NAMES
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


#: Non-slippery moves as (row, column) steps; a move into the edge leaves the player in place.
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
HELD_OUT = 1_000_000_000
#: A memoryless policy's move in a view the training maps never showed.
UNSEEN_VIEW_MOVE = "Right"


def _maps(env, seeds: range) -> list[tuple[str, ...]]:
    maps = []
    for seed in seeds:
        env.reset(seed=seed)
        maps.append(tuple(env.desc))
    return maps


def _view(desc: tuple[str, ...], row: int, col: int) -> tuple:
    """What the local view's text says: the position and what lies one step away in each direction."""
    size = len(desc)
    return (row, col, *(TILE_NAMES[desc[row + dr][col + dc]] if 0 <= row + dr < size and 0 <= col + dc < size else "edge" for dr, dc in MOVES.values()))


def _player_view(env) -> tuple:
    return _view(env.desc, *divmod(int(env._lake.s), env.size))


def _wins(desc: tuple[str, ...], policy: dict[tuple, str], turns: int) -> bool:
    row = col = 0
    for _ in range(turns):
        dr, dc = MOVES[policy.get(_view(desc, row, col), UNSEEN_VIEW_MOVE)]
        if 0 <= row + dr < len(desc) and 0 <= col + dc < len(desc):
            row, col = row + dr, col + dc
        if desc[row][col] in "HG":
            return desc[row][col] == "G"
    return False


def _success(maps: list[tuple[str, ...]], policy: dict[tuple, str], turns: int) -> float:
    return sum(_wins(desc, policy, turns) for desc in maps) / len(maps)


def memoryless_ceiling(turns: int, train_episodes: int, episodes: int, offset: int = 500_000_000) -> dict[str, float]:
    """Success of memoryless policies on the local view: the view expert's most frequent move per
    view over the training maps (what imitation from the current view alone learns), and the best
    memoryless policy coordinate ascent finds from it on those maps; on validation and held-out seeds.
    The majority policy is also played through the env itself on the held-out seeds, as a check of
    this module's own stepping."""
    env = envhub.make("frozenlake/FrozenLakeNotSlippery-v0", view="local", expert="view", max_turns=turns)
    moves: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    for seed in range(train_episodes):
        env.reset(seed=seed)
        done = False
        while not done:
            action = env.expert_action()
            moves[_player_view(env)][action] += 1
            *_, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    majority = {view: counts.most_common(1)[0][0] for view, counts in moves.items()}
    train = _maps(env, range(train_episodes))
    validation = _maps(env, range(offset, offset + episodes))
    held_out = _maps(env, range(HELD_OUT, HELD_OUT + 256))
    through_env = 0
    for seed in range(HELD_OUT, HELD_OUT + 256):
        env.reset(seed=seed)
        done, info = False, {}
        while not done:
            *_, terminated, truncated, info = env.step(majority.get(_player_view(env), UNSEEN_VIEW_MOVE))
            done = terminated or truncated
        through_env += bool(info.get("success"))
    best, score = dict(majority), _success(train, majority, turns)
    views = sorted({_view(desc, row, col) for desc in train for row in range(env.size) for col in range(env.size)})
    changed = True
    while changed:
        changed = False
        for view in views:
            for action in MOVES:
                trial = {**best, view: action}
                trial_score = _success(train, trial, turns)
                if trial_score > score:
                    best, score, changed = trial, trial_score, True
    ambiguous = sum(len(counts) > 1 for counts in moves.values())
    return {
        "views": len(moves), "views_with_history_dependent_expert_moves": ambiguous, "train_episodes": train_episodes,
        "majority_train": _success(train, majority, turns), "majority_validation": _success(validation, majority, turns),
        "majority_held_out": _success(held_out, majority, turns), "majority_held_out_through_env": through_env / 256,
        "best_memoryless_train": score, "best_memoryless_validation": _success(validation, best, turns),
        "best_memoryless_held_out": _success(held_out, best, turns),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--p", type=float, default=0.8)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--train-episodes", type=int, default=4096, help="Training maps the memoryless policies are read and chosen on.")
    args = parser.parse_args()
    started = time.perf_counter()
    optimum, count = view_optimum(args.turns, args.p)
    rule = memoryless_rule(args.turns, args.episodes)
    played = view_expert(args.turns, args.episodes)
    ceiling = memoryless_ceiling(args.turns, args.train_episodes, args.episodes)
    figures = {
        "turns": args.turns, "p": args.p, "maps": count, "local_view_optimum": optimum,
        "memoryless_rule_validation": rule, "view_expert_validation": played, "validation_episodes": args.episodes, "full_map_expert": 1.0,
        "memoryless": ceiling, "seconds": time.perf_counter() - started,
    }
    print(f"4x4 FrozenLake, {args.turns} turns, p={args.p}: {count} possible maps")
    print(f"  best policy on the local view (whole episode remembered): {optimum:.1%}")
    print(f"  memoryless rule on {args.episodes} validation seeds: {rule:.1%}")
    print(f"  the view expert (expert='view') on the same seeds: {played:.1%}")
    print("  full-map expert: 100%")
    print(f"  the view expert's most frequent move per view (memoryless imitation, {ceiling['views']} views, "
          f"{ceiling['views_with_history_dependent_expert_moves']} where the expert's move depends on the history): "
          f"{ceiling['majority_validation']:.1%} validation, {ceiling['majority_held_out']:.1%} held-out "
          f"({ceiling['majority_held_out_through_env']:.1%} played through the env)")
    print(f"  best memoryless policy found from it: {ceiling['best_memoryless_train']:.1%} on the training maps, "
          f"{ceiling['best_memoryless_validation']:.1%} validation, {ceiling['best_memoryless_held_out']:.1%} held-out")
    out = Path(__file__).parent / "results" / "frozenlake_view_optimum.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
