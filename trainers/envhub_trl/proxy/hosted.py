"""Envs the proxy hosts for its sessions: the env, not the agent, scores the session.

An agent may play an envhub env *through the proxy* instead of making its own: it resets and steps
the env at ``/v1/envhub/sessions/{id}/env/reset`` and ``.../env/step`` (:class:`~envhub_trl.proxy.client.ProxyEnv`
is the client, a Gymnasium-shaped env). The proxy then knows what the agent's own copy would keep to
itself, and writes it into the session:

- each step's reward, on the call whose reply the step acted on (the session's latest call), so a
  session's rewards need no posting and its step rewards are the env's;
- the env's ``state_key`` at each call, the anchor GiGPO groups turns by: the state the env was in,
  not a digest of the messages (which differ wherever two sessions word the same state apart);
- ``action_is_valid`` per call, and the episode's ``success``, ``terminated`` and ``truncated``.

A session holds one env at a time; a second reset of the same id and keyword arguments reuses it,
another makes a new one. The env closes when the session ends (its agent returned, or the
session was deleted) or when the proxy stops. Every refusal is OpenAI's error shape with a 4xx status:
an unknown env (404), a step before a reset or after the episode ended (409), an action that is
not a string, arguments an env does not take (400), more envs than ``max_envs`` at once (429).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Collection
from typing import Any

import envhub
from envhub.core import jsonable
from envhub.error import EnvhubError, UnknownEnv
from envhub_trl.proxy.requests import ProxyRequestError
from envhub_trl.proxy.sessions import Session, SessionStore


class _Hosted:
    """One session's env, and the lock that keeps its steps in order."""

    def __init__(self, env: Any, env_id: str, kwargs: dict[str, Any]):
        self.env, self.env_id, self.kwargs = env, env_id, kwargs
        self.lock = threading.Lock()
        self.done = True  # no episode until the first reset


