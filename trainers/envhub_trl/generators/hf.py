"""``HFGenerator``: sampling with transformers' ``generate``, the reference on any machine."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from envhub.chat import stop_token_ids
from envhub.generation import Completion, Prompt, SamplingParams, cut_at_stop
from envhub_trl.generators.registry import Capabilities, register_generator


class HFGenerator:
    """Complete token-id prompts with a transformers causal LM.

    Prompts are left-padded into batches of ``batch_size``. Logprobs are those of the distribution
    actually sampled from (after temperature, top-k and top-p), like vLLM's
    ``logprobs_mode="processed_logprobs"``; a batch keeps its scores in memory, so ``batch_size``
    bounds memory for large vocabularies.

    :meth:`generate` seeds one sampler for the whole call; :meth:`generate_each` gives every
    prompt its own :class:`SamplingParams` and samples each from its own seed, so a completion does
    not depend on which other requests share its batch (continuous and async rollouts, where
    requests arrive in any order, stream through it).

    Args:
        model: a causal LM (its training mode is restored after generating).
        tokenizer: its tokenizer (pad token, decoding, and the chat template, from which the
            tokens that end a reply come: :func:`envhub.chat.stop_token_ids`).
        batch_size: prompts per ``generate`` call.
    """

    #: It samples with the model object it is given (the trained one: nothing to sync).
    capabilities = Capabilities(weight_sync="shared", per_request_seeds=True, logprobs=True)

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

    def with_model(self, model: Any) -> HFGenerator:
        """The same generator over another model object (an async producer's own copy of the weights)."""
        return HFGenerator(model, self.tokenizer, self.batch_size)

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

    def generate_each(self, prompts: Sequence[Prompt], samplings: Sequence[SamplingParams]) -> list[Completion]:
        """One completion per prompt, each sampled with its own ``SamplingParams``, in order.

        A prompt whose sampling has a seed is sampled from a generator of that seed alone (by the
        Gumbel-max trick on the processed distribution), so its completion is the same whatever
        else is batched with it, up to floating-point near-ties between batch shapes. Prompts whose
        samplings differ in anything but the seed go in separate batches.
        """
        if len(samplings) != len(prompts):
            raise ValueError(f"generate_each needs one sampling per prompt, got {len(samplings)} for {len(prompts)}")
        for prompt in prompts:
            if not prompt.token_ids:
                raise ValueError("HFGenerator needs token-id prompts: give the manager a tokenizer")
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, sampling in enumerate(samplings):
            groups.setdefault((sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k), []).append(index)
        out: list[Completion | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=[] if self.model.device.type == "cpu" else [self.model.device]):
                for indices in groups.values():
                    for start in range(0, len(indices), self.batch_size):
                        chunk = indices[start : start + self.batch_size]
                        seeds = [samplings[i].seed for i in chunk]
                        done = self._generate_batch([prompts[i] for i in chunk], samplings[chunk[0]], seeds=seeds)
                        for index, completion in zip(chunk, done):
                            out[index] = completion
        finally:
            self.model.train(was_training)
        return out  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_batch(self, prompts: Sequence[Prompt], sampling: SamplingParams, seeds: Sequence[int | None] | None = None) -> list[Completion]:
        device = self.model.device
        width = max(len(p.token_ids) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt.token_ids) :] = torch.tensor(prompt.token_ids)
            attention[row, width - len(prompt.token_ids) :] = 1
        options: dict[str, Any] = {"do_sample": sampling.temperature > 0}
        sampler = None
        if sampling.temperature > 0 and seeds is not None:
            # Each row samples from its own generator: greedy decoding of the processed log-probs
            # plus Gumbel noise drawn per row is a draw from that row's processed distribution.
            sampler = _RowSeededSampler(sampling, seeds)
            options = {"do_sample": False, "logits_processor": [sampler], "temperature": None, "top_p": None, "top_k": None}
        elif sampling.temperature > 0:
            options.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=max(sampling.top_k, 0))
        stops = sorted({stop for prompt in prompts for stop in prompt.stop_strings})
        if stops:
            options["stopping_criteria"] = [_StopStrings(self.tokenizer, width, stops)]
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
        steps = sampler.processed if sampler is not None else output.scores
        scores = torch.stack(list(steps), dim=1).float().log_softmax(dim=-1).cpu()
        chosen = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        completions = []
        for row in range(len(prompts)):
            ids = new[row].tolist()
            end = next((i + 1 for i, t in enumerate(ids) if t in self.eos_ids), None)
            if prompts[row].stop_strings:
                end = _stop_end(self.tokenizer, ids[:end], prompts[row].stop_strings) or end
            finish = "stop" if end is not None else "length"
            ids = ids[:end] if end is not None else ids
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            completions.append(Completion(ids, chosen[row, : len(ids)].tolist(), text, finish))
        return completions


def _stop_end(tokenizer: Any, ids: Sequence[int], stop_strings: Sequence[str]) -> int | None:
    """How many of ``ids`` make a text that holds one of ``stop_strings`` (the shortest such
    prefix), or None when their text holds none."""
    if cut_at_stop(tokenizer.decode(list(ids), skip_special_tokens=True), stop_strings) is None:
        return None
    return next(k for k in range(1, len(ids) + 1) if cut_at_stop(tokenizer.decode(list(ids[:k]), skip_special_tokens=True), stop_strings) is not None)


class _StopStrings:
    """A stopping criterion: a row is done once its new tokens' text holds one of ``stop_strings``
    (:func:`_stop_end` then cuts it there)."""

    def __init__(self, tokenizer: Any, width: int, stop_strings: Sequence[str]):
        self.tokenizer, self.width, self.stop_strings = tokenizer, width, list(stop_strings)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.width :], skip_special_tokens=True)
        return torch.tensor([cut_at_stop(text, self.stop_strings) is not None for text in texts], device=input_ids.device)


class _RowSeededSampler:
    """A logits processor that samples each row from its own seed: it applies temperature, top-k
    and top-p as ``generate`` would, keeps the processed scores (the log-probs a completion
    reports), and returns them plus Gumbel noise from the row's generator, so that greedy decoding
    picks a draw from the processed distribution. A row without a seed draws fresh noise."""

    def __init__(self, sampling: SamplingParams, seeds: Sequence[int | None]):
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        warpers: list[Any] = [TemperatureLogitsWarper(sampling.temperature)]
        if sampling.top_k > 0:
            warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            warpers.append(TopPLogitsWarper(sampling.top_p))
        self.warpers = LogitsProcessorList(warpers)
        self.generators = [torch.Generator().manual_seed(int(seed)) if seed is not None else None for seed in seeds]
        self.processed: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        processed = self.warpers(input_ids, scores.float())
        self.processed.append(processed)
        rows, vocab = processed.shape
        uniform = torch.stack([torch.rand(vocab, generator=g) if g is not None else torch.rand(vocab) for g in self.generators])
        gumbel = -torch.log(-torch.log(uniform.clamp_(min=1e-20, max=1.0 - 1e-7)))
        return processed.log_softmax(dim=-1) + gumbel.to(processed.device)


@register_generator("hf", from_path=HFGenerator.from_pretrained)
def build_hf(model: Any, tokenizer: Any, args: Any, **kwargs: Any) -> HFGenerator:
    """The trainer's ``hf`` generator: transformers ``generate`` on the trained model itself."""
    return HFGenerator(model, tokenizer, **kwargs)
