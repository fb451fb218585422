"""Benchmark the Gymnasium and PettingZoo adapters.

Two kinds of figures, each against a baseline measured in the same run:

- overhead: seconds per step through the adapter divided by seconds per step of the wrapped env
  itself, on the same action sequence (text rendering and info keys included);
- difficulty: success rate and mean return of the expert (where one exists) and of the random
  policy, per registration, over the same seeds.

Prints a table and writes ``bench/results/adapters.json``.

Usage: ``python bench/adapters.py [--episodes N] [--steps N]``
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from typing import Any

import numpy as np

import envhub
from envhub.adapters.references import load_reference
from envhub.generation import ExpertPolicy, RandomPolicy

GYM_IDS = ["gym/Taxi-v3", "gym/CliffWalking-v1", "gym/Blackjack-v1"]
PZ_IDS = ["pettingzoo/TicTacToe-v0", "pettingzoo/ConnectFour-v0", "pettingzoo/TicTacToeSelfPlay-v0", "pettingzoo/ConnectFourSelfPlay-v0"]
RESULTS = pathlib.Path(__file__).parent / "results" / "adapters.json"


def gym_overhead(env_id: str, steps: int) -> dict[str, float]:
    """Seconds per step of the adapter and of its wrapped env on one random action sequence."""
    env = envhub.make(env_id)
    env.max_turns = None  # no truncation, so both sides reset on exactly the same steps
    inner = env.inner
    n = int(inner.action_space.n)
    actions = np.random.default_rng(0).integers(n, size=steps)

    def run_adapter() -> None:
        env.reset(seed=0)
        for a in actions:
            if env.step(env.action_names[a])[2]:
                env.reset()

    def run_raw() -> None:
        inner.reset(seed=0)
        for a in actions:
            if inner.step(int(a))[2]:
                inner.reset()

    return _ratio(run_adapter, run_raw, steps)


def pettingzoo_overhead(env_id: str, games: int) -> dict[str, float]:
    """Seconds per move of the self-play adapter and of the raw PettingZoo env, same games."""
    env = envhub.make(env_id)
    env_fn = load_reference(envhub.spec(env_id).kwargs["env_fn"], "env_fn")
    recorded: list[list[int]] = []
    policy = RandomPolicy(0)
    for seed in range(games):
        observation, _ = env.reset(seed=seed)
        moves, done = [], False
        while not done:
            action = policy.act(env, observation)
            moves.append(env.action_names.index(action))
            observation, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
        recorded.append(moves)
    raw = env_fn()
    total = sum(len(m) for m in recorded)

    def run_adapter() -> None:
        for seed, moves in enumerate(recorded):
            env.reset(seed=seed)
            for m in moves:
                env.step(env.action_names[m])

    def run_raw() -> None:
        for moves in recorded:
            raw.reset(seed=0)
            for m in moves:
                raw.observe(raw.agent_selection)
                raw.step(m)

    return _ratio(run_adapter, run_raw, total)


def _ratio(run_adapter: Any, run_raw: Any, steps: int, repeats: int = 3) -> dict[str, float]:
    adapter = min(_timed(run_adapter) for _ in range(repeats)) / steps
    raw = min(_timed(run_raw) for _ in range(repeats)) / steps
    return {"adapter_us_per_step": adapter * 1e6, "wrapped_us_per_step": raw * 1e6, "overhead_ratio": adapter / raw}


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def play_rates(env_id: str, policy_name: str, episodes: int) -> dict[str, float] | None:
    """Success rate and mean return of a policy over seeds 0..episodes-1; None without an expert."""
    env = envhub.make(env_id)
    env.reset(seed=0)
    if policy_name == "expert" and env.expert_action() is None:
        return None
    successes, returns = 0, []
    for seed in range(episodes):
        policy = ExpertPolicy() if policy_name == "expert" else RandomPolicy(seed)
        observation, _ = env.reset(seed=seed)
        total, done, info = 0.0, False, {}
        while not done:
            observation, reward, terminated, truncated, info = env.step(policy.act(env, observation))
            total += float(reward)
            done = terminated or truncated
        successes += bool(info["success"])
        returns.append(total)
    return {"success_rate": successes / episodes, "mean_return": float(np.mean(returns))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes per policy and env")
    parser.add_argument("--steps", type=int, default=20000, help="steps per overhead measurement (Gymnasium)")
    parser.add_argument("--games", type=int, default=200, help="games per overhead measurement (PettingZoo)")
    args = parser.parse_args()

    results: dict[str, Any] = {"episodes": args.episodes, "steps": args.steps, "games": args.games, "overhead": {}, "policies": {}}
    for env_id in GYM_IDS:
        results["overhead"][env_id] = gym_overhead(env_id, args.steps)
    for env_id in PZ_IDS[2:]:
        results["overhead"][env_id] = pettingzoo_overhead(env_id, args.games)
    for env_id in GYM_IDS + PZ_IDS:
        results["policies"][env_id] = {name: play_rates(env_id, name, args.episodes) for name in ("random", "expert")}

    print(f"{'overhead':38s} {'adapter us/step':>16s} {'wrapped us/step':>16s} {'ratio':>7s}")
    for env_id, row in results["overhead"].items():
        print(f"{env_id:38s} {row['adapter_us_per_step']:16.1f} {row['wrapped_us_per_step']:16.1f} {row['overhead_ratio']:7.1f}")
    print(f"\n{'policies (' + str(args.episodes) + ' episodes)':38s} {'random success':>15s} {'return':>8s} {'expert success':>15s} {'return':>8s}")
    for env_id, row in results["policies"].items():
        expert = row["expert"]
        cells = f"{expert['success_rate']:15.3f} {expert['mean_return']:8.2f}" if expert else f"{'-':>15s} {'-':>8s}"
        print(f"{env_id:38s} {row['random']['success_rate']:15.3f} {row['random']['mean_return']:8.2f} {cells}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
