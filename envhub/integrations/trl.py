"""envhub environments as TRL's ``environment_factory``.

TRL's ``GRPOTrainer(environment_factory=F)`` calls ``F()`` once per concurrent rollout, keeps the
instances in a pool, and for every rollout calls ``instance.reset(**row)`` (the dataset row): the
text it returns is appended to the prompt's last user message. The instance's public methods
become tools the model calls (their signatures and Google-style docstrings are the tool schemas),
and ``get_reward()`` scores the finished rollout. :func:`environment_factory` builds such a class
for any envhub id: one tool, ``act(action)``, steps the environment with an action's text, and the
reward is the episode's return.

This module imports no TRL and no torch: the contract is plain Python.
"""

from __future__ import annotations

import inspect
import itertools
import os
import re
import typing
from collections.abc import Callable, Iterator
from typing import Any

from envhub.actions import FORMATS
from envhub.chat import ChatRenderer
from envhub.core import TextEnv
from envhub.error import EnvhubError, ResetNeeded
from envhub.registration import make, spec

__all__ = ["EnvhubEnvironment", "environment_factory", "success"]

#: Told to the model after the task's rules: how it acts (through ``act``, or a tool env's own tools).
ACT_INSTRUCTIONS = "Act by calling the `act` tool with one action; its result is what happens next. Keep acting until the episode is over."
TOOL_INSTRUCTIONS = "Act by calling the tools; each result is what happens next. Keep going until the episode is over."


class EnvhubEnvironment:
    """One envhub environment, played by TRL's ``GRPOTrainer`` through a tool.

    Do not instantiate this class: :func:`environment_factory` returns a subclass bound to one
    environment id, with the model's tools as its public methods (``act``, or a tool env's own
    tools), and TRL instantiates that. Everything else here is ``reset``, ``get_reward``, private
    or a property, none of which TRL exposes as a tool.
    """

    _env_id: str = ""
    _max_turns: int | None = None
    _env_kwargs: dict[str, Any] = {}
    _show_legal_actions: bool = True
    _instructions: str | None = None
    _tool_names: tuple[str, ...] = ()
    _seeds: Iterator[int] = iter(())

    def __init__(self) -> None:
        if not self._env_id:
            raise EnvhubError("EnvhubEnvironment is bound to no env; build the class with envhub.integrations.trl.environment_factory(ID)")
        self._env: TextEnv = make(self._env_id, max_turns=self._max_turns, **self._env_kwargs)
        self._renderer = ChatRenderer(FORMATS["answer"], show_legal_actions=self._show_legal_actions)
        self._return = 0.0
        self._success = False
        self._over = True
        self._seed: int | None = None

    @property
    def env(self) -> TextEnv:
        """The envhub environment being played."""
        return self._env

    @property
    def success(self) -> bool:
        """Whether the current (or last) episode reached its goal, as the env's ``info["success"]`` says."""
        return self._success

    @property
    def episode_return(self) -> float:
        """The sum of the rewards of the current (or last) episode so far."""
        return self._return

    @property
    def episode_over(self) -> bool:
        """Whether the episode ended (terminated or truncated) or has not started."""
        return self._over

    @property
    def seed(self) -> int | None:
        """The seed of the current episode."""
        return self._seed

    def reset(self, seed: int | None = None, **row: Any) -> str:
        """Start an episode; return the task's rules and the first observation, for the prompt.

        Args:
            seed: the episode's seed, from a ``seed`` column of the training dataset (a GRPO group
                repeats its row, so its rollouts then share one initial state). Without one, each
                episode takes the next seed of the factory's stream.
            **row: the rest of the dataset row (``prompt`` and any other column), unused.
        """
        self._seed = next(self._seeds) if seed is None else int(seed)
        observation, info = self._env.reset(seed=self._seed)
        self._return, self._success, self._over = 0.0, bool(info["success"]), False
        own = self._instructions if self._instructions is not None else self._env.instructions
        how = ACT_INSTRUCTIONS if "act" in self._tool_names else TOOL_INSTRUCTIONS
        rules = "\n\n".join(part for part in (own.strip(), how) if part)
        return f"{rules}\n\n{self._user(observation)}"

    def _take(self, action: str) -> str:
        """Step the env with ``action``; return the next user message, or how the episode ended."""
        if self._over:
            raise ResetNeeded("the episode is over; no more actions are taken")
        observation, reward, terminated, truncated, info = self._env.step(action)
        self._return += float(reward)
        self._success = bool(info["success"])
        if not (terminated or truncated):
            return self._user(observation)
        self._over = True
        outcome = "success" if self._success else ("no success, the turn limit is reached" if truncated else "no success")
        return f"{observation}\nThe episode is over: {outcome}; return {self._return:g}."

    def get_reward(self) -> float:
        """The episode's return: the sum of the environment's rewards over its steps."""
        return self._return

    def _user(self, observation: str) -> str:
        return self._renderer.user(observation, self._env.turn, self._env.max_turns, self._env.valid_actions())


