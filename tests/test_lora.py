"""LoRA through PEFT (envhub_trl.lora): the config mapping and its checks, the merged weights a
generator receives, folding the warm start's adapter into the base, and `envhub train --lora-r`
end to end (the saved model loads without PEFT; the vLLM engine serves the merged weights)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from envhub_trl.lora import ALL_LINEAR, LoraSettings, fold_adapter, is_peft_model, merged_model, merged_weights  # noqa: E402
from envhub_trl.tiny import TinySpec  # noqa: E402

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


@pytest.fixture
def adapted():
    """A tiny model under a rank-4 adapter whose B is not zero (as after training)."""
    model, tokenizer = TinySpec().build([LAKE], seed=0)
    model = peft.get_peft_model(model, LoraSettings(r=4, alpha=8).peft_config())
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    return model.eval(), tokenizer


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_settings_read_a_mapping_and_refuse_bad_values_in_one_line():
    assert LoraSettings.from_mapping(None) is None
    lora = LoraSettings.from_mapping({"r": 8, "target_modules": ["q_proj", "v_proj"]})
    assert (lora.r, lora.alpha, lora.target_modules) == (8, 32.0, ("q_proj", "v_proj"))
    assert lora.record()["target_modules"] == ["q_proj", "v_proj"]
    config = lora.peft_config()
    assert (config.r, config.lora_alpha, set(config.target_modules)) == (8, 32.0, {"q_proj", "v_proj"})
    assert LoraSettings().target_modules == ALL_LINEAR
    for mapping, message in [
        ({"r": 0}, "lora.r must be a positive integer, got 0"),
        ({"r": True}, "lora.r must be a positive integer"),
        ({"alpha": -1}, "lora.alpha must be a positive number"),
        ({"dropout": 1.0}, r"lora.dropout must be in \[0, 1\)"),
        ({"target_modules": []}, "lora.target_modules must be 'all-linear' or a non-empty list"),
        ({"target_modules": "attention"}, "lora.target_modules must be 'all-linear' or a list of module names"),
        ({"rank": 8}, r"unknown lora key 'rank'; known: \['r', 'alpha', 'dropout', 'target_modules'\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            LoraSettings.from_mapping(mapping)
    with pytest.raises(ValueError, match="lora must be a mapping"):
        LoraSettings.from_mapping(8)


def test_merged_weights_are_the_merged_model_under_the_base_names(adapted):
    model, _ = adapted
    plain, _ = TinySpec().build([LAKE], seed=0)
    weights = merged_weights(model)
    assert set(weights) == set(plain.state_dict())  # the names vLLM loads, no lora_ or base_layer
    merged = merged_model(model)
    assert not is_peft_model(merged) and is_peft_model(model)  # a copy: the adapter stays
    for name, tensor in merged.state_dict().items():
        torch.testing.assert_close(weights[name], tensor)
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(logits(merged, ids), logits(model, ids))
    # The adapter changed the weights (else the test above would prove nothing).
    base = {n: t for n, t in model.get_base_model().state_dict().items() if "q_proj.base_layer.weight" in n}
    assert not torch.allclose(weights["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.base_layer.weight"])


def test_folding_moves_the_adapter_into_the_base_and_keeps_the_policy(adapted):
    model, _ = adapted
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    before = logits(model, ids)
    with model.disable_adapter():
        base_before = logits(model, ids)
    assert not torch.allclose(before, base_before)
    fold_adapter(model)
    torch.testing.assert_close(logits(model, ids), before, atol=1e-5, rtol=1e-5)
    with model.disable_adapter():  # PEFT's reference model is now the policy as it was
        torch.testing.assert_close(logits(model, ids), before, atol=1e-5, rtol=1e-5)
    assert all(float(p.detach().abs().max()) == 0.0 for n, p in model.named_parameters() if "lora_B" in n)
    plain, _ = TinySpec().build([LAKE], seed=0)
    fold_adapter(plain)  # a model without adapters is left alone
    torch.testing.assert_close(logits(plain, ids), logits(TinySpec().build([LAKE], seed=0)[0], ids))


@pytest.mark.slow
def test_vllm_engine_serves_the_merged_weights_of_a_lora_model(adapted, tmp_path):
    pytest.importorskip("vllm")
    from envhub.generation import Prompt, SamplingParams
    from envhub_trl.generators import VLLMGenerator

    model, tokenizer = adapted
    plain, _ = TinySpec().build([LAKE], seed=0)
    plain.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    engine = VLLMGenerator(tmp_path / "m", gpu_memory_utilization=0.05, max_model_len=256, dtype="float32", enforce_eager=True)
    prompt = tokenizer("Row 1, column 1. Down: ice. Right: hole.")["input_ids"]
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, seed=3)
    try:
        engine.load_weights(model)
        completion = engine.generate([Prompt(token_ids=prompt, messages=[])], sampling)[0]
    finally:
        del engine
    ids = torch.tensor([prompt + completion.token_ids])
    logp = torch.log_softmax(logits(model, ids)[0, len(prompt) - 1 : -1], -1)
    expected = logp.gather(1, torch.tensor(completion.token_ids).unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=2e-3, rtol=0)


@pytest.mark.slow
def test_train_with_lora_and_vllm_saves_a_merged_model_that_loads_without_peft(tmp_path):
    """What `envhub train --lora-r 4 generator=vllm` runs: a warm start of the adapter, folded in,
    RL whose vLLM engine gets the merged weights every step, the merged model saved."""
    from transformers import AutoModelForCausalLM

    from envhub_trl.run import run_training
    from envhub_trl.warm_start import WarmStart

    out = tmp_path / "out"
    values = {
        "env_id": LAKE, "output_dir": str(out), "eval_episodes": 4, "lora": {"r": 4}, "max_steps": 1, "groups_per_step": 2,
        "group_size": 2, "per_device_train_batch_size": 4, "max_turns": 3, "beta": 0.1, "gradient_checkpointing": False,
        "generator": "vllm", "generator_kwargs": {"gpu_memory_utilization": 0.05, "enforce_eager": True},
    }
    results = run_training(values, "tiny", warm_start=WarmStart(steps=3, episodes=8))
    assert results["config"]["lora"] == {"r": 4, "alpha": 32.0, "dropout": 0.0, "target_modules": "all-linear"}
    final = out / "final"
    assert not (final / "adapter_config.json").exists() and (final / "config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(final)
    assert not any("lora" in name for name in model.state_dict())
    assert json.loads((out / "results.json").read_text())["config"]["lora"]["r"] == 4


@pytest.mark.slow
def test_async_rollouts_with_lora_play_with_the_merged_weights(tmp_path, monkeypatch):
    """The async producer's generator gets the merged weights under the base names: with HF, a
    plain copy of the base model (a LoRA model cannot be rebuilt from its config: the producer
    failed to start with a TypeError)."""
    from envhub_trl.async_rollout import AsyncRollouts
    from envhub_trl.run import run_training
    from envhub_trl.warm_start import WarmStart

    posted = []
    post = AsyncRollouts.post_weights
    monkeypatch.setattr(AsyncRollouts, "post_weights", lambda self, batch, weights: (posted.append(weights), post(self, batch, weights))[1])
    values = {
        "env_id": LAKE, "output_dir": str(tmp_path / "out"), "eval_episodes": 2, "lora": {"r": 4}, "max_steps": 2, "groups_per_step": 2,
        "group_size": 2, "per_device_train_batch_size": 4, "max_turns": 3, "gradient_checkpointing": False, "learning_rate": 0.01,
        "rollout_mode": "async", "max_staleness": 1, "generator": "hf",
    }
    results = run_training(values, "tiny", warm_start=WarmStart(steps=2, episodes=4))
    assert results["rl_steps"] == 2 and len(posted) >= 2
    assert not any("lora" in name or "base_layer" in name for weights in posted for name in weights)


def test_train_refuses_bad_lora_settings_in_one_line(tmp_path):
    from click.testing import CliRunner

    from envhub.cli import cli

    result = CliRunner().invoke(cli, ["train", "--env", LAKE, "--output-dir", str(tmp_path / "o"), "lora.rank=4"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.splitlines()[-1] == "Error: bad configuration: unknown lora key 'rank'; known: ['r', 'alpha', 'dropout', 'target_modules']"
