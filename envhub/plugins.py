"""Plugin discovery: pluggy hooks loaded from the ``envhub`` entry-point group.

``import envhub`` loads no plugin. The entry points are read once, on first need. Looking up an
id (``envhub.make``, ``envhub.spec``) first loads only the distribution named after the id's
namespace (``envhub-<namespace>``) when one is installed; listing the registry, the CLI, a policy
lookup, or an id no such distribution offers load every plugin. ``ENVHUB_PLUGINS`` (a comma list of
entry-point or distribution names) limits which load. A plugin that fails to import, or whose hook
raises, is recorded with its error and never stops the others.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib
import importlib.metadata
import os
import threading
import traceback
from typing import Any

import pluggy

from envhub import actions, hookspecs
from envhub.registration import register, registry

ENTRY_POINT_GROUP = "envhub"

#: Plugins that ship with the core (plugin name -> module), registered through the same hooks
#: as external ones, like datasette's default plugins.
DEFAULT_PLUGINS: dict[str, str] = {"envhub-adapters": "envhub.adapters.plugin"}


@dataclasses.dataclass
class PluginInfo:
    """What ``envhub plugins`` reports about one plugin."""

    name: str
    version: str | None
    entry_point: str | None
    hooks: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None
    env_ids: list[str] = dataclasses.field(default_factory=list)
    #: Ids this plugin tried to take from another plugin's namespace, or another tried to take
    #: from it ("frozenlake/FrozenLake-v0: namespace 'frozenlake' belongs to envhub-frozenlake").
    conflicts: list[str] = dataclasses.field(default_factory=list)
    #: The reply formats its ``register_formats`` hook added.
    formats: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The plugin as the JSON object ``envhub plugins --json`` prints."""
        return {
            "name": self.name,
            "version": self.version,
            "entry_point": self.entry_point,
            "hooks": self.hooks,
            "error": self.error,
            "conflicts": self.conflicts,
        }


@dataclasses.dataclass(frozen=True)
class _Planned:
    """One plugin the entry-point scan found, to be loaded on first need."""

    name: str
    dist: str
    version: str | None
    entry_point: str
    loader: Any


