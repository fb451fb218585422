"""What the proxy records: each session's calls, token-exact, and how they fold into trajectories.

A :class:`CallRecord` holds one chat-completions call as the generator saw it: the prompt's token
ids and text, and per choice the sampled token ids and their log-probs exactly as sampled. A call
*extends* an earlier call of its session when the template's rendering of its messages starts with
that call's prompt text followed by the text of one of its samples (:meth:`Session.find_parent`):
the agent resent its history unchanged and appended to it. The proxy then prompts the generator
with the earlier ids, the sampled ids and the tokens of the appended text alone, so nothing the
model sampled is ever re-tokenised.

:func:`session_trajectory` turns a session into an :class:`envhub.trajectory.Trajectory`, the
record envhub's own turn loop makes, so the trainer's stages take it unchanged. A session whose
calls each extend the one before is one trajectory (layout ``trajectory``: sampled tokens with
``env_mask`` 1, the tokens between them 0). Any other session (an agent that rewrote or truncated
its history, a template that drops earlier ``<think>`` blocks, ``n`` > 1) becomes one step sample
per choice (layout ``step``), and :attr:`Session.breaks` counts the calls that broke the chain.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from envhub.bounds import is_number
from envhub.trajectory import Trajectory, Turn


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    """One sampled completion of a call.

    Attributes:
        token_ids: the sampled token ids, exactly as the generator returned them.
        logprobs: their sampling log-probabilities.
        sampled_text: the ids decoded with special tokens kept: what follows the prompt's text
            in the template's rendering when the agent resends this reply.
        reply: the reply as the model wrote it (any prefilled start included), which is how the
            proxy renders this reply when the agent sends it back.
        content: the message content returned to the agent (tool calls and stop strings cut out).
        tool_calls: the tool calls returned, OpenAI-shaped (``arguments`` a JSON string).
        finish_reason: ``"stop"``, ``"length"`` or ``"tool_calls"``.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    sampled_text: str
    reply: str
    content: str | None
    tool_calls: tuple[dict[str, Any], ...] = ()
    finish_reason: str = "stop"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CallRecord:
    """One call of a session.

    Attributes:
        index: the call's number in its session, from 0.
        prompt_ids: the token ids the generator was prompted with.
        prompt_text: the template's rendering of the call's messages (with the generation prompt).
        parent: ``(call index, choice index)`` of the reply this call extends, or None.
        env_ids: the prompt's tokens after that reply (the whole prompt when there is no parent).
        new_messages: the messages after that reply (all of them when there is no parent).
        choices: the completions sampled.
        system: the call's first system message, or "".
        tools: the call's tools, or None.
        state_key: the state key of the env the proxy hosts for the session, as it stood when the
            call was made (:mod:`~envhub_trl.proxy.hosted`); None without one.
    """

    index: int
    prompt_ids: tuple[int, ...]
    prompt_text: str
    parent: tuple[int, int] | None
    env_ids: tuple[int, ...]
    new_messages: tuple[dict[str, Any], ...]
    choices: tuple[Choice, ...]
    system: str = ""
    tools: tuple[dict[str, Any], ...] | None = None
    state_key: str | None = None


def reply_key(content: str | None, tool_calls: Sequence[dict[str, Any]] = ()) -> str:
    """A key of an assistant message by what it says: its content and its calls' names and arguments
    (ids left out: agents rewrite them)."""
    calls = []
    for call in tool_calls:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                pass
        calls.append([function.get("name"), arguments])
    return json.dumps([content or "", calls], sort_keys=True, ensure_ascii=False)


def is_reward(value: Any) -> bool:
    """Whether ``value`` may be a session's reward: a finite int or float, not a bool (which Python
    counts as an int) and not NaN or infinite, which no advantage survives."""
    return is_number(value) and math.isfinite(value)


