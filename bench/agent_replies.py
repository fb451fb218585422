"""What an agent's model does on each task: its sessions through the proxy, one line a task.

A trained agent's success rate says how often it won, not how. This plays ``--agent`` once on each
of the first ``--limit`` tasks of ``--tasks`` against a proxy over ``--model`` (the HF generator,
greedy unless ``--temperature``), and prints each session's reward and its replies: a tool call as
its first argument's value (``down``), a reply that made no call as ``-``. A policy that reads its
board plays different calls on different boards; one that learnt a fixed route plays the same
calls on every board. Writes ``bench/results/agent_replies.json``.

    python bench/agent_replies.py --model OUT/final --agent examples/agents/frozenlake_openai.py:play \\
        --tasks examples/agents/held_out.jsonl --limit 16
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib

from envhub_trl.agent_run import read_tasks
from envhub_trl.generators import HFGenerator
from envhub_trl.proxy import ChatProxy, ProxyServer
from envhub_trl.proxy.agents import load_agent, play_agents

RESULTS = pathlib.Path(__file__).parent / "results" / "agent_replies.json"


def reply_word(choice) -> str:
    """A reply as one word: its first call's first argument's value, or ``-`` for no call."""
    if not choice.tool_calls:
        return "-"
    try:
        arguments = json.loads(choice.tool_calls[0]["function"]["arguments"])
    except (json.JSONDecodeError, KeyError, TypeError):
        return "?"
    return str(next(iter(arguments.values()), "?")) if isinstance(arguments, dict) and arguments else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model folder (a run's OUT/final)")
    parser.add_argument("--agent", required=True, help="module:function or path.py:function")
    parser.add_argument("--tasks", required=True, help="a JSON Lines file of tasks")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    tasks = read_tasks(options.tasks)[: options.limit]
    generator = HFGenerator.from_pretrained(options.model, device="cpu")
    proxy = ChatProxy(generator, generator.tokenizer, model="*", temperature=options.temperature, seed=options.seed)
    with ProxyServer(proxy) as server:
        batch = play_agents(load_agent(options.agent), tasks, 1, server, batch="replies")
    sessions = []
    for task, (session,) in zip(tasks, batch.sessions):
        words = [reply_word(call.choices[0]) for call in session.calls]
        reward = session.episode_return()
        sessions.append({"task": task, "reward": reward, "won": session.won(), "error": session.error, "replies": words})
        print(f"{json.dumps(task):>24}  reward {reward if reward is not None else 'none':>5}  {' '.join(words)}")
    routes = collections.Counter(" ".join(s["replies"]) for s in sessions)
    won = sum(s["won"] for s in sessions)
    print(f"{len(sessions)} sessions, {won} won; {len(routes)} distinct reply sequences, the commonest played {routes.most_common(1)[0][1]} times")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"model": options.model, "agent": options.agent, "tasks": options.tasks,
                                   "temperature": options.temperature, "sessions": sessions}, indent=2, default=str))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
