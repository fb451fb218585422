"""A FrozenLake agent written with the OpenAI client, not with envhub's turn loop; envhub trains it unchanged.

It is an ordinary tool-calling loop: a system prompt, the board as the user message, a ``move``
tool, the tool's result as a ``tool`` message, the whole history resent on every call. Pointed at
envhub's proxy, every call it makes is recorded token-exactly and the game's outcome is its reward::

    envhub train --agent examples/agents/frozenlake_openai.py:play --tasks examples/agents/seeds.jsonl \
        --eval-tasks examples/agents/held_out.jsonl --model tiny --config examples/agents/frozenlake_openai.yaml

``play_on_proxy`` is the same agent playing the lake the proxy hosts for its session, which then
scores the session itself (``--agent examples/agents/frozenlake_openai.py:play_on_proxy``).

Or, to collect its sessions against a model being served::

    envhub proxy --model PATH --served-name '*' --port 8000
    python examples/agents/frozenlake_openai.py http://127.0.0.1:8000/v1 7
"""

from __future__ import annotations

import json
import sys
from typing import Any

import openai

import envhub
from envhub_trl.proxy.client import ProxyEnv

ENV_ID = "frozenlake/FrozenLakeNotSlippery-v0"
MAX_TURNS = 8
#: A reply's token budget: a move call is about 30 tokens in SmolLM2's vocabulary and 68 in the
#: tiny model's, which spells JSON a character at a time.
MAX_TOKENS = 96
DIRECTIONS = ["left", "down", "right", "up"]
#: What a reply that is not a move call costs, as envhub's own loop charges an invalid reply its
#: ``format_penalty``: without it, breaking the call format costs a model nothing more than a
#: losing move does, and RL, which pushes down every token of a losing session, wears the format away.
INVALID_REPLY_COST = 0.1
MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Take one step on the lake.",
        "parameters": {
            "type": "object",
            "properties": {"direction": {"type": "string", "enum": DIRECTIONS, "description": "Where to step."}},
            "required": ["direction"],
        },
    },
}

#: Every turn is a move, so the agent asks for one: with a named ``tool_choice`` the server
#: writes the start of the call and the model writes its arguments (OpenAI's API, vLLM's and the
#: proxy's alike). The tiny model's reply is then 17 tokens instead of 25, and in RL from a
#: format-only start this agent's training success rose where the free-form one's stayed near 2% (docs/results.md).
MOVE_CHOICE = {"type": "function", "function": {"name": "move"}}


def play(base_url: str, api_key: str, task: Any) -> float:
    """Play the lake of ``task`` (a seed, or ``{"seed": N}``) through the chat API at ``base_url``;
    return 1.0 when the agent reaches the goal, else 0.0, less ``INVALID_REPLY_COST`` for each
    reply that was not a move call."""
    won, invalid = _play(base_url, api_key, task, envhub.make(ENV_ID))
    return float(won) - INVALID_REPLY_COST * invalid


def play_on_proxy(base_url: str, api_key: str, task: Any) -> float:
    """The same agent on the lake the proxy hosts for its session (``ProxyEnv``): the env's reward
    (1 at the goal) is recorded by the proxy, on the call whose move earned it, and each call's state
    key is the env's own (map and position); the agent returns only what its invalid replies cost."""
    _, invalid = _play(base_url, api_key, task, ProxyEnv(base_url, api_key, ENV_ID))
    return -INVALID_REPLY_COST * invalid


def _play(base_url: str, api_key: str, task: Any, env: Any) -> tuple[bool, int]:
    """Play one episode of ``env``; return whether the agent won and how many replies were not move calls."""
    seed = int(task["seed"] if isinstance(task, dict) else task)
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    board, _ = env.reset(seed=seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"{env.instructions}\nAct by calling the move tool."},
        {"role": "user", "content": board},
    ]
    invalid = 0
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="agent", messages=messages, tools=[MOVE], tool_choice=MOVE_CHOICE, max_tokens=MAX_TOKENS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            invalid += 1
            messages.append({"role": "user", "content": "Call the move tool with one of: " + ", ".join(DIRECTIONS) + "."})
            continue
        call = reply.tool_calls[0]
        direction = str(json.loads(call.function.arguments).get("direction", ""))
        board, reward, terminated, truncated, info = env.step(direction.capitalize())
        messages.append({"role": "tool", "tool_call_id": call.id, "content": board})
        if terminated or truncated:
            return bool(info.get("success")), invalid
    return False, invalid


if __name__ == "__main__":
    url, seed = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
    print(f"reward {play(url, f'frozenlake-{seed}', seed)}")
