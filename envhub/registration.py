"""The environment registry: ``EnvSpec``, ``register``, ``spec``, ``make``.

Ids are ``namespace/Name-vN``. Plugins register specs whose entry points are ``"module:Class"``
strings, imported only when an environment is made. Every envhub id is also registered with
Gymnasium as its plugin loads, so ``gymnasium.make(id)`` works once the plugin has loaded: after
importing its package (``gymnasium.make("envhub_frozenlake:frozenlake/FrozenLake-v0")`` does that),
any ``envhub.make`` of its namespace, an ``envhub.registry`` listing, or ``envhub.load_plugins()``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import numbers
import re
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium

from envhub.core import TextEnv
from envhub.error import DuplicateEnv, EntryPointError, InvalidEnvId, UnknownEnv

ENV_ID_RE = re.compile(r"^(?P<namespace>[A-Za-z0-9_.-]+)/(?P<name>[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)*?)-v(?P<version>\d+)$")


def parse_env_id(env_id: str) -> tuple[str, str, int]:
    """Split ``namespace/Name-vN`` into its namespace, name and version.

    Raises:
        InvalidEnvId: if ``env_id`` is not of that form.
    """
    match = ENV_ID_RE.match(env_id) if isinstance(env_id, str) else None
    if match is None:
        raise InvalidEnvId(
            f"{env_id!r} is not an envhub id; ids look like 'namespace/Name-vN', e.g. 'frozenlake/FrozenLake-v0'"
        )
    return match["namespace"], match["name"], int(match["version"])


def check_max_turns(max_turns: Any, what: str = "max_turns") -> None:
    """Refuse a turn limit that is not a positive integer (None: no override).

    An env with ``max_turns=0`` would truncate at once, and ``"x"`` would fail only at the first
    ``step``; both are refused where they are given.

    Raises:
        ValueError: naming ``what`` and the value.
    """
    if max_turns is None:
        return
    if isinstance(max_turns, bool) or not isinstance(max_turns, numbers.Integral) or max_turns < 1:
        raise ValueError(f"{what} must be a positive integer (or None for the registered limit), got {max_turns!r}")


@dataclasses.dataclass
class EnvSpec:
    """Everything needed to make one registered environment.

    Attributes:
        id: ``namespace/Name-vN``.
        entry_point: ``"module:Class"`` (imported lazily) or a callable returning a ``TextEnv``.
        kwargs: keyword arguments for the entry point; ``make`` overrides them per call.
        max_turns: the turn limit that truncates episodes; None for no limit.
        description: one line for ``envhub list``.
        plugin: the distribution (or built-in plugin) that registered the spec.
        version: that distribution's version.
    """

    id: str
    entry_point: str | Callable[..., TextEnv]
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_turns: int | None = None
    description: str = ""
    plugin: str | None = None
    version: str | None = None

    def __post_init__(self) -> None:
        parse_env_id(self.id)
        if isinstance(self.entry_point, str) and ":" not in self.entry_point:
            raise EntryPointError(f"entry point {self.entry_point!r} of {self.id} must look like 'module:Class'")
        check_max_turns(self.max_turns, f"max_turns of {self.id}")

    @property
    def namespace(self) -> str:
        """The part of the id before ``/``."""
        return parse_env_id(self.id)[0]

    @property
    def entry_point_str(self) -> str:
        """The entry point as text: ``module:Class`` or a callable's qualified name."""
        if isinstance(self.entry_point, str):
            return self.entry_point
        return f"{self.entry_point.__module__}:{self.entry_point.__qualname__}"

    def load(self) -> Callable[..., TextEnv]:
        """Import and return the entry point.

        Raises:
            EntryPointError: when the module or attribute cannot be imported.
        """
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise EntryPointError(
                f"cannot load {self.entry_point!r} for {self.id} (plugin {self.plugin}): {exc}; "
                "reinstall the plugin or check its register_envs hook"
            ) from exc
        return obj

    def make(self, *, max_turns: int | None = None, **kwargs: Any) -> TextEnv:
        """Build the environment with the spec's kwargs updated by ``kwargs``.

        Raises:
            ValueError: when ``max_turns`` is not a positive integer (checked before the env is built).
        """
        check_max_turns(max_turns, f"max_turns for {self.id}")
        env = self.load()(**{**self.kwargs, **kwargs})
        if not isinstance(env, TextEnv):
            raise EntryPointError(f"{self.entry_point_str} made a {type(env).__name__}, not an envhub TextEnv")
        env.max_turns = max_turns if max_turns is not None else self.max_turns
        env.spec = _gymnasium_spec(self, env.max_turns, kwargs)
        return env


#: Namespaces of the known envhub plugins and the distribution that provides each (the install
#: hint for an unknown id names only these, never a name made from what was typed).
KNOWN_PLUGINS = {
    "frozenlake": "envhub-frozenlake",
    "sokoban": "envhub-sokoban",
    "webshop": "envhub-webshop",
    "textarena": "envhub-textarena",
    "textworld": "envhub-textworld",
    "alfworld": "envhub-alfworld",
    "gym": "envhub",
    "pettingzoo": "envhub[pettingzoo]",
}


