"""Level generation time: envhub-sokoban's generator against gym-sokoban's ``generate_room``, same run.

gym-sokoban is installed into a throwaway venv (``bench/.cache/gym-sokoban-venv``, git-ignored;
nothing goes into the project's environment) and its ``envs/room_utils.py`` is loaded by file
path, which runs on numpy 2 without gym. Each generator makes ``--levels`` levels per setting
(6x6/1 box, 8x8/2, 10x10/3) from seeds 0..n-1, timed one level at a time: gym-sokoban as
``SokobanEnv`` calls it (``num_steps = 1.7 * (height + width)``, its default 4 tries; a level that
raises counts as a failure and its time counts too); envhub-sokoban with the registered variants'
``search_depth``. Also reported: the optimal solution lengths of both generators' levels (from
envhub-sokoban's solver) and that solver's time on both generators' levels. Goal: gym-sokoban median /
envhub median >= 10 at 8x8/2 and at 10x10/3. Writes bench/results/sokoban_generation.json.

    python bench/sokoban_generation.py [--levels 50]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
import venv
from pathlib import Path

import numpy as np

from envhub_sokoban import generate_level, solve
from envhub_sokoban.interop import board_from_rooms

HERE = Path(__file__).resolve().parent
SETTINGS = [  # height, width, boxes, envhub search_depth (as registered)
    (6, 6, 1, 10),
    (8, 8, 2, 20),
    (10, 10, 3, 30),
]

# Runs inside the throwaway venv: time gym-sokoban's generate_room, print levels and times as JSON.
GYM_WORKER = r"""
import importlib.util, json, pathlib, random, sys, time
import numpy as np
# find_spec does not run gym_sokoban/__init__.py, which imports gym.
package = importlib.util.find_spec("gym_sokoban")
path = pathlib.Path(package.submodule_search_locations[0]) / "envs" / "room_utils.py"
spec = importlib.util.spec_from_file_location("room_utils", path)
room_utils = importlib.util.module_from_spec(spec)
spec.loader.exec_module(room_utils)
height, width, boxes, levels = (int(a) for a in sys.argv[1:5])
records = []
for seed in range(levels):
    random.seed(seed)
    np.random.seed(seed)
    start = time.perf_counter()
    try:
        fixed, state, _ = room_utils.generate_room(dim=(height, width), num_steps=int(1.7 * (height + width)), num_boxes=boxes)
        level = {"fixed": fixed.astype(int).tolist(), "state": state.astype(int).tolist()}
    except (RuntimeError, RuntimeWarning) as exc:
        level = {"error": f"{type(exc).__name__}: {exc}"}
    level["seconds"] = time.perf_counter() - start
    records.append(level)
print(json.dumps({"numpy": np.__version__, "records": records}))
"""


def gym_python(cache: Path) -> Path:
    """The throwaway venv's python, created with gym-sokoban (no gym) on first use."""
    env_dir = cache / "gym-sokoban-venv"
    python = env_dir / "bin" / "python"
    if not python.exists():
        venv.create(env_dir, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "gym-sokoban", "numpy"], check=True)
    return python


def gym_version(python: Path) -> str:
    out = subprocess.run([str(python), "-m", "pip", "show", "gym-sokoban"], capture_output=True, text=True, check=True)
    return next(line.split(":", 1)[1].strip() for line in out.stdout.splitlines() if line.startswith("Version:"))


def summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(1000 * s for s in seconds)
    return {
        "median_ms": statistics.median(ms),
        "p90_ms": float(np.percentile(ms, 90)),
        "mean_ms": statistics.fmean(ms),
        "max_ms": ms[-1],
    }


def lengths(values: list[int]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "mean": statistics.fmean(values)}


