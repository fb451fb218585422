"""Benchmark the OpenAI-compatible proxy: its cost over calling the generator directly.

The same conversations are played twice with the same generator (the HF generator on a tiny
model, or ``--model``), ``--sessions`` at once for ``--turns`` turns each, ``--max-tokens`` a reply
(every reply runs to the budget: the tiny model never ends its turn early, so both sides sample
exactly the same number of tokens):

- direct: envhub's own way, one ``generate_each`` batch per turn over every session, the prompts
  continued token by token (:class:`envhub.chat.ChatTokens`);
- proxy: each session an agent thread with the real ``openai`` client, resending its whole
  history to an in-process :class:`envhub_trl.proxy.ProxyServer` every turn (HTTP, JSON, the chat
  template's rendering, folding, recording), the proxy's worker batching whatever is queued.

Overhead is proxy seconds over direct seconds (the target of issue 45 is at most 1.3x), after one
warm-up round of each; the two alternate ``--repeats`` times (each going first in turn), and the best of each side and the
median of the per-repeat ratios are reported. Prints the figures and writes ``bench/results/proxy.json``.

Usage: ``python bench/proxy.py [--sessions 64] [--turns 4] [--max-tokens 16] [--repeats 3] [--model smollm2-135m]``
(with ``--model``, it writes ``bench/results/proxy-MODEL.json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import threading
import time
from typing import Any

import numpy as np
import openai
import torch

from envhub.chat import ChatTokens
from envhub.generation import Prompt, SamplingParams
from envhub_trl.generators import HFGenerator
from envhub_trl.proxy import ChatProxy, ProxyServer

RESULTS = pathlib.Path(__file__).parent / "results" / "proxy.json"
#: Where a run with ``--model`` writes (the tiny model's figures stay in proxy.json).
RESULTS_FOR_MODEL = pathlib.Path(__file__).parent / "results" / "proxy-{model}.json"
SYSTEM = "You are on a frozen lake and must reach the goal. Reply with one move."


def _user(session: int, turn: int) -> str:
    return f"Session {session}, turn {turn + 1}: the board is P___ _O__ O___ ___G. Where now?"


class Counted:
    """The generator, counting the requests of each ``generate_each`` call (a batch, before the
    generator splits it by its own ``batch_size``)."""

    def __init__(self, generator: HFGenerator):
        self.generator, self.model, self.batches = generator, generator.model, []

    def generate_each(self, prompts: list[Prompt], samplings: list[SamplingParams]) -> list[Any]:
        self.batches.append(len(prompts))
        return self.generator.generate_each(prompts, samplings)

    def take(self) -> list[int]:
        """The batch sizes since the last call, and forget them."""
        batches, self.batches = self.batches, []
        return batches


def direct(generator: Counted, sessions: int, turns: int, max_tokens: int) -> float:
    """Seconds to play every session's turns with one generator batch per turn."""
    chat = ChatTokens(generator.generator.tokenizer)
    prompts = [chat.prompt([{"role": "system", "content": SYSTEM}, {"role": "user", "content": _user(s, 0)}]) for s in range(sessions)]
    start = time.perf_counter()
    for turn in range(turns):
        samplings = [SamplingParams(max_new_tokens=max_tokens, temperature=1.0, seed=1000 * s + turn) for s in range(sessions)]
        done = generator.generate_each([Prompt(token_ids=p, messages=[]) for p in prompts], samplings)
        if turn + 1 < turns:
            prompts = [
                p + c.token_ids + chat.continuation(c.token_ids, c.finish_reason, [{"role": "user", "content": _user(s, turn + 1)}])
                for s, (p, c) in enumerate(zip(prompts, done))
            ]
    return time.perf_counter() - start


