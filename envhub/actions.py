"""Action formats: how an action is extracted from an LLM reply.

The default format wants ``<answer>ACTION</answer>``, optionally preceded by
``<think>...</think>``. Several actions per reply (``Up || Left``) can be allowed with a cap, as
RAGEN does. Parsing never raises on any reply: the result says whether the format was valid, which
actions it named, and, if anything is wrong, why, in words the model can learn from.

The parser scans for tags with ``str.find`` rather than regular expressions, so a megabyte of
unclosed tags costs linear time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from envhub.core import TextEnv, match_action, shorten


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


def _find_all(haystack: str, needle: str) -> list[int]:
    found, start = [], haystack.find(needle)
    while start != -1:
        found.append(start)
        start = haystack.find(needle, start + 1)
    return found


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

    def parse(self, reply: str, valid_actions: Sequence[str] | None = None) -> ParsedReply:
        """Extract the action(s) from ``reply``; never raises for any string."""
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
        opens, closes = _find_all(lower, f"<{tag}>"), _find_all(lower, f"</{tag}>")
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


#: The formats selectable by name (``--action-format`` and the trainer config).
FORMATS: dict[str, TagFormat] = {
    "answer": TagFormat(),
    "think-answer": TagFormat(require_think=True),
}


def get_format(name: str) -> TagFormat:
    """Return the action format called ``name``; a ``ValueError`` lists the known ones."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown action format {name!r}; choose one of {sorted(FORMATS)}") from None


def parse_reply(reply: str, valid_actions: Sequence[str] | None = None, fmt: TagFormat | None = None) -> ParsedReply:
    """Parse ``reply`` with ``fmt`` (default ``<answer>...</answer>``) against ``valid_actions``."""
    return (fmt or FORMATS["answer"]).parse(reply, valid_actions)


@dataclasses.dataclass
class ReplyOutcome:
    """The result of applying one reply to an environment: the parse and the last step's results.

    ``reward`` sums the rewards of every action the reply carried.
    """

    parsed: ParsedReply
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def apply_reply(env: TextEnv, reply: str, fmt: TagFormat | None = None) -> ReplyOutcome:
    """Parse ``reply`` and take its action(s) in ``env``; never raises for any reply.

    A reply that breaks the format, or names an illegal action, spends one turn through
    ``env.reject`` and leaves the state unchanged. Several actions are taken in order until the
    episode ends.
    """
    parsed = parse_reply(reply, env.valid_actions(), fmt)
    if not parsed.valid:
        return ReplyOutcome(parsed, *env.reject(parsed.error or "invalid reply"))
    total = 0.0
    for action in parsed.actions:
        observation, reward, terminated, truncated, info = env.step(action)
        total += float(reward)
        if terminated or truncated or not info["action_is_valid"]:
            break
    return ReplyOutcome(parsed, observation, total, terminated, truncated, info)