class HostedEnvs:
    """The envs the proxy hosts, one per session, scoring the sessions in ``store``.

    Args:
        store: the proxy's session store; its sessions' env fields are written here, and a
            session's env closes when the session ends.
        env_ids: the env ids agents may ask for; None allows every registered one.
        max_envs: the most envs held at once (a session that resets with every other slot taken
            is refused with 429, until a session ends); None for no bound (the trainer's own
            proxy, whose sessions are its batch).
        make: makes an env from an id and keyword arguments (``envhub.make``).
    """

    def __init__(self, store: SessionStore, *, env_ids: Collection[str] | None = None, max_envs: int | None = 1024,
                 make: Callable[..., Any] = envhub.make):
        self.store = store
        self.env_ids = None if env_ids is None else frozenset(env_ids)
        self.max_envs = max_envs
        self._make = make
        self._envs: dict[str, _Hosted] = {}
        self._lock = threading.Lock()
        store.on_end(self.release)

    def __len__(self) -> int:
        with self._lock:
            return len(self._envs)

    def reset(self, session_id: str, body: Any) -> dict[str, Any]:
        """Reset ``session_id``'s env to ``body``'s ``{"env_id", "seed", "kwargs", "options"}``.

        Returns:
            ``{"observation", "info", "instructions", "valid_actions", "tools"}``: the first
            observation, its info, the env's instructions, its legal actions (None where actions
            are free-form) and a tool env's tool schemas (else None).
        """
        if not isinstance(body, dict) or not isinstance(body.get("env_id"), str):
            raise ProxyRequestError("post {'env_id': ID, 'seed': N} to reset a session's env", param="env_id")
        env_id, seed = body["env_id"], body.get("seed")
        kwargs, options = body.get("kwargs") or {}, body.get("options")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            raise ProxyRequestError(f"seed must be a whole number from 0 to 2**63 - 1, not {seed!r}", param="seed")
        if not isinstance(kwargs, dict) or (options is not None and not isinstance(options, dict)):
            raise ProxyRequestError("kwargs and options must be JSON objects", param="kwargs")
        if self.env_ids is not None and env_id not in self.env_ids:
            raise ProxyRequestError(f"this proxy hosts {sorted(self.env_ids)}, not {env_id!r}", status=404, param="env_id", code="env_not_found")
        if self.store.has_ended(session_id):
            raise ProxyRequestError(f"session {session_id!r} has ended", status=409, code="session_ended")
        hosted = self._hosted_for(session_id, env_id, kwargs)
        with hosted.lock:
            observation, info = self._call(session_id, hosted.env.reset, seed=seed, options=options)
            hosted.done = False
            session = self.store.get(session_id)
            with self.store.lock():
                session.env_id, session.env_state_key = env_id, str(info.get("state_key", ""))
                session.env_terminated = session.env_truncated = session.env_success = False
            return self._call(session_id, lambda: {
                "observation": jsonable(observation),
                "info": jsonable(info),
                "instructions": str(getattr(hosted.env, "instructions", "")),
                "valid_actions": _valid_actions(hosted.env),
                "tools": jsonable(hosted.env.tool_schemas()) if hasattr(hosted.env, "tool_schemas") else None,
            })

    def step(self, session_id: str, body: Any) -> dict[str, Any]:
        """Step ``session_id``'s env with ``body``'s ``{"action": TEXT}``; the reward goes on the
        session's latest call.

        Returns:
            ``{"observation", "reward", "terminated", "truncated", "info", "valid_actions"}``.
        """
        action = body.get("action") if isinstance(body, dict) else None
        if not isinstance(action, str):
            raise ProxyRequestError("post {'action': TEXT} to step a session's env", param="action")
        with self._lock:
            hosted = self._envs.get(session_id)
        if hosted is None:
            raise ProxyRequestError(f"session {session_id!r} has no env: reset one first", status=409, code="env_not_reset")
        with hosted.lock:
            if hosted.done:
                raise ProxyRequestError(f"the episode of session {session_id!r} has ended: reset the env to play again",
                                        status=409, code="episode_ended")
            observation, reward, terminated, truncated, info = self._call(session_id, hosted.env.step, action)
            try:
                reward = float(reward)
            except (TypeError, ValueError):
                reward = math.nan
            if not math.isfinite(reward):
                raise self._failed(session_id, f"the env {hosted.env_id} returned a reward that is not a finite number")
            hosted.done = bool(terminated or truncated)
            session = self.store.get(session_id)
            with self.store.lock():
                _record_step(session, reward, info, bool(terminated), bool(truncated))
            return {
                "observation": jsonable(observation),
                "reward": reward,
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "info": jsonable(info),
                "valid_actions": None if hosted.done else self._call(session_id, _valid_actions, hosted.env),
            }

    def release(self, session_id: str) -> None:
        """Close ``session_id``'s env, if it has one (its session ended)."""
        with self._lock:
            hosted = self._envs.pop(session_id, None)
        if hosted is not None:
            with hosted.lock:
                _close(hosted.env)

    def close(self) -> None:
        """Close every env held."""
        with self._lock:
            held = list(self._envs)
        for session_id in held:
            self.release(session_id)

    def _hosted_for(self, session_id: str, env_id: str, kwargs: dict[str, Any]) -> _Hosted:
        with self._lock:
            hosted = self._envs.get(session_id)
            if hosted is not None and (hosted.env_id, hosted.kwargs) == (env_id, kwargs):
                return hosted
            if hosted is None and self.max_envs is not None and len(self._envs) >= self.max_envs:
                raise ProxyRequestError(f"this proxy holds {self.max_envs} envs, the most it hosts at once; end a session first",
                                        status=429, code="too_many_envs")
        try:
            env = self._make(env_id, **kwargs)
        except UnknownEnv as exc:
            raise ProxyRequestError(str(exc).strip("'\""), status=404, param="env_id", code="env_not_found") from None
        except (EnvhubError, TypeError, ValueError) as exc:
            raise ProxyRequestError(f"{env_id} cannot be made with {kwargs}: {exc}", param="kwargs") from None
        with self._lock:
            old = self._envs.get(session_id)
            self._envs[session_id] = made = _Hosted(env, env_id, dict(kwargs))
        if old is not None:
            with old.lock:
                _close(old.env)
        return made

    def _call(self, session_id: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except ProxyRequestError:
            raise
        except Exception as exc:  # the env's own failure: the session's, not the proxy's
            raise self._failed(session_id, f"the env raised {type(exc).__name__}: {exc}") from None

    def _failed(self, session_id: str, reason: str) -> ProxyRequestError:
        session = self.store.get(session_id)
        with self.store.lock():
            session.error = session.error or reason
        return ProxyRequestError(reason, status=422, code="env_error")


def _valid_actions(env: Any) -> list[str] | None:
    actions = env.valid_actions() if hasattr(env, "valid_actions") else None
    return None if actions is None else [str(a) for a in actions]


def _record_step(session: Session, reward: float, info: dict[str, Any], terminated: bool, truncated: bool) -> None:
    """Write one env step into ``session`` (the store's lock held): the reward and validity on its
    latest call, the state its next call answers, and how the episode stands."""
    call = max(len(session.calls) - 1, 0)
    session.env_rewards[call] = session.env_rewards.get(call, 0.0) + reward
    if not info.get("action_is_valid", True):
        session.env_invalid.add(call)
    session.env_state_key = str(info.get("state_key", ""))
    session.env_terminated, session.env_truncated = terminated, truncated
    session.env_success = bool(info.get("success", False))


def _close(env: Any) -> None:
    try:
        env.close()
    except Exception:  # an env that fails to close must not take the proxy with it
        pass
