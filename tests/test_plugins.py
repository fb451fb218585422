"""Plugin loading three ways: a throwaway hookimpl class, a faked entry-point scan, a real plugin."""

import dataclasses
import importlib.metadata
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import envhub
from envhub import hookimpl, hookspecs, plugins
from envhub.actions import ParsedReply, TagFormat, get_format
from envhub.core import match_action
from envhub.manager import EnvGroupManager
from envhub.cli import cli
from envhub.error import DuplicateEnv, PolicyError, UnknownEnv
from envhub.play import PLAYERS, get_player

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
        if name == "oracle-by-plugin":
            return PLAYERS["expert"]()
        return object() if name == "not-a-player" else None


def test_hook_make_policy():
    plugins.host.add(PolicyPlugin(), name="policy-plugin")
    try:
        assert type(get_player("oracle-by-plugin", "frozenlake/FrozenLake-v0").generator).__name__ == "ExpertGenerator"
        assert type(get_player("random", "frozenlake/FrozenLake-v0", seed=0).generator).__name__ == "RandomGenerator"
        with pytest.raises(PolicyError, match="no policy called"):
            get_player("nobody-knows-me", "frozenlake/FrozenLake-v0")
        with pytest.raises(PolicyError, match="with a object, not an envhub.play.Player"):
            get_player("not-a-player", "frozenlake/FrozenLake-v0")
    finally:
        plugins.host.remove("policy-plugin")


@dataclasses.dataclass(frozen=True)
class ShoutFormat:
    """A plugin's reply format: the action is the reply's last line, in capitals."""

    def instructions(self):
        return "End your reply with the action in capitals on its own line."

    def render(self, action):
        return action.upper()

    def parse(self, reply, valid_actions=None, tools=None):
        line = reply.strip().splitlines()[-1] if isinstance(reply, str) and reply.strip() else ""
        if not line.isupper():
            return ParsedReply((), False, False, "the last line is not in capitals")
        found = match_action(line, valid_actions) if valid_actions is not None else line
        return ParsedReply((found or line,), True, found is not None, None if found else f"{line!r} is not legal")


class FormatPlugin:
    @hookimpl
    def register_formats(self, register):
        register("shout", ShoutFormat())


def test_hook_register_formats():
    info = plugins.host.add(FormatPlugin(), name="format-plugin")
    try:
        assert info.hooks == ["register_formats"] and info.formats == ["shout"]
        with EnvGroupManager("frozenlake/FrozenLakeNotSlippery-v0", 1, 1, action_format="shout") as manager:
            manager.reset()
            assert "in capitals" in manager.prompts()[0].messages[0]["content"]
            manager.step(["I think so.\nRIGHT"])
            turn = manager.trajectories()[0].turns[0]
            assert turn.action == "Right" and turn.action_is_valid
            manager.prompts()
            manager.step(["right"])
            assert manager.trajectories()[0].turns[1].invalid_reason == "the last line is not in capitals"
    finally:
        plugins.host.remove("format-plugin")
    with pytest.raises(ValueError, match="unknown action format 'shout'"):
        get_format("shout")


class UnavailablePlugin:
    """Knows one id it cannot offer here; its broken twin's hook raises."""

    @hookimpl
    def unavailable_envs(self):
        return {"ghost/Haunted-v0": "needs a corpus that is fetched at run time"}


class BrokenUnavailablePlugin:
    @hookimpl
    def unavailable_envs(self):
        raise RuntimeError("boom")


def test_hook_unavailable_envs():
    plugins.host.add(UnavailablePlugin(), name="ghost-plugin")
    plugins.host.add(BrokenUnavailablePlugin(), name="broken-ghost-plugin")
    try:
        assert plugins.unavailable_envs()["ghost/Haunted-v0"] == ("ghost-plugin", "needs a corpus that is fetched at run time")
        with pytest.raises(UnknownEnv, match="ghost-plugin knows it but cannot offer it here: needs a corpus"):
            envhub.make("ghost/Haunted-v0")
        result = CliRunner().invoke(cli, ["list", "--unavailable"])
        assert result.exit_code == 0 and "ghost/Haunted-v0" in result.output
    finally:
        plugins.host.remove("ghost-plugin")
        plugins.host.remove("broken-ghost-plugin")
    assert "ghost/Haunted-v0" not in plugins.unavailable_envs()


def test_a_format_name_taken_twice_is_a_plugin_error_not_a_crash():
    class Clash:
        @hookimpl
        def register_formats(self, register):
            register("answer", ShoutFormat())

    info = plugins.host.add(Clash(), name="clash-plugin")
    try:
        assert "registered twice" in info.error and get_format("answer") == TagFormat()
    finally:
        plugins.host.remove("clash-plugin")


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


