"""envhub environments served over OpenEnv's HTTP/WebSocket protocol (``envhub serve ID``).

The server is OpenEnv's own (``openenv.core``'s FastAPI app) around :class:`EnvhubEnvironment`, so
every OpenEnv client works against it unchanged, ``GenericEnvClient`` included::

    from openenv.core import GenericEnvClient

    with GenericEnvClient(base_url="http://localhost:8000").sync() as client:
        result = client.reset(seed=0)
        result = client.step({"text": "<answer>Up</answer>"})
        result.observation["text"], result.reward, result.done

The action is ``{"text": reply}``: a model's reply, read with an envhub reply format
(``<answer>...</answer>`` by default; ``action_format=None`` takes the text as the action). The
observation carries ``text`` (the env's observation), ``valid_actions`` and ``info`` (envhub's info,
with ``terminated``, ``truncated`` and, after a reset, the task's ``instructions``); reward and done
are OpenEnv's own fields. Each WebSocket session gets its own environment.
"""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any

from envhub.actions import apply_reply, get_format
from envhub.core import TextEnv
from envhub.error import MissingDependency
from envhub.registration import make, spec

try:
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
    from pydantic import Field
except ImportError as exc:  # pragma: no cover - exercised only where openenv-core is absent
    raise MissingDependency(f"envhub.integrations.openenv needs OpenEnv: pip install 'envhub[openenv]' ({exc})") from exc

__all__ = ["EnvhubEnvironment", "EnvhubState", "TextAction", "TextObservation", "create_app"]


class TextAction(Action):
    """One reply of the agent."""

    text: str = Field(description="The agent's reply, e.g. '<answer>Up</answer>' (or the bare action where the server takes text as it is)")


class TextObservation(Observation):
    """What the agent sees after a reset or a step."""

    text: str = Field(default="", description="The environment's observation")
    valid_actions: list[str] | None = Field(default=None, description="The actions legal now, where the set is finite")
    info: dict[str, Any] = Field(default_factory=dict, description="envhub's info: action_is_valid, success, state_key, ...")


class EnvhubState(State):
    """The session's episode: OpenEnv's ``episode_id`` and ``step_count``, and envhub's own."""

    env_id: str = ""
    seed: int | None = None
    episode_return: float = 0.0
    success: bool = False
    done: bool = True


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


class EnvhubEnvironment(Environment[TextAction, TextObservation, EnvhubState]):
    """One envhub environment as an OpenEnv ``Environment``; the server makes one per session.

    Args:
        env_id: the envhub id.
        max_turns: overrides the registered turn limit.
        action_format: the reply format (``"answer"``, ``"think-answer"``), or None to take the
            action text as it is.
        env_kwargs: keyword arguments of the environment.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session owns its own TextEnv; nothing is shared

    def __init__(
        self,
        env_id: str,
        max_turns: int | None = None,
        action_format: str | None = "answer",
        env_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.env: TextEnv = make(env_id, max_turns=max_turns, **(env_kwargs or {}))
        self.fmt = get_format(action_format) if action_format is not None else None
        self._state = EnvhubState(env_id=env_id)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        """Start an episode (``seed`` as Gymnasium's); the info carries the task's instructions."""
        observation, info = self.env.reset(seed=seed)
        episode_id = episode_id or uuid.uuid4().hex
        self._state = EnvhubState(env_id=self._state.env_id, episode_id=episode_id, seed=seed, success=bool(info["success"]), done=False)
        parts = [self.env.instructions.strip(), self.fmt.instructions() if self.fmt is not None else ""]
        info = {**info, "instructions": "\n\n".join(part for part in parts if part)}
        return self._observation(observation, 0.0, False, False, info)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        """Apply one reply; ``done`` is Gymnasium's ``terminated or truncated``."""
        if self.fmt is None:
            observation, reward, terminated, truncated, info = self.env.step(action.text)
        else:
            outcome = apply_reply(self.env, action.text, self.fmt)
            observation, reward, terminated, truncated, info = (
                outcome.observation, outcome.reward, outcome.terminated, outcome.truncated, outcome.info
            )
        state = self._state
        state.step_count = self.env.turn
        state.episode_return += float(reward)
        state.success = bool(info["success"])
        state.done = bool(terminated or truncated)
        return self._observation(observation, float(reward), terminated, truncated, info)

    @property
    def state(self) -> EnvhubState:
        """The session's episode."""
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        """The env's id, description and plugin version."""
        env_spec = spec(self._state.env_id)
        return EnvironmentMetadata(name=env_spec.id, description=env_spec.description or env_spec.id, version=env_spec.version)

    def close(self) -> None:
        """Close the envhub environment."""
        self.env.close()

    def _observation(self, text: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> TextObservation:
        done = bool(terminated or truncated)
        return TextObservation(
            text=text,
            valid_actions=None if done else self.env.valid_actions(),
            info=_jsonable({**info, "terminated": bool(terminated), "truncated": bool(truncated)}),
            reward=reward,
            done=done,
        )


def create_app(
    env_id: str,
    *,
    max_turns: int | None = None,
    action_format: str | None = "answer",
    env_kwargs: dict[str, Any] | None = None,
    max_sessions: int = 64,
) -> Any:
    """OpenEnv's FastAPI app serving ``env_id``, one environment per WebSocket session.

    Raises:
        UnknownEnv: when no environment is registered under ``env_id``.
        TypeError, ValueError: when the environment refuses ``env_kwargs``.
    """
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
    settings = {"env_id": env_id, "max_turns": max_turns, "action_format": action_format, "env_kwargs": dict(env_kwargs or {})}
    EnvhubEnvironment(**settings).close()  # refuse an unknown id or bad keywords before serving
    # A partial of the class: OpenEnv reads SUPPORTS_CONCURRENT_SESSIONS from it.
    return create_fastapi_app(functools.partial(EnvhubEnvironment, **settings), TextAction, TextObservation, max_concurrent_envs=max_sessions)
