"""FrozenLake for envhub: Gymnasium's dynamics, a text grid, and a value-iteration expert."""

from envhub_frozenlake.env import FrozenLakeTextEnv
from envhub_frozenlake.planning import optimal_success_probability, success_values

__all__ = ["FrozenLakeTextEnv", "optimal_success_probability", "success_values"]
