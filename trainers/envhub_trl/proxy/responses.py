"""OpenAI-shaped answers: a sampled reply as a chat-completions choice, and the whole response.

A reply's ``<tool_call>`` blocks are read with envhub's tool-call format
(:func:`envhub.tools.parse_tool_calls`, checked against the request's tool schemas); when they
parse, the choice carries them as ``tool_calls`` (``arguments`` a JSON string, as OpenAI sends
them), its content is the text around them, and its finish reason is ``"tool_calls"``. A reply
whose calls do not parse is returned as plain content, as vLLM's tool parsers do. A stop string
ends the content and is not returned, as OpenAI does (the sampled ids keep it).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from envhub.generation import Completion, cut_at_stop
from envhub.tools import CALL_CLOSE, CALL_OPEN, parse_tool_calls
from envhub_trl.proxy.requests import ChatRequest
from envhub_trl.proxy.sessions import CallRecord, Choice

#: The most calls one reply may make when the request allows parallel tool calls.
MAX_PARALLEL_CALLS = 16


def _outside_calls(text: str) -> str:
    """``text`` with its ``<tool_call>`` blocks cut out."""
    out, position = [], 0
    lower = text.lower()
    while True:
        start = lower.find(CALL_OPEN, position)
        if start < 0:
            out.append(text[position:])
            return "".join(out)
        end = lower.find(CALL_CLOSE, start)
        out.append(text[position:start])
        position = end + len(CALL_CLOSE)


def make_choice(request: ChatRequest, start: str, completion: Completion, sampled_text: str, body_text: str) -> Choice:
    """The :class:`~envhub_trl.proxy.sessions.Choice` of ``completion``.

    Args:
        request: the request it answers.
        start: the reply's prefilled start (:func:`~envhub_trl.proxy.render.prefill`).
        completion: what the generator sampled.
        sampled_text: its ids decoded with special tokens kept.
        body_text: the same less the token that ended the turn: with ``start``, the reply as the
            model wrote it, which is how the proxy renders it when the agent sends it back (a
            special token sampled mid-reply included, which the returned content skips).
    """
    reply = start + completion.text
    content: str | None = reply
    cut = cut_at_stop(reply, request.stop) if request.stop and completion.finish_reason == "stop" else None
    if cut is not None:
        stop = next(s for s in request.stop if reply[:cut].endswith(s))
        content = reply[: cut - len(stop)]
    calls: list[dict[str, Any]] = []
    if request.tool_choice != "none" and request.tools:
        parsed = parse_tool_calls(content, request.tool_schemas, max_calls=MAX_PARALLEL_CALLS if request.parallel_tool_calls else 1)
        if parsed.error is None and parsed.calls:
            calls = [
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments), ensure_ascii=False)},
                }
                for call in parsed.calls
            ]
            content = _outside_calls(content).strip() or None
    return Choice(
        token_ids=tuple(completion.token_ids),
        logprobs=tuple(completion.logprobs),
        sampled_text=sampled_text,
        reply=start + body_text,
        content=content,
        tool_calls=tuple(calls),
        finish_reason="tool_calls" if calls else completion.finish_reason,
    )


def _logprobs(choice: Choice, tokenizer: Any) -> dict[str, Any]:
    entries = []
    for token, logprob in zip(choice.token_ids, choice.logprobs):
        text = tokenizer.decode([token], skip_special_tokens=False)
        entries.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": entries}


def chat_response(request: ChatRequest, call: CallRecord, *, model: str, tokenizer: Any, session_id: str) -> dict[str, Any]:
    """The chat-completions response for ``call``: its choices, usage, and (asked for with
    ``logprobs`` or ``return_token_ids``) each token's log-prob and the token ids. The ``envhub``
    field says which session and call it was recorded as, and which reply it extends."""
    choices = []
    for index, choice in enumerate(call.choices):
        message: dict[str, Any] = {"role": "assistant", "content": choice.content}
        if choice.tool_calls:
            message["tool_calls"] = [dict(c) for c in choice.tool_calls]
        entry: dict[str, Any] = {
            "index": index,
            "message": message,
            "logprobs": _logprobs(choice, tokenizer) if request.logprobs else None,
            "finish_reason": choice.finish_reason,
        }
        if request.return_token_ids:
            entry["token_ids"] = list(choice.token_ids)
        choices.append(entry)
    completion_tokens = sum(len(c.token_ids) for c in call.choices)
    response: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": len(call.prompt_ids), "completion_tokens": completion_tokens, "total_tokens": len(call.prompt_ids) + completion_tokens},
        "envhub": {"session_id": session_id, "call": call.index, "extends": list(call.parent) if call.parent else None},
    }
    if request.return_token_ids:
        response["prompt_token_ids"] = list(call.prompt_ids)
    return response


def session_json(session: Any, calls: Sequence[CallRecord]) -> dict[str, Any]:
    """A session as JSON: each call's token ids, log-probs and the reply it extends, its reward and
    breaks; and, where it played an env the proxy hosts, that env's rewards per call, the calls it
    found invalid, each call's state key and how the episode stands."""
    env = None
    if session.env_id is not None:
        env = {
            "env_id": session.env_id,
            "rewards": {str(k): v for k, v in session.env_rewards.items()},
            "invalid_calls": sorted(session.env_invalid),
            "terminated": session.env_terminated,
            "truncated": session.env_truncated,
            "success": session.env_success,
        }
    return {
        "session_id": session.session_id,
        "reward": session.reward,
        "step_rewards": {str(k): v for k, v in session.step_rewards.items()},
        "breaks": session.breaks,
        "error": session.error,
        "env": env,
        "calls": [
            {
                "index": call.index,
                "extends": list(call.parent) if call.parent else None,
                "state_key": call.state_key,
                "prompt_ids": list(call.prompt_ids),
                "env_ids": list(call.env_ids),
                "choices": [
                    {"token_ids": list(c.token_ids), "logprobs": list(c.logprobs), "reply": c.reply, "finish_reason": c.finish_reason}
                    for c in call.choices
                ],
            }
            for call in calls
        ],
    }
