"""Tools: JSON schemas from typed Python methods, tool calls, and argument checks (no torch).

A tool is a method marked with :func:`tool`; its JSON schema comes from its signature and its
Google-style docstring, in the OpenAI function-calling shape that chat templates render
(``{"type": "function", "function": {"name", "description", "parameters"}}``), the same shape
``transformers.utils.get_json_schema`` builds, without importing transformers.

:func:`parse_tool_calls` reads the calls a chat model writes (Hermes/Qwen
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) and :func:`check_arguments`
validates their arguments against the schemas. Neither raises on any input: they say exactly
what was wrong, in words the model can act on.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

#: The opening and closing tags of a tool call (Hermes, Qwen2.5, Qwen3, SmolLM3).
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


class ToolError(Exception):
    """Raised inside a tool for a call that runs but fails (bad expression, no such link): the
    message is the tool's result, and the episode goes on."""


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What a tool returns when it does more than answer with text.

    Attributes:
        content: the text the model reads (the ``tool`` message).
        reward: the reward of the call.
        terminated: whether the call ends the episode (a final tool such as ``submit``).
        info: extra keys for the step's ``info``.
    """

    content: str
    reward: float = 0.0
    terminated: bool = False
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def tool(method: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a method of a :class:`~envhub.core.ToolEnv` as a tool the model may call.

    The method needs a type annotation on every argument and a docstring whose first paragraph
    says what the tool does and whose ``Args:`` section describes each argument.
    """
    method.__envhub_tool__ = True  # type: ignore[attr-defined]
    return method


def _json_type(annotation: Any, where: str) -> dict[str, Any]:
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        kinds = {_JSON_TYPES[type(a)] for a in args}
        schema: dict[str, Any] = {"enum": list(args)}
        if len(kinds) == 1:
            schema["type"] = kinds.pop()
        return schema
    if origin in (Union, types.UnionType):
        if type(None) in args:  # Optional[X]: X's schema, nullable (as transformers writes it)
            rest = [a for a in args if a is not type(None)]
            schema = _json_type(rest[0] if len(rest) == 1 else Union[tuple(rest)], where)
            return {**schema, "nullable": True}
        parts = [_json_type(a, where) for a in args]
        if all(set(p) == {"type"} for p in parts):
            return {"type": [p["type"] for p in parts]}
        return {"anyOf": parts}
    if origin in (list, tuple, Sequence) or annotation in (list, tuple):
        return {"type": "array", "items": _json_type(args[0], where)} if args else {"type": "array"}
    if origin in (dict, Mapping) or annotation is dict:
        return {"type": "object"}
    raise TypeError(f"{where}: cannot express {annotation!r} as a JSON schema type; use str, int, float, bool, list, dict or Literal")


_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """The description (text before the first section) and each ``Args:`` entry of a Google docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        if re.match(r"^(Args|Arguments|Returns|Raises|Yields|Examples?|Notes?):\s*$", stripped):
            section, current = stripped.rstrip(":"), None
            continue
        if section is None:
            description.append(stripped)
        elif section in ("Args", "Arguments") and stripped:
            match = _ARG_LINE.match(line)
            if match and len(line) - len(line.lstrip()) <= 4:
                current = match[1]
                args[current] = match[2].strip()
            elif current is not None:
                args[current] = f"{args[current]} {stripped}".strip()
    text = " ".join(" ".join(description).split())
    return text, args


def json_schema(function: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI-style JSON schema of ``function`` (a bound or plain function), from its
    signature and Google-style docstring.

    Raises:
        TypeError: if an argument has no annotation, or one that JSON cannot express, or the
            docstring is missing or does not describe every argument.
    """
    name = function.__name__
    doc = inspect.getdoc(function)
    if not doc:
        raise TypeError(f"tool {name} needs a docstring: what it does, then an Args: section")
    description, documented = _docstring_parts(doc)
    hints = typing.get_type_hints(function)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name == "self":
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"tool {name}: *args and **kwargs cannot be described by a JSON schema")
        if parameter.name not in hints:
            raise TypeError(f"tool {name}: argument {parameter.name!r} needs a type annotation")
        if parameter.name not in documented:
            raise TypeError(f"tool {name}: the docstring's Args: section does not describe {parameter.name!r}")
        schema = _json_type(hints[parameter.name], f"tool {name}, argument {parameter.name!r}")
        schema["description"] = documented[parameter.name]
        properties[parameter.name] = schema
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


