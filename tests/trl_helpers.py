"""A generator for trainer tests, shared by tests/test_trainer.py and its torchrun script."""

from __future__ import annotations

from envhub.generation import Completion, ExpertGenerator, Prompt, SamplingParams
from envhub_trl.generators import HFGenerator


class HalfExpert:
    """The tiny model on even prompts, the expert on odd ones (so returns differ within groups)."""

    uses_expert = True

    def __init__(self, model, tokenizer):
        self.hf = HFGenerator(model, tokenizer)
        self.expert = ExpertGenerator(tokenizer=tokenizer)

    def generate(self, prompts: list[Prompt], sampling: SamplingParams) -> list[Completion]:
        model = self.hf.generate(prompts[0::2], sampling)
        expert = self.expert.generate(prompts[1::2], sampling)
        out = [None] * len(prompts)
        out[0::2], out[1::2] = model, expert
        return out


def save_tiny_lake_model(path):
    """The tiny model and a tokenizer fitted to FrozenLake's text, saved at ``path``; returns ``(path, tokenizer)``."""
    from envhub_trl.tiny import build_model, build_tokenizer, environment_corpus

    tokenizer = build_tokenizer(environment_corpus(["frozenlake/FrozenLakeNotSlippery-v0"], seeds=4))
    build_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, tokenizer
