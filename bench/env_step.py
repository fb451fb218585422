"""Steps per second of the FrozenLake text env against raw Gymnasium FrozenLake-v1, same run.

Both step the same 4x4 slippery map with the same random action sequence, resetting when an episode
ends; the text env also parses the action, draws the grid and builds the info dict. Goal: ratio
(text / raw) >= 0.5. Writes bench/results/env_step.json.

    python bench/env_step.py [--steps 200000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import gymnasium
import numpy as np

import envhub


def steps_per_second(step, reset, actions) -> float:
    reset()
    start = time.perf_counter()
    for a in actions:
        terminated, truncated = step(a)
        if terminated or truncated:
            reset()
    return len(actions) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "env_step.json")
    args = parser.parse_args()

    text_env = envhub.make("frozenlake/FrozenLake-v0", max_turns=100)
    text_env.reset(seed=0)
    raw_env = gymnasium.make("FrozenLake-v1", desc=list(text_env.desc), is_slippery=True, max_episode_steps=100)
    indices = np.random.default_rng(0).integers(4, size=args.steps)
    names = [text_env.action_names[i] for i in indices]
    raw_actions = [int(i) for i in indices]

    def text_step(action):
        _, _, terminated, truncated, _ = text_env.step(action)
        return terminated, truncated

    def raw_step(action):
        _, _, terminated, truncated, _ = raw_env.step(action)
        return terminated, truncated

    text_rates, raw_rates = [], []
    for r in range(args.repeats):  # interleaved, so drift in machine load hits both alike
        raw_rates.append(steps_per_second(raw_step, lambda: raw_env.reset(seed=r), raw_actions))
        text_rates.append(steps_per_second(text_step, lambda: text_env.reset(seed=0), names))
    figures = {
        "env": "frozenlake/FrozenLake-v0 vs gymnasium FrozenLake-v1 (same map, slippery)",
        "steps_per_repeat": args.steps,
        "repeats": args.repeats,
        "text_env_steps_per_s": statistics.median(text_rates),
        "raw_gymnasium_steps_per_s": statistics.median(raw_rates),
    }
    figures["ratio_text_over_raw"] = figures["text_env_steps_per_s"] / figures["raw_gymnasium_steps_per_s"]
    figures["goal_ratio"] = 0.5
    figures["meets_goal"] = figures["ratio_text_over_raw"] >= 0.5
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