# ---------------------------------------------------------------------- tool calls


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call of a tool: its name and arguments (a JSON object)."""

    name: str
    arguments: Mapping[str, Any]

    def to_json(self) -> str:
        """The call as canonical JSON, the action string a :class:`~envhub.core.ToolEnv` steps
        with: ``{"name": ..., "arguments": {...}}``, argument keys sorted, no ASCII escaping."""
        return '{"name": %s, "arguments": %s}' % (
            json.dumps(self.name, ensure_ascii=False),
            json.dumps(dict(self.arguments), ensure_ascii=False, sort_keys=True),
        )

    def render(self) -> str:
        """The call as a chat model writes it: ``<tool_call>{json}</tool_call>``."""
        return f"{CALL_OPEN}\n{self.to_json()}\n{CALL_CLOSE}"


def _preview(text: str, width: int = 60) -> str:
    flat = repr(text)[1:-1]
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _check_value(value: Any, schema: Mapping[str, Any], where: str, max_chars: int) -> str | None:
    if value is None and schema.get("nullable"):
        return None
    if "anyOf" in schema:
        errors = [_check_value(value, option, where, max_chars) for option in schema["anyOf"]]
        return None if any(e is None for e in errors) else errors[0]
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {json.dumps(schema['enum'], ensure_ascii=False)}, got {_preview(json.dumps(value, ensure_ascii=False))}"
    wanted = schema.get("type")
    if wanted is not None:
        kinds = wanted if isinstance(wanted, list) else [wanted]
        actual = _kind(value)
        ok = actual in kinds or (actual == "integer" and "number" in kinds)
        if not ok:
            return f"{where} must be {' or '.join(kinds)}, got {actual} {_preview(json.dumps(value, ensure_ascii=False, default=str))}"
    if isinstance(value, str) and len(value) > max_chars:
        return f"{where} is {len(value)} characters long; at most {max_chars} are allowed"
    if isinstance(value, list):
        if len(value) > max_chars:
            return f"{where} has {len(value)} items; at most {max_chars} are allowed"
        items = schema.get("items")
        for i, item in enumerate(value if items else ()):
            error = _check_value(item, items, f"{where}[{i}]", max_chars)
            if error:
                return error
    return None


def check_arguments(call: ToolCall, schemas: Mapping[str, Mapping[str, Any]], max_chars: int = 2000) -> str | None:
    """Why ``call`` does not fit its tool's schema (unknown tool, missing, unexpected or
    mistyped argument, a text argument over ``max_chars``), or None when it fits.

    Args:
        call: the call.
        schemas: tool name -> the tool's JSON schema (:func:`json_schema`).
        max_chars: the longest text (and list) argument accepted.
    """
    schema = schemas.get(call.name)
    if schema is None:
        return f"there is no tool called '{_preview(call.name)}'; the tools are: {', '.join(schemas)}"
    parameters = schema["function"]["parameters"]
    properties = parameters.get("properties", {})
    unexpected = [key for key in call.arguments if key not in properties]
    if unexpected:
        known = ", ".join(properties) or "none"
        return f"{call.name}() got an unexpected argument '{_preview(unexpected[0])}'; its arguments are: {known}"
    missing = [key for key in parameters.get("required", ()) if key not in call.arguments]
    if missing:
        return f"{call.name}() is missing the required argument '{missing[0]}'"
    for key, value in call.arguments.items():
        error = _check_value(value, properties[key], f"{call.name}() argument '{key}'", max_chars)
        if error:
            return error
    return None


def _decode_call(text: str, max_chars: int) -> tuple[ToolCall | None, str | None]:
    """One call from the JSON between ``<tool_call>`` tags (or a bare JSON object)."""
    body = text.strip()
    if not body:
        return None, "the tool call is empty; write {\"name\": ..., \"arguments\": {...}}"
    if len(body) > 4 * max_chars + 1000:
        return None, f"the tool call is {len(body)} characters long; at most {4 * max_chars + 1000} are allowed"
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        message = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        where = f" at character {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
        return None, f"the tool call is not valid JSON ({message}{where}): {_preview(body)}"
    if not isinstance(payload, dict):
        return None, f"a tool call is a JSON object {{\"name\": ..., \"arguments\": {{...}}}}, got {_kind(payload)}"
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return None, "the tool call has no \"name\" (a string naming the tool)"
    extra = sorted(set(payload) - {"name", "arguments"})
    if extra:
        return None, f"the tool call has unexpected keys {extra}; it takes only \"name\" and \"arguments\""
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI's wire format sends the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return None, f"the \"arguments\" of {_preview(name)} are a string that is not a JSON object"
    if not isinstance(arguments, dict):
        return None, f"the \"arguments\" of {_preview(name)} must be a JSON object, got {_kind(arguments)}"
    return ToolCall(name, arguments), None


@dataclasses.dataclass(frozen=True)
class ParsedCalls:
    """The tool calls a reply made, or why it made none that can run.

    Attributes:
        calls: the calls, in order (at most the cap).
        error: why the reply is invalid, or None.
        dropped: how many calls past the cap were ignored.
    """

    calls: tuple[ToolCall, ...]
    error: str | None = None
    dropped: int = 0
    #: False when the reply broke the syntax (tags, JSON); True when only a call's tool or
    #: arguments were wrong.
    well_formed: bool = True


def find_all(haystack: str, needle: str) -> list[int]:
    """Every position of ``needle`` in ``haystack`` (overlaps included)."""
    found, start = [], haystack.find(needle)
    while start != -1:
        found.append(start)
        start = haystack.find(needle, start + 1)
    return found


def parse_tool_calls(
    reply: Any, schemas: Mapping[str, Mapping[str, Any]], max_calls: int = 1, max_chars: int = 2000
) -> ParsedCalls:
    """Every ``<tool_call>...</tool_call>`` block of ``reply``, decoded and checked against
    ``schemas``; never raises.

    Text outside the blocks (reasoning) is allowed. Blocks may not nest or be left open; the
    first ``max_calls`` calls are kept and the rest dropped (counted in ``dropped``). One bad call
    makes the whole reply invalid, with the reason.
    """
    if not isinstance(reply, str):
        return ParsedCalls((), f"the reply must be text, got {type(reply).__name__}", well_formed=False)
    lower = reply.lower()
    opens, closes = find_all(lower, CALL_OPEN), find_all(lower, CALL_CLOSE)
    tools = ", ".join(schemas)
    if not opens and not closes:
        return ParsedCalls((), f"the reply calls no tool; write <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call> with one of: {tools}", well_formed=False)
    if len(opens) != len(closes):
        return ParsedCalls((), f"the reply has {len(opens)} {CALL_OPEN} and {len(closes)} {CALL_CLOSE} tags; close every call once, do not nest them", well_formed=False)
    blocks: list[str] = []
    for i, (start, end) in enumerate(zip(opens, closes)):
        if end < start or (i + 1 < len(opens) and opens[i + 1] < end):
            return ParsedCalls((), f"the reply's {CALL_OPEN} tags are nested or out of order; write one block per call", well_formed=False)
        blocks.append(reply[start + len(CALL_OPEN) : end])
    dropped = max(0, len(blocks) - max_calls)
    calls: list[ToolCall] = []
    for block in blocks[:max_calls]:
        call, error = _decode_call(block, max_chars)
        if error is not None:
            return ParsedCalls(tuple(calls), error, dropped, well_formed=False)
        error = check_arguments(call, schemas, max_chars)  # type: ignore[arg-type]
        if error is not None:
            return ParsedCalls(tuple(calls), error, dropped)
        calls.append(call)  # type: ignore[arg-type]
    return ParsedCalls(tuple(calls), None, dropped)


def parse_action_call(action: Any, schemas: Mapping[str, Mapping[str, Any]], max_chars: int = 2000) -> tuple[ToolCall | None, str | None]:
    """The one call an action string names: ``{"name": ..., "arguments": ...}`` JSON, or a reply
    with exactly one ``<tool_call>`` block; ``(call, None)`` or ``(None, reason)``, never raises."""
    if not isinstance(action, str):
        return None, f"an action is text, got {type(action).__name__}"
    if CALL_OPEN in action.lower() or CALL_CLOSE in action.lower():
        parsed = parse_tool_calls(action, schemas, max_calls=1, max_chars=max_chars)
        if parsed.error is None and parsed.dropped:
            return None, f"an action is one tool call; this one has {1 + parsed.dropped}"
        return (parsed.calls[0], None) if parsed.error is None else (None, parsed.error)
    call, error = _decode_call(action, max_chars)
    if error is None:
        error = check_arguments(call, schemas, max_chars)  # type: ignore[arg-type]
    return (call, None) if error is None else (None, error)


def tools_text(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The tools as a system-prompt section, for chat templates that do not render ``tools=``
    (Hermes' and Qwen2.5's own wording, so a model tuned on either reads it as its template would)."""
    listed = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
    )


