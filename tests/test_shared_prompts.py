"""share_prompt_forward: one forward pass per distinct prompt gives TRL's log-probs, entropies and gradients."""

from __future__ import annotations

import pytest
import torch

from envhub_trl.shared_prompts import distinct_rows, shared_prompt_logps


def _model(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        tie_word_embeddings=True, pad_token_id=0, dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model


def _rows(rows: int = 24, distinct: int = 5, width: int = 6, seed: int = 0):
    """TRL's layout: left-padded prompts (``distinct`` of them, of several lengths), right-padded replies of ``width``."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 97, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g) for _ in range(distinct)]
    longest = max(len(p) for p in prompts)
    ids = torch.randint(1, 97, (rows, longest + width), generator=g)  # padding positions hold junk ids, as padding may
    mask = torch.zeros_like(ids)
    for row in range(rows):
        prompt = prompts[row % distinct]
        ids[row, longest - len(prompt) : longest] = prompt
        mask[row, longest - len(prompt) : longest] = 1
        mask[row, longest : longest + 1 + row % width] = 1
    return ids, mask


def _trl(model, ids, mask, width):
    """What TRL's ``_get_per_token_logps_and_entropies`` computes: the whole row in one pass."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-width] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -width:], out.entropy[:, -width:]


def test_distinct_rows_ignore_the_ids_under_padding():
    ids = torch.tensor([[5, 1, 2], [9, 1, 2], [0, 1, 3], [7, 7, 7]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [0, 1, 1], [1, 1, 1]])
    first, inverse = distinct_rows(ids, mask)
    assert len(first) == 3
    assert inverse[0] == inverse[1] != inverse[2]
    assert torch.equal(inverse[first], torch.arange(3))  # each distinct row's representative is one of its own


def test_one_pass_per_prompt_gives_the_whole_rows_log_probs_entropies_and_gradients():
    model = _model()
    ids, mask = _rows()
    width = 6
    reference = _trl(model, ids, mask, width)
    tokens = mask[:, -width:].float()
    (reference[0] * tokens).sum().add((reference[1] * tokens).sum()).backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    logps, entropies, prompts = shared_prompt_logps(model, ids, mask, width, compute_entropy=True)
    assert prompts == 5
    torch.testing.assert_close(logps * tokens, reference[0].detach() * tokens, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropies * tokens, reference[1].detach() * tokens, rtol=1e-5, atol=1e-5)
    (logps * tokens).sum().add((entropies * tokens).sum()).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-5, msg=name)


def test_one_pass_per_prompt_under_a_lora_adapter():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_model(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    ids, mask = _rows(seed=1)
    width = 6
    tokens = mask[:, -width:].float()
    reference, _ = _trl(model, ids, mask, width)
    (reference * tokens).sum().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    logps, _, _ = shared_prompt_logps(model, ids, mask, width)
    torch.testing.assert_close(logps * tokens, reference.detach() * tokens, rtol=1e-5, atol=1e-5)
    (logps * tokens).sum().backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-5, msg=name)


def test_share_prompt_forward_is_refused_with_gradient_checkpointing(tmp_path):
    from trl_helpers import lake_config

    with pytest.raises(ValueError, match="share_prompt_forward"):
        lake_config(tmp_path, share_prompt_forward=True, gradient_checkpointing=True)
    for reads_hidden_states in ({"advantage_estimator": "ppo"}, {"action_entropy_coef": 0.01}):  # read off the second pass
        assert lake_config(tmp_path, share_prompt_forward=True, gradient_checkpointing=False, **reads_hidden_states).share_prompt_forward