class Registry:
    """All registered specs, by id.

    The registry knows nothing of plugins: the plugin host (:mod:`envhub.plugins`) binds
    :attr:`loader`, which fills the registry before its first lookup, and :attr:`explain_unknown`,
    which adds to the message for an unknown id (a plugin of that namespace that failed to load).
    """

    def __init__(self) -> None:
        self._specs: dict[str, EnvSpec] = {}
        #: Loads every plugin (once); called before listing, and before failing a lookup.
        self.loader: Callable[[], None] | None = None
        #: Loads the plugin that owns a namespace, if one does; called before the full load on a
        #: lookup, so that making one env does not load every plugin.
        self.namespace_loader: Callable[[str], None] | None = None
        #: More words for an unknown id, or "".
        self.explain_unknown: Callable[[str], str] | None = None

    def _ensure_loaded(self) -> None:
        if self.loader is not None:
            self.loader()

    def add(self, env_spec: EnvSpec) -> EnvSpec:
        """Add ``env_spec``; raise ``DuplicateEnv`` if its id is taken."""
        existing = self._specs.get(env_spec.id)
        if existing is not None:
            raise DuplicateEnv(
                f"{env_spec.id} is registered twice: by {existing.plugin} and by {env_spec.plugin}; "
                "uninstall one of them or limit plugins with ENVHUB_PLUGINS"
            )
        self._specs[env_spec.id] = env_spec
        gymnasium.register(
            id=env_spec.id,
            entry_point=_GymnasiumEntry(env_spec.id),
            # No TimeLimit wrapper: the TextEnv truncates at its own max_turns, which
            # gymnasium.make(id, max_turns=N) sets, and which its prompts count down. A second,
            # independent limit would cut episodes short of what the prompts promise.
            max_episode_steps=None,
            disable_env_checker=True,
        )
        return env_spec

    def remove(self, env_id: str) -> None:
        """Forget ``env_id`` here and in Gymnasium's registry."""
        self._specs.pop(env_id, None)
        gymnasium.registry.pop(env_id, None)

    def get(self, env_id: str) -> EnvSpec:
        """Return the spec of ``env_id``.

        Raises:
            UnknownEnv: naming close matches and how to list what is installed.
        """
        found = self._lookup(env_id)
        if found is not None:
            return found
        raise UnknownEnv(self._unknown_message(env_id))

    def _lookup(self, env_id: object) -> EnvSpec | None:
        found = self._specs.get(env_id)  # type: ignore[arg-type]
        if found is None and self.namespace_loader is not None and isinstance(env_id, str):
            self.namespace_loader(env_id.partition("/")[0])
            found = self._specs.get(env_id)
        if found is None:
            self._ensure_loaded()
            found = self._specs.get(env_id)  # type: ignore[arg-type]
        return found

    def _unknown_message(self, env_id: str) -> str:
        ids = sorted(self._specs)
        by_lower = {i.lower(): i for i in ids}
        close = difflib.get_close_matches(str(env_id).lower(), list(by_lower), n=3, cutoff=0.5)
        message = f"no environment {env_id!r} is registered."
        if close:
            message += " Did you mean " + " or ".join(repr(by_lower[c]) for c in close) + "?"
        namespace = str(env_id).partition("/")[0]
        if self.explain_unknown is not None:
            message += self.explain_unknown(str(env_id))
        installed = {i.partition("/")[0] for i in ids}
        if namespace not in installed and namespace in KNOWN_PLUGINS:
            message += f" Its plugin is not installed: pip install '{KNOWN_PLUGINS[namespace]}'."
        message += " Run `envhub list` to see what is installed."
        return message

    def __contains__(self, env_id: object) -> bool:
        return self._lookup(env_id) is not None

    def __iter__(self) -> Iterator[str]:
        self._ensure_loaded()
        return iter(sorted(self._specs))

    def __len__(self) -> int:
        self._ensure_loaded()
        return len(self._specs)

    def values(self) -> list[EnvSpec]:
        """Every spec, sorted by id."""
        self._ensure_loaded()
        return [self._specs[i] for i in sorted(self._specs)]


registry = Registry()


def register(
    id: str,
    entry_point: str | Callable[..., TextEnv],
    *,
    kwargs: dict[str, Any] | None = None,
    max_turns: int | None = None,
    description: str = "",
    plugin: str | None = None,
    version: str | None = None,
) -> EnvSpec:
    """Register an environment under ``id`` (``namespace/Name-vN``).

    Plugins receive this function, bound to their name, as the ``register`` argument of their
    ``register_envs`` hook. Returns the new spec.
    """
    return registry.add(
        EnvSpec(
            id=id,
            entry_point=entry_point,
            kwargs=dict(kwargs or {}),
            max_turns=max_turns,
            description=description,
            plugin=plugin,
            version=version,
        )
    )


def spec(env_id: str) -> EnvSpec:
    """Return the spec registered under ``env_id``; raise ``UnknownEnv`` with suggestions if none."""
    return registry.get(env_id)


def make(env_id: str, *, max_turns: int | None = None, **kwargs: Any) -> TextEnv:
    """Make the environment registered under ``env_id``.

    Args:
        env_id: ``namespace/Name-vN``.
        max_turns: overrides the registered turn limit.
        **kwargs: override the registered keyword arguments (e.g. ``render_mode="rgb_array"``).

    Returns:
        The environment itself (no wrappers), so ``valid_actions()`` and friends are at hand.
    """
    return registry.get(env_id).make(max_turns=max_turns, **kwargs)


class _GymnasiumEntry:
    """Gymnasium's entry point for an envhub id: makes the env through envhub's registry.

    A class rather than a closure so that Gymnasium specs stay picklable (vector envs pickle them).
    """

    def __init__(self, env_id: str):
        self.env_id = env_id

    def __call__(self, **kwargs: Any) -> TextEnv:
        return make(self.env_id, **kwargs)


def _gymnasium_spec(env_spec: EnvSpec, max_turns: int | None, kwargs: dict[str, Any]) -> gymnasium.envs.registration.EnvSpec:
    return gymnasium.envs.registration.EnvSpec(
        id=env_spec.id,
        entry_point=_GymnasiumEntry(env_spec.id),
        max_episode_steps=max_turns,
        disable_env_checker=True,
        kwargs={**env_spec.kwargs, **kwargs},
    )
