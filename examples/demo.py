"""The envhub demo: FrozenLake played by a random and an expert policy on 128 held-out seeds,
against the optimal success probability value iteration computes for each map.

    python examples/demo.py [--env frozenlake/FrozenLake-v0] [--episodes 128]
"""

from __future__ import annotations

import argparse

import numpy as np

import envhub
from envhub.cli import table
from envhub.generation import ExpertPolicy, RandomPolicy


def success_rate(env_id: str, policy, seeds: range) -> float:
    env = envhub.make(env_id)
    wins = 0
    for seed in seeds:
        observation, info = env.reset(seed=seed)
        while True:
            observation, _, terminated, truncated, info = env.step(policy.act(env, observation))
            if terminated or truncated:
                break
        wins += info["success"]
    return wins / len(seeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="frozenlake/FrozenLake-v0")
    parser.add_argument("--episodes", type=int, default=128)
    args = parser.parse_args()
    seeds = range(10_000, 10_000 + args.episodes)  # held out: training seeds start at 0
    env = envhub.make(args.env)
    limits = []
    for seed in seeds:
        env.reset(seed=seed)
        limits.append(env.optimal_success_probability())
    print(f"{args.env}: {args.episodes} held-out maps\n")
    print(env.instructions, "\n")
    rows = [
        ("random", f"{success_rate(args.env, RandomPolicy(seed=0), seeds):.1%}"),
        ("expert (value iteration)", f"{success_rate(args.env, ExpertPolicy(), seeds):.1%}"),
        ("optimal limit (expected)", f"{float(np.mean(limits)):.1%}"),
    ]
    print(table(rows, ["policy", "success"]))


if __name__ == "__main__":
    main()
