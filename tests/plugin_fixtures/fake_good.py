"""A plugin found by the faked entry-point scan; registers one environment."""

from envhub import hookimpl


@hookimpl
def register_envs(register):
    register("fakegood/Echo-v0", "fake_good_env:EchoEnv", max_turns=3, description="echo")
