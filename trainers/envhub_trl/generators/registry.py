"""Generator backends as plug-ins: each registers under a name and declares what it can do.

A backend is one module that calls :func:`register_generator` with a builder (how the trainer makes
it from the model being trained and the run's config) and, optionally, how ``envhub eval`` makes it
from a model folder. What a generator can do is its class's ``capabilities``
(:class:`Capabilities`); the trainer asks :func:`capabilities_of` instead of testing classes, so a
generator given by hand (``EnvGRPOTrainer(..., generator=...)``) works by the same rules. Adding a
backend is one file plus its test::

    @register_generator("mine", from_path=MyGenerator.from_pretrained)
    def build(model, tokenizer, args, **kwargs):
        return MyGenerator(model, tokenizer, **kwargs)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

#: How a generator comes to sample with the trained weights:
#: ``shared``: it samples with the trained model object itself (nothing to send; an async producer
#: needs its own copy of the model); ``local``: it holds its own copy, refreshed by
#: ``load_weights(model)`` in every process; ``server``: a server holds it, refreshed by
#: ``load_weights(model)`` from the main process while the others wait; ``none``: its weights never
#: change (a scripted policy).
WeightSync = Literal["shared", "local", "server", "none"]
WEIGHT_SYNCS = ("shared", "local", "server", "none")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What a generator can do.

    Attributes:
        weight_sync: how it gets the trained weights (see :data:`WeightSync`).
        per_request_seeds: whether each request of a batch samples from its own seed, so a
            completion does not depend on what it is batched with (continuous rollouts rely on it).
        logprobs: whether it returns the sampling log-probability of each token (async rollouts
            correct for their lag with them).
    """

    weight_sync: WeightSync
    per_request_seeds: bool
    logprobs: bool

    def __post_init__(self) -> None:
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"weight_sync must be one of {WEIGHT_SYNCS}, got {self.weight_sync!r}")


#: Builds a backend's generator for a trainer: ``(model, tokenizer, args, **generator_kwargs)``.
Builder = Callable[..., Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Backend:
    """A registered generator backend.

    Attributes:
        name: what ``EnvGRPOConfig.generator`` and ``envhub eval --generator`` call it.
        build: makes the trainer's generator: ``build(model, tokenizer, args, **generator_kwargs)``.
        from_path: makes a generator from a model folder (``envhub eval``), or None if it cannot.
        in_sync_when_built: whether a freshly built generator already holds the model's current
            weights (so the first weight sync is skipped).
        needs_server_url: whether it needs ``EnvGRPOConfig.vllm_server_url``.
    """

    name: str
    build: Builder
    from_path: Callable[..., Any] | None = None
    in_sync_when_built: bool = False
    needs_server_url: bool = False


#: Every registered backend, by name.
BACKENDS: dict[str, Backend] = {}


def register_generator(
    name: str,
    *,
    from_path: Callable[..., Any] | None = None,
    in_sync_when_built: bool = False,
    needs_server_url: bool = False,
) -> Callable[[Builder], Builder]:
    """Register the decorated builder as the generator backend ``name`` (a name is taken once)."""

    def decorate(build: Builder) -> Builder:
        if name in BACKENDS:
            raise ValueError(f"a generator backend named {name!r} is already registered")
        BACKENDS[name] = Backend(
            name=name, build=build, from_path=from_path, in_sync_when_built=in_sync_when_built, needs_server_url=needs_server_url
        )
        return build

    return decorate


def backend(name: str) -> Backend:
    """The backend registered as ``name``.

    Raises:
        ValueError: naming the registered backends.
    """
    found = BACKENDS.get(name)
    if found is None:
        raise ValueError(f"unknown generator {name!r}; choose one of {', '.join(sorted(BACKENDS))}")
    return found


def capabilities_of(generator: Any) -> Capabilities:
    """What ``generator`` can do: its ``capabilities`` when it declares them; otherwise read from
    the methods it has (a generator written before capabilities, or a test double): a
    ``load_weights(model)`` method means ``local`` weight sync, ``generate_each`` per-request seeds."""
    declared = getattr(generator, "capabilities", None)
    if isinstance(declared, Capabilities):
        return declared
    return Capabilities(
        weight_sync="local" if callable(getattr(generator, "load_weights", None)) else "none",
        per_request_seeds=callable(getattr(generator, "generate_each", None)),
        logprobs=True,
    )