def through_proxy(server: ProxyServer, sessions: int, turns: int, max_tokens: int, tag: str) -> tuple[float, int]:
    """Seconds to play every session's turns as concurrent OpenAI-client agents; and the fold breaks."""
    barrier = threading.Barrier(sessions + 1)

    def agent(s: int) -> None:
        client = openai.OpenAI(base_url=server.base_url, api_key=f"{tag}-{s}", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _user(s, 0)}]
        barrier.wait()
        for turn in range(turns):
            reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens, seed=1000 * s + turn)
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": _user(s, turn + 1)}]

    threads = [threading.Thread(target=agent, args=(s,)) for s in range(sessions)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    breaks = sum(server.proxy.store.find(f"{tag}-{s}").breaks for s in range(sessions))
    return seconds, breaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="smollm2-135m, a model folder or a hub id (default: the tiny model, built here).")
    parser.add_argument("--straggler-wait-s", type=float, default=None,
                        help="the proxy's straggler_wait_s (default: ChatProxy's; 0 batches as before it existed)")
    options = parser.parse_args()
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads()))
    if options.model is None:
        from envhub_trl.tiny import build_tiny

        path = str(build_tiny(pathlib.Path(__file__).parent / ".cache" / "proxy-tiny", env_ids=["frozenlake/FrozenLake-v0"]))
    else:
        from envhub_trl.models import resolve_model

        path = resolve_model(options.model)
    generator = HFGenerator.from_pretrained(path, device="cpu", dtype="float32")
    # A model ends its turn early at times; without the end tokens both sides sample the whole budget.
    generator.eos_ids = set()
    counted = Counted(generator)
    waits = {} if options.straggler_wait_s is None else {"straggler_wait_s": options.straggler_wait_s}
    server = ProxyServer(ChatProxy(counted, generator.tokenizer, model="tiny", **waits)).start()
    turns_total = options.sessions * options.turns
    direct(counted, options.sessions, 1, options.max_tokens)  # warm-up, not counted: first calls compile and connect
    through_proxy(server, options.sessions, 1, options.max_tokens, "warm-up")
    counted.take()
    rows = []
    for repeat in range(options.repeats):
        if repeat % 2:  # alternate which side goes first, so that a change of load falls on both
            proxy_s, breaks = through_proxy(server, options.sessions, options.turns, options.max_tokens, f"r{repeat}")
            proxy_batches = counted.take()
            direct_s = direct(counted, options.sessions, options.turns, options.max_tokens)
        else:
            direct_s = direct(counted, options.sessions, options.turns, options.max_tokens)
            counted.take()
            proxy_s, breaks = through_proxy(server, options.sessions, options.turns, options.max_tokens, f"r{repeat}")
            proxy_batches = counted.take()
        rows.append({"direct_s": direct_s, "proxy_s": proxy_s, "overhead": proxy_s / direct_s, "fold_breaks": breaks,
                     "proxy_batches": proxy_batches})
        print(f"repeat {repeat}: direct {turns_total / direct_s:.1f} turns/s, proxy {turns_total / proxy_s:.1f} turns/s, "
              f"overhead {proxy_s / direct_s:.2f}x, fold breaks {breaks}, the proxy's {len(proxy_batches)} batches "
              f"(direct: {options.turns} of {options.sessions}): {proxy_batches}")
    server.stop()
    best_direct, best_proxy = min(r["direct_s"] for r in rows), min(r["proxy_s"] for r in rows)
    result = {
        "date": datetime.date.today().isoformat(),
        "command": f"python bench/proxy.py --sessions {options.sessions} --turns {options.turns} --max-tokens {options.max_tokens} --repeats {options.repeats}"
        + (f" --model {options.model}" if options.model else "")
        + (f" --straggler-wait-s {options.straggler_wait_s:g}" if options.straggler_wait_s is not None else ""),
        "straggler_wait_s": server.proxy.straggler_wait_s,
        "model": options.model or "tiny",
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version()},
        "sessions": options.sessions, "turns": options.turns, "max_tokens": options.max_tokens,
        "direct_turns_per_s": turns_total / best_direct, "proxy_turns_per_s": turns_total / best_proxy,
        "overhead_best": best_proxy / best_direct, "overhead_median": float(np.median([r["overhead"] for r in rows])), "repeats": rows,
    }
    print(f"best of {options.repeats}: direct {result['direct_turns_per_s']:.1f} turns/s, proxy {result['proxy_turns_per_s']:.1f} turns/s, "
          f"overhead {result['overhead_best']:.2f}x (median of the repeats' {result['overhead_median']:.2f}x; {options.sessions} concurrent sessions)")
    out = RESULTS if options.model is None else pathlib.Path(str(RESULTS_FOR_MODEL).format(model=pathlib.Path(options.model).name))
    if options.straggler_wait_s is not None:
        out = out.with_name(f"{out.stem}-straggler{options.straggler_wait_s:g}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
