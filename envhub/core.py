"""The text-environment contract every envhub environment implements.

``TextEnv`` is a ``gymnasium.Env[str, str]``: observations and actions are text. It keeps
Gymnasium's ``reset``/``step`` semantics and adds what multi-turn LLM training needs: the task's
``instructions``, the legal actions, an oracle's action, and three info keys on every step
(``action_is_valid``, ``success``, ``state_key``).

Subclasses implement a handful of hooks (``_reset``, ``_step``, ``state_key``, ``is_success``,
``render_text`` and, where they have them, ``valid_actions`` and ``expert_action``); the base class
owns the parts every environment must get the same way: invalid actions leave the state unchanged
and explain themselves, the turn limit truncates, and stepping a finished episode is an error.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, SupportsFloat

import gymnasium
import numpy as np
from gymnasium import spaces

from envhub.error import InvalidAction, ResetNeeded

#: Keys present in the ``info`` dict of every ``reset`` and ``step``.
INFO_KEYS: dict[str, type] = {"action_is_valid": bool, "success": bool, "state_key": str}
#: An optional ``info`` key of a step: a few words on what a move did when it is not what was
#: chosen (slid elsewhere on ice, blocked by a wall); ``envhub run`` shows it after the move.
OUTCOME_KEY = "outcome"


def normalize_action(text: str) -> str:
    """Return ``text`` case-folded with runs of whitespace collapsed, for lenient matching."""
    return " ".join(text.split()).casefold()


def match_action(text: str, valid_actions: Sequence[str]) -> str | None:
    """Return the legal action ``text`` names, ignoring case and runs of whitespace, else None."""
    if text in valid_actions:  # the usual reply names it exactly: no need to normalise every one
        return text
    key = normalize_action(text)
    for candidate in valid_actions:
        if normalize_action(candidate) == key:
            return candidate
    return None


def shorten(text: str, width: int = 60) -> str:
    """Return a one-line preview of ``text`` at most ``width`` characters long."""
    flat = repr(text)[1:-1]
    return flat if len(flat) <= width else flat[: width - 3] + "..."


class TextSpace(spaces.Space[str]):
    """The space of Python strings of at most ``max_length`` characters (any Unicode).

    ``legal`` (an env's ``valid_actions``) makes :meth:`sample` draw a legal action whenever the
    legal actions are a finite list, as Gymnasium users expect of ``action_space.sample()``.
    """

    def __init__(
        self,
        max_length: int = 1 << 20,
        seed: int | np.random.Generator | None = None,
        legal: Callable[[], list[str] | None] | None = None,
    ):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_length = max_length
        self.legal = legal

    @property
    def is_np_flattenable(self) -> bool:
        """Text has no fixed-size numeric form."""
        return False

    def contains(self, x: Any) -> bool:
        """Return whether ``x`` is a string no longer than ``max_length``."""
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """Return a uniformly random legal action where ``legal`` lists them, else a random
        printable ASCII string of 0 to 16 characters."""
        actions = self.legal() if self.legal is not None else None
        if actions:
            return actions[int(self.np_random.integers(len(actions)))]
        length = int(self.np_random.integers(0, 17))
        return "".join(chr(c) for c in self.np_random.integers(32, 127, size=length))

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length


def stable_key(data: str | bytes, length: int | None = None) -> str:
    """A digest of ``data`` that is the same in every process and on every machine (unlike
    Python's ``hash()``): the hex SHA-256, its first ``length`` characters (None: all 64). Envs
    use it for the parts of a ``state_key`` too long to spell out (a board's facts, a question)."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(raw).hexdigest()
    return digest if length is None else digest[:length]


def jsonable(value: Any) -> Any:
    """``value`` (an observation, an ``info`` dict, a tool schema) as JSON can hold it: numpy
    scalars and arrays as Python numbers and lists, tuples and sets as lists (a set sorted), keys
    as text, a NaN or infinite number as None (JSON has no such numbers, and a reader's parser
    refuses the ``NaN`` Python would write), anything else as its ``str``. ``envhub run --json``,
    the OpenEnv server and the trainer's proxy send env data through it."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, (set, frozenset)):  # in an order every process gives
        return sorted((jsonable(item) for item in value), key=repr)
    if isinstance(value, (np.generic, np.ndarray)):
        return jsonable(value.tolist())
    return str(value)


class TextEnv(gymnasium.Env[str, str]):
    """A multi-turn environment that an LLM plays through text.

    Set these in all subclasses:

    - ``instructions``: the task's rules, shown to the model once.
    - ``_reset(options)``, ``_step(action)``, ``state_key()``, ``is_success()``, ``render_text()``.

    Override where the environment has them:

    - ``valid_actions()``: the legal actions now, for finite action sets.
    - ``expert_action()``: an oracle's next action.
    - ``parse_action(action)``: how a text action maps to a legal one (default: case- and
      whitespace-insensitive match against ``valid_actions()``).
    - ``render_rgb()``: a picture of the state, for ``render_mode="rgb_array"``.
    - ``optimal_success_probability()``: the physical limit of the episode, where it is known
      (``envhub.baselines`` reports its mean over seeds as the ``optimal`` reference).

    ``max_turns`` (set by :func:`envhub.make` from the registration) truncates episodes.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}
    observation_space: spaces.Space[str] = TextSpace()
    action_space: spaces.Space[str] = TextSpace()

    instructions: str = ""
    max_turns: int | None = None
    #: Phrases of this env's observations that each carry one meaning (FrozenLake's local view:
    #: "Down: hole."), for tokenizers trained on the env's text: the tiny model's makes each one
    #: token when asked (``tiny: {phrase_tokens: true}``), so a small model need not learn which
    #: word follows which to read its view. Pretrained tokenizers ignore them.
    phrases: tuple[str, ...] = ()
    #: Whether the open-loop reference (:func:`envhub.baselines.best_open_loop`) may search this
    #: env by copying and stepping it. False where a copy cannot be made (state held by a native
    #: library) or the search could not finish (ALFWorld: a PDDL engine at tens of milliseconds a
    #: step, commands that differ between tasks); the open-loop reference is then left out.
    searchable: bool = True

    _turn: int = 0
    _observation: str | None = None
    _episode_over: bool = True

    def __init__(self, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode={render_mode!r} is not supported by {type(self).__name__}; "
                f"choose one of {self.metadata['render_modes']}"
            )
        self.render_mode = render_mode
        # Per instance: sample() draws from this env's legal actions (before reset: random text).
        self.action_space = TextSpace(legal=self._legal_or_none)

    def _legal_or_none(self) -> list[str] | None:
        return None if self._episode_over and self._observation is None else self.valid_actions()

    # ------------------------------------------------------------------ the public API

    @property
    def turn(self) -> int:
        """The number of steps taken since the last ``reset``."""
        return self._turn

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start a new episode.

        Args:
            seed: seeds ``self.np_random``; the same seed gives the same initial state and the same
                dynamics in any process. ``None`` continues the current random stream.
            options: environment-specific reset options.

        Returns:
            The first observation and an info dict with at least ``INFO_KEYS``.
        """
        super().reset(seed=seed)
        self._turn = 0
        observation, extra = self._reset(dict(options or {}))
        self._observation = observation
        self._episode_over = False
        return observation, self._info(True, extra)

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Take one turn.

        An action that ``parse_action`` rejects (illegal, empty, not text) changes nothing: the
        observation repeats the current state after a line saying why, the reward is 0,
        ``info["action_is_valid"]`` is False and ``info["invalid_reason"]`` holds the reason. It
        still counts as a turn.

        Returns:
            ``(observation, reward, terminated, truncated, info)`` with Gymnasium's meaning;
            ``truncated`` is True when the turn limit ends the episode.

        Raises:
            ResetNeeded: if no episode is running (before ``reset`` or after it ended).
        """
        if self._episode_over:
            raise ResetNeeded(
                f"{type(self).__name__}.step() was called with no episode running; "
                "call reset() first (and again after terminated or truncated)"
            )
        try:
            legal = self.parse_action(action)
        except InvalidAction as exc:
            return self.reject(str(exc))
        self._turn += 1
        observation, reward, terminated, extra = self._step(legal)
        self._observation = observation
        return self._finish(observation, float(reward), bool(terminated), self._info(True, extra))

    def reject(self, reason: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Spend a turn on a reply that named no legal action, leaving the state unchanged.

        The manager calls this when a reply fails the action format; ``step`` calls it for
        illegal actions.
        """
        if self._episode_over:
            raise ResetNeeded(f"{type(self).__name__}.reject() was called with no episode running")
        self._turn += 1
        observation = f"Invalid action: {reason}\n{self._observation}"
        info = self._info(False, {"invalid_reason": reason})
        return self._finish(observation, 0.0, False, info)

    def parse_action(self, action: str) -> str:
        """Return the legal action that ``action`` names.

        Matching ignores case and runs of whitespace. Environments with an open action space
        (``valid_actions()`` is None) accept any non-empty text by default.

        Raises:
            InvalidAction: with a reason the model can act on.
        """
        if not isinstance(action, str):
            raise InvalidAction(f"an action is text, got {type(action).__name__}")
        if not action.strip():  # what normalize_action would leave empty
            raise InvalidAction("the action is empty")
        legal = self.valid_actions()
        if legal is None:
            return action.strip()
        found = match_action(action, legal)
        if found is not None:
            return found
        raise InvalidAction(f"'{shorten(action)}' is not one of the legal actions: {', '.join(legal)}")

    def valid_actions(self) -> list[str] | None:
        """Return the actions legal now, or None where the action space is open."""
        return None

    def expert_action(self) -> str | None:
        """Return an oracle's next action, or None where the environment has no oracle."""
        return None

    def optimal_success_probability(self) -> float | None:
        """Return the highest probability any policy has of succeeding in this episode, from its
        initial state under the turn limit, or None where the environment does not know it.

        Optional: call it after ``reset``; the default knows nothing.
        """
        return None

    def state_key(self) -> str:
        """Return a canonical, deterministic key of the current state (the GiGPO anchor).

        Equal states give equal keys in any process; never built from Python's ``hash()``.
        """
        raise NotImplementedError

    def is_success(self) -> bool:
        """Return whether the task is accomplished in the current state."""
        raise NotImplementedError

    def render_text(self) -> str:
        """Return the current state as text for a person (the ``ansi`` rendering)."""
        raise NotImplementedError

    def render_rgb(self) -> np.ndarray:
        """Return the current state as an ``(H, W, 3)`` uint8 picture."""
        raise NotImplementedError(f"{type(self).__name__} has no picture rendering")

    def render(self) -> str | np.ndarray:  # type: ignore[override]
        """Return the state as text (``ansi`` or no render mode) or a picture (``rgb_array``)."""
        if self.render_mode == "rgb_array":
            return self.render_rgb()
        return self.render_text()

    # ------------------------------------------------------------------ subclass hooks

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Set up the initial state from ``self.np_random``; return the observation and extra info."""
        raise NotImplementedError

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply a legal ``action``; return ``(observation, reward, terminated, extra_info)``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ internals

    def _info(self, valid: bool, extra: dict[str, Any]) -> dict[str, Any]:
        info = {"action_is_valid": valid, "success": bool(self.is_success()), "state_key": self.state_key()}
        info.update(extra)
        return info

    def _finish(
        self, observation: str, reward: float, terminated: bool, info: dict[str, Any]
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        truncated = not terminated and self.max_turns is not None and self._turn >= self.max_turns
        self._episode_over = terminated or truncated
        return observation, reward, terminated, truncated, info


class DiscreteTextEnv(TextEnv):
    """A ``TextEnv`` whose actions are a fixed list of names, all legal in every state.

    Set ``action_names`` in the subclass; ``valid_actions()`` returns it, and ``action_index``
    maps a legal name back to its index for environments whose dynamics work on integers.
    """

    action_names: tuple[str, ...] = ()

    def valid_actions(self) -> list[str]:
        """Return every action name: all are legal in every state."""
        return list(self.action_names)

    def parse_action(self, action: str) -> str:
        """Return the action name ``action`` matches, ignoring case and whitespace."""
        if isinstance(action, str):
            names = self.action_names
            lookup = _LOOKUPS.get(names)
            if lookup is None:
                lookup = _LOOKUPS.setdefault(names, {normalize_action(name): name for name in names})
            found = lookup.get(normalize_action(action))
            if found is not None:
                return found
        return super().parse_action(action)

    def action_index(self, name: str) -> int:
        """Return the index of the legal action ``name`` in ``action_names``."""
        return self.action_names.index(name)


# Normalised-name lookups per action-name tuple, shared by every instance with those names.
_LOOKUPS: dict[tuple[str, ...], dict[str, str]] = {}


class ToolEnv(TextEnv):
    """A ``TextEnv`` the model plays by calling tools (Agent-R1's ToolEnv, OpenAI function calling).

    Set these in all subclasses:

    - tools: methods marked with :func:`envhub.tools.tool`, typed, with Google-style docstrings;
      their JSON schemas (:meth:`tool_schemas`) come from those. A tool returns its result as text,
      or a :class:`~envhub.tools.ToolResult` to give a reward or end the episode, or raises
      :class:`~envhub.tools.ToolError`, whose message becomes the result.
    - ``final_tools``: the tools whose call ends the episode (``("submit",)``).
    - ``_reset(options)``, ``state_key()``, ``is_success()``, ``render_text()``, and
      ``expert_action()`` where an oracle exists (return :meth:`call_action`'s string).

    An action is one tool call as JSON, ``{"name": ..., "arguments": {...}}`` (or a reply with
    one ``<tool_call>`` block); ``valid_actions()`` is None. A call that names no tool, misses an
    argument or has one of the wrong type is an invalid action whose observation says exactly what
    was wrong. The first observation is the task (a user message); every later one is a tool's
    result (a ``tool`` message).
    """

    #: The reply format the manager applies to this env when none is chosen.
    reply_format: str = "tool-call"
    #: The tools whose call ends the episode.
    final_tools: tuple[str, ...] = ()
    #: The longest text argument a call may carry (a longer one is an invalid action).
    max_argument_chars: int = 2000

    _tool_names: tuple[str, ...] = ()
    _schemas: tuple[dict[str, Any], ...] = ()
    _schema_map: Mapping[str, dict[str, Any]] = MappingProxyType({})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        from envhub.tools import json_schema

        names: list[str] = []
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                if getattr(member, "__envhub_tool__", False) and name not in names:
                    names.append(name)
        clashes = [name for name in names if hasattr(TextEnv, name)]
        if clashes:
            raise TypeError(f"{cls.__name__}: tools may not be named after TextEnv's own methods ({', '.join(clashes)})")
        cls._tool_names = tuple(names)
        cls._schemas = tuple(json_schema(getattr(cls, name)) for name in names)
        cls._schema_map = MappingProxyType(dict(zip(names, cls._schemas)))
        unknown = sorted(set(cls.final_tools) - set(names))
        if unknown and names:
            raise TypeError(f"{cls.__name__}.final_tools names {unknown}, which are not tools of {cls.__name__} ({', '.join(names)})")

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas in the OpenAI function-calling shape (``tools=`` of a chat template)."""
        return [dict(schema) for schema in self._schemas]

    def tool_schema_map(self) -> Mapping[str, dict[str, Any]]:
        """Tool name -> JSON schema (read-only; one mapping per class, so callers may cache on it)."""
        return self._schema_map

    def call_action(self, name: str, **arguments: Any) -> str:
        """The action string of a call of tool ``name`` (canonical JSON), e.g. for ``expert_action``."""
        from envhub.tools import ToolCall

        return ToolCall(name, arguments).to_json()

    def valid_actions(self) -> None:
        """None: a tool env's actions are tool calls, checked against the tools' schemas."""
        return None

    def parse_action(self, action: str) -> str:
        """Return ``action``'s call as canonical JSON, after checking it against the schemas.

        Raises:
            InvalidAction: naming what was wrong (malformed JSON, unknown tool, a missing,
                unexpected or mistyped argument).
        """
        from envhub.tools import parse_action_call

        call, error = parse_action_call(action, self.tool_schema_map(), self.max_argument_chars)
        if call is None:
            raise InvalidAction(error or "not a tool call")
        return call.to_json()

    def reject(self, reason: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Spend a turn on a bad call: the state is unchanged and the result is the reason (the
        last tool result is not repeated: the model still has it in its context)."""
        if self._episode_over:
            raise ResetNeeded(f"{type(self).__name__}.reject() was called with no episode running")
        self._turn += 1
        info = self._info(False, {"invalid_reason": reason})
        return self._finish(f"Error: {reason}", 0.0, False, info)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        import json

        from envhub.tools import ToolError, ToolResult

        call = json.loads(action)
        name, arguments = call["name"], call["arguments"]
        extra: dict[str, Any] = {"tool": name}
        try:
            result = getattr(self, name)(**arguments)
        except ToolError as exc:
            return f"Error: {exc}", 0.0, False, {**extra, "tool_error": str(exc)}
        if isinstance(result, ToolResult):
            terminated = result.terminated or name in self.final_tools
            return result.content, float(result.reward), terminated, {**extra, **result.info}
        return str(result), 0.0, name in self.final_tools, extra
