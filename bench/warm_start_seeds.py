"""Does the warm start read its view at every training seed? Held-out greedy success on validation
seeds after the supervised warm start alone (no RL), one training seed after another.

Each seed builds the tiny model (its weights seeded with the training seed), runs the config's
``warm_start`` (overridden by ``--warm-start JSON``), and plays greedily on ``--episodes``
validation seeds from 500,000,000 (the held-out evaluation seeds of ``envhub train`` start at
1,000,000,000, so nothing here is tuned on them). A warm start that ignores its input plays one
fixed route and lands at the open-loop level; one that reads the view avoids the holes beside it.

Usage:
    python bench/warm_start_seeds.py --seeds 0 1 2 3 4 --set show_turns=false \\
        --warm-start '{"episodes": 1024, "steps": 300, "learning_rate": 3e-4}'

Writes bench/results/warm_start_seeds.json (or ``--out``; one file per call).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from envhub.generation import SamplingParams  # noqa: E402
from envhub_trl.config import EnvGRPOConfig  # noqa: E402
from envhub_trl.evaluation import evaluate_generator  # noqa: E402
from envhub_trl.generators.hf import HFGenerator  # noqa: E402
from envhub_trl.models import load_model_and_tokenizer  # noqa: E402
from envhub_trl.tiny import TinySpec  # noqa: E402
from envhub_trl.run import load_config_file  # noqa: E402
from envhub_trl.warm_start import WarmStart  # noqa: E402

VALIDATION_OFFSET = 500_000_000
ROOT = Path(__file__).resolve().parent.parent


def warm_start_success(values: dict, warm_start: WarmStart, seed: int, episodes: int) -> dict:
    """Warm-start the tiny model at training ``seed``; its greedy figures on the validation seeds."""
    values = dict(values)
    tiny = TinySpec.from_mapping(values.pop("tiny", None))
    args = EnvGRPOConfig(**{**values, "seed": seed, "output_dir": "/tmp/envhub-warm-start-seeds", "report_to": "none"})
    entry = args.env_entries()[0]
    settings = args.env_settings(entry)
    started = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer("tiny", [entry.env_id], seed, kwargs_by_env={entry.env_id: entry.env_kwargs}, tiny=tiny)
    losses = warm_start.run_on(model, tokenizer, [settings], seed, bf16=bool(args.bf16))
    trained = time.perf_counter()
    sampling = SamplingParams(max_new_tokens=args.max_turn_tokens, temperature=0.0, seed=seed)
    seeds = list(range(VALIDATION_OFFSET, VALIDATION_OFFSET + episodes))
    metrics = evaluate_generator(HFGenerator(model, tokenizer, batch_size=256), tokenizer, settings, seeds, sampling)
    return {
        "seed": seed, "success_rate": metrics["success_rate"], "mean_turns": metrics["mean_turns"],
        "truncated_rate": metrics["truncated_rate"], "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        "warm_start_seconds": trained - started, "eval_seconds": time.perf_counter() - trained,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Held-out greedy success after the warm start, per training seed.")
    # The 1,000-step warm start that reads the view at every seed (make demo's until 2026-11-28).
    parser.add_argument("--config", default=str(ROOT / "bench" / "learning" / "frozenlake_not_slippery.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Override a config value.")
    parser.add_argument("--warm-start", default="{}", help="JSON of WarmStart fields over the config's warm_start.")
    parser.add_argument("--episodes", type=int, default=256, help="Validation episodes per seed.")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "warm_start_seeds.json"), help="Where to write the figures.")
    args = parser.parse_args()
    values = load_config_file(args.config, args.set, ignore=("model", "targets"))  # checked as `envhub train` checks it
    warm_start = WarmStart.from_mapping({**(values.pop("warm_start", None) or {}), **json.loads(args.warm_start)})
    print(f"{values.get('env_id')}: {warm_start.describe()}; {args.episodes} validation seeds, greedy")
    runs = []
    for seed in args.seeds:
        run = warm_start_success(values, warm_start, seed, args.episodes)
        runs.append(run)
        print(f"  training seed {seed}: {run['success_rate']:.1%} (mean turns {run['mean_turns']:.2f}; "
              f"warm start {run['warm_start_seconds']:.0f} s)", flush=True)
    rates = [r["success_rate"] for r in runs]
    print(f"  mean {sum(rates) / len(rates):.1%}, lowest {min(rates):.1%}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": args.config, "overrides": args.set, "warm_start": warm_start.__dict__, "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