@dataclasses.dataclass(eq=False)
class Session:
    """The calls recorded under one session id, and how the session ended.

    Attributes:
        session_id: the id the client sent (header or API key).
        calls: the calls, in the order they were made.
        reward: the session's reward, once posted.
        step_rewards: per call index, a reward posted for that call (optional).
        breaks: calls after the first that did not extend the call before them.
        error: why the session ended without a reward (the agent raised, hung, posted none).
        task: what the agent was asked to do, when the trainer started it.
        begun: calls the proxy has started for this session (recorded or still generating); the
            next call's number, which keys its sampler seed.
        env_id: the env the proxy hosts for this session (:mod:`~envhub_trl.proxy.hosted`), or None.
        env_state_key: that env's state key now: the state the session's next call answers.
        env_rewards: per call index, the rewards of the env steps that acted on its reply.
        env_invalid: the calls whose reply an env step found invalid (``action_is_valid`` false).
        env_terminated: the env ended the episode.
        env_truncated: the env's turn limit ended it.
        env_success: the env's ``success`` at its last step.
    """

    session_id: str
    calls: list[CallRecord] = dataclasses.field(default_factory=list)
    reward: float | None = None
    step_rewards: dict[int, float] = dataclasses.field(default_factory=dict)
    breaks: int = 0
    error: str | None = None
    task: Any = None
    begun: int = 0
    #: ``reply_key`` -> the reply as sampled, for every choice returned in this session.
    replies: dict[str, str] = dataclasses.field(default_factory=dict)
    env_id: str | None = None
    env_state_key: str | None = None
    env_rewards: dict[int, float] = dataclasses.field(default_factory=dict)
    env_invalid: set[int] = dataclasses.field(default_factory=set)
    env_terminated: bool = False
    env_truncated: bool = False
    env_success: bool = False

    def episode_return(self) -> float | None:
        """The session's return: its reward, its step rewards and the rewards of the env it played
        on the proxy; None while it has no reward (it failed, or has not ended)."""
        if self.reward is None:
            return None
        return self.reward + sum(self.step_rewards.values()) + sum(self.env_rewards.values())

    def won(self) -> bool:
        """Whether the session succeeded: the env's ``success`` where it played one on the proxy,
        else a reward above 0; never when it failed."""
        if self.error is not None:
            return False
        return self.env_success if self.env_id is not None else (self.reward or 0.0) > 0

    def find_parent(self, text: str) -> tuple[CallRecord, int, str] | None:
        """The call and choice whose prompt and sampled text ``text`` starts with (the longest such
        prefix, the latest call on a tie), and that prefix; None when ``text`` extends no reply."""
        best: tuple[CallRecord, int, str] | None = None
        for call in self.calls:
            for k, choice in enumerate(call.choices):
                prefix = call.prompt_text + choice.sampled_text
                if len(text) > len(prefix) and text.startswith(prefix) and (best is None or len(prefix) >= len(best[2])):
                    best = (call, k, prefix)
        return best

    def extended_chain(self) -> bool:
        """Whether every call has one choice and every call after the first extends the one before."""
        return all(len(c.choices) == 1 for c in self.calls) and all(
            call.parent == (call.index - 1, 0) for call in self.calls[1:]
        )

    def add(self, call: CallRecord) -> None:
        """Record ``call`` (its index must be the next one) and remember its replies."""
        if call.index != len(self.calls):
            raise ValueError(f"call {call.index} recorded as call {len(self.calls)} of session {self.session_id!r}")
        if call.index > 0 and call.parent != (call.index - 1, 0):
            self.breaks += 1
        self.calls.append(call)
        for choice in call.choices:
            self.replies[reply_key(choice.content, choice.tool_calls)] = choice.reply


