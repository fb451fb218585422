"""Reply formats: how actions (or tool calls) are extracted from an LLM reply.

The default format wants ``<answer>ACTION</answer>``, optionally preceded by
``<think>...</think>``. Several actions per reply (``Up || Left``) can be allowed with a cap, as
RAGEN does. The ``tool-call`` format reads the calls chat models write,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and checks them against the tools'
JSON schemas (:class:`~envhub.core.ToolEnv`). Parsing never raises on any reply: the result says
whether the format was valid, which actions it named, and, if anything is wrong, why, in words the
model can learn from.

Formats live in a registry (:data:`FORMATS`, :func:`register_format`); plugins add theirs through
the ``register_formats`` hook, the way they add environments. A format is any hashable, picklable
object with ``instructions()``, ``parse(reply, valid_actions, tools)`` and ``render(action)``.

The parser scans for tags with ``str.find`` rather than regular expressions, so a megabyte of
unclosed tags costs linear time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from envhub.core import TextEnv, ToolEnv, match_action, shorten
from envhub.tools import CALL_CLOSE, CALL_OPEN, find_all, parse_tool_calls


@dataclasses.dataclass(frozen=True)
class ParsedReply:
    """What an action format made of one reply.

    Attributes:
        actions: the actions named, each the canonical legal spelling where ``valid_actions`` was
            given and it matched, else the stripped text between the tags.
        format_valid: whether the reply followed the format.
        legal: whether every action matched a legal action (True when no legal list was given).
        error: why the reply is not valid (format or legality), or None.
        think: the reasoning between ``<think>`` tags, or None.
        dropped: how many actions past the cap were ignored.
    """

    actions: tuple[str, ...]
    format_valid: bool
    legal: bool
    error: str | None = None
    think: str | None = None
    dropped: int = 0

    @property
    def valid(self) -> bool:
        """Whether the reply followed the format and named only legal actions."""
        return self.format_valid and self.legal

    @property
    def action(self) -> str | None:
        """The first action, or None when there is none."""
        return self.actions[0] if self.actions else None


@dataclasses.dataclass(frozen=True)
class TagFormat:
    """``[<think>...</think>] <answer>A [|| B ...]</answer>``.

    Attributes:
        answer_tag: name of the tag around the action(s).
        think_tag: name of the optional reasoning tag.
        require_think: whether the reasoning block is mandatory.
        max_actions: how many actions one reply may carry; extra ones are dropped.
        separator: what separates several actions.
        strict: whether text outside the tags makes the format invalid.
    """

    answer_tag: str = "answer"
    think_tag: str = "think"
    require_think: bool = False
    max_actions: int = 1
    separator: str = "||"
    strict: bool = False

    def __post_init__(self) -> None:
        if self.max_actions < 1:
            raise ValueError(f"max_actions must be at least 1, got {self.max_actions}")

    def instructions(self) -> str:
        """Tell the model how to format a reply."""
        think = f"<{self.think_tag}>your reasoning</{self.think_tag}> " if self.require_think else (
            f"optionally <{self.think_tag}>your reasoning</{self.think_tag}>, then "
        )
        answer = f"<{self.answer_tag}>action</{self.answer_tag}>"
        several = (
            f" You may give up to {self.max_actions} actions separated by '{self.separator}'."
            if self.max_actions > 1
            else " Give exactly one action."
        )
        return f"Reply with {think}{answer}.{several}"

    def render(self, action: str) -> str:
        """A reply in this format that names ``action`` (the expert's, an SFT target)."""
        think = f"<{self.think_tag}></{self.think_tag}>" if self.require_think else ""
        return f"{think}<{self.answer_tag}>{action}</{self.answer_tag}>"

    def parse(self, reply: str, valid_actions: Sequence[str] | None = None, tools: Mapping[str, Any] | None = None) -> ParsedReply:
        """Extract the action(s) from ``reply``; never raises for any string (``tools`` is unused)."""
        if not isinstance(reply, str):
            return ParsedReply((), False, False, f"the reply must be text, got {type(reply).__name__}")
        lower = reply.lower()
        think, end_of_think, error = self._block(reply, lower, self.think_tag)
        if error:
            return ParsedReply((), False, False, error)
        if think is None and self.require_think:
            return ParsedReply((), False, False, f"the reply has no <{self.think_tag}>...</{self.think_tag}> block")
        answer, _, error = self._block(reply, lower, self.answer_tag)
        if error:
            return ParsedReply((), False, False, error, think)
        if answer is None:
            return ParsedReply((), False, False, f"the reply has no <{self.answer_tag}>...</{self.answer_tag}> block", think)
        open_answer = lower.find(f"<{self.answer_tag}>")
        if think is not None and open_answer < end_of_think:
            return ParsedReply((), False, False, f"<{self.think_tag}> must come before <{self.answer_tag}>", think)
        if self.strict:
            outside = reply[:open_answer] if think is None else reply[end_of_think:open_answer]
            close_answer = lower.find(f"</{self.answer_tag}>") + len(self.answer_tag) + 3
            if outside.strip() or reply[close_answer:].strip():
                return ParsedReply((), False, False, "the reply has text outside its tags", think)
        parts = [part.strip() for part in answer.split(self.separator)] if self.max_actions > 1 else [answer.strip()]
        if any(not part for part in parts):
            return ParsedReply((), False, False, f"the <{self.answer_tag}> block names an empty action", think)
        dropped = max(0, len(parts) - self.max_actions)
        parts = parts[: self.max_actions]
        if valid_actions is None:
            return ParsedReply(tuple(parts), True, True, None, think, dropped)
        matched = [match_action(part, valid_actions) for part in parts]
        illegal = [part for part, m in zip(parts, matched) if m is None]
        if illegal:
            reason = f"'{shorten(illegal[0])}' is not one of the legal actions: {', '.join(valid_actions)}"
            return ParsedReply(tuple(parts), True, False, reason, think, dropped)
        return ParsedReply(tuple(m for m in matched if m is not None), True, True, None, think, dropped)

    @staticmethod
    def _block(reply: str, lower: str, tag: str) -> tuple[str | None, int, str | None]:
        """Return (content, end index, error) of the single ``<tag>...</tag>`` block, if any."""
        opens, closes = find_all(lower, f"<{tag}>"), find_all(lower, f"</{tag}>")
        if not opens and not closes:
            return None, -1, None
        if len(opens) > 1 or len(closes) > 1:
            return None, -1, f"the reply has {len(opens)} <{tag}> and {len(closes)} </{tag}> tags; use exactly one block, not nested"
        if not opens:
            return None, -1, f"</{tag}> has no opening <{tag}>"
        if not closes:
            return None, -1, f"<{tag}> is never closed with </{tag}>"
        start, end = opens[0] + len(tag) + 2, closes[0]
        if end < start:
            return None, -1, f"</{tag}> comes before <{tag}>"
        return reply[start:end], end + len(tag) + 3, None


@dataclasses.dataclass(frozen=True)
class ToolCallFormat:
    """``[reasoning] <tool_call>{"name": ..., "arguments": {...}}</tool_call> [<tool_call>...]``.

    Each call is checked against the env's tool schemas: malformed JSON, an unknown tool, a
    missing, unexpected or mistyped argument, or an over-long one make the reply invalid, with the
    reason. Text outside the calls is allowed (a model's reasoning).

    Attributes:
        max_calls: how many calls one reply may carry; extra ones are dropped.
        max_argument_chars: the longest text argument accepted (None: the env's own limit).
    """

    max_calls: int = 1
    max_argument_chars: int | None = None

    def __post_init__(self) -> None:
        if self.max_calls < 1:
            raise ValueError(f"max_calls must be at least 1, got {self.max_calls}")

    def instructions(self) -> str:
        """Tell the model how to call a tool."""
        several = f"You may make up to {self.max_calls} calls per reply; they run in order." if self.max_calls > 1 else "Make exactly one call per reply."
        return (
            f'Act by calling a tool: {CALL_OPEN}{{"name": "TOOL", "arguments": {{...}}}}{CALL_CLOSE}, '
            f"with the arguments its schema asks for. {several} Each result comes back to you."
        )

    def render(self, action: str) -> str:
        """A reply that makes the call ``action`` (canonical JSON)."""
        return f"{CALL_OPEN}\n{action}\n{CALL_CLOSE}"

    def parse(self, reply: str, valid_actions: Sequence[str] | None = None, tools: Mapping[str, Any] | None = None) -> ParsedReply:
        """The calls of ``reply`` as actions (canonical JSON), checked against ``tools`` (tool
        name -> JSON schema); never raises for any string."""
        if not tools:
            return ParsedReply((), False, False, "this environment has no tools; use a reply format such as 'answer'")
        limit = self.max_argument_chars if self.max_argument_chars is not None else 2000
        parsed = parse_tool_calls(reply, tools, self.max_calls, limit)
        if parsed.error is not None:
            actions = tuple(call.to_json() for call in parsed.calls)
            return ParsedReply(actions, parsed.well_formed, False, parsed.error, None, parsed.dropped)
        return ParsedReply(tuple(call.to_json() for call in parsed.calls), True, True, None, None, parsed.dropped)


class ReplyFormat(Protocol):
    """What a reply format provides (``TagFormat``, ``ToolCallFormat``, a plugin's own)."""

    def instructions(self) -> str:
        """Tell the model how to format a reply."""
        ...

    def parse(self, reply: str, valid_actions: Sequence[str] | None = None, tools: Mapping[str, Any] | None = None) -> ParsedReply:
        """Extract the actions from ``reply``; never raise."""
        ...

    def render(self, action: str) -> str:
        """A reply in this format that names ``action``."""
        ...


#: The formats selectable by name (``action_format`` of the prompt settings and the trainer config).
FORMATS: dict[str, ReplyFormat] = {
    "answer": TagFormat(),
    "think-answer": TagFormat(require_think=True),
    "tool-call": ToolCallFormat(),
    "tool-calls": ToolCallFormat(max_calls=4),
}
#: The plugin host binds this: it runs every plugin's ``register_formats`` hook, once.
format_loader: Callable[[], None] | None = None


def register_format(name: str, fmt: ReplyFormat) -> ReplyFormat:
    """Add the reply format ``fmt`` under ``name`` (plugins receive this as the ``register`` of
    their ``register_formats`` hook).

    Raises:
        ValueError: if ``name`` is taken, or ``fmt`` lacks ``instructions``, ``parse`` or ``render``.
    """
    if name in FORMATS:
        raise ValueError(f"the reply format {name!r} is registered twice; pick another name")
    missing = [m for m in ("instructions", "parse", "render") if not callable(getattr(fmt, m, None))]
    if missing:
        raise ValueError(f"reply format {name!r} lacks {', '.join(missing)}(); a format has instructions(), parse() and render()")
    FORMATS[name] = fmt
    return fmt


def get_format(name: str) -> ReplyFormat:
    """Return the reply format called ``name``; a ``ValueError`` lists the known ones."""
    if name not in FORMATS and format_loader is not None:
        format_loader()
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown action format {name!r}; choose one of {sorted(FORMATS)}") from None


def env_format_name(env: Any) -> str:
    """The reply format an env (or env class, or entry point) plays in when none is chosen:
    its ``reply_format`` attribute (``tool-call`` for a :class:`~envhub.core.ToolEnv`), else ``answer``."""
    name = getattr(env, "reply_format", None)
    return name if isinstance(name, str) else "answer"


def env_tools(env: TextEnv) -> dict[str, Any] | None:
    """Tool name -> JSON schema of a :class:`~envhub.core.ToolEnv`; None for other envs."""
    return env.tool_schema_map() if isinstance(env, ToolEnv) else None


def parse_reply(
    reply: str, valid_actions: Sequence[str] | None = None, fmt: ReplyFormat | None = None, tools: Mapping[str, Any] | None = None
) -> ParsedReply:
    """Parse ``reply`` with ``fmt`` (default ``<answer>...</answer>``) against ``valid_actions`` (and ``tools``)."""
    return (fmt or FORMATS["answer"]).parse(reply, valid_actions, tools)


@dataclasses.dataclass
class ReplyOutcome:
    """The result of applying one reply to an environment: the parse and the last step's results.

    ``reward`` sums the rewards of every action the reply carried; ``observations`` holds each
    step's observation (one per tool call of a reply with several), ``observation`` the last.
    """

    parsed: ParsedReply
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    observations: tuple[str, ...] = ()


#: Why a reply the token limit cut off is refused (``EnvGroupManager(unfinished_replies="invalid")``).
UNFINISHED_REASON = "the reply did not end its turn within the token limit; end it right after the answer"


def apply_reply(env: TextEnv, reply: str, fmt: ReplyFormat | None = None, cut: bool = False) -> ReplyOutcome:
    """Parse ``reply`` and take its action(s) in ``env``; never raises for any reply.

    A reply that breaks the format, or names an illegal action, spends one turn through
    ``env.reject`` and leaves the state unchanged; so does a reply marked ``cut`` (the token
    limit cut it off before it ended its turn), whatever it says. Several actions are taken in
    order until the episode ends.
    """
    if cut:
        parsed = ParsedReply(actions=(), format_valid=False, legal=True, error=UNFINISHED_REASON)
        observation, reward, terminated, truncated, info = env.reject(UNFINISHED_REASON)
        return ReplyOutcome(parsed, observation, reward, terminated, truncated, info, (observation,))
    parsed = (fmt or FORMATS["answer"]).parse(reply, env.valid_actions(), env_tools(env))
    if not parsed.valid:
        observation, reward, terminated, truncated, info = env.reject(parsed.error or "invalid reply")
        return ReplyOutcome(parsed, observation, reward, terminated, truncated, info, (observation,))
    total = 0.0
    observations = []
    for action in parsed.actions:
        observation, reward, terminated, truncated, info = env.step(action)
        observations.append(observation)
        total += float(reward)
        if terminated or truncated or not info["action_is_valid"]:
            break
    return ReplyOutcome(parsed, observation, total, terminated, truncated, info, tuple(observations))
