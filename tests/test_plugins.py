"""Plugin loading three ways: a throwaway hookimpl class, a faked entry-point scan, a real plugin."""

import importlib.metadata
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import envhub
from envhub import hookimpl, hookspecs, plugins
from envhub.error import DuplicateEnv, PolicyError
from envhub.generation import POLICIES, get_policy

FIXTURES = Path(__file__).parent / "plugin_fixtures"


def _fake_entry_points(*modules):
    return lambda: [importlib.metadata.EntryPoint(name=m, value=m, group="envhub") for m in modules]


@pytest.fixture
def fake_host(monkeypatch):
    """A fresh PluginHost whose entry-point scan finds the fixture plugins; cleaned up after."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setattr(plugins, "_entry_points", _fake_entry_points("fake_broken_hook", "fake_broken_import", "fake_good"))
    host = plugins.PluginHost()
    yield host
    for name in list(host.infos):
        host.remove(name)


class ThrowawayPlugin:
    """Registered and unregistered around one test."""

    @hookimpl
    def register_envs(self, register):
        register("throwaway/Echo-v0", "fake_good_env:EchoEnv", max_turns=2, description="throwaway")

    @hookimpl
    def register_commands(self, cli):
        @cli.command("hello")
        def hello():
            click.echo("hello from a plugin")


@pytest.fixture
def throwaway(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    info = plugins.host.add(ThrowawayPlugin(), name="throwaway")
    yield info
    plugins.host.remove("throwaway")


def test_hook_register_envs(throwaway):
    assert throwaway.hooks == ["register_commands", "register_envs"]
    env_spec = envhub.spec("throwaway/Echo-v0")
    assert env_spec.plugin == "throwaway" and env_spec.max_turns == 2
    env = envhub.make("throwaway/Echo-v0")
    word, _ = env.reset(seed=0)
    assert env.step(word)[1] == 1.0


def test_hook_register_commands(throwaway):
    group = click.Group()
    plugins.host.register_commands(group)
    result = CliRunner().invoke(group, ["hello"])
    assert result.exit_code == 0 and "hello from a plugin" in result.output


class PolicyPlugin:
    """Answers ``make_policy`` for one name only, as the trainer plugin does for model folders."""

    @hookimpl
    def make_policy(self, name, env_id, seed):
        return POLICIES["expert"]() if name == "oracle-by-plugin" else None


def test_hook_make_policy():
    plugins.host.add(PolicyPlugin(), name="policy-plugin")
    try:
        assert type(get_policy("oracle-by-plugin", "frozenlake/FrozenLake-v0")).__name__ == "ExpertPolicy"
        assert type(get_policy("random", "frozenlake/FrozenLake-v0", seed=0)).__name__ == "RandomPolicy"
        with pytest.raises(PolicyError, match="no policy called"):
            get_policy("nobody-knows-me", "frozenlake/FrozenLake-v0")
    finally:
        plugins.host.remove("policy-plugin")


def test_unregistering_a_plugin_forgets_its_envs(throwaway):
    assert "throwaway/Echo-v0" in envhub.registry
    plugins.host.remove("throwaway")
    assert "throwaway/Echo-v0" not in envhub.registry
    plugins.host.add(ThrowawayPlugin(), name="throwaway")  # the fixture removes it again


def test_faked_entry_point_scan_loads_good_and_reports_broken_plugins(fake_host):
    fake_host.load()
    infos = fake_host.infos
    assert infos["fake_good"].error is None and infos["fake_good"].hooks == ["register_envs"]
    assert "RuntimeError: this plugin is broken on purpose" in infos["fake_broken_import"].error
    assert "ValueError: hook exploded on purpose" in infos["fake_broken_hook"].error
    assert envhub.make("fakegood/Echo-v0").reset(seed=1)[0] in ("ping", "pong")


def test_plugins_load_once(fake_host, monkeypatch):
    fake_host.load()
    monkeypatch.setattr(plugins, "_entry_points", lambda: pytest.fail("entry points scanned twice"))
    fake_host.load()


def test_envhub_plugins_variable_limits_what_loads(fake_host, monkeypatch):
    monkeypatch.setenv("ENVHUB_PLUGINS", "fake_good")
    fake_host.load()
    assert list(fake_host.infos) == ["fake_good"]


def test_a_real_installed_plugin_is_found_through_its_entry_point():
    info = {p.name: p for p in plugins.plugin_infos()}["envhub-frozenlake"]
    assert info.error is None and info.version == importlib.metadata.version("envhub-frozenlake")
    assert info.entry_point == "envhub_frozenlake.plugin" and "register_envs" in info.hooks
    assert envhub.spec("frozenlake/FrozenLake-v0").plugin == "envhub-frozenlake"


def test_two_plugins_claiming_one_id_is_an_error_naming_both(throwaway):
    with pytest.raises(DuplicateEnv, match="registered twice"):
        envhub.register("throwaway/Echo-v0", "fake_good_env:EchoEnv", plugin="another")


def test_every_hook_has_a_test():
    hooks = [name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "envhub_spec")]
    assert hooks, "no hookspecs found"
    missing = [h for h in hooks if f"test_hook_{h}" not in globals()]
    assert not missing, f"hooks without a test_hook_<name> test: {missing}"


def test_removing_a_throwaway_hosts_plugins_keeps_the_real_hosts_envs(fake_host):
    fake_host.load()  # also loads the built-in adapters, whose ids the real host already holds
    for name in list(fake_host.infos):
        fake_host.remove(name)
    assert "gym/Taxi-v3" in envhub.registry and "frozenlake/FrozenLake-v0" in envhub.registry
    assert "fakegood/Echo-v0" not in envhub.registry
