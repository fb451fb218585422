"""Helpers for trainer tests: a generator (shared with the torchrun script), a spied training run, the tiny lake model."""

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


def lake_config(tmp_path, **overrides):
    """A small GRPO config on the non-slippery FrozenLake, on the CPU (``overrides`` replace its fields)."""
    from envhub_trl.config import EnvGRPOConfig

    values = dict(
        output_dir=str(tmp_path), env_id="frozenlake/FrozenLakeNotSlippery-v0", max_turns=4, groups_per_step=2, group_size=4,
        per_device_train_batch_size=8, max_steps=2, max_turn_tokens=8, logging_steps=1, report_to="none", learning_rate=1e-3,
        use_cpu=True, save_strategy="no", disable_tqdm=True, seed=3,
    )
    values.update(overrides)
    return EnvGRPOConfig(**values)


def save_tiny_lake_model(path):
    """The tiny model and a tokenizer fitted to FrozenLake's text, saved at ``path``; returns ``(path, tokenizer)``."""
    from envhub_trl.tiny import build_model, build_tokenizer, environment_corpus

    tokenizer = build_tokenizer(environment_corpus(["frozenlake/FrozenLakeNotSlippery-v0"], seeds=4))
    build_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, tokenizer


def spied_run(tiny, config):
    """Train on the tiny model with the half-expert generator; return the trainer, the weights
    before, and every generation batch as the loss saw it (``output``, its ``trajectories`` and
    ``seeds``)."""
    from transformers import AutoModelForCausalLM

    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = tiny
    model = AutoModelForCausalLM.from_pretrained(path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batches = []

    class Spy(EnvGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            batches.append({"output": output, "trajectories": list(self._managers["main"][0].trajectories()), "seeds": list(self._batch_seeds)})
            return output

    trainer = Spy(model, config, processing_class=tokenizer, generator=HalfExpert(model, tokenizer))
    trainer.train()
    return trainer, before, batches