def call_from_python(text: str, schemas: Mapping[str, Mapping[str, Any]]) -> ToolCall | None:
    """A call typed as Python, ``search("Brakmouth")`` or ``submit(answer="Lirgard")``, as a
    :class:`ToolCall` (positional arguments in the schema's order); None when ``text`` is not
    one call of a known tool with literal arguments. For people at ``envhub run --policy human``."""
    import ast

    if not isinstance(text, str) or len(text) > 10_000:
        return None
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in schemas):
        return None
    order = list(schemas[node.func.id]["function"]["parameters"].get("properties", {}))
    try:
        if len(node.args) > len(order) or any(k.arg is None for k in node.keywords):
            return None
        arguments = {order[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
        arguments.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return ToolCall(node.func.id, arguments)


def describe_tools(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The tools for a person: one signature line per tool, its description, one line per argument."""
    lines = []
    for schema in schemas:
        function = schema["function"]
        properties = function["parameters"].get("properties", {})
        required = set(function["parameters"].get("required", ()))
        signature = ", ".join(f"{name}: {spec.get('type', 'any')}{'' if name in required else ' = optional'}" for name, spec in properties.items())
        lines.append(f"  {function['name']}({signature})  {function.get('description', '')}")
        lines.extend(f"      {name}: {spec.get('description', '')}" for name, spec in properties.items())
    return "\n".join(lines)
