"""A plugin whose register_envs hook raises."""

from envhub import hookimpl


@hookimpl
def register_envs(register):
    raise ValueError("hook exploded on purpose")