class SessionStore:
    """Every session the proxy has recorded, by id; safe to use from several threads."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._closed: set[str] = set()
        self._expected: set[str] = set()  # sessions started whose first call has not come (expect)
        self._lock = threading.Lock()
        self._on_end: list[Callable[[str], None]] = []

    def on_end(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(session_id)`` whenever a session ends (:meth:`has_ended` turns true)."""
        self._on_end.append(listener)

    def _ended(self, session_id: str) -> None:
        for listener in self._on_end:
            listener(session_id)

    def close(self, session_id: str) -> None:
        """Refuse any later call of ``session_id`` (its agent ended, or ran past its deadline)."""
        with self._lock:
            if session_id in self._closed:
                return
            self._closed.add(session_id)
        self._ended(session_id)

    def expect(self, session_ids: Iterable[str]) -> None:
        """Say that the agents of ``session_ids`` have started: the proxy's worker waits for their
        first calls as it waits for the callers a batch answered (:meth:`ChatProxy._gather`), so
        agents started together share their first batch though their calls come in spread out."""
        with self._lock:
            self._expected.update(s for s in session_ids if s not in self._sessions and s not in self._closed)

    def arrived(self, session_id: str | None) -> None:
        """``session_id``'s call has reached the generator: its first call is no longer due."""
        with self._lock:
            self._expected.discard(session_id)

    def first_calls_due(self) -> list[str]:
        """The sessions :meth:`expect` named that have made no call and have not ended."""
        with self._lock:
            self._expected = {s for s in self._expected if s not in self._sessions and s not in self._closed}
            return list(self._expected)

    def is_closed(self, session_id: str) -> bool:
        """Whether ``session_id`` was closed."""
        with self._lock:
            return session_id in self._closed

    def has_ended(self, session_id: str) -> bool:
        """Whether ``session_id`` is over: closed, or its reward posted. The proxy's worker does not
        wait for an ended session's next call before it starts a batch."""
        with self._lock:
            if session_id in self._closed:
                return True
            session = self._sessions.get(session_id)
            return session is not None and session.reward is not None

    def get(self, session_id: str) -> Session:
        """The session ``session_id``, started empty if new."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                session = self._sessions[session_id] = Session(session_id)
            return session

    def lock(self) -> threading.Lock:
        """The store's lock: hold it while reading a session's calls and recording the next one."""
        return self._lock

    def ids(self) -> list[str]:
        """The ids of the sessions recorded, oldest first."""
        with self._lock:
            return list(self._sessions)

    def find(self, session_id: str) -> Session | None:
        """The session ``session_id``, or None."""
        with self._lock:
            return self._sessions.get(session_id)

    def pop(self, session_id: str) -> Session | None:
        """Remove and return the session ``session_id`` (None if it made no call and has no reward)."""
        with self._lock:
            return self._sessions.pop(session_id, None)

    def set_reward(self, session_id: str, reward: float, step_rewards: dict[int, float] | None = None) -> Session:
        """Post ``session_id``'s reward (and optional rewards of its calls, by call index)."""
        session = self.get(session_id)
        with self._lock:
            session.reward = float(reward)
            session.step_rewards.update({int(k): float(v) for k, v in (step_rewards or {}).items()})
        self._ended(session_id)
        return session

    def stats(self) -> dict[str, int]:
        """Counts over the sessions held: ``sessions``, ``calls``, ``folded_calls`` (calls that
        extend the call before them) and ``breaks`` (later calls that do not)."""
        with self._lock:
            sessions = list(self._sessions.values())
        calls = sum(len(s.calls) for s in sessions)
        breaks = sum(s.breaks for s in sessions)
        return {"sessions": len(sessions), "calls": calls, "folded_calls": calls - breaks - sum(bool(s.calls) for s in sessions), "breaks": breaks}


