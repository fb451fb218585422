"""A training run's description, :class:`RunSpec`: the trainer's config, the warm start, the model,
the tiny model's spec and a LoRA adapter, read from a YAML file and ``KEY=VALUE`` overrides in one
place (:meth:`RunSpec.read`), checked before anything loads. :mod:`envhub_trl.run` runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import click

from envhub.error import EnvhubError

#: Keys of a config file that are not EnvGRPOConfig fields: the warm start (a mapping of
#: :class:`envhub_trl.warm_start.WarmStart` fields), how ``--model tiny`` is built (a mapping
#: of :class:`envhub_trl.tiny.TinySpec` fields) and a LoRA adapter (a mapping of
#: :class:`envhub_trl.lora.LoraSettings` fields).
RUN_KEYS = ("warm_start", "tiny", "lora")


def load_config_file(path: str | None, overrides: Sequence[str] = (), ignore: Sequence[str] = ()) -> dict[str, Any]:
    """The fields of a YAML config file (empty without one) with Hydra-style ``KEY=VALUE``
    ``overrides`` applied: EnvGRPOConfig fields and :data:`RUN_KEYS`, each checked against its
    annotation (and converted where safe: ``1e-4`` read as a string becomes a float) before
    anything loads. Keys in ``ignore`` are the caller's own (``bench/learning.py``'s ``model`` and
    ``targets``): left out, not checked.

    Raises:
        click.ClickException: for malformed YAML, an unknown field or a value of the wrong type,
            naming the field and the type it expects.
    """
    from envhub_trl.config import EnvGRPOConfig
    from envhub_trl.config_file import ConfigError, apply_overrides, check_values, read_yaml_mapping

    try:
        values = read_yaml_mapping(path) if path is not None else {}
        values = apply_overrides({k: v for k, v in values.items() if k not in ignore}, overrides, EnvGRPOConfig)
        return check_values(values, EnvGRPOConfig, extra=RUN_KEYS, source=path or "config")
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def split_warm_start(values: dict[str, Any], source: str | None = None, overrides: dict[str, Any] | None = None) -> Any:
    """Take the ``warm_start`` mapping out of config ``values`` (in place) as a
    :class:`~envhub_trl.warm_start.WarmStart`, with ``overrides`` (its fields) applied.

    Raises:
        click.ClickException: for a bad mapping, naming ``source`` (the config file).
    """
    from envhub_trl.warm_start import WarmStart

    mapping = values.pop("warm_start", None)
    try:
        if mapping is not None and not isinstance(mapping, dict):
            raise ValueError(f"warm_start must be a mapping of WarmStart fields, got {mapping!r}")
        return WarmStart.from_mapping({**(mapping or {}), **(overrides or {})})
    except ValueError as exc:
        raise click.ClickException(f"{source or 'config'}: {exc}") from exc


@dataclass(frozen=True)
class RunSpec:
    """One training run, as ``envhub train`` and the learning benchmark describe it.

    Attributes:
        args: the trainer's config (``output_dir`` included).
        model: ``tiny``, ``smollm2-135m``, a model folder or a hub id.
        warm_start: the supervised start before RL (inactive with no steps).
        tiny: how ``--model tiny`` is built (None: not given).
        lora: a LoRA adapter to train instead of every weight (None: every weight).
        config: the config as the run records it (results.json's ``config``, each checkpoint's
            record): the values given, without ``output_dir``, with ``tiny`` and ``lora``.
        resume_from: the config's ``resume_from_checkpoint`` (it means ``--resume PATH``).
    """

    args: Any
    model: str = "tiny"
    warm_start: Any = None
    tiny: Any = None
    lora: Any = None
    config: Mapping[str, Any] = field(default_factory=dict)
    resume_from: str | None = None

    @classmethod
    def read(
        cls,
        path: str | None,
        overrides: Sequence[str] = (),
        *,
        model: str = "tiny",
        fields: Mapping[str, Any] | None = None,
        warm_start: Mapping[str, Any] | None = None,
    ) -> RunSpec:
        """A run from a YAML file, its ``KEY=VALUE`` ``overrides``, then ``fields`` given on the
        command line (EnvGRPOConfig fields, and ``lora``, whose keys go over the file's) and
        ``warm_start`` fields (over the file's ``warm_start`` mapping).

        Raises:
            click.ClickException: naming the file or the field, before anything loads.
        """
        values = load_config_file(path, overrides)
        for key, value in (fields or {}).items():
            values[key] = {**(values.get(key) or {}), **value} if key == "lora" else value
        return cls.from_values(values, model, split_warm_start(values, path, dict(warm_start or {})))

    @classmethod
    def from_values(cls, values: Mapping[str, Any], model: str = "tiny", warm_start: Any = None) -> RunSpec:
        """A run from EnvGRPOConfig field values (``output_dir`` included; ``tiny`` and ``lora``
        mappings may be among them) and a :class:`~envhub_trl.warm_start.WarmStart` (None: none).

        Raises:
            click.ClickException: ``bad configuration: ...``, for a field, an env or a mapping
                that is refused, before anything loads.
        """
        from envhub_trl.config import EnvGRPOConfig
        from envhub_trl.lora import LoraSettings
        from envhub_trl.tiny import TinySpec
        from envhub_trl.warm_start import WarmStart

        values = dict(values)
        values.setdefault("report_to", "none")
        resume_from = values.pop("resume_from_checkpoint", None)  # a config's way of saying --resume PATH
        tiny_values, lora_values = values.pop("tiny", None), values.pop("lora", None)
        try:
            args = EnvGRPOConfig(**values)
            args.check_envs()
            tiny = TinySpec.from_mapping(tiny_values)
            lora = LoraSettings.from_mapping(lora_values)
            if tiny_values is not None and model != "tiny":
                raise ValueError(f"tiny settings are for --model tiny, not {model!r}")
        except (TypeError, ValueError, EnvhubError) as exc:
            raise click.ClickException(f"bad configuration: {exc}") from exc
        config = {k: v for k, v in values.items() if k != "output_dir"}
        if tiny_values is not None:
            config["tiny"] = dict(tiny_values)
        if lora is not None:
            config["lora"] = lora.record()
        return cls(args, model, warm_start if warm_start is not None else WarmStart(), tiny, lora, config, resume_from)

    def record(self) -> dict[str, Any]:
        """What a checkpoint keeps of this run, to check that a resume continues the same one."""
        return {"model": self.model, "config": dict(self.config), "warm_start": dataclasses.asdict(self.warm_start)}
