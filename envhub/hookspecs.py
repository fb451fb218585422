"""The hooks an envhub plugin can implement (entry-point group and project name ``envhub``)."""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("envhub")
hookimpl = pluggy.HookimplMarker("envhub")


@hookspec
def register_envs(register: Any) -> None:
    """Register environments: call ``register(id, entry_point="module:Class", **spec_kwargs)``."""


@hookspec
def register_formats(register: Any) -> None:
    """Register reply formats: call ``register(name, fmt)`` (see :func:`envhub.actions.register_format`)."""


@hookspec
def unavailable_envs() -> dict[str, str]:
    """Return the ids this plugin knows but does not register here, each with the reason (data that
    would be fetched at run time, a network service, an interpreter too old). ``envhub list
    --unavailable`` lists them, and asking for one gets its reason instead of a bare "unknown"."""


@hookspec
def register_commands(cli: Any) -> None:
    """Add click commands or groups to the ``envhub`` command-line group ``cli``."""


@hookspec(firstresult=True)
def make_policy(name: str, env_id: str, seed: Any) -> Any:
    """Return the :class:`envhub.play.Player` for ``envhub run --policy NAME`` (e.g. NAME is a model
    path), or None if NAME is not yours.

    A player is a generator plus the prompt settings, env settings (``env_kwargs``) and turn limit
    it plays under; ``envhub run`` plays it through a 1x1 env manager, the turn loop of training
    (``--max-turns`` and ``--env-kwarg`` win over the player's own settings).
    """
