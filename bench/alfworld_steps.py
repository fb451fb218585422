"""ALFWorld env steps per second: envhub's ``ALFWorldEnv`` against ALFWorld's own ``AlfredTWEnv``.

Both play the same generated games, written in the official layout (``game.tw-pddl`` beside
``traj_data.json``) for ``AlfredTWEnv`` to find, with the same engine (TextWorld's ``PddlEnv`` over
ALFWorld's domain and grammar). Each plays ``--episodes`` episodes of ``--turns`` random admissible
commands (the same random stream on both sides), with its expert computed as in training: ALFWorld's
``AlfredTWEnv`` with its DAgger wrappers (the hand-coded expert told every command), envhub's env
with ``expert="handcoded"`` asked for its action every turn, and, as a third row, envhub's default
planner expert. Resets count: a step rate here is turns per second of whole episodes. Then it
describes ``--stats`` generated tasks (types, planner plan lengths, scene sizes) beside the
official split's task counts, and plays ``--experts`` tasks with each of ``--expert-kinds``, ``--random``
held-out tasks with random admissible commands, and ``--fixed`` held-out tasks with each fixed policy
(always the K-th admissible command, for K in ``--fixed-indices``; the best is the fixed-policy reference).

    python bench/alfworld_steps.py [--episodes 4] [--rounds 3] [--turns 30]

Prints the figures and writes bench/results/alfworld_steps.json. (Not ``bench/alfworld.py``: run as a
script, a file of that name would shadow the ``alfworld`` package it measures.)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results" / "alfworld_steps.json"


def write_games(root: Path, seeds: list[int]) -> list[Path]:
    from envhub_alfworld.tasks import generate_task

    folders = []
    for seed in seeds:
        task = generate_task(seed)
        folders.append(task.write(root / "json_2.1.1" / "train" / f"{task.task_type}-{seed}" / "trial_T0"))
    return folders


def alfworld_env(root: Path, turns: int):
    """ALFWorld's own env over the games under ``root``, as its DAgger training makes it."""
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    config = {
        "env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6], "domain_randomization": False,
                "expert_type": "handcoded"},
        "dataset": {"data_path": str(root / "json_2.1.1" / "train"), "num_train_games": -1},
        "logic": {"domain": ALFRED_PDDL_PATH, "grammar": ALFRED_TWL2_PATH},
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": turns}},
    }
    return AlfredTWEnv(config, train_eval="train").init_env(batch_size=1)


def play_alfworld(env, episodes: int, turns: int, rng: np.random.Generator, row: dict) -> None:
    start = time.perf_counter()
    for _ in range(episodes):
        _, infos = env.reset()
        for _ in range(turns):
            commands = infos["admissible_commands"][0]
            _, _, dones, infos = env.step([commands[int(rng.integers(len(commands)))]])
            row["steps"] += 1
            if dones[0]:
                row["won"] += int(infos["won"][0])
                break
    row["seconds"] += time.perf_counter() - start


def play_envhub(env, episodes: int, first: int, rng: np.random.Generator, row: dict) -> None:
    start = time.perf_counter()
    for episode in range(first, first + episodes):
        env.reset(seed=episode)
        done = False
        while not done:
            env.expert_action()
            commands = env.valid_actions()
            _, _, terminated, truncated, _ = env.step(commands[int(rng.integers(len(commands)))])
            row["steps"] += 1
            done = terminated or truncated
        row["won"] += int(env.is_success())
    row["seconds"] += time.perf_counter() - start


#: ALFWorld's official split, tasks per type (the ALFWorld paper's Table 1): train, valid_seen, valid_unseen.
OFFICIAL_COUNTS = {
    "pick_and_place_simple": (790, 35, 24),
    "look_at_obj_in_light": (308, 13, 18),
    "pick_clean_then_place_in_recep": (650, 27, 31),
    "pick_heat_then_place_in_recep": (459, 16, 23),
    "pick_cool_then_place_in_recep": (533, 25, 21),
    "pick_two_obj_and_place": (813, 24, 17),
}


def task_statistics(count: int) -> dict:
    """Over ``count`` generated tasks (seeds 0..count-1): each type's share, and its planner plan's
    length from the start, with the scene's receptacles and placed objects."""
    from envhub_alfworld.env import ALFWorldEnv

    env = ALFWorldEnv()
    per_type: dict[str, list[int]] = {}
    receptacles, objects = [], []
    for seed in range(count):
        env.reset(seed=seed)
        per_type.setdefault(env.task_type, []).append(len(env.plan()))
        declared = env.pddl_problem.split("(:init", 1)[0]
        receptacles.append(declared.count(" - receptacle"))
        objects.append(declared.count(" - object"))
    env.close()
    train_total = sum(c[0] for c in OFFICIAL_COUNTS.values())
    return {
        "tasks": count,
        "per_type": {
            kind: {"share": len(lengths) / count, "official_train_share": OFFICIAL_COUNTS[kind][0] / train_total,
                   "plan_mean": float(np.mean(lengths)), "plan_max": int(max(lengths))}
            for kind, lengths in sorted(per_type.items())
        },
        "plan_mean": float(np.mean([n for lengths in per_type.values() for n in lengths])),
        "receptacles_mean": float(np.mean(receptacles)),
        "objects_mean": float(np.mean(objects)),
    }