def test_a_plugin_that_exits_on_import_is_reported_and_the_others_load(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setattr(plugins, "_entry_points", _fake_entry_points("fake_exits_on_import", "fake_good"))
    host = plugins.PluginHost()
    try:
        host.load()
        assert host.infos["fake_exits_on_import"].error.startswith("SystemExit: this plugin exits on import")
        assert host.infos["fake_good"].error is None and host.infos["fake_good"].env_ids
    finally:
        for name in list(host.infos):
            host.remove(name)


def test_sys_exit_in_step_ends_only_its_own_episode():
    from helper_envs import registered

    from envhub.executors import InProcessExecutor
    from envhub.generation import ExpertGenerator
    from envhub.manager import EnvGroupManager
    from envhub.rollout import rollout

    class Exits(envhub.DiscreteTextEnv):
        instructions = "Say go."
        action_names = ("go",)

        def _reset(self, options):
            return "ready", {}

        def _step(self, action):
            raise SystemExit("step exits")

        def state_key(self):
            return "s"

        def is_success(self):
            return False

        def render_text(self):
            return "ready"

        def expert_action(self):
            return "go"

    with registered("test/Exits-v0", Exits, max_turns=3):
        manager = EnvGroupManager({"test/Exits-v0": 1, "frozenlake/FrozenLakeNotSlippery-v0": 1}, group_size=1, executor=InProcessExecutor())
        exited, lake = rollout(manager, ExpertGenerator())
    assert exited.error.startswith("SystemExit: step exits") and exited.end_reason == "error"
    assert lake.success and lake.error is None


class _Dist:
    def __init__(self, name):
        self.name, self.version = name, "1.0"


def _points(*pairs):
    """Entry points (name, module, distribution name), as an installed set would have them."""
    points = []
    for name, module, dist in pairs:
        ep = importlib.metadata.EntryPoint(name=name, value=module, group="envhub")
        object.__setattr__(ep, "dist", _Dist(dist)) if hasattr(ep, "dist") else None
        points.append(ep)
    return lambda: points


@pytest.fixture
def host_with(monkeypatch):
    """A fresh host over given (entry point, module, distribution) triples; its ids removed after."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    hosts = []

    def make(*pairs):
        monkeypatch.setattr(plugins, "_entry_points", _points(*pairs))
        host = plugins.PluginHost()
        hosts.append(host)
        host.load()
        return host

    yield make
    for host in hosts:
        for name, info in list(host.infos.items()):
            for env_id in info.env_ids:
                if envhub.registry._specs.get(env_id) is not None and envhub.registry._specs[env_id].plugin == name:
                    envhub.registry.remove(env_id)


def test_an_impostor_neither_takes_nor_hides_the_owners_ids(host_with):
    # aaa_impostor loads first (entry points load in name order) and registers in fakens/.
    host = host_with(("aaa_impostor", "aaa_impostor", "aaa-impostor"), ("fakens", "fake_owner", "envhub-fakens"))
    impostor, owner = host.infos["aaa-impostor"], host.infos["envhub-fakens"]
    conflict = "fakens/Echo-v0: namespace 'fakens' belongs to envhub-fakens; aaa-impostor may not register in it"
    assert impostor.conflicts == [conflict] and owner.conflicts == [conflict]  # reported on both
    assert impostor.error is None and impostor.env_ids == ["aaa/Echo-v0"]
    assert owner.error is None and owner.env_ids == ["fakens/Echo-v0", "fakens/Other-v0"]
    assert envhub.spec("fakens/Echo-v0").plugin == "envhub-fakens"
    assert type(envhub.make("fakens/Echo-v0")).__name__ == "EchoEnv"


def test_two_entry_points_of_one_distribution_both_load(host_with):
    host = host_with(("first", "fake_good", "two-points"), ("second", "aaa_impostor", "two-points"))
    assert set(host.infos) - set(plugins.DEFAULT_PLUGINS) == {"two-points:first", "two-points:second"}
    assert host.infos["two-points:first"].error is None and host.infos["two-points:second"].error is None
    assert "aaa/Echo-v0" in host.infos["two-points:second"].env_ids and host.infos["two-points:first"].env_ids


def test_a_plugin_that_fails_partway_keeps_none_of_its_ids(host_with):
    host = host_with(("half", "fake_half_register", "fake-half"))
    info = host.infos["fake-half"]
    assert info.error.startswith("RuntimeError: failed after one registration") and info.env_ids == []
    assert "half/Echo-v0" not in envhub.registry


# ------------------------------------------------------------------------------------ lazy loading

_PLUGIN_MODULES = "[m for m in sys.modules if m.endswith('.plugin') and m != 'envhub.plugins']"


def _python(code: str) -> str:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout.strip()


def test_import_envhub_imports_no_plugin():
    assert _python(f"import envhub, sys; print({_PLUGIN_MODULES})") == "[]"


def test_making_an_env_loads_only_the_plugin_of_its_namespace_and_listing_loads_all():
    code = (
        "import envhub, sys; envhub.make('frozenlake/FrozenLake-v0');"
        f"print(sorted({_PLUGIN_MODULES})); envhub.registry.values(); print('envhub_sokoban.plugin' in sys.modules)"
    )
    first, after_listing = _python(code).splitlines()
    assert first == "['envhub_frozenlake.plugin']" and after_listing == "True"


def test_threads_that_make_envs_at_once_in_a_fresh_process_all_find_them():
    """The first lookups race the plugins' loading: each thread waits for it to end, none finds a
    half-filled registry (an agent's sessions, each making its env in its own thread, found
    'no environment ... is registered' in all but one)."""
    code = (
        "import threading, envhub\n"
        "barrier, errors = threading.Barrier(16), []\n"
        "def make(k):\n"
        "    barrier.wait()\n"
        "    try:\n"
        "        envhub.make(['frozenlake/FrozenLakeNotSlippery-v0', 'sokoban/Sokoban-v0'][k % 2]).reset(seed=k)\n"
        "    except Exception as exc:\n"
        "        errors.append(type(exc).__name__)\n"
        "threads = [threading.Thread(target=make, args=(k,)) for k in range(16)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "envhub.registry.values()\n"
        "print(errors)"
    )
    assert _python(code) == "[]"


def test_entry_points_are_read_once_by_a_namespace_load_and_the_full_load(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    scans = []
    points = _points(("aaa_impostor", "aaa_impostor", "aaa-impostor"), ("fakens", "fake_owner", "envhub-fakens"))
    monkeypatch.setattr(plugins, "_entry_points", lambda: scans.append(1) or points())
    host = plugins.PluginHost()
    try:
        host.load_namespace("fakens")
        assert list(host.infos) == ["envhub-fakens"]  # only the owner of the namespace
        host.load()
        assert len(scans) == 1 and set(host.infos) == {"envhub-fakens", "aaa-impostor", *plugins.DEFAULT_PLUGINS}
    finally:
        for name in list(host.infos):
            host.remove(name)


def test_who_registers_first_in_an_unowned_namespace_does_not_depend_on_what_loaded_early(monkeypatch):
    """envhub-fakens loads early (an id of fakens/ was made) and also registers aaa/Echo-v0; at the
    full load, aaa-impostor, first in load order, still takes the unowned aaa/ namespace."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    points = _points(("aaa_impostor", "aaa_impostor", "aaa-impostor"), ("fakens", "fake_owner_elsewhere", "envhub-fakens"))
    monkeypatch.setattr(plugins, "_entry_points", points)
    hosts = []
    try:
        for early in (True, False):
            host = plugins.PluginHost()
            hosts.append(host)
            if early:
                host.load_namespace("fakens")
                assert host.infos["envhub-fakens"].env_ids == ["fakens/Echo-v0"]  # aaa/ waits for the full load
            host.load()
            assert host.infos["aaa-impostor"].env_ids == ["aaa/Echo-v0"]
            assert host.infos["envhub-fakens"].env_ids == ["fakens/Echo-v0"]
            assert any("namespace 'aaa' belongs to aaa-impostor" in c for c in host.infos["envhub-fakens"].conflicts)
            for name in list(host.infos):
                host.remove(name)
    finally:
        for host in hosts:
            for name in list(host.infos):
                host.remove(name)


def test_a_plugin_whose_import_asks_for_its_namespace_again_loads_once_and_still_defers(monkeypatch):
    """What a plugin package's load_on_import does while envhub loads that plugin: nothing, and the
    outer load of the namespace still defers registrations in namespaces nobody owns by name."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setattr(plugins, "_entry_points", _points(("fakens", "fake_owner_elsewhere", "envhub-fakens")))
    host = plugins.PluginHost()
    *defaults, owner = host._scan()
    calls = []

    def reentrant(loader=owner.loader):
        calls.append(1)
        host.load_namespace("fakens")  # as the package's __init__ does
        return loader()

    host._plan = [*defaults, dataclasses.replace(owner, loader=reentrant)]
    try:
        host.load_namespace("fakens")
        info = host.infos["envhub-fakens"]
        assert calls == [1] and info.error is None and info.env_ids == ["fakens/Echo-v0"]
    finally:
        for name in list(host.infos):
            host.remove(name)

