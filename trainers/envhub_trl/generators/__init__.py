"""Model-backed generators: transformers ``generate``, in-process vLLM, and a ``vllm serve`` client.

Each implements :class:`envhub.generation.Generator`: token-id prompts in, completion token ids,
their sampling logprobs, text and finish reason out. vLLM is imported only when a vLLM generator
is built.
"""

from typing import Any

from envhub.generation import Generator
from envhub_trl.generators.hf import HFGenerator
from envhub_trl.generators.vllm_engine import VLLMGenerator
from envhub_trl.generators.vllm_server import VLLMServerGenerator

__all__ = ["HFGenerator", "VLLMGenerator", "VLLMServerGenerator", "make_generator"]


def make_generator(kind: str, model_path: str, **kwargs: Any) -> Generator:
    """Build the generator ``kind`` (``"hf"`` or ``"vllm"``) for the model at ``model_path``."""
    if kind == "hf":
        return HFGenerator.from_pretrained(model_path, **kwargs)
    if kind == "vllm":
        return VLLMGenerator(model_path, **kwargs)
    raise ValueError(f"unknown generator {kind!r}; choose hf or vllm")
