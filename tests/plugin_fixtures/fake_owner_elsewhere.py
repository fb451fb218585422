"""Owns fakens (distribution envhub-fakens) and also registers in aaa/, a namespace nobody owns by name."""

from envhub import hookimpl


@hookimpl
def register_envs(register):
    register("fakens/Echo-v0", "fake_good_env:EchoEnv", max_turns=2)
    register("aaa/Echo-v0", "fake_good_env:EchoEnv", max_turns=2)