def act(self, action: str) -> str:  # self unannotated: TRL reads the type hints as the tool schema
    """Take one action in the environment and return what happens next.

    Args:
        action: the action to take, e.g. one of the legal actions listed in the last observation.

    Returns:
        The next observation, or how the episode ended.
    """
    return self._take(action)


def _tool_method(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """A method of the factory's class standing for the tool env's tool ``name``: the same
    signature, types and docstring (TRL builds the tool's schema from them); a call becomes the
    env's action for that call."""

    def call(self, **arguments: Any) -> str:
        return self._take(self._env.call_action(name, **arguments))

    call.__name__ = call.__qualname__ = name
    call.__doc__ = original.__doc__
    call.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    call.__annotations__ = typing.get_type_hints(original)
    return call


def _tools(env: TextEnv) -> dict[str, Callable[..., Any]]:
    """The model's tools for ``env``: ``act`` for an env played by actions; for a tool env (one that
    declares ``_tool_names`` and ``call_action``, as ``envhub.core.ToolEnv`` does), its own tools."""
    names = getattr(type(env), "_tool_names", ())
    if names and callable(getattr(env, "call_action", None)):
        return {name: _tool_method(name, getattr(type(env), name)) for name in names}
    return {"act": act}


def _seed_stream(seed: int) -> Iterator[int]:
    """Seeds ``seed + rank, seed + rank + world, ...``: each training process plays its own seeds."""
    rank, world = int(os.environ.get("RANK", "0")), max(1, int(os.environ.get("WORLD_SIZE", "1")))
    return itertools.count(seed + rank, world)


def _class_name(env_id: str) -> str:
    """``sokoban/Sokoban-v0`` -> ``Sokoban_v0``: TRL logs the env's reward under its class name."""
    return re.sub(r"\W", "_", env_id.partition("/")[2]) or "EnvhubEnvironment"


def environment_factory(
    env_id: str,
    *,
    seed: int = 0,
    max_turns: int | None = None,
    instructions: str | None = None,
    show_legal_actions: bool = True,
    **env_kwargs: Any,
) -> type[EnvhubEnvironment]:
    """Return a class that TRL's ``GRPOTrainer(environment_factory=...)`` accepts, for ``env_id``.

    Each instance is one environment; ``act(action)`` is the model's tool, ``get_reward()`` the
    episode's return, and :attr:`EnvhubEnvironment.success` whether it reached its goal (pass
    :func:`success` as a reward function with weight 0 to log it).

    Args:
        env_id: an envhub id, e.g. ``"sokoban/Sokoban-v0"``.
        seed: the first seed of the stream episodes take when the dataset has no ``seed`` column.
        max_turns: overrides the registered turn limit.
        instructions: replaces the environment's own rules in the first prompt (a short prompt for
            a small model), as ``PromptSettings.instructions`` does in envhub's trainer.
        show_legal_actions: list the legal actions after every observation.
        **env_kwargs: keyword arguments of the environment (its registered ones overridden).

    Raises:
        UnknownEnv: when no environment is registered under ``env_id``.
        TypeError, ValueError: when the environment refuses ``env_kwargs``.
    """
    spec(env_id)
    probe = make(env_id, max_turns=max_turns, **env_kwargs)  # refuse bad keywords now, not inside TRL
    tools = _tools(probe)
    probe.close()
    return type(
        _class_name(env_id),
        (EnvhubEnvironment,),
        {
            "__doc__": f"The envhub environment {env_id}, for TRL's environment_factory.",
            "__module__": __name__,
            "_env_id": env_id,
            "_max_turns": max_turns,
            "_env_kwargs": dict(env_kwargs),
            "_show_legal_actions": show_legal_actions,
            "_instructions": instructions,
            "_seeds": _seed_stream(seed),
            "_tool_names": tuple(tools),
            **tools,
        },
    )


def success(environments: list[Any], **kwargs: Any) -> list[float | None]:
    """A TRL reward function: 1.0 for each rollout whose episode succeeded, else 0.0.

    Give it weight 0 (``GRPOConfig(reward_weights=[0.0])``) to log the success rate as
    ``rewards/success/mean`` without changing the reward; rollouts of other environments get None.
    """
    return [float(e.success) if isinstance(e, EnvhubEnvironment) else None for e in environments]
