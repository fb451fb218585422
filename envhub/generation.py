"""Who picks the actions: policies that need no model (random, expert, a person at the keyboard).

A policy maps an environment and its latest observation to an action string. Model-backed
generators live in the trainer package; these are the baselines and the oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from envhub.core import TextEnv
from envhub.error import PolicyError


class Policy(Protocol):
    """Anything that chooses an action for ``env`` given its latest ``observation``."""

    def act(self, env: TextEnv, observation: str) -> str:
        """Return the next action as text."""
        ...


class RandomPolicy:
    """Uniform over ``env.valid_actions()``, from its own seeded generator."""

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def act(self, env: TextEnv, observation: str) -> str:
        """Return a uniformly random legal action."""
        legal = env.valid_actions()
        if not legal:
            raise PolicyError(f"{env.spec.id if env.spec else type(env).__name__} has no finite action list; the random policy needs one")
        return legal[int(self.rng.integers(len(legal)))]


class ExpertPolicy:
    """The environment's own oracle (``expert_action()``)."""

    def act(self, env: TextEnv, observation: str) -> str:
        """Return the oracle's action."""
        action = env.expert_action()
        if action is None:
            raise PolicyError(f"{env.spec.id if env.spec else type(env).__name__} has no expert; use --policy random or human")
        return action


class HumanPolicy:
    """Reads each action from a prompt function (``input`` by default)."""

    def __init__(self, prompt: Callable[[str], str] = input):
        self.prompt = prompt

    def act(self, env: TextEnv, observation: str) -> str:
        """Return what the person typed (EOFError ends the episode upstream)."""
        legal = env.valid_actions()
        hint = f" [{' / '.join(legal)}]" if legal else ""
        return self.prompt(f"action{hint}> ")


#: Policies selectable by name in ``envhub run --policy``.
POLICIES: dict[str, Callable[..., Policy]] = {
    "random": RandomPolicy,
    "expert": lambda seed=None: ExpertPolicy(),
    "human": lambda seed=None: HumanPolicy(),
}
