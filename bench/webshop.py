"""WebShop: start-up, memory, step and search latency, at 1k products and at 100k resampled.

Measured in one run:
- start-up and peak RSS of a fresh process that imports envhub, makes ``webshop/WebShop-v0`` and
  resets it, against a fresh process that only imports envhub (the baseline);
- step latency p50/p99 of ``search[...]`` steps (a new query each: the instructions of other goals)
  and of ``click[...]`` steps (random legal clicks), against FrozenLake's step latency;
- search latency of our BM25 against ``rank_bm25.BM25Okapi`` (k1 0.9, b 0.4) on the same analysed
  tokens and queries, and how often both put the same product first;
- the same at a 100k-product catalogue made by resampling the 1k with replacement (new asins; only
  the original 1k keep their instructions, so the goals stay 6,910): start-up, RSS, search p50.

Goals: 1k start-up < 1 s and < 300 MB; step p50 < 2 ms. Start-ups report wall and CPU seconds: on a
shared machine the wall time includes waiting for a core. Writes bench/results/webshop.json.

    python bench/webshop.py [--queries 300] [--steps 3000] [--big 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import envhub
from envhub_webshop.analysis import analyze

ROOT = Path(__file__).resolve().parents[1]
DATA = os.environ.setdefault("ENVHUB_WEBSHOP_DATA", str(ROOT.parent / "shared" / "data" / "webshop"))

STARTUP = """
import time, resource, json
t0 = time.perf_counter()
import envhub
{body}
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"seconds": time.perf_counter() - t0, "cpu_seconds": usage.ru_utime + usage.ru_stime,
                  "peak_rss_mb": usage.ru_maxrss / 1024}}))
"""
MAKE_AND_RESET = "env = envhub.make('webshop/WebShop-v0'); env.reset(seed=0)"

BIG = """
import time, resource, json, random, statistics
t0 = time.perf_counter()
import dataclasses
from envhub_webshop.catalog import Catalog
from envhub_webshop.shop import Shop
small = Catalog.load({data!r})
rng = random.Random(0)
products = list(small.products)
for i in range({n} - len(products)):
    p = rng.choice(small.products)
    products.append(dataclasses.replace(p, asin=f"R{{i:09d}}", instruction=None, instruction_attributes=None))
shop = Shop(Catalog(products), title_tagger="builtin")
seconds = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_SELF)
rss, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
queries = {queries!r}
times = []
for q in queries:
    s = time.perf_counter(); shop.index.search(q); times.append(time.perf_counter() - s)
print(json.dumps({{"products": len(products), "startup_seconds": seconds, "startup_cpu_seconds": cpu, "peak_rss_mb": rss,
                  "search_p50_ms": statistics.median(times) * 1e3}}))
"""


def run_python(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


def step_latencies(n_steps: int) -> dict:
    env = envhub.make("webshop/WebShop-v0", max_turns=10_000)
    goals = env.shop.goals
    rng = np.random.default_rng(0)
    search_t, click_t = [], []
    env.reset(seed=0)
    query_goal = 0
    while len(search_t) + len(click_t) < n_steps:
        clicks = env.valid_actions() if env.session.page != "search" else []
        if not clicks or rng.random() < 0.15:
            query_goal += 1
            action = "search[" + goals[query_goal * 7 % len(goals)].instruction_text.lower() + "]"
            bucket = search_t
        else:
            action = clicks[int(rng.integers(len(clicks)))]
            bucket = click_t
        start = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        bucket.append(time.perf_counter() - start)
        if terminated or truncated:
            env.reset()
    lake = envhub.make("frozenlake/FrozenLake-v0", max_turns=100)
    lake.reset(seed=0)
    lake_t = []
    for i in range(n_steps):
        start = time.perf_counter()
        _, _, terminated, truncated, _ = lake.step(lake.action_names[i % 4])
        lake_t.append(time.perf_counter() - start)
        if terminated or truncated:
            lake.reset()
    return {
        "search_steps": len(search_t),
        "search_step_p50_ms": percentile(search_t, 50),
        "search_step_p99_ms": percentile(search_t, 99),
        "click_steps": len(click_t),
        "click_step_p50_ms": percentile(click_t, 50),
        "click_step_p99_ms": percentile(click_t, 99),
        "frozenlake_step_p50_ms": percentile(lake_t, 50),
        "click_p50_over_frozenlake_p50": percentile(click_t, 50) / percentile(lake_t, 50),
    }


def search_vs_rank_bm25(queries: list[str]) -> dict:
    from rank_bm25 import BM25Okapi

    shop = envhub.make("webshop/WebShop-v0").shop
    products = shop.catalog.products
    start = time.perf_counter()
    corpus = [analyze(p.search_text) for p in products]
    okapi = BM25Okapi(corpus, k1=0.9, b=0.4)
    okapi_build = time.perf_counter() - start
    ours_t, okapi_t, same_first = [], [], 0
    for q in queries:
        s = time.perf_counter()
        ours = shop.index.search(q)
        ours_t.append(time.perf_counter() - s)
        s = time.perf_counter()
        scores = okapi.get_scores(analyze(q))
        top = np.argsort(-scores, kind="stable")[:50]
        okapi_t.append(time.perf_counter() - s)
        same_first += bool(ours) and products[int(top[0])].asin == ours[0][0]
    ours_p50, okapi_p50 = statistics.median(ours_t) * 1e3, statistics.median(okapi_t) * 1e3
    return {
        "queries": len(queries),
        "ours_search_p50_ms": ours_p50,
        "rank_bm25_search_p50_ms": okapi_p50,
        "rank_bm25_over_ours_p50": okapi_p50 / ours_p50,
        "rank_bm25_build_seconds": okapi_build,
        "same_top_hit_fraction": same_first / len(queries),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "webshop.json")
    args = parser.parse_args()

    baseline = run_python(STARTUP.format(body=""))
    startup = min((run_python(STARTUP.format(body=MAKE_AND_RESET)) for _ in range(3)), key=lambda r: r["seconds"])
    env = envhub.make("webshop/WebShop-v0")
    goals = env.shop.goals
    queries = [goals[i * 23 % len(goals)].instruction_text.lower() for i in range(args.queries)]
    steps = step_latencies(args.steps)
    search = search_vs_rank_bm25(queries)
    big = run_python(BIG.format(data=DATA, n=args.big, queries=queries[:100]))

    figures = {
        "startup_1k": {
            "seconds": startup["seconds"],
            "cpu_seconds": startup["cpu_seconds"],
            "peak_rss_mb": startup["peak_rss_mb"],
            "baseline_import_envhub_seconds": baseline["seconds"],
            "baseline_import_envhub_peak_rss_mb": baseline["peak_rss_mb"],
            "seconds_over_baseline": startup["seconds"] / baseline["seconds"],
            "rss_over_baseline": startup["peak_rss_mb"] / baseline["peak_rss_mb"],
            "goal_seconds": 1.0,
            "goal_rss_mb": 300,
        },
        "steps_1k": {**steps, "goal_p50_ms": 2.0},
        "search_1k_vs_rank_bm25": search,
        "catalog_100k": {**big, "search_p50_over_1k": big["search_p50_ms"] / search["ours_search_p50_ms"]},
        "title_tagger": env.shop.nouns.name,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
