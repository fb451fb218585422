"""Dynamics and rewards parity: envhub-sokoban against gym-sokoban's own ``SokobanEnv.step``.

gym-sokoban's env needs gym, which needs numpy<2, so it runs in a throwaway venv
(``bench/.cache/gym-venv``, git-ignored; nothing is installed into the project's environment).
Levels come from envhub-sokoban's generator (6x6/1, 8x8/2, 10x10/3); on each, three action
sequences are played by both implementations, step by step: uniformly random actions, the
optimal solution, and random actions followed by the expert's (so boxes go on and off targets and
levels get solved). Every step's reward, done flag and full room state must be equal. Reports the
steps compared, the reward events covered (+1, -1, +10, blocked moves) and the mismatches.
Writes bench/results/sokoban_parity.json.

    python bench/sokoban_parity.py [--levels 30] [--steps 120]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import venv
from pathlib import Path

import numpy as np

from envhub_sokoban import ACTIONS, Oracle, generate_level
from envhub_sokoban.env import step_reward
from envhub_sokoban.interop import board_from_rooms, board_to_rooms

HERE = Path(__file__).resolve().parent
SETTINGS = [(6, 6, 1, 10), (8, 8, 2, 20), (10, 10, 3, 30)]

# Runs inside the throwaway venv: play each case through gym-sokoban's SokobanEnv.step.
GYM_WORKER = r"""
import json, sys
import numpy as np
from gym_sokoban.envs.sokoban_env import SokobanEnv
out = []
for case in json.load(sys.stdin):
    fixed, state = np.array(case["fixed"]), np.array(case["state"])
    env = SokobanEnv(dim_room=fixed.shape, num_boxes=case["boxes"], max_steps=10**6, reset=False)
    # What SokobanEnv.reset sets after generate_room.
    env.room_fixed, env.room_state = fixed, state
    env.player_position = np.argwhere(state == 5)[0]
    env.num_env_steps, env.reward_last, env.boxes_on_target = 0, 0, 0
    trace = []
    for action in case["actions"]:
        _, reward, done, _ = env.step(action, observation_mode="tiny_rgb_array")
        trace.append({"reward": float(reward), "done": bool(done), "state": env.room_state.astype(int).tolist()})
        if done:
            break
    out.append(trace)
print(json.dumps(out))
"""


def gym_python(cache: Path) -> Path:
    """The throwaway venv's python, created with gym, numpy<2 and gym-sokoban on first use."""
    env_dir = cache / "gym-venv"
    python = env_dir / "bin" / "python"
    if not python.exists():
        venv.create(env_dir, with_pip=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "numpy<2", "gym", "imageio", "requests", "tqdm"], check=True)
        subprocess.run([*pip, "--no-deps", "gym-sokoban"], check=True)
    return python


def cases_for(rng: np.random.Generator, levels: int, steps: int) -> list[dict]:
    """Levels and action sequences (random, optimal, random then expert) for every setting."""
    cases = []
    for height, width, boxes, depth in SETTINGS:
        for _ in range(levels):
            level = generate_level(rng, height=height, width=width, num_boxes=boxes, search_depth=depth)
            oracle = Oracle(level.board, level.table)
            random_moves = [ACTIONS[int(i)] for i in rng.integers(4, size=steps)]
            mixed = random_moves[: steps // 2]
            board = level.board
            for action in mixed:
                board = board.move(action)[0]
            for _ in range(steps // 2):
                action = oracle.action(board)
                if action is None:
                    break
                mixed.append(action)
                board = board.move(action)[0]
            fixed, state = board_to_rooms(level.board)
            for actions in (random_moves, oracle.solve(level.board), mixed):
                cases.append(
                    {
                        "setting": f"{height}x{width}/{boxes}",
                        "boxes": boxes,
                        "fixed": fixed.tolist(),
                        "state": state.tolist(),
                        "actions": [ACTIONS.index(a) + 1 for a in actions],  # gym-sokoban: 1..4 push up/down/left/right
                    }
                )
    return cases


def envhub_trace(case: dict) -> list[dict]:
    board = board_from_rooms(case["fixed"], case["state"])
    trace = []
    for index in case["actions"]:
        before = board.boxes_on_target
        board, _, _ = board.move(ACTIONS[index - 1])
        reward = step_reward(before, board.boxes_on_target, board.solved)
        trace.append({"reward": reward, "done": board.solved, "state": board_to_rooms(board)[1].tolist()})
        if board.solved:
            break
    return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, default=30, help="levels per setting")
    parser.add_argument("--steps", type=int, default=120, help="random actions per random sequence")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=HERE / ".cache")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sokoban_parity.json")
    args = parser.parse_args()

    cases = cases_for(np.random.default_rng(args.seed), args.levels, args.steps)
    proc = subprocess.run(
        [str(gym_python(args.cache)), "-c", GYM_WORKER], input=json.dumps(cases), capture_output=True, text=True, check=True
    )
    gym_traces = json.loads(proc.stdout)

    per_setting: dict[str, dict] = {}
    mismatches = []
    for case, theirs in zip(cases, gym_traces):
        ours = envhub_trace(case)
        row = per_setting.setdefault(
            case["setting"], {"sequences": 0, "steps": 0, "box_on_target": 0, "box_off_target": 0, "solved": 0, "blocked": 0}
        )
        row["sequences"] += 1
        if len(ours) != len(theirs):
            mismatches.append({"setting": case["setting"], "what": f"episode length {len(ours)} vs gym {len(theirs)}"})
        previous = case["state"]
        for t, (a, b) in enumerate(zip(ours, theirs)):
            row["steps"] += 1
            bonus = round(b["reward"] + 0.1, 6)
            row["box_on_target"] += bonus in (1.0, 11.0)
            row["box_off_target"] += bonus == -1.0
            row["solved"] += b["done"]
            row["blocked"] += b["state"] == previous
            previous = b["state"]
            if a["reward"] != b["reward"] or a["done"] != b["done"] or a["state"] != b["state"]:
                mismatches.append({"setting": case["setting"], "step": t, "ours": a, "gym": b})
                break
    total = sum(r["steps"] for r in per_setting.values())
    for setting, row in per_setting.items():
        print(
            f"{setting:>9}: {row['sequences']} sequences, {row['steps']} steps compared; events: "
            f"{row['box_on_target']} box onto target, {row['box_off_target']} box off target, "
            f"{row['solved']} solved, {row['blocked']} blocked moves"
        )
    print(f"{total} steps compared, {len(mismatches)} mismatches (rewards, done and room state must be equal)")
    result = {"benchmark": "sokoban_parity", "steps_compared": total, "mismatches": mismatches[:20],
              "mismatch_count": len(mismatches), "settings": per_setting}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
