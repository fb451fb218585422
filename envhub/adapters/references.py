"""Resolving ``"module:attribute"`` references, so registrations can name functions as strings.

Registration kwargs must stay JSON-ready (the checker replays them in other processes), so the
adapters accept renderers, predicates, experts and opponents either as objects or as
``"package.module:name"`` strings that are imported when the environment is made.
"""

from __future__ import annotations

import importlib
from typing import Any

from envhub.error import AdapterError, MissingDependency


def load_reference(reference: str, what: str) -> Any:
    """Import the object that ``reference`` (``"package.module:name"``) names.

    Args:
        reference: ``module:attribute``; the attribute may be dotted (``module:Class.method``).
        what: what the reference is for, used in error messages (e.g. ``"observation_to_text"``).

    Raises:
        AdapterError: when ``reference`` is not of that form or names nothing.
        MissingDependency: when importing the module needs a package that is not installed.
    """
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise AdapterError(f"{what}={reference!r} must be a callable or a 'package.module:name' string")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            raise AdapterError(f"{what}={reference!r}: there is no module {exc.name!r}") from exc
        raise MissingDependency(f"{what}={reference!r} needs {exc.name!r}, which is not installed: pip install {exc.name}") from exc
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise AdapterError(f"{what}={reference!r}: module {module_name!r} has no attribute {attr!r}") from exc
    return obj


def resolve(value: Any, what: str) -> Any:
    """Return ``value`` itself, or the object it names when it is a ``module:name`` string."""
    return load_reference(value, what) if isinstance(value, str) else value
