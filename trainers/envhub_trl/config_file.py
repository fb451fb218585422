"""Config values from a YAML file and ``KEY=VALUE`` overrides, checked against the dataclass's
annotations before anything loads.

YAML reads ``1e-4`` as a string and ``4.5`` as a float wherever they are written; TRL's own checks
would catch some of that late, under TRL's field names, after a model has loaded. Here every value
is checked (and, where it is safe, converted) against the field's annotation when the file is read,
and a problem names the field and the type it expects.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from typing import Any, Literal, Union

import yaml


class ConfigError(ValueError):
    """A config value of the wrong type, an unknown field, or a malformed file or override."""


def did_you_mean(word: str, names: typing.Iterable[str]) -> str:
    """`` (did you mean NAME?)`` for the name of ``names`` closest to ``word``; empty if none is close."""
    close = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def unknown_keys_message(unknown: typing.Sequence[str], names: typing.Iterable[str], what: str) -> str:
    """``unknown WHAT KEY (did you mean NAME?)``, for each of ``unknown``, joined by ``, ``."""
    names = list(names)
    return ", ".join(f"unknown {what} {key!r}{did_you_mean(key, names)}" for key in unknown)


def _describe(annotation: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping", list: "a list"}
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(annotation))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    return names.get(origin or annotation, getattr(annotation, "__name__", str(annotation)))


def _coerce(value: Any, annotation: Any) -> Any:
    """``value`` as ``annotation`` wants it; raises ``ValueError`` if it cannot be."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        # Exact matches first, so that "5" stays a string where a string is allowed.
        for option in options:
            if option is not type(None) and _matches(value, option):
                return value
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option)
            except ValueError:
                continue
        raise ValueError
    if origin is Literal:
        if value in typing.get_args(annotation):
            return value
        raise ValueError
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ValueError
    if annotation in (int, float):
        # An int is a number; a float is not an integer (group_size: 4.5); a bool is neither.
        numbers = (int,) if annotation is int else (int, float)
        if isinstance(value, numbers) and not isinstance(value, bool):
            return annotation(value)
        if isinstance(value, str):
            return annotation(value.strip())
        raise ValueError
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ValueError
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation(value)
    if origin in (dict, list) or annotation in (dict, list):
        if isinstance(value, origin or annotation):
            return value
        raise ValueError
    return value  # anything else (a config object): the dataclass checks it


def _matches(value: Any, annotation: Any) -> bool:
    if annotation in (int, float) and isinstance(value, bool):
        return False
    if annotation is float:
        return isinstance(value, float)
    base = typing.get_origin(annotation) or annotation
    return isinstance(base, type) and isinstance(value, base)


def check_values(values: dict[str, Any], config_class: type, extra: typing.Collection[str] = (), source: str = "config") -> dict[str, Any]:
    """``values`` with each checked and converted against ``config_class``'s annotation.

    Keys in ``extra`` are passed through unchecked (the caller handles them).

    Raises:
        ConfigError: naming ``source``, the field and the type it expects.
    """
    hints = typing.get_type_hints(config_class)
    fields = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - fields - set(extra))
    if unknown:
        names = [*fields, *extra]
        raise ConfigError(f"{source}: {unknown_keys_message(unknown, names, 'config field')}; `envhub train --help-config` lists the fields")
    checked = {}
    for key, value in values.items():
        if key in extra:
            checked[key] = value
            continue
        try:
            checked[key] = _coerce(value, hints[key])
        except (ValueError, TypeError):
            hint = ""
            if isinstance(value, bool) and _takes_text_not_bool(hints[key]):
                hint = " (YAML reads an unquoted no, off, yes or on as true or false: quote the word)"
            raise ConfigError(f"{source}: {key} must be {_describe(hints[key])}, got {value!r}{hint}") from None
    return checked


def _takes_text_not_bool(annotation: Any) -> bool:
    """Whether a field of ``annotation`` takes a string but not a boolean (``save_strategy``)."""
    origin = typing.get_origin(annotation)
    options = typing.get_args(annotation) if origin in (Union, types.UnionType) else (annotation,)
    return str in options and bool not in options


def settings_from_mapping(cls: type, values: typing.Mapping[str, Any], key: str) -> Any:
    """``cls(**values)`` for a config file's ``key`` mapping of ``cls``'s dataclass fields; a value
    that is not a mapping, or an unknown key, is a ValueError that lists the known ones."""
    known = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(values, typing.Mapping):
        raise ValueError(f"{key} must be a mapping of {known}, got {values!r}")
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{unknown_keys_message(unknown, known, key + ' key')}; known: {known}")
    return cls(**values)


