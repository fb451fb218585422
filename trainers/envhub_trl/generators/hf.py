"""``HFGenerator``: sampling with transformers' ``generate``, the reference on any machine."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from envhub.chat import stop_token_ids
from envhub.generation import Completion, Prompt, SamplingParams


class HFGenerator:
    """Complete token-id prompts with a transformers causal LM.

    Prompts are left-padded into batches of ``batch_size``. Logprobs are those of the distribution
    actually sampled from (after temperature, top-k and top-p), like vLLM's
    ``logprobs_mode="processed_logprobs"``; a batch keeps its scores in memory, so ``batch_size``
    bounds memory for large vocabularies.

    Args:
        model: a causal LM (its training mode is restored after generating).
        tokenizer: its tokenizer (pad token, decoding, and the chat template, from which the
            tokens that end a reply come: :func:`envhub.chat.stop_token_ids`).
        batch_size: prompts per ``generate`` call.
    """

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 64):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        # A reply ends at its turn's end, which the chat template knows; tokenizer.eos_token may be
        # another token (SmolLM2's GGUF: <|im_start|>). Without a template, the eos tokens end it.
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model.generation_config.eos_token_id
        stop = stop_token_ids(tokenizer) if getattr(tokenizer, "chat_template", None) else []
        self.eos_ids = set(stop) | set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)

    @classmethod
    def from_pretrained(cls, path: str | Path, batch_size: int = 64, dtype: str = "auto", device: str | None = None) -> HFGenerator:
        """Load the model and tokenizer saved at ``path`` (CUDA when available, else CPU)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        return cls(model, tokenizer, batch_size)

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[Completion]:
        """Return one completion per prompt, in order."""
        for prompt in prompts:
            if not prompt.token_ids:
                raise ValueError("HFGenerator needs token-id prompts: give the manager a tokenizer")
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=[] if self.model.device.type == "cpu" else [self.model.device]):
                if sampling.seed is not None:
                    torch.manual_seed(sampling.seed)
                completions: list[Completion] = []
                for start in range(0, len(prompts), self.batch_size):
                    completions += self._generate_batch(prompts[start : start + self.batch_size], sampling)
        finally:
            self.model.train(was_training)
        return completions

    @torch.no_grad()
    def _generate_batch(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[Completion]:
        device = self.model.device
        width = max(len(p.token_ids) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt.token_ids) :] = torch.tensor(prompt.token_ids)
            attention[row, width - len(prompt.token_ids) :] = 1
        options: dict[str, Any] = {"do_sample": sampling.temperature > 0}
        if sampling.temperature > 0:
            options.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=max(sampling.top_k, 0))
        output = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=sorted(self.eos_ids) or None,
            pad_token_id=self.pad_id,
            output_scores=True,
            return_dict_in_generate=True,
            **options,
        )
        new = output.sequences[:, width:].cpu()
        scores = torch.stack(output.scores, dim=1).float().log_softmax(dim=-1).cpu()
        chosen = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        completions = []
        for row in range(len(prompts)):
            ids = new[row].tolist()
            end = next((i + 1 for i, t in enumerate(ids) if t in self.eos_ids), None)
            finish = "stop" if end is not None else "length"
            ids = ids[:end] if end is not None else ids
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            completions.append(Completion(ids, chosen[row, : len(ids)].tolist(), text, finish))
        return completions
