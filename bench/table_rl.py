"""Is the credit there? A benchmark config's RL with a policy that reads its observation exactly.

The tiny model's RL alone can stall for two reasons: the estimator's advantages say too little about
which action was right (the credit), or the network does not turn that credit into a policy that
depends on its observation (the view's path, docs/results-rl-alone.md). This loop separates them. It
plays the config's env, turns, groups and group size through the real env (``envhub.make`` with the
config's ``env_kwargs``), computes GRPO's or GiGPO's advantages with the trainer's own functions
(:func:`envhub_trl.advantages.grpo_advantages`, :func:`~envhub_trl.advantages.gigpo_advantages`, with
the config's ``step_reward_weight``, ``step_reward_gamma`` and ``advantage_norm``; anchors are the
group and the env's ``state_key``), and takes one Adam step a batch on ``-mean(advantage * log p(action))``
(the trainer's on-policy update without KL), with the config's step count, a 10-step warm-up and a
cosine decay. The policy is a table: one softmax over the env's actions per distinct observation
text, so nothing is shared between observations and nothing has to learn to read them.

If the table learns at the trainer's budget and the model does not, the model's reading is what
stalls, not the estimator. Greedy success is measured on 256 validation seeds (from 5 * 10^8, as the
benchmark's ``eval_seed_offset`` tuning runs), next to the uniformly random policy's.

    python bench/table_rl.py --config bench/learning/format/sokoban6x6.yaml --algos grpo gigpo --seeds 0 1 2 --steps 300

Writes bench/results/table_rl/<config name>-<groups a step>x<steps>.json. ``--steps`` and ``--groups-per-step`` ask
what budget a policy that reads exactly needs to reach a target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import yaml

import envhub
from envhub_trl.advantages import gigpo_advantages, grpo_advantages

ROOT = Path(__file__).resolve().parent
VALIDATION = 5 * 10**8


class TablePolicy(torch.nn.Module):
    """One softmax over ``actions`` per distinct observation (uniform until trained)."""

    def __init__(self, actions: int, capacity: int = 1 << 18) -> None:
        super().__init__()
        self.index: dict[str, int] = {}
        self.logits = torch.nn.Parameter(torch.zeros(capacity, actions))

    def forward(self, observations: list[str]) -> torch.Tensor:
        rows = [self.index.setdefault(o, len(self.index)) for o in observations]
        if len(self.index) > len(self.logits):
            raise SystemExit(f"more than {len(self.logits)} distinct observations: raise the table's capacity")
        return torch.log_softmax(self.logits[rows], -1)


def play(envs: list[Any], seeds: list[int], act: Any, turns: int) -> tuple[list[list[tuple[str, int, float, str, int]]], list[bool]]:
    """Each seed played in its own env for at most ``turns`` turns; ``act(observations)`` gives an
    action index per observation. Per episode: (observation, action, reward, state key, turn)."""
    observations, keys = [], []
    for env, seed in zip(envs, seeds):
        observation, info = env.reset(seed=int(seed))
        observations.append(observation)
        keys.append(str(info.get("state_key", observation)))
    episodes: list[list[tuple[str, int, float, str, int]]] = [[] for _ in seeds]
    won, live = [False] * len(seeds), list(range(len(seeds)))
    for turn in range(turns):
        if not live:
            break
        chosen = act([observations[i] for i in live])
        still = []
        for i, action in zip(live, chosen):
            observation, reward, terminated, truncated, info = envs[i].step(envs[i].unwrapped.action_names[action])
            episodes[i].append((observations[i], action, float(reward), keys[i], turn))
            observations[i], keys[i] = observation, str(info.get("state_key", observation))
            won[i] = won[i] or bool(info.get("success"))
            if not (terminated or truncated):
                still.append(i)
        live = still
    return episodes, won


def advantages(config: dict[str, Any], algo: str, episodes: list[list[tuple[str, int, float, str, int]]], groups: np.ndarray) -> np.ndarray:
    """The trainer's advantages for the batch's turns, in order; ``groups``: each episode's group."""
    turns = [(e, turn) for e, episode in enumerate(episodes) for turn in episode]
    rewards = np.array([turn[2] for _, turn in turns])
    trajectory = np.array([e for e, _ in turns])
    norm = config.get("advantage_norm", "mean_std")
    if algo == "grpo":
        return grpo_advantages(np.bincount(trajectory, weights=rewards, minlength=len(episodes)), groups, norm)[trajectory]
    return gigpo_advantages(
        rewards, trajectory, np.array([turn[4] for _, turn in turns]), groups, np.array([turn[3] for _, turn in turns]),
        step_weight=float(config.get("step_reward_weight", 1.0)), gamma=float(config.get("step_reward_gamma", 0.95)), norm=norm,
    )["advantages"]


