"""Tool envs: steps/s of each tool env, and the search tool's p50 latency at each variant's corpus size.

1. Steps/s: the expert plays whole episodes (reset included, as training pays for it) for
   ``--seconds`` per env; steps/s counts every ``step`` call, the episodes' resets included in the time.
   Resets are timed on their own as well (MultiHopQA draws and indexes a new world per episode).
2. Search latency: for each MultiHopQA corpus size among the variants, ``search(query)`` (BM25
   top k, result formatting included) on the expert's queries and on the question text itself,
   over ``--worlds`` worlds; p50 and p95 in microseconds.

Writes bench/results/tools.json.

    python bench/tools.py [--seconds 3] [--worlds 20]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import envhub


def steps_per_second(env_id: str, seconds: float) -> dict[str, float]:
    env = envhub.make(env_id)
    steps = episodes = 0
    reset_time = 0.0
    seed = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        env.reset(seed=seed)
        reset_time += time.perf_counter() - t
        seed += 1
        episodes += 1
        while True:
            *_, terminated, truncated, _ = env.step(env.expert_action())
            steps += 1
            if terminated or truncated:
                break
    elapsed = time.perf_counter() - start
    return {"steps_per_s": steps / elapsed, "episodes": episodes, "steps": steps, "reset_ms": 1000 * reset_time / episodes}


def search_latency(corpus_size: int, worlds: int) -> dict[str, float]:
    env = envhub.make("tools/MultiHopQA-v0", corpus_size=corpus_size)
    times = []
    for seed in range(worlds):
        env.reset(seed=seed)
        queries = [env.entities[i].name for i in env.question.chain[:-1]] + [env.question.text]
        for query in queries:
            for _ in range(5):
                t = time.perf_counter()
                env.search(query)
                times.append(time.perf_counter() - t)
    micro = np.array(times) * 1e6
    return {"p50_us": float(np.percentile(micro, 50)), "p95_us": float(np.percentile(micro, 95)), "calls": len(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--worlds", type=int, default=20)
    args = parser.parse_args()
    ids = [s.id for s in envhub.registry.values() if s.id.startswith("tools/") or s.id == "webshop/WebShopTools-v0"]
    results: dict = {"steps": {}, "search": {}}
    for env_id in ids:
        try:
            results["steps"][env_id] = figures = steps_per_second(env_id, args.seconds)
        except FileNotFoundError as exc:  # WebShop's data is not here
            print(f"{env_id}: skipped ({exc})")
            continue
        print(f"{env_id:32s} {figures['steps_per_s']:9.0f} steps/s  reset {figures['reset_ms']:7.2f} ms  ({figures['episodes']} episodes)")
    sizes = sorted({envhub.spec(i).kwargs["corpus_size"] for i in ids if "MultiHopQA" in i})
    for size in sizes:
        results["search"][str(size)] = figures = search_latency(size, args.worlds)
        print(f"search over {size:5d} documents: p50 {figures['p50_us']:7.1f} us  p95 {figures['p95_us']:7.1f} us  ({figures['calls']} calls)")
    out = Path(__file__).parent / "results" / "tools.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
