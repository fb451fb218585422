"""Where a Sokoban policy's greedy episodes go wrong: a box stuck for good, or turns run out.

A run that stops under the target ("RL alone", issue 40) can stop for different reasons, and the
levers differ: a policy that pushes boxes into corners has not learnt what a push does; one that
wanders with the level still solvable has not learnt where to go; one whose replies are invalid
has lost its format. This plays a model folder's policy greedily on the validation levels (the
run's prompt, the move sampled after ``<answer>``, as ``bench/rl_sim.py`` plays it), replays each
episode in the real env with the optimal solver (``envhub_sokoban.solver.solve``) after every
turn, and counts, per episode:

- the turn, if any, after which the level could not be solved any more (a box stuck for good);
- the moves that did not bring the solution one step nearer (the optimal remaining length did not
  fall by one), and the first of them;
- invalid replies;
- the moves themselves (None for an invalid reply), in the JSON.

It prints success by the level's optimal length, the failures split into *stuck* and *out of
turns*, and the share of optimal moves at each turn; writes bench/results/sokoban_failures/NAME.json.

    python bench/sokoban_failures.py --config CONFIG --model FOLDER [--name NAME]

``FOLDER``: a model folder, e.g. ``bench/rl_sim.py --save``'s or a trainer run's ``final``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import yaml

import envhub

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from rl_sim import VALIDATION, ModelPolicy, choice_index, play  # noqa: E402


def remaining(env: Any) -> int | None:
    """The optimal number of moves left from the env's board; None where no solution exists."""
    from envhub_sokoban.solver import solve

    path = solve(env.unwrapped.board)
    return None if path is None else len(path)


def replay(env: Any, seed: int, moves: list[str | None]) -> dict[str, Any]:
    """One episode's moves (None: an invalid reply) replayed from ``seed`` with the solver after each turn."""
    _, info = env.reset(seed=seed)
    optimal = info.get("optimal_length")
    left = [remaining(env)]
    won = False
    for move in moves:
        if move is not None and not won:
            *_, info = env.step(move)
            won = bool(info.get("success"))
        left.append(remaining(env))
    wasted = [t for t in range(len(moves)) if left[t] is not None and (left[t + 1] is None or left[t + 1] != left[t] - 1)]
    stuck = next((t for t in range(len(moves)) if left[t] is not None and left[t + 1] is None), None)
    return {
        "seed": seed, "moves": list(moves), "optimal_length": int(optimal if optimal is not None else left[0] or 0), "won": won,
        "turns": len(moves), "stuck_at": stuck, "wasted": len(wasted), "first_wasted": wasted[0] if wasted else None,
        "invalid": sum(m is None for m in moves), "optimal_moves": [t not in wasted for t in range(len(moves))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the run's YAML (bench/learning/format/sokoban6x6.yaml)")
    parser.add_argument("--model", required=True, help="a model folder")
    parser.add_argument("--episodes", type=int, default=256, help="validation levels (seeds from 5 * 10^8)")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    if not str(config["env_id"]).startswith("sokoban/"):
        raise SystemExit(f"{args.config}: a Sokoban config, not {config['env_id']}")
    turns, penalty = int(config["max_turns"]), float(config.get("format_penalty", -0.1))
    envs = [envhub.make(config["env_id"], **config.get("env_kwargs", {})) for _ in range(64)]
    names = tuple(envs[0].unwrapped.action_names)
    policy = ModelPolicy(args.model, config, names)
    policy.eval()
    column = {c: k for k, c in enumerate(choice_index(policy))}
    episodes = []
    for start in range(0, args.episodes, len(envs)):
        seeds = [VALIDATION + start + k for k in range(min(len(envs), args.episodes - start))]
        played, won = play(policy, envs, seeds, turns, penalty, greedy=True)
        for seed, episode, w in zip(seeds, played, won):
            moves = [names[column[t[1]]] if t[1] in column else None for t in episode]
            record = replay(envs[0], seed, moves)
            if record["won"] != w:
                raise SystemExit(f"seed {seed}: the replay's outcome differs from the play's")
            episodes.append(record)

    by_length: dict[int, list[bool]] = collections.defaultdict(list)
    for e in episodes:
        by_length[int(e["optimal_length"])].append(e["won"])
    failed = [e for e in episodes if not e["won"]]
    stuck = [e for e in failed if e["stuck_at"] is not None]
    per_turn = [[e["optimal_moves"][t] for e in episodes if len(e["optimal_moves"]) > t and e["optimal_length"] > 0] for t in range(turns)]
    summary = {
        "model": args.model, "episodes": len(episodes), "success": float(np.mean([e["won"] for e in episodes])),
        "success_by_optimal_length": {str(n): {"levels": len(v), "success": float(np.mean(v))} for n, v in sorted(by_length.items())},
        "failed": len(failed), "stuck": len(stuck), "out_of_turns": len(failed) - len(stuck),
        "stuck_at_turn": dict(sorted(collections.Counter(int(e["stuck_at"]) for e in stuck).items())),
        "first_wasted_turn_of_failures": dict(sorted(collections.Counter(int(e["first_wasted"]) for e in failed if e["first_wasted"] is not None).items())),
        "invalid_replies_per_failure": float(np.mean([e["invalid"] for e in failed])) if failed else 0.0,
        "optimal_move_rate_by_turn": [round(float(np.mean(v)), 3) if v else None for v in per_turn],
    }
    print(f"{args.model}: {summary['success']:.1%} greedy on {len(episodes)} validation levels")
    for n, v in summary["success_by_optimal_length"].items():
        print(f"  optimal length {n}: {v['levels']} levels, {v['success']:.1%} won")
    print(f"  failures: {len(failed)}; a box stuck for good in {len(stuck)} (at turns {summary['stuck_at_turn']}), "
          f"out of turns with the level solvable in {summary['out_of_turns']}; invalid replies a failure: {summary['invalid_replies_per_failure']:.2f}")
    print(f"  first move off an optimal path, failures: {summary['first_wasted_turn_of_failures']}")
    print(f"  optimal moves by turn: {summary['optimal_move_rate_by_turn']}")
    name = args.name or Path(args.model).name
    out = ROOT / "results" / "sokoban_failures" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "episodes": episodes}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
