"""Model-backed generators: transformers ``generate``, in-process vLLM, and a ``vllm serve`` client.

Each implements :class:`envhub.generation.Generator`: token-id prompts in, completion token ids,
their sampling logprobs, text and finish reason out, and registers itself as a backend under its
name, declaring its capabilities (:mod:`envhub_trl.generators.registry`). vLLM is imported only
when a vLLM generator is built.
"""

from collections.abc import Sequence
from typing import Any

from envhub.generation import Generator
from envhub_trl.generators.hf import HFGenerator
from envhub_trl.generators.vllm_engine import VLLMGenerator
from envhub_trl.generators.vllm_server import VLLMServerGenerator
from envhub_trl.generators.registry import BACKENDS, Capabilities, backend, capabilities_of, register_generator

__all__ = [
    "BACKENDS",
    "loaders",
    "Capabilities",
    "HFGenerator",
    "VLLMGenerator",
    "VLLMServerGenerator",
    "backend",
    "capabilities_of",
    "load_generator",
    "make_generator",
    "register_generator",
]


def make_generator(kind: str, model: str, env_ids: Sequence[str] | None = None, seed: int = 0, **kwargs: Any) -> Generator:
    """Build the generator backend ``kind`` (``"hf"``, ``"vllm"``, or any registered one that can
    load a folder) for ``model``: ``tiny``, ``smollm2-135m``, a folder or a hub id
    (:func:`envhub_trl.models.resolve_model`, which ``env_ids`` and ``seed`` reach). A ``kind``
    that cannot load a folder is refused before the model is resolved: building ``tiny`` for every
    installed env takes a minute on 2 cores."""
    from envhub_trl.models import resolve_model

    _check_loader(kind)
    return load_generator(kind, resolve_model(model, env_ids, seed), **kwargs)


def loaders() -> list[str]:
    """The registered generators that can load a model folder (``from_path``), sorted."""
    return sorted(name for name, b in BACKENDS.items() if b.from_path is not None)


def load_generator(kind: str, path: str, **kwargs: Any) -> Generator:
    """Build the generator backend ``kind`` for a model folder or hub id ``path`` already resolved
    (:func:`envhub_trl.models.resolve_model`), so that a command resolves its model once."""
    _check_loader(kind)
    return backend(kind).from_path(path, **kwargs)


def _check_loader(kind: str) -> None:
    if kind not in loaders():
        raise ValueError(f"generator {kind!r} cannot load a model folder; choose one of {', '.join(loaders())}")
