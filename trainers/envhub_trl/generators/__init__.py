"""Model-backed generators: transformers ``generate``, in-process vLLM, and a ``vllm serve`` client.

Each implements :class:`envhub.generation.Generator`: token-id prompts in, completion token ids,
their sampling logprobs, text and finish reason out. vLLM is imported only when a vLLM generator
is built.
"""

from collections.abc import Sequence
from typing import Any

from envhub.generation import Generator
from envhub_trl.generators.hf import HFGenerator
from envhub_trl.generators.vllm_engine import VLLMGenerator
from envhub_trl.generators.vllm_server import VLLMServerGenerator

__all__ = ["HFGenerator", "VLLMGenerator", "VLLMServerGenerator", "make_generator"]


def make_generator(kind: str, model: str, env_ids: Sequence[str] | None = None, seed: int = 0, **kwargs: Any) -> Generator:
    """Build the generator ``kind`` (``"hf"`` or ``"vllm"``) for ``model``: ``tiny``, ``smollm2-135m``,
    a folder or a hub id (:func:`envhub_trl.models.resolve_model`, which ``env_ids`` and ``seed`` reach)."""
    from envhub_trl.models import resolve_model

    if kind not in ("hf", "vllm"):
        raise ValueError(f"unknown generator {kind!r}; choose hf or vllm")
    path = resolve_model(model, env_ids, seed)
    if kind == "hf":
        return HFGenerator.from_pretrained(path, **kwargs)
    return VLLMGenerator(path, **kwargs)