def _text_fields(config_class: type) -> set[str]:
    """The fields of ``config_class`` that take a string and no boolean."""
    hints = typing.get_type_hints(config_class)
    return {f.name for f in dataclasses.fields(config_class) if _takes_text_not_bool(hints[f.name])}


def read_yaml_mapping(path: str) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` (empty for an empty file)."""
    try:
        with open(path, encoding="utf-8") as handle:
            values = yaml.safe_load(handle)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{at}: {problem}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path} must hold a mapping of config fields, got {type(values).__name__}")
    return values


def apply_overrides(values: dict[str, Any], overrides: typing.Iterable[str], config_class: type | None = None) -> dict[str, Any]:
    """``values`` updated by Hydra-style ``KEY=VALUE`` overrides (``VALUE`` read as YAML, so
    ``max_steps=200`` is an integer); ``a.b=VALUE`` sets key ``b`` of the mapping ``a``.

    A field of ``config_class`` that takes a string and no boolean keeps ``VALUE`` as written:
    YAML would read ``save_strategy=no`` as false, which the field refuses.

    ``envs.<env id>.KEY=VALUE`` sets one env's setting in a mix. An env id the config's ``envs:``
    does not hold is refused, naming the ones it does: a typo must not add a second, unconfigured env.
    """
    values = dict(values)
    for override in overrides:
        key, sep, raw = override.partition("=")
        key = key.strip().removeprefix("--")
        if not sep or not key:
            raise ConfigError(f"override {override!r} is not KEY=VALUE")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        target = values
        *parents, leaf = key.split(".")
        if isinstance(value, bool) and not parents and config_class is not None and leaf in _text_fields(config_class):
            value = raw.strip()
        envs = values.get("envs")
        if parents[:1] == ["envs"] and len(parents) > 1 and isinstance(envs, dict) and parents[1] not in envs:
            raise ConfigError(f"override {override!r}: envs has no {parents[1]!r}; it has {sorted(envs)}")
        for parent in parents:
            child = target.get(parent)
            target[parent] = child = dict(child) if isinstance(child, dict) else {}
            target = child
        target[leaf] = value
    return values


def _flag_key(flag: str) -> str:
    """``--max-steps`` as the key ``max_steps``; a dotted flag's parts each so, but an env id
    after ``envs.`` keeps its dashes (``--envs.frozenlake/FrozenLake-v0.max-turns``)."""
    parts = flag.removeprefix("--").split(".")
    return ".".join(p if i and parts[i - 1] == "envs" else p.replace("-", "_") for i, p in enumerate(parts))


def _takes_bool(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    return bool in (typing.get_args(annotation) if origin in (Union, types.UnionType) else (annotation,))


def flags_as_overrides(
    args: typing.Sequence[str], config_class: type, extra: typing.Collection[str] = (), options: typing.Collection[str] = (),
) -> list[str]:
    """``args`` with TRL's and transformers' flag habits written as ``KEY=VALUE`` overrides:
    ``--max-steps 5``, ``--max_steps 5`` and ``--max-steps=5`` are ``max_steps=5``, and a flag of a
    boolean field without a value (``--bf16``) is ``bf16=true``. Other arguments pass unchanged.

    ``extra`` are further top-level keys (``warm_start``, ``lora``...); ``options`` the command's own
    flags, offered with the fields' when a flag is unknown.

    Raises:
        ConfigError: for a flag that names no field (with the closest one) or lacks its value.
    """
    hints = typing.get_type_hints(config_class)
    fields = [f.name for f in dataclasses.fields(config_class) if f.init]
    out, rest = [], list(args)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--"):
            out.append(arg)
            continue
        flag, sep, value = arg.partition("=")
        key = _flag_key(flag)
        top = key.split(".")[0]
        if top not in fields and top not in extra:
            known = [*options, *(f"--{n.replace('_', '-')}" for n in [*fields, *extra])]
            raise ConfigError(f"no such option: {flag}{did_you_mean(flag, known)}; `envhub train --help-config` lists the config fields")
        if not sep:
            following = rest[0] if rest else "--"
            if not following.startswith("--") and following.partition("=")[0].split(".")[0] not in (*fields, *extra):
                value = rest.pop(0)
            elif top == key and _takes_bool(hints[key]):
                value = "true"
            else:
                raise ConfigError(f"{flag} needs a value ({flag} VALUE, or {key}=VALUE)")
        out.append(f"{key}={value}")
    return out
