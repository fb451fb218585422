"""Environment managers, generators and executors: three figures, each a ratio within one run.

1. Manager overhead: one turn of 1,024 envs (128 groups x 8) of FrozenLake and of Sokoban with an
   instant policy (random legal replies decided beforehand). ``EnvGroupManager.step`` (parsing,
   records, the next user message) against raw ``env.step`` of the same envs from the same states
   with the same actions. Goal: ratio <= 1.5. Tokenisation (the tiny byte-level BPE tokenizer and
   its chat template, token-exact continuation) is timed separately, as a second manager.
2. Generators: tokens/s of ``HFGenerator`` and in-process ``VLLMGenerator`` on the tiny model,
   same prompts (first turns of FrozenLake), same sampling, one torch thread each, runs
   interleaved, medians.
3. Executors: env steps/s through the manager with the in-process executor and with the Ray
   actor pool at 1 and 2 workers (a local Ray with 2 CPUs), same batch.

Writes bench/results/manager.json.

    python bench/manager.py [--repeats 15] [--generator-repeats 5] [--skip-generators] [--skip-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import envhub
from envhub.generation import SamplingParams
from envhub.manager import EnvGroupManager, group_seeds

GROUPS, GROUP_SIZE = 128, 8


def turn_overhead(env_id: str, repeats: int, tokenizer) -> dict:
    """Median time of one turn: raw env.step, the manager, the manager with a tokenizer."""
    envs = [envhub.make(env_id) for _ in range(GROUPS * GROUP_SIZE)]
    text = EnvGroupManager(env_id, GROUPS, GROUP_SIZE, seed=0)
    tokens = EnvGroupManager(env_id, GROUPS, GROUP_SIZE, seed=0, tokenizer=tokenizer) if tokenizer is not None else None
    rng = np.random.default_rng(0)
    raw_s, text_s, token_s = [], [], []
    for r in range(repeats):
        seeds = group_seeds(0, r, GROUPS)
        for i, env in enumerate(envs):
            env.reset(seed=seeds[i // GROUP_SIZE])
        actions = [legal[int(rng.integers(len(legal)))] for legal in (env.valid_actions() for env in envs)]
        replies = [f"<answer>{a}</answer>" for a in actions]
        start = time.perf_counter()
        for env, action in zip(envs, actions):
            env.step(action)
        raw_s.append(time.perf_counter() - start)
        for manager, times in ((text, text_s), (tokens, token_s)):
            if manager is None:
                continue
            manager.reset(epoch=r)
            manager.prompts()
            start = time.perf_counter()
            manager.step(replies)
            times.append(time.perf_counter() - start)
    raw, managed = statistics.median(raw_s), statistics.median(text_s)
    figures = {
        "envs": len(envs),
        "raw_ms_per_turn": raw * 1e3,
        "manager_ms_per_turn": managed * 1e3,
        "manager_over_raw": managed / raw,
        "goal_manager_over_raw": 1.5,
    }
    if token_s:
        tokenized = statistics.median(token_s)
        figures["manager_with_tokenizer_ms_per_turn"] = tokenized * 1e3
        figures["tokenisation_ms_per_turn"] = (tokenized - managed) * 1e3
        figures["manager_with_tokenizer_over_raw"] = tokenized / raw
    return figures


def generator_throughput(tiny_path: Path, tokenizer, prompts_n: int, max_new_tokens: int, repeats: int) -> dict:
    """Generated tokens per second (median of ``repeats``) of the HF and in-process vLLM generators, same prompts."""
    from envhub_trl.generators import HFGenerator, VLLMGenerator

    manager = EnvGroupManager("frozenlake/FrozenLake-v0", prompts_n // 8, 8, seed=0, tokenizer=tokenizer)
    manager.reset()
    prompts = manager.prompts()
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=0)

    def rate(generator) -> float:
        start = time.perf_counter()
        completions = generator.generate(prompts, sampling)
        return sum(len(c.token_ids) for c in completions) / (time.perf_counter() - start)

    import torch

    # One thread for both, as vLLM's CPU worker runs: multi-threaded OpenMP on a busy machine
    # slows small matrix products by orders of magnitude and would decide the figure alone.
    torch.set_num_threads(1)
    hf_generator = HFGenerator.from_pretrained(tiny_path, batch_size=len(prompts), dtype="float32", device="cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    vllm_generator = VLLMGenerator(tiny_path, gpu_memory_utilization=0.1, max_model_len=2048, dtype="float32")
    rates: dict[str, list[float]] = {"hf": [], "vllm": []}
    for generator in (hf_generator, vllm_generator):
        generator.generate(prompts[:8], sampling)  # warm-up
    for _ in range(repeats):  # interleaved, so drift in machine load hits both alike
        rates["hf"].append(rate(hf_generator))
        rates["vllm"].append(rate(vllm_generator))
    hf, vllm = statistics.median(rates["hf"]), statistics.median(rates["vllm"])
    return {
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "hf_tokens_per_s": hf,
        "vllm_tokens_per_s": vllm,
        "vllm_over_hf": vllm / hf,
    }


def executor_throughput(env_id: str, workers: list[int], turns: int) -> dict:
    """Env steps per second through the manager: in-process, then Ray actors at each worker count."""
    import ray

    from envhub.executors import InProcessExecutor, RayExecutor

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    def steps_per_second(executor) -> float:
        manager = EnvGroupManager(env_id, GROUPS, GROUP_SIZE, seed=0, executor=executor)
        rng = np.random.default_rng(0)
        manager.reset()
        steps, elapsed = 0, 0.0
        for _ in range(turns):
            prompts = manager.prompts()
            if not prompts:
                break
            replies = [f"<answer>{p.valid_actions[int(rng.integers(len(p.valid_actions)))]}</answer>" for p in prompts]
            start = time.perf_counter()
            manager.step(replies)
            elapsed += time.perf_counter() - start
            steps += len(replies)
        return steps / elapsed

    try:
        figures = {"inprocess_steps_per_s": steps_per_second(InProcessExecutor())}
        for n in workers:
            executor = RayExecutor(num_workers=n)
            steps_per_second(executor)  # warm-up: the actors start and import envhub
            figures[f"ray_{n}_workers_steps_per_s"] = steps_per_second(executor)
            executor.close()
            figures[f"ray_{n}_workers_over_inprocess"] = figures[f"ray_{n}_workers_steps_per_s"] / figures["inprocess_steps_per_s"]
    finally:
        ray.shutdown()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--generator-repeats", type=int, default=5)
    parser.add_argument("--ray-turns", type=int, default=5)
    parser.add_argument("--skip-generators", action="store_true")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "manager.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    tokenizer, tiny_path = None, None
    try:
        from envhub_trl.tiny import build_tiny
        from transformers import AutoTokenizer

        tiny_path = build_tiny(Path(tempfile.mkdtemp(prefix="envhub-bench-")) / "tiny")
        tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    except ImportError as exc:
        print(f"no trainer package ({exc}): tokenisation and generators skipped")

    results: dict = {"turn": {}}
    for env_id in ("frozenlake/FrozenLake-v0", "sokoban/Sokoban-v0"):
        if env_id not in envhub.registry:
            print(f"{env_id}: not installed, skipped")
            continue
        figures = turn_overhead(env_id, args.repeats, tokenizer)
        results["turn"][env_id] = figures
        line = f"{env_id}: one turn of {figures['envs']} envs: raw {figures['raw_ms_per_turn']:.1f} ms, manager {figures['manager_ms_per_turn']:.1f} ms, ratio {figures['manager_over_raw']:.2f} (goal <= 1.5)"
        if "tokenisation_ms_per_turn" in figures:
            line += f"; tokenisation +{figures['tokenisation_ms_per_turn']:.1f} ms"
        print(line)
    if tiny_path is not None and not args.skip_generators:
        results["generators"] = gen = generator_throughput(tiny_path, tokenizer, args.prompts, args.max_new_tokens, args.generator_repeats)
        print(f"generators on the tiny model, {gen['prompts']} prompts x {gen['max_new_tokens']} tokens: HF {gen['hf_tokens_per_s']:.0f} tok/s, vLLM {gen['vllm_tokens_per_s']:.0f} tok/s, vLLM/HF {gen['vllm_over_hf']:.2f}")
    if not args.skip_ray:
        results["executors"] = ex = executor_throughput("frozenlake/FrozenLake-v0", [1, 2], args.ray_turns)
        print("executors, env steps/s: " + ", ".join(f"{k} {v:.2f}" if "over" in k else f"{k} {v:.0f}" for k, v in ex.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
