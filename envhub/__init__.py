"""envhub: multi-turn text environments for training LLM agents with reinforcement learning.

Importing envhub reads the ``envhub`` entry points and runs each plugin's ``register_envs`` hook,
which records ids and ``module:Class`` strings; an environment's own code is imported only when it
is made. After ``import envhub``, every envhub id also works with ``gymnasium.make``.
"""

from __future__ import annotations

import importlib.metadata

from envhub.core import DiscreteTextEnv, TextEnv, TextSpace
from envhub.hookspecs import hookimpl
from envhub.registration import EnvSpec, make, register, registry, spec

try:
    __version__ = importlib.metadata.version("envhub")
except importlib.metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = [
    "DiscreteTextEnv",
    "EnvSpec",
    "TextEnv",
    "TextSpace",
    "__version__",
    "hookimpl",
    "make",
    "register",
    "registry",
    "spec",
]

# Last, so that plugins importing ``envhub.hookimpl`` find it defined.
from envhub.plugins import load_plugins  # noqa: E402

load_plugins()
