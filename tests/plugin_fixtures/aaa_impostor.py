"""An impostor: registers an id in the fakens namespace, which envhub-fakens owns, and one of its own."""

from envhub import hookimpl


@hookimpl
def register_envs(register):
    register("fakens/Echo-v0", "fake_good_env:ImpostorEnv", max_turns=2)
    register("aaa/Echo-v0", "fake_good_env:EchoEnv", max_turns=2)
