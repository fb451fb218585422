"""A table of a training run's per-step metrics, read back from its ``envhub train --verbose`` log.

With ``--verbose`` the trainer prints each step's metrics dict (TRL's log line); this reads those
lines and prints the chosen metrics every ``--every`` steps, with the held-out (or validation)
lines between them, so that a run's diagnostics (``diag/``, ``env/``; docs/training.md) can be read
as a table:

    envhub train --verbose --model tiny --config examples/frozenlake_rl_alone.yaml --output-dir OUT > OUT.log 2>&1
    python bench/log_table.py OUT.log env/success_rate,env/zero_std_group_fraction,grad_norm --every 20
"""

from __future__ import annotations

import argparse
import ast
import math

DEFAULT = "env/success_rate,env/invalid_action_rate,diag/first_move_entropy,diag/observation_action_information,env/zero_std_group_fraction,grad_norm"


def rows(path: str) -> list[dict[str, float] | str]:
    """The log's step dicts (values as floats) and its held-out lines, in order."""
    out: list[dict[str, float] | str] = []
    with open(path, encoding="utf-8", errors="replace") as log:
        for line in log:
            line = line.strip()
            if line.startswith("{'loss'"):
                values = ast.literal_eval(line)
                out.append({k: _number(v) for k, v in values.items()})
            elif line.startswith("held-out success"):
                out.append(line)
    return out


def _number(value: object) -> float:
    try:
        return float(value)  # TRL prints some numbers as quoted strings
    except (TypeError, ValueError):
        return math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="an `envhub train --verbose` log")
    parser.add_argument("metrics", nargs="?", default=DEFAULT, help="comma-separated metric names")
    parser.add_argument("--every", type=int, default=1, help="print every Nth step (and the first)")
    args = parser.parse_args()
    keys = args.metrics.split(",")
    print("step " + " ".join(f"{k.split('/')[-1][:12]:>12}" for k in keys))
    step = 0
    for row in rows(args.log):
        if isinstance(row, str):
            print(row)
            continue
        step += 1
        if step == 1 or step % args.every == 0:
            print(f"{step:4d} " + " ".join(f"{row.get(k, math.nan):12.3f}" for k in keys))


if __name__ == "__main__":
    main()
