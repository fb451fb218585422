"""The config described for people: every field listed (``envhub train --help-config``) and a
run's resolved config printed as YAML (``envhub train --print-config``), both without loading a model.

:class:`~envhub_trl.config.EnvGRPOConfig` has envhub's fields and the TRL and transformers fields it
inherits; each is listed under the class that declares it, with its type, default, bounds
(:data:`~envhub_trl.config_checks.FIELD_BOUNDS`) and the first line of its help.
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

import yaml

#: Who declares a field, by the module its class lives in.
ORIGINS = {"envhub_trl": "envhub", "trl": "TRL", "transformers": "transformers"}


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """One config field as ``--help-config`` lists it."""

    name: str
    type: str
    default: Any
    bounds: str
    help: str
    origin: str


def type_name(annotation: Any) -> str:
    """``annotation`` as a reader writes it: ``int | None``, ``'token' | 'sequence'``."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _plain(value: Any) -> Any:
    """``value`` as YAML can write it (an enum as its value, an object as its text)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _origin(config_class: type, name: str) -> str:
    """Which of envhub, TRL and transformers declares field ``name`` (the first in the MRO to annotate it)."""
    for cls in config_class.__mro__:
        if name in vars(cls).get("__annotations__", {}):
            return ORIGINS.get(cls.__module__.split(".")[0], cls.__module__)
    return "?"


def field_docs(config_class: type | None = None) -> list[FieldDoc]:
    """Every field a config file may set, envhub's first, then TRL's, then transformers'."""
    from envhub_trl.config import EnvGRPOConfig
    from envhub_trl.config_checks import FIELD_BOUNDS

    config_class = config_class or EnvGRPOConfig
    hints = typing.get_type_hints(config_class)
    docs = []
    for f in dataclasses.fields(config_class):
        if not f.init:
            continue
        bounds = FIELD_BOUNDS.get(f.name)
        lines = str(f.metadata.get("help", "")).strip().splitlines()
        docs.append(FieldDoc(
            name=f.name, type=type_name(hints[f.name]), default=_plain(_default(f)),
            bounds=bounds.describe() if bounds is not None else "", help=lines[0].strip() if lines else "",
            origin=_origin(config_class, f.name),
        ))
    rank = {origin: i for i, origin in enumerate(ORIGINS.values())}
    return sorted(docs, key=lambda d: rank.get(d.origin, len(rank)))


def matching(docs: list[FieldDoc], pattern: str | None) -> list[FieldDoc]:
    """The fields ``pattern`` names: a glob over names (``'*_lr*'``), or else a word found in a
    name or its help (``rate``); every field without one."""
    if not pattern:
        return docs
    if any(c in pattern for c in "*?["):
        return [d for d in docs if fnmatch.fnmatchcase(d.name, pattern)]
    word = pattern.lower()
    return [d for d in docs if word in d.name.lower() or word in d.help.lower()]


def format_fields(docs: list[FieldDoc]) -> str:
    """Two lines a field, ``name: type = default  (bounds)`` and its help, under a heading per origin."""
    out, origin = [], None
    for doc in docs:
        if doc.origin != origin:
            origin = doc.origin
            out += [""] * bool(out) + [f"# {origin} fields"]
        default = yaml.safe_dump(doc.default, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
        bounds = f"  ({doc.bounds})" if doc.bounds else ""
        out.append(f"{doc.name}: {doc.type} = {default}{bounds}")
        if doc.help:
            out.append(f"    {doc.help}")
    return "\n".join(out)


def resolved_yaml(spec: Any, output_dir: str | None = None) -> str:
    """The config ``spec`` (a :class:`~envhub_trl.run.RunSpec`) runs with, as YAML that ``--config``
    reads back: the values given (file, overrides and flags), then the warm start, then every other
    field at its default, envhub's first."""
    from envhub_trl.config import EnvGRPOConfig

    given = {k: _plain(v) for k, v in spec.config.items()}
    defaults: dict[str, dict[str, Any]] = {}
    for doc in field_docs(EnvGRPOConfig):
        if doc.name not in given and doc.name != "output_dir":
            defaults.setdefault(doc.origin, {})[doc.name] = doc.default

    def dump(values: Mapping[str, Any]) -> str:
        return yaml.safe_dump(dict(values), sort_keys=False, default_flow_style=False, width=10**6) if values else ""

    command = f"# envhub train --model {spec.model}" + (f" --output-dir {output_dir}" if output_dir else "")
    parts = [command, "# set for this run (config file, KEY=VALUE, flags)",
             dump(given).rstrip(), "# the warm start", dump({"warm_start": _plain(dataclasses.asdict(spec.warm_start))}).rstrip()]
    for origin, values in defaults.items():
        parts += [f"# {origin} defaults", dump(values).rstrip()]
    return "\n".join(p for p in parts if p) + "\n"
