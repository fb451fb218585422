"""The owner of the fakens namespace (distribution envhub-fakens)."""

from envhub import hookimpl


@hookimpl
def register_envs(register):
    register("fakens/Echo-v0", "fake_good_env:EchoEnv", max_turns=2)
    register("fakens/Other-v0", "fake_good_env:EchoEnv", max_turns=3)
