"""Reading an OpenAI ``/v1/chat/completions`` request: checked fields, or an OpenAI-style 4xx error.

:func:`parse_request` turns the JSON body into a :class:`ChatRequest`, refusing what the proxy
cannot serve with a :class:`ProxyRequestError` that carries the HTTP status and the OpenAI error
shape (``{"error": {"message", "type", "param", "code"}}``). Messages come out in the form chat
templates read: text content (OpenAI's list of text parts joined), an assistant's ``tool_calls``
with their ``arguments`` as JSON objects (the wire sends them as strings), tools with a
``parameters`` schema.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from envhub.bounds import is_number
from envhub.error import EnvhubError

#: The roles a message may have.
ROLES = ("system", "developer", "user", "assistant", "tool")
#: The most completions one request may ask for (``n``).
MAX_CHOICES = 16


class ProxyRequestError(EnvhubError):
    """A request the proxy refuses, with the HTTP status and the OpenAI error fields to answer it with."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
        kind = {401: "authentication_error", 404: "invalid_request_error", 413: "invalid_request_error"}.get(self.status, "invalid_request_error")
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatRequest:
    """One chat-completions request, checked.

    Attributes:
        model: the model it names.
        messages: the conversation, as chat templates read it.
        tools: the tools' schemas (OpenAI's function shape), or None.
        tool_choice: ``"auto"``, ``"none"``, ``"required"`` or the name of the one tool to call.
        temperature: sampling temperature (0 is greedy).
        top_p: nucleus mass.
        max_tokens: the most tokens per completion, or None for the proxy's default.
        stop: strings that end a completion (not returned in its text).
        n: completions to sample.
        seed: seeds the sampler (each choice its own seed derived from it), or None.
        logprobs: whether to return each token's log-probability.
        return_token_ids: whether to return the prompt's and each choice's token ids (vLLM's extension).
        parallel_tool_calls: whether a reply may make several tool calls.
    """

    model: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str = "auto"
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None
    logprobs: bool = False
    return_token_ids: bool = False
    parallel_tool_calls: bool = True

    @property
    def named_tool(self) -> str | None:
        """The tool ``tool_choice`` names, which the reply must call; None for ``auto``, ``none`` and ``required``."""
        return None if self.tool_choice in ("auto", "none", "required") else self.tool_choice

    @property
    def tool_schemas(self) -> dict[str, dict[str, Any]]:
        """Tool name -> schema, for :func:`envhub.tools.parse_tool_calls`."""
        return {tool["function"]["name"]: tool for tool in self.tools or ()}


def _number(body: Mapping[str, Any], key: str, default: float, low: float, high: float, *, low_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not is_number(value):
        raise ProxyRequestError(f"{key} must be a number, got {type(value).__name__}", param=key)
    if value > high or value < low or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise ProxyRequestError(f"{key} must be in {bound}, got {value}", param=key)
    return float(value)


def _integer(body: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProxyRequestError(f"{key} must be an integer, got {type(value).__name__}", param=key)
    if value < low or (high is not None and value > high):
        raise ProxyRequestError(f"{key} must be at least {low}" + (f" and at most {high}" if high is not None else "") + f", got {value}", param=key)
    return value


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ProxyRequestError(f"{where}.content: only text parts ({{'type': 'text', 'text': ...}}) are served", param=where)
            parts.append(part["text"])
        return "".join(parts)
    raise ProxyRequestError(f"{where}.content must be a string or a list of text parts, got {type(content).__name__}", param=where)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant's ``tool_calls``, each ``{"id", "type", "function": {"name", "arguments": dict}}``."""
    if not isinstance(calls, list):
        raise ProxyRequestError(f"{where}.tool_calls must be a list", param=where)
    out = []
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ProxyRequestError(f"{where}.tool_calls[{k}] needs a function with a name", param=where)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                raise ProxyRequestError(f"{where}.tool_calls[{k}].function.arguments is not JSON", param=where) from None
        if not isinstance(arguments, dict):
            raise ProxyRequestError(f"{where}.tool_calls[{k}].function.arguments must be a JSON object", param=where)
        out.append({"id": str(call.get("id", "")), "type": "function", "function": {"name": function["name"], "arguments": arguments}})
    return out


def _message(raw: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise ProxyRequestError(f"{where} must be an object with a role and content", param=where)
    role = raw.get("role")
    if role not in ROLES:
        raise ProxyRequestError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param=where)
    calls = _tool_calls(raw["tool_calls"], where) if role == "assistant" and raw.get("tool_calls") else []
    content = raw.get("content")
    if content is None and not calls:
        raise ProxyRequestError(f"{where} has no content", param=where)
    message: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": "" if content is None else _text(content, where)}
    if calls:
        message["tool_calls"] = calls
    if role == "tool" and raw.get("tool_call_id") is not None:
        message["tool_call_id"] = str(raw["tool_call_id"])
    return message


def _tools(raw: Any) -> tuple[dict[str, Any], ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ProxyRequestError("tools must be a list of {'type': 'function', 'function': {...}}", param="tools")
    tools = []
    for k, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ProxyRequestError(f"tools[{k}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}", param="tools")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise ProxyRequestError(f"tools[{k}].function.parameters must be a JSON schema object", param="tools")
        tools.append({"type": "function", "function": {**function, "parameters": parameters}})
    return tuple(tools) or None


def _tool_choice(raw: Any, tools: tuple[dict[str, Any], ...] | None) -> str:
    if raw is None:
        return "auto" if tools else "none"
    if isinstance(raw, dict):
        name = (raw.get("function") or {}).get("name") if raw.get("type") == "function" else None
        if not isinstance(name, str):
            raise ProxyRequestError("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}", param="tool_choice")
        raw = name
        if name not in {tool["function"]["name"] for tool in tools or ()}:
            raise ProxyRequestError(f"tool_choice names {name!r}, which is not one of the request's tools", param="tool_choice")
    elif raw not in ("auto", "none", "required"):
        raise ProxyRequestError(f"tool_choice must be 'auto', 'none', 'required' or a function, got {raw!r}", param="tool_choice")
    if raw != "none" and not tools:
        raise ProxyRequestError(f"tool_choice {raw!r} needs tools", param="tool_choice")
    return raw


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise ProxyRequestError("stop must be a non-empty string or a list of at most 4 of them", param="stop")
    return tuple(stops)


def parse_request(body: Any) -> ChatRequest:
    """The checked request of a decoded JSON ``body``.

    Raises:
        ProxyRequestError: (400) naming the field that is missing or wrong.
    """
    if not isinstance(body, dict):
        raise ProxyRequestError("the request body must be a JSON object")
    if not isinstance(body.get("model"), str):
        raise ProxyRequestError("model is required (a string)", param="model")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise ProxyRequestError("messages must be a non-empty list", param="messages")
    messages = tuple(_message(raw, k) for k, raw in enumerate(raw_messages))
    tools = _tools(body.get("tools"))
    top_logprobs = _integer(body, "top_logprobs", 0, 20)
    if top_logprobs:
        raise ProxyRequestError("top_logprobs is not served: only the sampled token's log-probability is returned", param="top_logprobs")
    max_tokens = _integer(body, "max_completion_tokens", 1)
    return ChatRequest(
        model=body["model"],
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        max_tokens=max_tokens if max_tokens is not None else _integer(body, "max_tokens", 1),
        stop=_stop(body.get("stop")),
        n=_integer(body, "n", 1, MAX_CHOICES) or 1,
        seed=_integer(body, "seed", -(2**63)),
        logprobs=bool(body.get("logprobs")),
        return_token_ids=bool(body.get("return_token_ids")),
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
    )