def policy_success(count: int, first_seed: int, policy: str, turns: int = 50) -> dict:
    """Success over ``count`` generated tasks from ``first_seed``: an expert (``planner``,
    ``search`` or ``handcoded``) played to the end, ``random`` admissible commands (seeded stream),
    or ``index:K``, the fixed policy that always sends the K-th admissible command (counted from the
    end when K < 0; the last when the list is shorter), which reads nothing of the task or the room."""
    from envhub_alfworld.env import EXPERTS, ALFWorldEnv

    env = ALFWorldEnv(expert=policy if policy in EXPERTS else "planner")
    env.max_turns = turns
    rng = np.random.default_rng(0)
    won: dict[str, list[int]] = {}
    commands = 0
    for seed in range(first_seed, first_seed + count):
        env.reset(seed=seed)
        done = False
        while not done:
            if policy == "random":
                legal = env.valid_actions()
                action = legal[int(rng.integers(len(legal)))]
            elif policy.startswith("index:"):
                legal, index = env.valid_actions(), int(policy.split(":")[1])
                action = legal[max(-len(legal), min(index, len(legal) - 1))]
            else:
                action = env.expert_action()
                if action is None:
                    break
            _, _, terminated, truncated, _ = env.step(action)
            commands += 1
            done = terminated or truncated
        won.setdefault(env.task_type, []).append(int(env.is_success()))
    env.close()
    total = sum(sum(v) for v in won.values())
    return {"policy": policy, "tasks": count, "first_seed": first_seed, "won": total, "commands_per_task": commands / count,
            "per_type": {kind: [sum(v), len(v)] for kind, v in sorted(won.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4, help="episodes per side per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each plays every side in turn, so load shifts hit all alike (0: no step rates)")
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--games", type=int, default=12)
    parser.add_argument("--stats", type=int, default=100, help="generated tasks to describe (0: none)")
    parser.add_argument("--experts", type=int, default=100, help="generated tasks (seeds 0..) each expert plays to the end, 50 turns (0: none)")
    parser.add_argument("--expert-kinds", nargs="+", default=["planner", "search", "handcoded"], help="the experts --experts plays")
    parser.add_argument("--random", type=int, default=40, help="held-out generated tasks (seeds 1e9..) of random admissible commands, 50 turns (0: none)")
    parser.add_argument("--fixed", type=int, default=40, help="held-out generated tasks (seeds 1e9..) each fixed policy plays, 20 turns as examples/alfworld_tiny.yaml (0: none)")
    parser.add_argument("--fixed-indices", type=int, nargs="+", default=[0, 1, 2, 3, 4, -1], help="the fixed policies: always the K-th admissible command")
    args = parser.parse_args()
    from envhub_alfworld.env import ALFWorldEnv

    names = ("alfworld AlfredTWEnv (handcoded expert)", "envhub ALFWorldEnv (handcoded expert)", "envhub ALFWorldEnv (planner expert)")
    rows = {name: {"steps": 0, "seconds": 0.0, "won": 0} for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_games(root, list(range(args.games)))
        theirs = alfworld_env(root, args.turns)
        ours = {}
        for name, expert in zip(names[1:], ("handcoded", "planner")):
            ours[name] = ALFWorldEnv(source="official", split="train", data_root=str(root), expert=expert)
            ours[name].max_turns = args.turns
        for round_ in range(args.rounds):
            play_alfworld(theirs, args.episodes, args.turns, np.random.default_rng(round_), rows[names[0]])
            for name, env in ours.items():
                play_envhub(env, args.episodes, round_ * args.episodes, np.random.default_rng(round_), rows[name])
        theirs.close()
        for env in ours.values():
            env.close()
    base = rows[names[0]]["steps"] / rows[names[0]]["seconds"] if args.rounds else 0.0
    for name, row in rows.items() if args.rounds else ():
        row["steps_per_s"] = row["steps"] / row["seconds"]
        row["ratio_to_alfworld"] = row["steps_per_s"] / base
        print(f"{name:42s} {row['steps_per_s']:6.2f} steps/s  ({row['steps']} steps in {row['seconds']:.1f} s)  x{row['ratio_to_alfworld']:.2f}")
    stats = task_statistics(args.stats) if args.stats else None
    if stats:
        print(f"\n{stats['tasks']} generated tasks: {stats['receptacles_mean']:.1f} receptacles and {stats['objects_mean']:.1f} objects a scene, "
              f"planner plans of {stats['plan_mean']:.2f} commands")
        for kind, row in stats["per_type"].items():
            print(f"  {kind:32s} {row['share']:6.1%} of tasks (official train split {row['official_train_share']:5.1%}), "
                  f"plans {row['plan_mean']:.2f} commands on average, {row['plan_max']} at most")
    policies = [policy_success(args.experts, 0, name) for name in args.expert_kinds if args.experts]
    if args.random:
        policies.append(policy_success(args.random, 10**9, "random"))
    fixed = [policy_success(args.fixed, 10**9, f"index:{k}", turns=20) for k in args.fixed_indices] if args.fixed else []
    policies += fixed
    for row in policies:
        types = ", ".join(f"{kind} {w}/{n}" for kind, (w, n) in row["per_type"].items())
        print(f"{row['policy']:9s} won {row['won']}/{row['tasks']} (seeds from {row['first_seed']}), "
              f"{row['commands_per_task']:.2f} commands a task; {types}")
    best = max(fixed, key=lambda row: row["won"], default=None)
    if best:
        print(f"best fixed policy: {best['policy']}, {best['won']}/{best['tasks']} held-out tasks in 20 turns")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"args": vars(args), "rows": rows, "task_statistics": stats, "policies": policies,
                                   "best_fixed": best}, indent=2))


if __name__ == "__main__":
    main()