class PluginHost:
    """The pluggy manager plus what envhub knows about each plugin (version, error)."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self.loaded = False
        #: Names in ENVHUB_PLUGINS that match no plugin (the CLI warns about them).
        self.unmatched_allowed: list[str] = []
        #: Every plugin name ENVHUB_PLUGINS could have named.
        self.available: list[str] = []
        #: Namespace -> the distribution named after it (envhub-<namespace>), and namespace -> the
        #: first plugin that registered in it, for namespaces no distribution is named after.
        self.owners: dict[str, str] = {}
        self.first_in: dict[str, str] = {}
        #: Conflicts to report on an owner that has not loaded yet.
        self.pending_conflicts: dict[str, list[str]] = {}
        #: The load plan from the one entry-point scan (None until the first need).
        self._plan: list[_Planned] | None = None
        #: Plugins whose loading has begun (by a namespace lookup or the full load).
        self._started: set[str] = set()
        #: True while one namespace's distribution loads ahead of the others.
        self._partial = False
        #: Plugin -> registrations it made, while loading early, in namespaces nobody owns by name.
        self._deferred: dict[str, list[tuple[str, Any, dict[str, Any]]]] = {}
        #: Held while plugins load: a thread that needs the registry waits for another's load to
        #: end instead of finding it half filled (re-entrant: a plugin's import loads its namespace).
        self._lock = threading.RLock()
        #: Set once the full load has ended (``loaded`` is set as it begins).
        self._done = False

    def _scan(self) -> list[_Planned]:
        """Read the entry points (once) and plan the load: every allowed plugin, in load order."""
        if self._plan is not None:
            return self._plan
        allowed = _allowed_plugins()
        points = _entry_points()  # the one scan of the installed distributions
        per_dist = collections.Counter(_dist_name(ep) for ep in points)
        names = set(DEFAULT_PLUGINS) | {ep.name for ep in points} | set(per_dist)
        self.available = sorted(names)
        #: The namespace each distribution named envhub-<namespace> owns.
        self.owners = {n.removeprefix("envhub-"): n for n in names if n.startswith("envhub-")}
        self.unmatched_allowed = sorted(set(allowed or ()) - names)
        plan = []
        for name, module_name in DEFAULT_PLUGINS.items():
            if allowed is None or name in allowed:
                version = importlib.metadata.version("envhub")
                plan.append(_Planned(name, name, version, module_name, lambda m=module_name: importlib.import_module(m)))
        for ep in points:
            dist = getattr(ep, "dist", None)
            dist_name = _dist_name(ep)
            if allowed is not None and ep.name not in allowed and dist_name not in allowed:
                continue
            version = dist.version if dist is not None else None
            # A distribution with several entry points gets a plugin per entry point.
            name = dist_name if per_dist[dist_name] == 1 else f"{dist_name}:{ep.name}"
            plan.append(_Planned(name, dist_name, version, ep.value, ep.load))
        self._plan = plan
        return plan

    def load(self) -> None:
        """Load every (allowed) default and entry-point plugin and run its hooks, once. Safe to
        call from several threads: the others wait for the one that loads."""
        if self._done:
            return
        with self._lock:
            if self.loaded:  # done, or loading further up this thread's stack
                return
            self.loaded = True
            try:
                for planned in self._scan():
                    if planned.name in self._started:
                        # Loaded early for one namespace: its registrations in namespaces nobody owns by
                        # name run now, at its place in the order, so that "first to register" does not
                        # depend on which id was made first.
                        self._replay_deferred(planned.name)
                    else:
                        self._load_one(planned.name, planned.version, planned.entry_point, planned.loader)
            finally:
                self._done = True

    def load_namespace(self, namespace: str) -> None:
        """Load only the distribution named ``envhub-<namespace>`` (if installed and allowed)."""
        if self._done:
            return
        with self._lock:
            if self.loaded:
                return
            plan = self._scan()
            owner = self.owners.get(namespace)
            if owner is None:
                return
            # Restored, not reset: a plugin package's import calls this again while it loads
            # (load_on_import), and the outer load must still defer.
            outer, self._partial = self._partial, True
            try:
                for planned in plan:
                    if planned.dist == owner and planned.name not in self._started:
                        self._load_one(planned.name, planned.version, planned.entry_point, planned.loader)
            finally:
                self._partial = outer

    def _replay_deferred(self, name: str) -> None:
        info = self.infos.get(name)
        deferred = self._deferred.pop(name, [])
        if info is None or info.error is not None:
            return
        try:
            for env_id, entry_point, spec_kwargs in deferred:
                self._register_for(info, env_id, entry_point, **spec_kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # as in _register_envs_of: a failed plugin registers nothing
            info.error = _describe(exc)
            for env_id in info.env_ids:
                registry.remove(env_id)
            info.env_ids.clear()

    def _load_one(self, name: str, version: str | None, entry_point: str, loader: Any) -> None:
        self._started.add(name)
        info = PluginInfo(name=name, version=version, entry_point=entry_point)
        info.conflicts.extend(self.pending_conflicts.pop(name.partition(":")[0], []))
        self.infos[name] = info
        try:
            plugin = loader()
            self.pm.register(plugin, name=name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a broken plugin (sys.exit() included) never takes the others down
            info.error = _describe(exc)
            return
        info.hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
        self._register_envs_of(name)
        self._register_formats_of(name)

    def add(self, plugin: Any, name: str, version: str | None = None) -> PluginInfo:
        """Register a plugin object by hand (tests, notebooks) and run its ``register_envs``."""
        self.load()
        info = PluginInfo(name=name, version=version, entry_point=None)
        self.infos[name] = info
        self.pm.register(plugin, name=name)
        info.hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
        self._register_envs_of(name)
        self._register_formats_of(name)
        return info

    def remove(self, name: str) -> None:
        """Unregister the plugin ``name`` and forget the environments it registered.

        Only the ids its own hook registered are forgotten: another host loading the same plugin
        (tests build throwaway hosts) never removes the envs the real one registered.
        """
        info = self.infos.get(name)
        for env_id in info.env_ids if info is not None else ():
            registry.remove(env_id)
        for format_name in info.formats if info is not None else ():
            actions.FORMATS.pop(format_name, None)
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin)
        self.infos.pop(name, None)
        self.first_in = {ns: owner for ns, owner in self.first_in.items() if owner != name}

    def _register_envs_of(self, name: str) -> None:
        info = self.infos[name]
        bound = functools.partial(self._register_for, info)
        for impl in self._impls("register_envs", name):
            try:
                impl.function(register=bound)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # SystemExit included
                info.error = _describe(exc)
                # A failed plugin registers nothing: the ids it had registered before failing are
                # rolled back, so no id is listed and usable under a plugin shown as broken.
                for env_id in info.env_ids:
                    registry.remove(env_id)
                info.env_ids.clear()

    def _register_formats_of(self, name: str) -> None:
        info = self.infos[name]

        def register_format(format_name: str, fmt: actions.ReplyFormat) -> actions.ReplyFormat:
            registered = actions.register_format(format_name, fmt)
            info.formats.append(format_name)
            return registered

        for impl in self._impls("register_formats", name):
            try:
                impl.function(register=register_format)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # a broken plugin never takes the others down
                info.error = _describe(exc)
                for format_name in info.formats:
                    actions.FORMATS.pop(format_name, None)
                info.formats.clear()

    def _register_for(self, info: PluginInfo, id: str, entry_point: Any, **spec_kwargs: Any) -> Any:
        """The ``register`` a plugin's hook receives: :func:`envhub.registration.register` with
        the plugin's name and version, and the namespace rule.

        The namespace rule: a namespace belongs to the distribution named ``envhub-<namespace>``
        when one is installed, else to the first plugin that registers in it (plugins load in
        entry-point-name order, so the same one every time). A registration in someone else's
        namespace is refused, recorded on both plugins (``envhub plugins``), and returns None.
        """
        namespace = str(id).partition("/")[0]
        if self._partial and namespace not in self.owners:
            # Who is first in an unowned namespace is decided in load order, by the full load.
            self._deferred.setdefault(info.name, []).append((id, entry_point, spec_kwargs))
            return None
        owner = self.owners.get(namespace) or self.first_in.setdefault(namespace, info.name)
        if owner != info.name and not info.name.startswith(f"{owner}:"):
            conflict = f"{id}: namespace {namespace!r} belongs to {owner}; {info.name} may not register in it"
            info.conflicts.append(conflict)
            if owner in self.infos:
                self.infos[owner].conflicts.append(conflict)
            else:
                self.pending_conflicts.setdefault(owner, []).append(conflict)
            return None
        spec_kwargs.setdefault("plugin", info.name)
        spec_kwargs.setdefault("version", info.version)
        env_spec = register(id, entry_point, **spec_kwargs)
        info.env_ids.append(env_spec.id)
        return env_spec

    def register_commands(self, cli: Any) -> None:
        """Run every plugin's ``register_commands`` hook on ``cli``, isolating failures."""
        self.load()
        for name, info in self.infos.items():
            for impl in self._impls("register_commands", name):
                try:
                    impl.function(cli=cli)
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:  # SystemExit included
                    info.error = _describe(exc)

    def _impls(self, hook_name: str, plugin_name: str) -> list[Any]:
        caller = getattr(self.pm.hook, hook_name)
        return [impl for impl in caller.get_hookimpls() if impl.plugin_name == plugin_name]