def run_setting(python: Path, height: int, width: int, boxes: int, depth: int, levels: int) -> dict:
    proc = subprocess.run(
        [str(python), "-c", GYM_WORKER, str(height), str(width), str(boxes), str(levels)],
        capture_output=True, text=True, check=True,
    )
    gym = json.loads(proc.stdout)
    gym_records = gym["records"]
    gym_failures = [r["error"] for r in gym_records if "error" in r]
    gym_lengths, gym_solve_seconds = [], []
    for record in gym_records:
        if "error" not in record:
            start = time.perf_counter()
            gym_lengths.append(len(solve(board_from_rooms(record["fixed"], record["state"]))))
            gym_solve_seconds.append(time.perf_counter() - start)

    ours_seconds, ours_lengths, ours_attempts, solve_seconds = [], [], [], []
    for seed in range(levels):
        start = time.perf_counter()
        level = generate_level(np.random.default_rng(seed), height=height, width=width, num_boxes=boxes, search_depth=depth)
        ours_seconds.append(time.perf_counter() - start)
        ours_lengths.append(level.optimal_length)
        ours_attempts.append(level.attempts)
        start = time.perf_counter()
        path = solve(level.board)
        solve_seconds.append(time.perf_counter() - start)
        if path is None or len(path) != level.optimal_length:
            raise AssertionError(f"seed {seed}: the solver disagrees with the generator's optimal length")

    gym_time, ours_time = summary([r["seconds"] for r in gym_records]), summary(ours_seconds)
    return {
        "setting": f"{height}x{width}/{boxes}",
        "levels": levels,
        "gym_sokoban": {
            **gym_time,
            "failures": len(gym_failures),
            "failure_messages": sorted(set(gym_failures)),
            "optimal_length": lengths(gym_lengths) if gym_lengths else None,
            "envhub_solver": summary(gym_solve_seconds) if gym_solve_seconds else None,
            "numpy": gym["numpy"],
        },
        "envhub_sokoban": {
            **ours_time,
            "failures": 0,
            "search_depth": depth,
            "rooms_drawn_mean": statistics.fmean(ours_attempts),
            "optimal_length": lengths(ours_lengths),
            "solver_from_scratch": summary(solve_seconds),
        },
        "speedup_median": gym_time["median_ms"] / ours_time["median_ms"],
        "speedup_p90": gym_time["p90_ms"] / ours_time["p90_ms"],
        "speedup_mean": gym_time["mean_ms"] / ours_time["mean_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, default=50)
    parser.add_argument("--cache", type=Path, default=HERE / ".cache")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sokoban_generation.json")
    args = parser.parse_args()

    python = gym_python(args.cache)
    rows = []
    for height, width, boxes, depth in SETTINGS:
        row = run_setting(python, height, width, boxes, depth, args.levels)
        rows.append(row)
        g, o = row["gym_sokoban"], row["envhub_sokoban"]
        print(
            f"{row['setting']:>9}  gym-sokoban median {g['median_ms']:8.2f} ms  p90 {g['p90_ms']:8.2f} ms  "
            f"failures {g['failures']:2d}  |  envhub median {o['median_ms']:6.2f} ms  p90 {o['p90_ms']:6.2f} ms  "
            f"failures 0  |  speedup median {row['speedup_median']:6.1f}x  p90 {row['speedup_p90']:6.1f}x  |  "
            f"optimal length median gym {g['optimal_length']['median'] if g['optimal_length'] else '-'} "
            f"envhub {o['optimal_length']['median']}  |  solver on envhub levels median "
            f"{o['solver_from_scratch']['median_ms']:.1f} ms max {o['solver_from_scratch']['max_ms']:.1f} ms"
            + (f", on gym levels median {g['envhub_solver']['median_ms']:.1f} ms max {g['envhub_solver']['max_ms']:.1f} ms"
               if g["envhub_solver"] else ""),
            flush=True,
        )
    result = {
        "benchmark": "sokoban_generation",
        "python": platform.python_version(),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "gym_sokoban_version": gym_version(python),
        "numpy_envhub": np.__version__,
        "settings": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