def state_digest(messages: Sequence[dict[str, Any]]) -> str:
    """A turn's state key: a digest of what the messages say, not of the ids that name them. A tool
    result carries the ``tool_call_id`` of the call it answers, which is new on every call; with
    it in the digest two sessions that reach the same board would never share a key, and GiGPO's
    step-level groups would all be single turns past the first."""

    def said(message: dict[str, Any]) -> dict[str, Any]:
        kept = {k: v for k, v in message.items() if k not in ("tool_call_id", "id", "tool_calls")}
        if message.get("tool_calls"):
            kept["tool_calls"] = [{k: v for k, v in call.items() if k != "id"} for call in message["tool_calls"]]
        return kept

    text = json.dumps([said(m) for m in messages], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def _turn(index: int, call: CallRecord, choice: Choice, input_ids: Sequence[int], reward: float, env_reward: float, valid: bool,
          state_key: str, next_key: str) -> Turn:
    shown = "\n".join(str(m.get("content", "")) for m in call.new_messages)
    action = json.dumps([[c["function"]["name"], c["function"]["arguments"]] for c in choice.tool_calls]) if choice.tool_calls else None
    return Turn(
        index=index,
        user=shown,
        observation=shown,
        reply=choice.reply,
        action=action,
        reward=reward,
        env_reward=env_reward,
        action_is_valid=valid,
        format_valid=True,
        state_key=state_key,
        next_state_key=next_key,
        input_ids=list(input_ids),
        completion_ids=list(choice.token_ids),
        logprobs=list(choice.logprobs),
        finish_reason="length" if choice.finish_reason == "length" else "stop",
    )


def session_trajectory(session: Session, *, group_id: int = 0, member: int = 0, index: int = 0, seed: int = 0, env_id: str = "agent") -> Trajectory:
    """The session as envhub's episode record: one trajectory when its calls each extend the one
    before (layout ``trajectory``), else one step sample per choice (layout ``step``).

    The posted reward goes on the last turn, and any step rewards on their calls' turns. A turn's
    ``state_key`` is a digest of the messages it answered, less their ids (:func:`state_digest`:
    GiGPO groups turns that answered the same tool result or user message).

    A session that played an env the proxy hosts (:mod:`~envhub_trl.proxy.hosted`) takes what
    that env said: each step's reward on the turn whose reply it acted on (the posted reward, if
    any, added on the last), the env's state key as each turn's ``state_key``, its
    ``action_is_valid``, and the episode's ``success``, ``terminated`` and ``truncated``.

    Raises:
        ValueError: if the session has no call.
    """
    if not session.calls:
        raise ValueError(f"session {session.session_id!r} made no call")
    chain = session.extended_chain()
    hosted = session.env_id is not None
    pairs = [(call, k, choice) for call in session.calls for k, choice in enumerate(call.choices)]
    last = len(pairs) - 1
    # once a call, not once a turn and again as the next turn's
    keys = {call.index: call.state_key if call.state_key is not None else state_digest(call.new_messages) for call in session.calls}
    end_key = (session.env_state_key or "end") if hosted else "end"
    turns = []
    for t, (call, _, choice) in enumerate(pairs):
        env_reward = session.env_rewards.get(call.index, 0.0)
        reward = env_reward + session.step_rewards.get(call.index, 0.0) + ((session.reward or 0.0) if t == last else 0.0)
        next_key = keys[pairs[t + 1][0].index] if t < last else end_key
        turns.append(_turn(t, call, choice, call.env_ids if chain else call.prompt_ids, reward, env_reward if hosted else reward,
                           call.index not in session.env_invalid, keys[call.index], next_key))
    first = session.calls[0]
    failed = session.error is not None
    terminated = session.env_terminated if hosted else True
    return Trajectory(
        env_id=env_id,
        group_id=group_id,
        member=member,
        seed=seed,
        index=index,
        layout="trajectory" if chain else "step",
        system=first.system,
        turns=turns,
        terminated=terminated and not failed,
        truncated=not terminated and not failed,
        success=session.won(),
        error=session.error,
        end_reason="error" if failed else "terminated" if terminated else "truncated",
        tools=list(first.tools) if first.tools else None,
    )