def run(config: dict[str, Any], algo: str, seed: int, steps: int, learning_rate: float, eval_every: int, episodes: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    groups, size, turns = int(config["groups_per_step"]), int(config["group_size"]), int(config["max_turns"])
    envs = [envhub.make(config["env_id"], **config.get("env_kwargs", {})) for _ in range(groups * size)]
    policy = TablePolicy(len(envs[0].unwrapped.action_names))
    optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)

    def greedy(observations: list[str]) -> list[int]:
        with torch.no_grad():
            return policy(observations).argmax(-1).tolist()

    def sampled(observations: list[str]) -> list[int]:
        with torch.no_grad():
            return torch.distributions.Categorical(logits=policy(observations)).sample().tolist()

    def validation() -> float:
        won: list[bool] = []
        for start in range(0, episodes, len(envs)):
            won += play(envs, [VALIDATION + start + k for k in range(min(len(envs), episodes - start))], greedy, turns)[1]
        return float(np.mean(won))

    curve, started = [{"step": 0, "greedy": validation(), "training_success": None}], time.time()
    for step in range(steps):
        seeds = np.repeat(rng.integers(0, VALIDATION, groups), size).tolist()
        batch, won = play(envs, seeds, sampled, turns)
        turns_played = [turn for episode in batch for turn in episode]
        advantage = torch.tensor(advantages(config, algo, batch, np.arange(len(batch)) // size), dtype=torch.float32)
        logp = policy([t[0] for t in turns_played])[torch.arange(len(turns_played)), torch.tensor([t[1] for t in turns_played])]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate * min(1.0, (step + 1) / 10) * 0.5 * (1 + math.cos(math.pi * step / steps))
        optimizer.zero_grad()
        (-(advantage * logp).mean()).backward()
        optimizer.step()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            curve.append({"step": step + 1, "greedy": validation(), "training_success": float(np.mean(won))})
            print(f"  {algo} seed {seed} step {step + 1}: validation greedy {curve[-1]['greedy']:.1%}, training success {np.mean(won):.1%}, {len(policy.index)} observations seen, {time.time() - started:.0f} s", flush=True)
    return {"algo": algo, "seed": seed, "curve": curve, "observations_seen": len(policy.index)}


def random_success(config: dict[str, Any], episodes: int) -> float:
    """The uniformly random policy's success on the validation seeds."""
    rng = np.random.default_rng(0)
    envs = [envhub.make(config["env_id"], **config.get("env_kwargs", {})) for _ in range(episodes)]
    actions = len(envs[0].unwrapped.action_names)
    return float(np.mean(play(envs, [VALIDATION + k for k in range(episodes)], lambda obs: rng.integers(actions, size=len(obs)).tolist(), int(config["max_turns"]))[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a benchmark or recipe YAML (env_id, env_kwargs, max_turns, groups_per_step, group_size)")
    parser.add_argument("--algos", nargs="+", choices=("grpo", "gigpo"), default=["grpo", "gigpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default: the config's max_steps)")
    parser.add_argument("--groups-per-step", type=int, default=None, help="groups (levels) a step (default: the config's groups_per_step)")
    parser.add_argument("--learning-rate", type=float, default=0.05, help="Adam's rate on the table's logits")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--episodes", type=int, default=256, help="validation seeds")
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    steps = args.steps or int(config["max_steps"])
    if args.groups_per_step:
        config["groups_per_step"] = args.groups_per_step
    print(f"{config['env_id']} {config.get('env_kwargs', {})}: {config['groups_per_step']} groups of {config['group_size']} a step, {config['max_turns']} turns, {steps} steps")
    baseline = random_success(config, args.episodes)
    print(f"uniformly random policy: {baseline:.1%} validation success")
    runs = [run(config, algo, seed, steps, args.learning_rate, args.eval_every, args.episodes) for algo in args.algos for seed in args.seeds]
    for algo in args.algos:
        final = [r["curve"][-1]["greedy"] for r in runs if r["algo"] == algo]
        print(f"{algo}: validation greedy after {steps} steps {' / '.join(f'{f:.1%}' for f in final)} (seeds {' / '.join(map(str, args.seeds))}), mean {np.mean(final):.1%} ± {np.std(final, ddof=1) if len(final) > 1 else 0.0:.1%}")
    out = ROOT / "results" / "table_rl" / f"{Path(args.config).stem}-{config['groups_per_step']}x{steps}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": args.config, "steps": steps, "learning_rate": args.learning_rate, "random": baseline, "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
