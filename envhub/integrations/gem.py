"""envhub environments in GEM's registry, for GEM users and ROLL's agentic pipeline.

Importing this module registers every envhub id in GEM as ``envhub:ID``::

    import envhub.integrations.gem  # noqa: F401
    import gem

    env = gem.make("envhub:sokoban/Sokoban-v0")
    observation, info = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("<answer>Up</answer>")

A GEM env takes the model's whole reply as its action, as GEM's own games do, and reads the action
out of it with an envhub reply format (``<answer>...</answer>`` by default); a reply that breaks the
format spends a turn and leaves the state unchanged, exactly as in envhub's own training. The
observations are the envhub environment's own, so an episode reads as ``envhub run`` shows it; the
task's rules and the reply format travel in ``info`` under ``env_instruction``, and the reminder
GEM's games append to every observation under ``suffix``.
"""

from __future__ import annotations

import copy
from typing import Any

from envhub.actions import apply_reply, get_format
from envhub.core import TextEnv
from envhub.error import MissingDependency
from envhub.registration import make, registry

try:
    import gem
    from gem.envs.registration import ENV_REGISTRY
except ImportError as exc:  # pragma: no cover - exercised only where gem-llm is absent
    raise MissingDependency(f"envhub.integrations.gem needs GEM: pip install 'envhub[gem]' ({exc})") from exc

__all__ = ["PREFIX", "EnvhubGemEnv", "register_envs"]

#: GEM ids of envhub environments are ``PREFIX + envhub id``.
PREFIX = "envhub:"


class EnvhubGemEnv(gem.Env):
    """An envhub environment behind GEM's ``reset``/``step`` contract.

    Args:
        envhub_id: the envhub id, e.g. ``"sokoban/Sokoban-v0"``.
        seed: the seed of the first ``reset()`` that names none (``gem.make_vec`` passes one per env).
        max_turns: overrides the registered turn limit.
        action_format: the reply format actions are read with (``"answer"``, ``"think-answer"``),
            or None to take the action text as it is.
        **env_kwargs: keyword arguments of the environment.
    """

    def __init__(
        self,
        envhub_id: str,
        seed: int | None = None,
        max_turns: int | None = None,
        action_format: str | None = "answer",
        **env_kwargs: Any,
    ):
        super().__init__()
        self.envhub_id = envhub_id
        self.env: TextEnv = make(envhub_id, max_turns=max_turns, **env_kwargs)
        self.fmt = get_format(action_format) if action_format is not None else None
        self._config = {"seed": seed, "max_turns": max_turns, "action_format": action_format, **env_kwargs}
        self._next_seed = seed

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; return the first observation and ``info`` (envhub's keys, with
        ``env_instruction`` and ``suffix``)."""
        super().reset(seed)  # GEM seeds Python's and NumPy's global generators, as its games expect
        if seed is None:
            seed, self._next_seed = self._next_seed, None
        observation, info = self.env.reset(seed=seed)
        return observation, self._info(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one reply (or, with ``action_format=None``, one action); GEM's five-tuple back."""
        if self.fmt is None:
            observation, reward, terminated, truncated, info = self.env.step(action)
            return observation, float(reward), terminated, truncated, self._info(info)
        outcome = apply_reply(self.env, action, self.fmt)
        return outcome.observation, outcome.reward, outcome.terminated, outcome.truncated, self._info(outcome.info)

    def get_task_instruction(self) -> str:
        """The task's rules and the reply format (a system message)."""
        parts = [self.env.instructions.strip(), self.fmt.instructions() if self.fmt is not None else ""]
        return "\n\n".join(part for part in parts if part)

    def get_task_suffix(self) -> str:
        """What to put after each observation: the legal actions and the reply format."""
        legal = self.env.valid_actions()
        parts = [f"Legal actions: {', '.join(legal)}" if legal else "", self.fmt.instructions() if self.fmt is not None else ""]
        return "\n".join(part for part in parts if part)

    def sample_random_action(self) -> str:
        """A random legal action, written as a reply in the env's format."""
        action = self.env.action_space.sample()
        if self.fmt is None:
            return action
        return f"<{self.fmt.answer_tag}>{action}</{self.fmt.answer_tag}>"

    def spawn(self, same_state: bool = False, **kwargs: Any) -> EnvhubGemEnv:
        """A new env of the same id and settings (``kwargs`` override them); with ``same_state``, a
        copy of this one, mid-episode state included."""
        if same_state:
            twin = copy.deepcopy(self)
            for key, value in kwargs.items():
                setattr(twin, key, value)
            return twin
        return type(self)(self.envhub_id, **{**self._config, **kwargs})

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        return {**info, "env_instruction": self.get_task_instruction(), "suffix": self.get_task_suffix()}


def register_envs() -> list[str]:
    """Register every envhub id not yet in GEM's registry as ``envhub:ID``; return the GEM ids added.

    Runs when this module is imported; call it again after registering more envhub environments.
    """
    added = []
    for env_id in registry:
        gem_id = PREFIX + env_id
        if gem_id not in ENV_REGISTRY:
            gem.register(gem_id, f"{__name__}:EnvhubGemEnv", envhub_id=env_id)
            added.append(gem_id)
    return added


register_envs()
