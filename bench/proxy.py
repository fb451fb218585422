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

Then, one call at a time with a generator that answers at once, what a call costs apart from
generation: through ``ChatProxy.complete`` (the proxy's own work), from the ``openai`` client over
HTTP, and the client's own work with no server at all (an HTTP transport that answers at once).

``--agents process`` runs the agents in processes of their own (``--agent-processes N``, one by
default, the sessions dealt among them), as agents deployed apart from the trainer do and as
``envhub train --agent ... agent_processes=N`` runs them: the ``openai`` client's own work on each
call (building and checking the request's parameters, reading the response into its models, its
HTTP) then no longer shares this process's interpreter lock with the proxy and the generator, and
with several processes it is spread over the cores.

Each repeat's line also gives the garbage collector's full passes in this process while the
proxy side ran (every thread stops for one); ``--no-freeze-gc`` starts the proxy without freezing
the heap (:class:`~envhub_trl.proxy.ProxyServer`'s ``freeze_gc``).

Usage: ``python bench/proxy.py [--sessions 64] [--turns 4] [--max-tokens 16] [--repeats 3] [--model smollm2-135m] [--agents process [--agent-processes N]] [--no-freeze-gc]``
(with ``--model``, it writes ``bench/results/proxy-MODEL.json``).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import multiprocessing
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
from envhub.generation import Completion, Prompt, SamplingParams
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


def _converse(ask: Any, session: int, turns: int) -> None:
    """One agent's conversation: ``turns`` calls, each resending the whole history with the reply
    and the next user message appended; ``ask(messages, seed)`` makes a call and returns the
    assistant message as the agent sends it back."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _user(session, 0)}]
    for turn in range(turns):
        messages += [ask(messages, 1000 * session + turn), {"role": "user", "content": _user(session, turn + 1)}]


def _asking(client: openai.OpenAI, max_tokens: int) -> Any:
    """``ask`` for :func:`_converse` through the ``openai`` client."""

    def ask(messages: list[dict[str, Any]], seed: int) -> dict[str, Any]:
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens, seed=seed)
        return reply.choices[0].message.model_dump(exclude_none=True)

    return ask


def _play_agents(base_url: str, sessions: range, turns: int, max_tokens: int, tag: str, everyone: Any = None) -> float:
    """Seconds for OpenAI-client agent threads, one per session of ``sessions``, to play their turns
    against ``base_url``, from the moment all are ready (clients made, connections not yet opened;
    with ``everyone``, a barrier of the agents' processes, in every process) to the last one's end."""
    ready, go = threading.Barrier(len(sessions) + 1), threading.Barrier(len(sessions) + 1)

    def agent(s: int) -> None:
        ask = _asking(openai.OpenAI(base_url=base_url, api_key=f"{tag}-{s}", max_retries=0), max_tokens)
        ready.wait()
        go.wait()
        _converse(ask, s, turns)

    threads = [threading.Thread(target=agent, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    ready.wait()  # this process's clients are made (about 17 ms each)
    if everyone is not None:
        everyone.wait()  # and every other process's
    go.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def _agents_process(base_url: str, sessions: range, turns: int, max_tokens: int, tag: str, everyone: Any, out: Any) -> None:
    out.send(_play_agents(base_url, sessions, turns, max_tokens, tag, everyone))


def through_proxy(server: ProxyServer, sessions: int, turns: int, max_tokens: int, tag: str, agents: str = "threads",
                  processes: int = 1) -> tuple[float, int]:
    """Seconds to play every session's turns as concurrent OpenAI-client agents; and the fold breaks.
    ``agents="process"`` runs the agent threads in ``processes`` processes of their own (spawned, so
    their start is not timed; the sessions dealt among them in turn), as agents deployed apart from
    the trainer run; else they share this process. The time is the slowest process's. The
    sessions are expected by the proxy, as the trainer's agents are (their first calls share a batch)."""
    server.proxy.store.expect(f"{tag}-{s}" for s in range(sessions))
    if agents == "process":
        spawn = multiprocessing.get_context("spawn")
        everyone = spawn.Barrier(processes)
        pipes = [spawn.Pipe(duplex=False) for _ in range(processes)]
        children = [
            spawn.Process(target=_agents_process, args=(server.base_url, range(k, sessions, processes), turns, max_tokens, tag, everyone, send))
            for k, (_, send) in enumerate(pipes)
        ]
        for child in children:
            child.start()
        seconds = max(receive.recv() for receive, _ in pipes)
        for child in children:
            child.join()
    else:
        seconds = _play_agents(server.base_url, range(sessions), turns, max_tokens, tag)
    breaks = sum(server.proxy.store.find(f"{tag}-{s}").breaks for s in range(sessions))
    return seconds, breaks


class _FullCollections:
    """The garbage collector's full passes (generation 2) in this process, in milliseconds each:
    every thread stops for them."""

    def __init__(self):
        self.passes, self._began = [], 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                self._began = time.perf_counter()
            else:
                self.passes.append((time.perf_counter() - self._began) * 1e3)

    def take(self) -> list[float]:
        """The passes since the last call, and forget them."""
        passes, self.passes = self.passes, []
        return passes


def client_cost(turns: int, max_tokens: int, calls: int = 256) -> float:
    """Milliseconds of the ``openai`` client's own work per call in one agent's loop, with no server:
    its HTTP transport answers every request at once with a canned completion of ``max_tokens``
    tokens' text. What an agent pays on each call whatever serves it."""
    import httpx2

    canned = json.dumps({
        "id": "chatcmpl-0", "object": "chat.completion", "created": 0, "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": " Down" * max_tokens}, "finish_reason": "length", "logprobs": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": max_tokens, "total_tokens": 1 + max_tokens},
    }).encode()
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=canned, headers={"content-type": "application/json"}))
    client = openai.OpenAI(base_url="http://agent.invalid/v1", api_key="client-cost", max_retries=0, http_client=httpx2.Client(transport=transport))
    ask, conversations = _asking(client, max_tokens), -(-calls // turns)
    start = time.perf_counter()
    for _ in range(conversations):
        _converse(ask, 0, turns)
    return (time.perf_counter() - start) / (conversations * turns) * 1e3


class Instant:
    """A generator that answers every request at once with the same ``max_tokens`` tokens: the
    proxy's own work per call, with no generation in it."""

    def __init__(self, tokenizer: Any, max_tokens: int):
        ids = tokenizer.encode(" Down" * max_tokens, add_special_tokens=False)[:max_tokens]
        self.completion = Completion(text=tokenizer.decode(ids), token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="length")

    def generate_each(self, prompts: list[Prompt], samplings: list[SamplingParams]) -> list[Completion]:
        return [self.completion for _ in prompts]


def per_call_costs(tokenizer: Any, turns: int, max_tokens: int, sessions: int = 32) -> dict[str, float]:
    """Milliseconds a call, one call at a time, with a generator that answers at once (:class:`Instant`):
    ``proxy_ms`` through :meth:`ChatProxy.complete` (rendering, prompt ids, the hand-off to the
    generator's worker, recording, the response), ``http_ms`` the same calls made by the ``openai``
    client over HTTP (the client's own work, the transport and the server included)."""
    proxy = ChatProxy(Instant(tokenizer, max_tokens), tokenizer, model="tiny", batch_wait_s=0.0, straggler_wait_s=0.0)

    def through_complete(tag: str) -> None:
        def ask(messages: list[dict[str, Any]], seed: int) -> dict[str, Any]:
            message = proxy.complete({"model": "tiny", "messages": messages, "max_tokens": max_tokens, "seed": seed}, tag)["choices"][0]["message"]
            return {k: v for k, v in message.items() if v is not None}

        _converse(ask, 0, turns)

    with ProxyServer(proxy) as server:
        warm = sessions // 4  # warm-up conversations: connections, the template's first rendering
        clients = [openai.OpenAI(base_url=server.base_url, api_key=f"cost-{s}", max_retries=0) for s in range(sessions + warm)]
        for s in range(warm):
            through_complete(f"warm-{s}")
            _converse(_asking(clients[sessions + s], max_tokens), 0, turns)
        start = time.perf_counter()
        for s in range(sessions):
            through_complete(f"complete-{s}")
        proxy_ms = (time.perf_counter() - start) / (sessions * turns) * 1e3
        start = time.perf_counter()
        for client in clients[:sessions]:
            _converse(_asking(client, max_tokens), 0, turns)
        http_ms = (time.perf_counter() - start) / (sessions * turns) * 1e3
    return {"proxy_ms": proxy_ms, "http_ms": http_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="smollm2-135m, a model folder or a hub id (default: the tiny model, built here).")
    parser.add_argument("--agents", choices=("threads", "process"), default="threads",
                        help="where the agents run: threads of this process (as the trainer runs agent callables by default), or processes of their own")
    parser.add_argument("--agent-processes", type=int, default=1, help="with --agents process: how many processes the agents are dealt among")
    parser.add_argument("--no-freeze-gc", action="store_true", help="start the proxy without freezing the heap (ProxyServer's freeze_gc)")
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
    server = ProxyServer(ChatProxy(counted, generator.tokenizer, model="tiny", **waits), freeze_gc=not options.no_freeze_gc).start()
    pauses = _FullCollections()
    turns_total = options.sessions * options.turns
    direct(counted, options.sessions, 1, options.max_tokens)  # warm-up, not counted: first calls compile and connect
    agents = {"agents": options.agents, "processes": options.agent_processes}
    through_proxy(server, options.sessions, 1, options.max_tokens, "warm-up", **agents)
    counted.take()
    rows = []
    for repeat in range(options.repeats):
        if repeat % 2:  # alternate which side goes first, so that a change of load falls on both
            pauses.take()
            proxy_s, breaks = through_proxy(server, options.sessions, options.turns, options.max_tokens, f"r{repeat}", **agents)
            proxy_batches, full = counted.take(), pauses.take()
            direct_s = direct(counted, options.sessions, options.turns, options.max_tokens)
        else:
            direct_s = direct(counted, options.sessions, options.turns, options.max_tokens)
            counted.take(), pauses.take()
            proxy_s, breaks = through_proxy(server, options.sessions, options.turns, options.max_tokens, f"r{repeat}", **agents)
            proxy_batches, full = counted.take(), pauses.take()
        rows.append({"direct_s": direct_s, "proxy_s": proxy_s, "overhead": proxy_s / direct_s, "fold_breaks": breaks,
                     "proxy_batches": proxy_batches, "full_collections_ms": full})
        print(f"repeat {repeat}: direct {turns_total / direct_s:.1f} turns/s, proxy {turns_total / proxy_s:.1f} turns/s, "
              f"overhead {proxy_s / direct_s:.2f}x, fold breaks {breaks}, the proxy's {len(proxy_batches)} batches "
              f"(direct: {options.turns} of {options.sessions}): {proxy_batches}"
              + (f"; full collections in this process meanwhile: {', '.join(f'{ms:.0f} ms' for ms in full)}" if full else ""))
    server.stop()
    client_ms = client_cost(options.turns, options.max_tokens)
    costs = per_call_costs(generator.tokenizer, options.turns, options.max_tokens)
    print(f"a call, one at a time, no generation: {costs['proxy_ms']:.2f} ms through ChatProxy.complete, {costs['http_ms']:.2f} ms "
          f"from the openai client over HTTP, of which the client's own work {client_ms:.2f} ms (with no server)")
    best_direct, best_proxy = min(r["direct_s"] for r in rows), min(r["proxy_s"] for r in rows)
    result = {
        "date": datetime.date.today().isoformat(),
        "command": f"python bench/proxy.py --sessions {options.sessions} --turns {options.turns} --max-tokens {options.max_tokens} --repeats {options.repeats}"
        + (f" --model {options.model}" if options.model else "")
        + (f" --straggler-wait-s {options.straggler_wait_s:g}" if options.straggler_wait_s is not None else "")
        + (" --no-freeze-gc" if options.no_freeze_gc else "")
        + (f" --agents process --agent-processes {options.agent_processes}" if options.agents == "process" else ""),
        "straggler_wait_s": server.proxy.straggler_wait_s,
        "agents": options.agents,
        "agent_processes": options.agent_processes if options.agents == "process" else 0,
        "model": options.model or "tiny",
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version()},
        "sessions": options.sessions, "turns": options.turns, "max_tokens": options.max_tokens,
        "direct_turns_per_s": turns_total / best_direct, "proxy_turns_per_s": turns_total / best_proxy,
        "client_ms_per_call": client_ms,
        "proxy_ms_per_call": costs["proxy_ms"],
        "http_ms_per_call": costs["http_ms"],
        "overhead_best": best_proxy / best_direct, "overhead_median": float(np.median([r["overhead"] for r in rows])), "repeats": rows,
    }
    print(f"best of {options.repeats}: direct {result['direct_turns_per_s']:.1f} turns/s, proxy {result['proxy_turns_per_s']:.1f} turns/s, "
          f"overhead {result['overhead_best']:.2f}x (median of the repeats' {result['overhead_median']:.2f}x; {options.sessions} concurrent sessions)")
    out = RESULTS if options.model is None else pathlib.Path(str(RESULTS_FOR_MODEL).format(model=pathlib.Path(options.model).name))
    if options.straggler_wait_s is not None:
        out = out.with_name(f"{out.stem}-straggler{options.straggler_wait_s:g}.json")
    if options.agents == "process":
        out = out.with_name(f"{out.stem}-agents-process{'' if options.agent_processes == 1 else options.agent_processes}.json")
    if options.no_freeze_gc:
        out = out.with_name(f"{out.stem}-no-freeze.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
