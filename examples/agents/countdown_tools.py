"""A Countdown agent written with the OpenAI client, playing envhub's Countdown through its own tools.

The env's tools (``calculate``, ``submit``) are handed to the chat API as they are
(``env.tool_schemas()``); each call the model makes is run in the env, and its result goes back as a
``tool`` message. The env is the one the proxy hosts for the agent's session (``ProxyEnv``), so the
proxy records the env's rewards (paid by ``submit``) on the calls that earned them, and the agent
returns no reward of its own::

    envhub train --agent examples/agents/countdown_tools.py:play --tasks examples/agents/seeds.jsonl --model tiny
"""

from __future__ import annotations

import json
import sys
from typing import Any

import openai

from envhub.tools import ToolCall
from envhub_trl.proxy.client import ProxyEnv

ENV_ID = "tools/Countdown-v0"
MAX_TURNS = 6


def play(base_url: str, api_key: str, task: Any) -> None:
    """Solve the puzzle of ``task`` (a seed, or ``{"seed": N}``) through the chat API at
    ``base_url``, on the env the proxy hosts; the env's rewards are the session's."""
    seed = int(task["seed"] if isinstance(task, dict) else task)
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    env = ProxyEnv(base_url, api_key, ENV_ID)
    puzzle, _ = env.reset(seed=seed)
    tools = env.tool_schemas()
    messages: list[dict[str, Any]] = [{"role": "system", "content": env.instructions}, {"role": "user", "content": puzzle}]
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="agent", messages=messages, tools=tools, max_tokens=64).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            messages.append({"role": "user", "content": "Use the calculate or submit tool."})
            continue
        for call in reply.tool_calls:
            action = ToolCall(call.function.name, json.loads(call.function.arguments)).to_json()
            result, _, terminated, truncated, _ = env.step(action)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if terminated or truncated:
                return None
    return None


if __name__ == "__main__":
    url, seed = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
    play(url, f"countdown-{seed}", seed)
    print(f"played: the session countdown-{seed} and its rewards are at {url}/envhub/sessions/countdown-{seed}")
