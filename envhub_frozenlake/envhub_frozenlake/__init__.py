"""FrozenLake for envhub: Gymnasium's dynamics, a text grid, and a value-iteration expert."""

from envhub_frozenlake.env import FrozenLakeTextEnv
from envhub_frozenlake.planning import optimal_success_probability, success_values

__all__ = ["FrozenLakeTextEnv", "optimal_success_probability", "success_values"]

# Importing the package registers its ids with envhub and Gymnasium (Gymnasium 1.x loads no plugins).
from envhub.plugins import load_on_import as _load_on_import  # noqa: E402

_load_on_import("frozenlake")
