"""Registers one id, then fails: its id must not stay registered."""

from envhub import hookimpl


@hookimpl
def register_envs(register):
    register("half/Echo-v0", "fake_good_env:EchoEnv", max_turns=2)
    raise RuntimeError("failed after one registration")
