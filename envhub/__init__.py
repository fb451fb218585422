"""envhub: multi-turn text environments for training LLM agents with reinforcement learning.

Importing envhub imports no plugin. The first lookup of an id (``make``, ``spec``) loads the plugin
of its namespace; listing the registry (``envhub list``) loads them all. A plugin's
``register_envs`` hook records ids and ``module:Class`` strings; an environment's own code is
imported only when it is made. A plugin's ids also work with ``gymnasium.make`` once it has loaded,
and importing a plugin's package loads it (``import envhub_frozenlake``, or Gymnasium's own
``gymnasium.make("envhub_frozenlake:frozenlake/FrozenLake-v0")``).
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
    "load_plugins",
    "make",
    "register",
    "registry",
    "spec",
]

# Binds the registry to the plugin host; loads nothing until an id or the list is asked for.
from envhub.plugins import load_plugins  # noqa: E402
