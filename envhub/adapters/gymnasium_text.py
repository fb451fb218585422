"""Any Gymnasium env with a discrete action space as an envhub text environment.

The adapter steps the real Gymnasium env, so transitions are exactly Gymnasium's. Text comes from
the env's own ``ansi`` rendering (colour codes stripped) or from a function you pass; action names
come from the env's action-meaning table (``get_action_meanings()``, as Atari has) or from you.
Gymnasium's own time limit is dropped: envhub's ``max_turns`` truncates instead. With
``render_mode="rgb_array"`` pictures come from the env's own ``rgb_array`` rendering (text then
needs ``observation_to_text``, since a Gymnasium env renders in one mode only).

Pluggable functions are given as callables or as ``"package.module:name"`` strings (so that
registrations stay JSON-ready):

- ``observation_to_text(env, observation, terminated) -> str``: the text the model reads.
- ``success(env, observation, reward, terminated) -> bool``: whether the task is accomplished;
  by default, the episode terminated on a positive reward.
- ``expert(env) -> policy``: called once, when the adapter is made, with the Gymnasium env;
  ``policy(observation, turns_left)`` returns the oracle's action index.
  :class:`envhub.adapters.planning.TablePlanner` is one for envs with a transition table.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

from envhub.adapters.references import load_reference, resolve
from envhub.core import DiscreteTextEnv, normalize_action, stable_key
from envhub.error import AdapterError

ObservationToText = Callable[[gymnasium.Env, Any, bool], str]
SuccessPredicate = Callable[[gymnasium.Env, Any, float, bool], bool]
ExpertFactory = Callable[[gymnasium.Env], Callable[[Any, "int | None"], int]]

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def canonical_key(value: Any) -> str:
    """Return a deterministic text key of a Gymnasium observation (never Python's ``hash()``).

    Numbers, strings and nested tuples, lists and dicts become compact JSON; arrays become their
    dtype, shape and a SHA-256 of their bytes.
    """
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"))


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        digest = stable_key(np.ascontiguousarray(value).tobytes(), 32)
        return {"array": str(value.dtype), "shape": list(value.shape), "sha256": digest}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


def positive_terminal_reward(env: gymnasium.Env, observation: Any, reward: float, terminated: bool) -> bool:
    """The default success predicate: the episode terminated on a positive reward."""
    return terminated and reward > 0


class GymnasiumTextEnv(DiscreteTextEnv):
    """A Gymnasium env with a ``Discrete`` action space, played through text.

    Give exactly one of ``gym_id`` and ``entry_point``.

    Args:
        gym_id: a Gymnasium id (anything ``gymnasium.make`` accepts, e.g. ``"CliffWalking-v1"``).
        entry_point: ``"package.module:Class"`` (or a callable) building the Gymnasium env
            directly, for envs that are not (or no longer) in Gymnasium's registry.
        gym_kwargs: keyword arguments for the Gymnasium env.
        action_names: one name per action index; default: the env's ``get_action_meanings()``.
        observation_to_text: how observations become text; default: the env's ``ansi`` rendering.
        success: the success predicate; default :func:`positive_terminal_reward`.
        expert: an expert factory (see the module docstring), or None for no expert.
        instructions: the task's rules for the model; default: a generic description.
        render_mode: ``"ansi"``, ``"rgb_array"`` (the env's own pictures) or None.

    Raises:
        AdapterError: when the env has no discrete actions, no text rendering and no
            ``observation_to_text``, or no action names; the message says what to pass.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(
        self,
        gym_id: str | None = None,
        *,
        entry_point: str | Callable[..., gymnasium.Env] | None = None,
        gym_kwargs: dict[str, Any] | None = None,
        action_names: Sequence[str] | None = None,
        observation_to_text: str | ObservationToText | None = None,
        success: str | SuccessPredicate | None = None,
        expert: str | ExpertFactory | None = None,
        instructions: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if (gym_id is None) == (entry_point is None):
            raise AdapterError("give exactly one of gym_id (a Gymnasium id) and entry_point ('package.module:Class')")
        self.source = gym_id if gym_id is not None else (entry_point if isinstance(entry_point, str) else repr(entry_point))
        kwargs = dict(gym_kwargs or {})
        creator = _creator(gym_id, entry_point)
        to_text = resolve(observation_to_text, "observation_to_text")
        modes = list(getattr(creator, "metadata", {}).get("render_modes", []))
        if render_mode == "rgb_array":
            if "rgb_array" not in modes or to_text is None:
                raise AdapterError(
                    f"render_mode='rgb_array' needs {self.source} to render rgb_array (its render modes are {modes}) "
                    "and an observation_to_text function for the text"
                )
            kwargs["render_mode"] = "rgb_array"
            # Gymnasium's toy-text games draw with pygame; off-screen, SDL needs no display (and
            # prints no "XDG_RUNTIME_DIR is invalid" line on a machine without a desktop session).
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
            os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        elif to_text is None:
            if "ansi" not in modes:
                raise AdapterError(
                    f"{self.source} has no text rendering (its render modes are {modes}); pass "
                    "observation_to_text='package.module:function' (or a callable) taking "
                    "(env, observation, terminated) and returning the text the model reads"
                )
            kwargs["render_mode"] = "ansi"
            to_text = _ansi_text
        self._to_text: ObservationToText = to_text
        self.inner = _build(gym_id, creator, kwargs)
        if not isinstance(self.inner.action_space, spaces.Discrete):
            raise AdapterError(
                f"{self.source} has action space {self.inner.action_space}; the Gymnasium adapter wraps envs "
                "with a Discrete action space only"
            )
        self.action_names = _action_names(self.source, self.inner, action_names)
        self._start = int(self.inner.action_space.start)
        self._success_fn: SuccessPredicate = resolve(success, "success") or positive_terminal_reward
        factory: ExpertFactory | None = resolve(expert, "expert")
        self._expert: Callable[[Any, int | None], int] | None = None if factory is None else factory(self.inner)
        self.instructions = instructions or (
            f"You play the Gymnasium environment {self.source}. Each turn, choose one action from: "
            f"{', '.join(self.action_names)}. Maximise the total reward."
        )
        self._obs: Any = None
        self._terminated = False
        self._success = False
        self._text = ""

    # ------------------------------------------------------------------ TextEnv hooks

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        seed = int(self.np_random.integers(2**31 - 1))
        self._obs, _ = self.inner.reset(seed=seed, options=options or None)
        self._terminated = False
        self._success = False
        self._text = self._to_text(self.inner, self._obs, False)
        return self._text, {}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        index = self._start + self.action_index(action)
        self._obs, reward, terminated, _, _ = self.inner.step(index)
        self._terminated = bool(terminated)
        self._success = bool(self._success_fn(self.inner, self._obs, float(reward), self._terminated))
        self._text = self._to_text(self.inner, self._obs, self._terminated)
        observation = f"{self._text}\nReward: {float(reward):g}"
        if self._terminated:
            observation += "\nThe episode is over."
        return observation, float(reward), self._terminated, {}

    def state_key(self) -> str:
        """The observation as canonical JSON, marked when the episode has terminated."""
        return canonical_key(self._obs) + ("|terminated" if self._terminated else "")

    def is_success(self) -> bool:
        """Whether the success predicate held on the last step."""
        return self._success

    def render_text(self) -> str:
        """The current observation as text."""
        return self._text

    def expert_action(self) -> str | None:
        """The expert factory's action, or None without an expert or after the episode ended."""
        if self._expert is None or self._terminated:
            return None
        turns_left = None if self.max_turns is None else self.max_turns - self.turn
        return self.action_names[int(self._expert(self._obs, turns_left)) - self._start]

    def render_rgb(self) -> np.ndarray:
        """The Gymnasium env's own ``rgb_array`` picture."""
        return np.asarray(self.inner.render(), dtype=np.uint8)

    def close(self) -> None:
        """Close the Gymnasium env."""
        self.inner.close()

    @property
    def observation(self) -> Any:
        """The Gymnasium env's latest observation."""
        return self._obs


def _ansi_text(env: gymnasium.Env, observation: Any, terminated: bool) -> str:
    """The env's own ``ansi`` rendering without colour escape codes."""
    return _ANSI_ESCAPE.sub("", str(env.render())).rstrip()


def _creator(gym_id: str | None, entry_point: str | Callable[..., gymnasium.Env] | None) -> Any:
    if entry_point is not None:
        return resolve(entry_point, "entry_point")
    try:
        gym_spec = gymnasium.spec(gym_id)
    except gymnasium.error.Error as exc:
        raise AdapterError(f"Gymnasium cannot find {gym_id!r}: {exc}") from exc
    if isinstance(gym_spec.entry_point, str):
        return load_reference(gym_spec.entry_point, f"entry point of {gym_id}")
    return gym_spec.entry_point


def _build(gym_id: str | None, creator: Any, kwargs: dict[str, Any]) -> gymnasium.Env:
    if gym_id is None:
        return creator(**kwargs)
    env = gymnasium.make(gym_id, disable_env_checker=True, **kwargs)
    while isinstance(env, TimeLimit):
        env = env.env
    return env


def _action_names(source: str, env: gymnasium.Env, given: Sequence[str] | None) -> tuple[str, ...]:
    n = int(env.action_space.n)
    if given is None:
        meanings = getattr(env.unwrapped, "get_action_meanings", None)
        if meanings is None:
            raise AdapterError(
                f"{source} has no action-meaning table; pass action_names=[...] with {n} names, one per action index"
            )
        given = [str(m) for m in meanings()]
    names = tuple(str(name) for name in given)
    if len(names) != n:
        raise AdapterError(f"{source} has {n} actions but action_names has {len(names)}: {list(names)}")
    keys = [normalize_action(name) for name in names]
    if "" in keys or len(set(keys)) != len(keys):
        raise AdapterError(f"action_names must be non-empty and distinct ignoring case and spaces, got {list(names)}")
    return names