def _dist_name(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else ep.name


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def _allowed_plugins() -> set[str] | None:
    raw = os.environ.get("ENVHUB_PLUGINS")
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _describe(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    location = f" ({where[0].filename.rsplit(os.sep, 1)[-1]}:{where[0].lineno})" if where else ""
    return f"{type(exc).__name__}: {exc}{location}"


def unavailable_envs() -> dict[str, tuple[str, str]]:
    """Every id a loaded plugin knows but does not register here: id -> (plugin, reason).

    A hook that raises contributes nothing (``envhub list`` must not fail because of it).
    """
    host.load()
    found: dict[str, tuple[str, str]] = {}
    for name in list(host.infos):
        for impl in host._impls("unavailable_envs", name):
            try:
                entries = dict(impl.function())
            except Exception:
                continue
            for env_id, reason in entries.items():
                found.setdefault(str(env_id), (name, str(reason)))
    return found


def _explain_unknown(env_id: str) -> str:
    """For the registry's unknown-id message: why a plugin does not offer that id here, or the
    plugins of its namespace that failed to load."""
    known = unavailable_envs().get(env_id)
    if known is not None:
        return f" {known[0]} knows it but cannot offer it here: {known[1]}."
    namespace = env_id.partition("/")[0]
    broken = [p for p in plugin_infos() if p.error and namespace and namespace in p.name]
    return "".join(f" Plugin {p.name} failed to load: {p.error}." for p in broken)


host = PluginHost()
# The host fills the registry and explains what it lacks; the registry does not know of plugins.
registry.loader = host.load
registry.namespace_loader = host.load_namespace
registry.explain_unknown = _explain_unknown
actions.format_loader = host.load


def load_on_import(namespace: str) -> None:
    """Load the plugin that owns ``namespace`` (the distribution ``envhub-<namespace>``), once.

    A plugin package calls this at the end of its ``__init__``, so that importing it registers its
    ids with envhub and with Gymnasium. That is what Gymnasium 1.x's own habits rely on, now that it
    no longer loads other packages' environments through entry points:
    ``gymnasium.make("envhub_frozenlake:frozenlake/FrozenLake-v0")`` (Gymnasium imports the module
    before it looks the id up), and ``import envhub_frozenlake`` or
    ``gymnasium.register_envs(envhub_frozenlake)`` before ``gymnasium.make("frozenlake/...")``.

    Nothing loads twice: while envhub itself loads the plugin (which imports its package), or once
    every plugin has loaded, this does nothing. ``ENVHUB_PLUGINS`` applies as for ``envhub.make``.
    """
    host.load_namespace(namespace)


def load_plugins() -> None:
    """Load every plugin once (a no-op after the first call)."""
    host.load()


def plugin_infos() -> list[PluginInfo]:
    """Every plugin envhub found, loaded or broken, sorted by name."""
    host.load()
    return [host.infos[name] for name in sorted(host.infos)]


def get_plugin_manager() -> pluggy.PluginManager:
    """The pluggy manager, with every plugin loaded."""
    host.load()
    return host.pm
