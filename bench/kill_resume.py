"""A checkpointed training SIGKILLed at random moments and resumed each time ends with the
uninterrupted run's weights and figures (issue 43).

``envhub train --model tiny`` (GiGPO on the non-slippery FrozenLake, the HF generator, a checkpoint
every step, the last few kept) runs ``--steps`` steps uninterrupted, in a process of its own. Then
the same run, in a fresh folder, is killed with SIGKILL ``--kills`` times and resumed with
``--resume`` after each kill, until it finishes. Kill ``i`` comes once the run has written a
checkpoint at or past a step drawn at random (the steps sorted, each past the last kill's), plus a
random fraction of a step's time, so kills land in rollouts, optimizer steps and checkpoint writes
alike. After each kill every checkpoint left is checked whole (``run_state.checkpoint_damage``).
The figures: the largest weight difference between the two final models (the goal: at most 1e-6),
whether the results match (wall-clock figures aside), how far training moved the weights from the
tiny model it started from (so the comparison can fail), and where each kill landed.

    python bench/kill_resume.py [--steps 50] [--kills 5] [--seed 0] [--workdir DIR]

Writes bench/results/kill_resume.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from safetensors.torch import load_file

from envhub_trl import run_files, run_state
from envhub_trl.models import load_model_and_tokenizer

ENV = "frozenlake/FrozenLakeNotSlippery-v0"
CONFIG = """\
max_turns: 3
groups_per_step: 2
group_size: 2
per_device_train_batch_size: 4
max_steps: {steps}
max_turn_tokens: 6
eval_episodes: 2
save_strategy: steps
save_steps: 1
save_total_limit: 4
logging_steps: 1
disable_tqdm: true
seed: 5
learning_rate: 0.01
format_penalty: -0.1
"""
#: Figures that measure the wall clock, not the run.
CLOCK = ("seconds", "phase_seconds")


def command(config: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "envhub", "train", "--env", ENV, "--model", "tiny", "--algo", "gigpo", "--config", str(config),
            "--output-dir", str(out), *extra]


def last_step(out: Path) -> int:
    """The step of the last checkpoint the run has written (0 for none)."""
    found = run_state.checkpoints(out)
    return int(found[-1].name.rsplit("-", 1)[1]) if found else 0


def run_to_end(argv: list[str], log: Path) -> float:
    started = time.perf_counter()
    with open(log, "a") as handle:
        subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - started


def kill_at(argv: list[str], out: Path, target: int, step_seconds: float, rng: random.Random, log: Path) -> dict:
    """Start ``argv``; once its folder holds a checkpoint at or past ``target``, wait a random
    fraction of a step and SIGKILL it. Returns where the kill landed."""
    started = time.perf_counter()
    with open(log, "a") as handle:
        process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT)
    while process.poll() is None and last_step(out) < target:
        time.sleep(0.05)
    if process.poll() is not None:
        return {"target": target, "killed": False, "exit_code": process.returncode}
    time.sleep(rng.uniform(0, step_seconds))
    at = last_step(out)
    process.send_signal(signal.SIGKILL)
    process.wait()
    damaged = {p.name: run_state.checkpoint_damage(p) for p in run_state.checkpoints(out)}
    return {
        "target": target,
        "killed": process.returncode == -signal.SIGKILL,
        "seconds_after_start": round(time.perf_counter() - started, 2),
        "last_checkpoint_seen_before_kill": at,
        "last_checkpoint_after_kill": last_step(out),
        "partial_writes_left": sorted(p.name for p in out.iterdir() if p.name.startswith(run_files.PARTIAL_PREFIX)),
        "damaged_checkpoints": {name: problem for name, problem in damaged.items() if problem is not None},
    }


def results(out: Path) -> dict:
    figures = json.loads((out / "results.json").read_text())
    return {k: v for k, v in figures.items() if k not in CLOCK}


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="Seeds the kill moments.")
    parser.add_argument("--workdir", type=Path, default=None, help="Where the runs go (default: a temporary folder).")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "kill_resume.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="envhub-kill-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    config = work / "run.yaml"
    config.write_text(CONFIG.format(steps=args.steps))
    log = work / "log.txt"

    whole, cut = work / "whole", work / "cut"
    whole_seconds = run_to_end(command(config, whole), log)
    rl_seconds = json.loads((whole / "results.json").read_text())["phase_seconds"]["rl"]
    step_seconds = rl_seconds / args.steps
    print(f"uninterrupted: {args.steps} steps in {whole_seconds:.0f} s ({step_seconds:.2f} s a step)", flush=True)

    rng = random.Random(args.seed)
    targets = sorted(rng.sample(range(1, args.steps), args.kills))
    kills, started = [], time.perf_counter()
    for i, target in enumerate(targets):
        target = max(target, last_step(cut) + 1)
        kill = kill_at(command(config, cut, *(["--resume"] if i else [])), cut, target, step_seconds, rng, log)
        kills.append(kill)
        print(f"kill {i + 1}: {kill}", flush=True)
    resumes = run_to_end(command(config, cut, "--resume"), log)
    chain_seconds = time.perf_counter() - started

    final_whole, final_cut = load_file(str(whole / "final" / "model.safetensors")), load_file(str(cut / "final" / "model.safetensors"))
    initial = load_model_and_tokenizer("tiny", [ENV], 5, kwargs_by_env={ENV: {}})[0].state_dict()  # the run's start (seed 5)
    difference = max_difference(final_cut, final_whole)
    figures = {
        "steps": args.steps,
        "kill_seed": args.seed,
        "kills": kills,
        "kills_landed": sum(k["killed"] for k in kills),
        "damaged_checkpoints_after_kills": sum(len(k.get("damaged_checkpoints", {})) for k in kills),
        "max_weight_difference_resumed_vs_uninterrupted": difference,
        "max_weight_difference_initial_vs_final": max_difference({k: initial[k] for k in final_whole}, final_whole),
        "results_equal": results(cut) == results(whole),
        "rl_steps": [results(whole)["rl_steps"], results(cut)["rl_steps"]],
        "checkpoint_past_max_steps": any(last_step(folder) > args.steps for folder in (whole, cut)),
        "uninterrupted_seconds": round(whole_seconds, 1),
        "killed_and_resumed_seconds": round(chain_seconds, 1),
        "last_resume_seconds": round(resumes, 1),
        "seconds_per_step": round(step_seconds, 2),
        "workdir": str(work),
    }
    print(json.dumps({k: v for k, v in figures.items() if k != "kills"}, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    ok = figures["kills_landed"] == args.kills and difference <= 1e-6 and figures["results_equal"] and not figures["checkpoint_past_max_steps"]
    print(("PASS" if ok else "FAIL") + f": {figures['kills_landed']} kills, weights within {difference:.1e}, results equal: {figures['results_equal']}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
