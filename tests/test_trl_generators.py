"""The trainer package's generators, tiny model, commands and model policy, on a tiny model built here.

One vLLM engine and one ``vllm serve`` server per test session (vLLM's CPU start-up is slow); the
server is launched when this module starts and is waited for only by the test that needs it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import click  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from envhub.actions import get_format, parse_reply  # noqa: E402

import envhub  # noqa: E402
from envhub.error import PolicyError  # noqa: E402
from envhub.generation import Completion, ExpertGenerator, Prompt, SamplingParams  # noqa: E402
from envhub.play import get_player  # noqa: E402
from envhub.manager import EnvGroupManager  # noqa: E402
from envhub.rollout import rollout  # noqa: E402
from serve_helpers import free_port  # noqa: E402

LAKE = "frozenlake/FrozenLake-v0"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> Path:
    import envhub
    from envhub_trl.tiny import build_tiny

    # Every installed env's text but TextArena's medium Sokoban: its 8 resets generate levels by
    # reverse play for 77 of the build's 99 s, and its text is the small Sokoban's on a larger board.
    env_ids = [env_id for env_id in envhub.registry if env_id != "textarena/Sokoban-medium-v0"]
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", env_ids=env_ids)


@pytest.fixture(scope="session")
def tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def hf(tiny_path):
    from envhub_trl.generators import HFGenerator

    return HFGenerator.from_pretrained(tiny_path, batch_size=16, dtype="float32", device="cpu")


def forward_logprobs(model, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
    """The model's log-probabilities of ``completion_ids`` after ``prompt_ids``, by one forward pass."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()


# ---------------------------------------------------------------------------------------- vLLM server



class _Server:
    def __init__(self, model: Path, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        # `vllm serve` runs this module; vllm-cpu 0.31.0's `vllm` script looks up the distribution
        # "vllm" (it is "vllm-cpu") and exits, so the module is started directly.
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--max-model-len", "2048", "--gpu-memory-utilization", "0.1",
            "--logprobs-mode", "processed_logprobs", "--enforce-eager", "--seed", "0",
        ]
        # Development mode adds the endpoints a trainer updates the weights through.
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        self.process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)

    def wait(self, timeout: float = 300.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"vllm serve exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2):
                    return self.url
            except OSError:
                time.sleep(1.0)
        pytest.fail(f"vllm serve did not answer within {timeout}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def server(tiny_path, tmp_path_factory):
    pytest.importorskip("vllm")
    started = _Server(tiny_path, tmp_path_factory.mktemp("vllm-serve") / "server.log")
    yield started
    started.stop()


@pytest.fixture(scope="module", autouse=True)
def start_server_early(request):
    """Launch the server as the module starts, so its slow start-up overlaps the other tests."""
    if any("server" in item.fixturenames for item in request.session.items if item.module is request.module):
        request.getfixturevalue("server")


@pytest.fixture(scope="session")
def engine(tiny_path):
    pytest.importorskip("vllm")
    from envhub_trl.generators import VLLMGenerator

    return VLLMGenerator(tiny_path, gpu_memory_utilization=0.1, max_model_len=2048, dtype="float32", enforce_eager=True)


# ---------------------------------------------------------------------------------------- tiny model


@pytest.mark.slow
def test_tiny_model_is_qwen2_shaped_with_a_chat_template(tiny_path, tokenizer, hf):
    config = hf.model.config
    assert config.model_type == "qwen2" and config.hidden_size == 128 and config.num_attention_heads == 2
    assert config.hidden_size // config.num_attention_heads == 64
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    text = "Turn 3 of 20 ✓ — naïve 日本 <answer>Left</answer>"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


@pytest.mark.slow
@pytest.mark.parametrize("env_id", [LAKE, "sokoban/Sokoban-v0"])
def test_tiny_tokenizer_gives_each_grid_cell_a_token(tokenizer, env_id):
    """A text grid is one token per cell (capital letters such as "PO" or "OOO" included), so a
    cell's neighbours sit at fixed token distances; words keep their own tokens."""
    env = envhub.make(env_id)
    for seed in range(20):
        grid, _ = env.reset(seed=seed)
        for line in grid.splitlines():
            pieces = [tokenizer.decode([i]) for i in tokenizer.encode(line, add_special_tokens=False)]
            assert pieces == list(line), (line, pieces)
    assert len(tokenizer.encode(" Left", add_special_tokens=False)) == 1


@pytest.mark.slow
def test_rollout_is_token_exact_against_the_chat_template(tokenizer):
    """Multi-turn FrozenLake: prompt + completion equal the template's own tokens of the whole conversation."""
    manager = EnvGroupManager(LAKE, 2, 2, seed=4, tokenizer=tokenizer, max_turns=8)
    trajectories = rollout(manager, ExpertGenerator(tokenizer=tokenizer))
    assert max(t.num_turns for t in trajectories) >= 3
    for trajectory in trajectories:
        sample = trajectory.sample()
        full = sample.prompt_ids + sample.completion_ids
        expected = tokenizer.apply_chat_template(trajectory.messages, tokenize=True, return_dict=False)
        assert full == expected[: len(full)]
        assert tokenizer.decode(expected[len(full) :]) == "\n"  # after the last <|im_end|>, never sampled
        model_tokens = [t for t, m in zip(sample.completion_ids, sample.env_mask) if m]
        assert model_tokens == [t for turn in trajectory.turns for t in turn.completion_ids]
        env_text = tokenizer.decode([t for t, m in zip(sample.completion_ids, sample.env_mask) if not m])
        assert env_text.count("<|im_start|>user") == trajectory.num_turns - 1


# ---------------------------------------------------------------------------------------- HF generator


@pytest.mark.slow
def test_hf_generator_returns_sampled_ids_with_their_logprobs(hf, tokenizer):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Turn 1"}], add_generation_prompt=True, tokenize=True, return_dict=False)
    completions = hf.generate([Prompt(prompt, [])] * 3, SamplingParams(max_new_tokens=12, temperature=1.0, seed=0))
    assert len({tuple(c.token_ids) for c in completions}) > 1  # rows sample independently
    for completion in completions:
        assert len(completion.token_ids) == len(completion.logprobs) <= 12
        assert completion.logprobs == pytest.approx(forward_logprobs(hf.model, prompt, completion.token_ids), abs=1e-4)
        assert completion.finish_reason == ("stop" if completion.token_ids[-1] == tokenizer.eos_token_id else "length")
        assert tokenizer.eos_token_id not in completion.token_ids[:-1]
    again = hf.generate([Prompt(prompt, [])] * 3, SamplingParams(max_new_tokens=12, temperature=1.0, seed=0))
    assert [c.token_ids for c in again] == [c.token_ids for c in completions]


@pytest.mark.slow
def test_replies_end_at_the_templates_end_of_turn_when_eos_is_another_token(hf, tokenizer):
    """Qwen2.5's base models say eos is <|endoftext|> while turns end with <|im_end|>: the generator
    stops on both, and the expert's episodes are still the template's tokens."""
    from envhub.chat import end_of_turn_ids
    from envhub_trl.generators import HFGenerator

    base = copy.deepcopy(tokenizer)
    base.eos_token = "<|endoftext|>"
    im_end, endoftext = base.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert end_of_turn_ids(base) == [im_end] and HFGenerator(hf.model, base).eos_ids == {im_end, endoftext}
    for trajectory in rollout(EnvGroupManager(LAKE, 1, 2, seed=4, tokenizer=base, max_turns=4), ExpertGenerator(base)):
        sample = trajectory.sample()
        assert all(turn.completion_ids[-1] == im_end for turn in trajectory.turns)
        assert sample.prompt_ids + sample.completion_ids == base.apply_chat_template(trajectory.messages, tokenize=True, return_dict=False)[:-1]


@pytest.mark.slow
def test_hf_generator_left_pads_prompts_of_different_lengths(hf, tokenizer):
    short = tokenizer.apply_chat_template([{"role": "user", "content": "Up"}], add_generation_prompt=True, tokenize=True, return_dict=False)
    long = tokenizer.apply_chat_template([{"role": "user", "content": "Turn 1 of 20; a much longer prompt " * 3}], add_generation_prompt=True, tokenize=True, return_dict=False)
    prompts = [Prompt(short, []), Prompt(long, [])]
    for ids, completion in zip((short, long), hf.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.7, seed=1))):
        assert completion.logprobs == pytest.approx(forward_logprobs(hf.model, ids, completion.token_ids, temperature=0.7), abs=1e-4)
    for ids, completion in zip((short, long), hf.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.7, top_k=5, seed=1))):
        unfiltered = forward_logprobs(hf.model, ids, completion.token_ids, temperature=0.7)
        assert all(got > ref for got, ref in zip(completion.logprobs, unfiltered))  # renormalised over the top 5


@pytest.mark.slow
def test_hf_generate_each_samples_every_request_from_its_own_seed(hf, tokenizer):
    """Continuous and async rollouts batch whatever requests have arrived: a request's completion
    must not depend on its batch. Each is a draw from the processed distribution (its log-probs are
    the model's at that temperature), and the same seed gives the same draw alone, in another
    order, or beside other requests."""
    from envhub.generation import BatchStream

    texts = ["Turn 1", "Up", "Turn 1 of 20; a much longer prompt " * 2, "Left"]
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=False) for t in texts]
    prompts = [Prompt(i, []) for i in ids]
    samplings = [SamplingParams(max_new_tokens=10, temperature=0.8, seed=100 + k) for k in range(4)]
    together = hf.generate_each(prompts, samplings)
    for k, completion in enumerate(together):
        assert completion.logprobs == pytest.approx(forward_logprobs(hf.model, ids[k], completion.token_ids, temperature=0.8), abs=1e-4)
        assert hf.generate_each([prompts[k]], [samplings[k]])[0].token_ids == completion.token_ids
    backwards = hf.generate_each(prompts[::-1], samplings[::-1])[::-1]
    assert [c.token_ids for c in backwards] == [c.token_ids for c in together]
    assert len({tuple(c.token_ids) for c in hf.generate_each([prompts[0]] * 4, samplings)}) > 1  # other seeds, other draws
    stream = BatchStream(hf)
    for k in (2, 0):
        stream.submit(k, prompts[k], samplings[k])
    assert {k: c.token_ids for k, c in stream.poll()} == {2: together[2].token_ids, 0: together[0].token_ids}


@pytest.mark.slow
def test_hf_row_seeded_sampling_follows_the_processed_distribution(hf, tokenizer):
    """The Gumbel-max draw is a sample of softmax(logits / T) restricted to the top k: 2,000 one-token
    draws from one prompt match the model's probabilities."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Turn 1"}], add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        logits = hf.model(torch.tensor([prompt])).logits[0, -1].float()
    probs = torch.softmax(logits / 1.5, dim=-1)
    top = torch.topk(probs, 3)
    expected = top.values / top.values.sum()
    draws = hf.generate_each([Prompt(prompt, [])] * 2000, [SamplingParams(max_new_tokens=1, temperature=1.5, top_k=3, seed=s) for s in range(2000)])
    counts = torch.tensor([sum(c.token_ids[0] == int(t) for c in draws) for t in top.indices], dtype=torch.float)
    assert counts.sum() == 2000  # nothing outside the top 3
    np.testing.assert_allclose((counts / 2000).numpy(), expected.numpy(), atol=0.035)  # about 4 standard errors


# ---------------------------------------------------------------------------------------- vLLM in-process


@pytest.mark.slow
def test_vllm_engine_samples_with_logprobs_of_the_model(engine, hf, tokenizer):
    manager = EnvGroupManager(LAKE, 1, 3, tokenizer=tokenizer, max_turns=2)
    manager.reset()
    prompts = manager.prompts()
    completions = engine.generate(prompts, SamplingParams(max_new_tokens=10, temperature=1.0, seed=3))
    assert len({tuple(c.token_ids) for c in completions}) > 1  # same prompt, different per-request seeds
    for prompt, completion in zip(prompts, completions):
        assert completion.logprobs == pytest.approx(forward_logprobs(hf.model, prompt.token_ids, completion.token_ids), abs=2e-3)
    again = engine.generate(prompts, SamplingParams(max_new_tokens=10, temperature=1.0, seed=3))
    assert [c.token_ids for c in again] == [c.token_ids for c in completions]
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        engine.generate([Prompt([5] * 2048, [])], SamplingParams(max_new_tokens=4))
    manager.step(completions)
    assert all(t.num_turns == 1 for t in manager.trajectories())


@pytest.mark.slow
def test_vllm_engine_on_the_cpu_prefills_every_seeded_prompt_in_one_piece(engine, tokenizer):
    """vllm-cpu crashed ("CPU Generator does not use offset") when a seeded prompt's prefill was
    split across scheduler steps, as it is once a batch's prompts pass max_num_batched_tokens."""
    if engine.prefill_budget is None:
        pytest.skip("vLLM runs on an accelerator here")
    length = 1900
    count = engine.prefill_budget // length + 3
    rng = np.random.default_rng(0)
    prompts = [Prompt(rng.integers(3, len(tokenizer) - 1, size=length).tolist(), []) for _ in range(count)]
    assert len(engine._runs(prompts)) == 2 and engine._runs(prompts)[-1][1] == count
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, seed=11)
    completions = engine.generate(prompts, sampling)
    assert len(completions) == count and all(len(c.token_ids) == len(c.logprobs) > 0 for c in completions)
    assert [c.token_ids for c in engine.generate(prompts, sampling)] == [c.token_ids for c in completions]


@pytest.mark.slow
def test_vllm_engine_streams_a_continuous_rollout(engine, tokenizer):
    """Continuous mode on vLLM's own continuous batching: requests join the running batch as envs
    step, each with the seed of its (slot, turn), so a rerun samples the same episodes; with greedy
    decoding the episodes are those of lockstep."""
    from envhub.rollout import RolloutStats

    def play(mode, sampling):
        stats = RolloutStats()
        with EnvGroupManager(LAKE, 2, 3, tokenizer=tokenizer, max_turns=3, seed=4) as manager:
            trajectories = rollout(manager, engine, sampling, mode=mode, stats=stats)
        return [[(list(u.completion_ids), u.reward, u.state_key) for u in t.turns] for t in trajectories], stats

    steps_before = engine.engine_steps
    sampled, stats = play("continuous", SamplingParams(max_new_tokens=6, temperature=1.0, seed=9))
    assert engine.engine_steps > steps_before and engine.pending() == 0
    assert stats.turns == sum(len(t) for t in sampled) > 6 and stats.turns_per_s > 0
    assert len({tuple(t[0][0]) for t in sampled}) > 1  # members of a group sample different first replies
    assert play("continuous", SamplingParams(max_new_tokens=6, temperature=1.0, seed=9))[0] == sampled
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    assert play("continuous", greedy)[0] == play("lockstep", greedy)[0]


@pytest.mark.slow
def test_vllm_engine_loads_new_weights_from_a_torch_model(engine, hf, tokenizer):
    trained = copy.deepcopy(hf.model)
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    prompt = Prompt(tokenizer.apply_chat_template([{"role": "user", "content": "go"}], add_generation_prompt=True, tokenize=True, return_dict=False), [])
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    try:
        engine.load_weights(trained)
        completion = engine.generate([prompt], greedy)[0]
        assert completion.logprobs == pytest.approx(forward_logprobs(trained, prompt.token_ids, completion.token_ids), abs=2e-3)
        assert completion.logprobs != pytest.approx(forward_logprobs(hf.model, prompt.token_ids, completion.token_ids), abs=2e-3)
    finally:
        engine.load_weights(hf.model)
    restored = engine.generate([prompt], greedy)[0]
    assert restored.logprobs == pytest.approx(forward_logprobs(hf.model, prompt.token_ids, restored.token_ids), abs=2e-3)


# ---------------------------------------------------------------------------------------- vLLM server


@pytest.mark.slow
def test_vllm_server_client_returns_token_ids_and_logprobs(server, hf, tokenizer):
    from envhub_trl.generators import VLLMServerGenerator

    generator = VLLMServerGenerator(server.wait())
    manager = EnvGroupManager(LAKE, 1, 2, tokenizer=tokenizer, max_turns=2)
    trajectories = rollout(manager, generator, SamplingParams(max_new_tokens=10, temperature=1.0, seed=5))
    for trajectory in trajectories:
        sample = trajectory.sample()
        context = list(sample.prompt_ids)
        for turn in trajectory.turns:
            context += list(turn.input_ids) if turn.index else []
            assert len(turn.completion_ids) == len(turn.logprobs) > 0
            assert list(turn.logprobs) == pytest.approx(forward_logprobs(hf.model, context, list(turn.completion_ids)), abs=2e-3)
            context += list(turn.completion_ids)


@pytest.mark.slow
def test_vllm_server_client_stops_at_its_stop_tokens(server, tokenizer):
    """The client sends its stop tokens (the trainer passes the end-of-turn ones); the server stops there."""
    from envhub_trl.generators import VLLMServerGenerator

    url = server.wait()
    prompt = Prompt(tokenizer.apply_chat_template([{"role": "user", "content": "Turn 1"}], add_generation_prompt=True, tokenize=True, return_dict=False), [])
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    free = VLLMServerGenerator(url).generate([prompt], greedy)[0]
    first = free.token_ids[0]
    stopped = VLLMServerGenerator(url, stop_token_ids=[first]).generate([prompt], greedy)[0]
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"


STOP_SAMPLING = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)  # the untrained model's greedy replies are blank


def _stop_case(generator, tokenizer):
    """A prompt, a stop string its seeded reply holds (a later token's text) and the reply's
    tokens up to where that text first appears."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Turn 1"}], add_generation_prompt=True, tokenize=True, return_dict=False)
    free = generator.generate([Prompt(prompt, [])] * 2, STOP_SAMPLING)[0]
    pieces = [tokenizer.decode([token], skip_special_tokens=True).strip() for token in free.token_ids]
    stop = next((piece for j, piece in enumerate(pieces) if j and piece and piece not in "".join(pieces[:j])), None)
    assert stop, f"the tiny model's greedy reply {pieces} has a later token with text of its own"
    ends = [k for k in range(1, len(free.token_ids) + 1) if stop in tokenizer.decode(free.token_ids[:k], skip_special_tokens=True)]
    return Prompt(prompt, [], stop_strings=(stop,)), stop, free.token_ids[: ends[0]]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["hf", "engine", "server"])
def test_generators_stop_at_a_prompts_stop_strings_and_keep_them(which, request, tokenizer):
    """Every generator ends a reply at the first of the prompt's stop strings, the string kept in
    the text and its tokens in the ids (vLLM's include_stop_str_in_output), finish_reason 'stop'."""
    if which == "server":
        from envhub_trl.generators import VLLMServerGenerator

        generator = VLLMServerGenerator(request.getfixturevalue("server").wait())
    else:
        generator = request.getfixturevalue(which)
    prompt, stop, expected = _stop_case(generator, tokenizer)
    completion = generator.generate([prompt, Prompt(prompt.token_ids, [])], STOP_SAMPLING)
    assert completion[0].token_ids == expected and completion[0].finish_reason == "stop"
    assert completion[0].text.endswith(stop) and len(completion[0].logprobs) == len(expected)
    assert len(completion[1].token_ids) > len(expected)  # the other prompt has no stop string


@pytest.mark.slow
def test_trainer_syncs_its_weights_to_the_server(server, tiny_path, tokenizer, hf, tmp_path):
    """After an optimizer step the server samples with the trained weights (weight decay makes the step
    move them even if every reply of the random model is invalid); the test puts the initial ones back."""
    from transformers import AutoModelForCausalLM

    from envhub_trl.config import EnvGRPOConfig
    from envhub_trl.generators import VLLMServerGenerator
    from envhub_trl.trainer import EnvGRPOTrainer

    url = server.wait()
    config = EnvGRPOConfig(
        output_dir=str(tmp_path), env_id=LAKE, max_turns=2, groups_per_step=2, group_size=2, per_device_train_batch_size=4,
        max_steps=1, max_turn_tokens=6, report_to="none", learning_rate=0.5, weight_decay=1.0, use_cpu=True,
        save_strategy="no", disable_tqdm=True, generator="vllm-server", vllm_server_url=url,
    )
    trainer = EnvGRPOTrainer(AutoModelForCausalLM.from_pretrained(tiny_path), config, processing_class=tokenizer)
    try:
        trainer.train()
        client = trainer.generator
        assert isinstance(client, VLLMServerGenerator) and client.weights_version == 2  # at the start, after the step
        assert client.stop_token_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        assert [p.name for p in client.weights_dir.iterdir()] == ["weights-000002"]  # the old checkpoint is gone
        manager = EnvGroupManager(LAKE, 1, 1, tokenizer=tokenizer).__enter__()
        manager.reset(seeds=[0])
        prompt = manager.prompts()[0]
        completion = VLLMServerGenerator(url).generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.0))[0]
        # A plain copy of the trained weights: the trainer's own model runs under accelerate's autocast.
        plain = type(hf.model)(hf.model.config)
        plain.load_state_dict(trainer.model.state_dict())
        trained = forward_logprobs(plain.eval(), prompt.token_ids, completion.token_ids)
        initial = forward_logprobs(hf.model, prompt.token_ids, completion.token_ids)
        assert completion.logprobs == pytest.approx(trained, abs=2e-3)
        assert max(abs(a - b) for a, b in zip(completion.logprobs, initial)) > 0.1
    finally:
        VLLMServerGenerator(url, weights_dir=tmp_path / "restore").load_weights(hf.model)


@pytest.mark.slow
def test_weight_sync_names_the_server_setting_it_needs(hf, tmp_path):
    """A server without development mode answers 404 on the weight endpoints: the error says how to start it."""
    import http.server
    import threading

    from envhub_trl.generators.vllm_server import ServerError, VLLMServerGenerator

    class Plain(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # /v1/models
            body = json.dumps({"data": [{"id": "tiny"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        client = VLLMServerGenerator(f"http://127.0.0.1:{httpd.server_address[1]}", weights_dir=tmp_path)
        with pytest.raises(ServerError, match="VLLM_SERVER_DEV_MODE=1"):
            client.load_weights(hf.model)
    finally:
        httpd.shutdown()


def test_vllm_server_client_reports_an_unreachable_server():
    from envhub_trl.generators.vllm_server import ServerError, VLLMServerGenerator

    with pytest.raises(ServerError, match="vllm serve"):
        VLLMServerGenerator(f"http://127.0.0.1:{free_port()}", timeout=2)


# ---------------------------------------------------------------------------------------- commands


@pytest.fixture
def cli():
    from envhub_trl import plugin

    group = click.Group("envhub")
    plugin.register_commands(cli=group)
    return group


@pytest.mark.slow
def test_eval_command_prints_json(cli, tiny_path):
    result = CliRunner().invoke(cli, ["eval", "frozenlake/FrozenLake-v0", "--model", str(tiny_path), "--episodes", "3", "--max-turns", "2", "--max-turn-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report) == {
        "env_id", "episodes", "success_rate", "mean_return", "invalid_action_rate", "mean_turns",
        "references", "open_loop_actions", "open_loop_exhaustive",
    }
    assert report["episodes"] == 3 and 0.0 <= report["success_rate"] <= 1.0 and 1.0 <= report["mean_turns"] <= 2.0


@pytest.mark.slow
def test_eval_command_with_the_vllm_generator(cli, tiny_path, engine, monkeypatch):
    import envhub_trl.generators as generators

    monkeypatch.setattr(generators, "VLLMGenerator", lambda path, **kwargs: engine)  # reuse the session's engine
    result = CliRunner().invoke(cli, ["eval", LAKE, "--model", str(tiny_path), "--episodes", "2", "--max-turns", "2", "--generator", "vllm"])
    assert result.exit_code == 0, result.output
    assert "success_rate" in result.output and "mean_turns" in result.output


def test_eval_command_builds_the_tiny_model(cli):
    result = CliRunner().invoke(cli, ["eval", LAKE, "--model", "tiny", "--episodes", "2", "--max-turns", "1", "--max-turn-tokens", "4", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["mean_turns"] == 1.0


@pytest.mark.slow
def test_model_names_resolve_to_folders_or_hub_ids(tiny_path, tmp_path):
    from envhub.error import ModelNotFound
    from envhub_trl.models import is_model_name, resolve_model

    assert resolve_model(str(tiny_path)) == str(tiny_path) and is_model_name(str(tiny_path))
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct" and is_model_name("Qwen/Qwen2.5-0.5B-Instruct")
    built = Path(resolve_model("tiny", [LAKE], seed=1))
    assert (built / "config.json").is_file() and (built / "tokenizer.json").is_file()
    for name in ("random-words", str(tmp_path)):  # not a name, and a folder without a model
        assert not is_model_name(name)
        with pytest.raises(ModelNotFound):
            resolve_model(name)


@pytest.mark.slow
def test_export_sft_writes_a_conversational_dataset(cli, tmp_path, tokenizer):
    from datasets import load_from_disk
    from trl.data_utils import is_conversational

    out = tmp_path / "sft"
    result = CliRunner().invoke(cli, ["export-sft", "frozenlake/FrozenLakeNotSlippery-v0", "--episodes", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    dataset = load_from_disk(str(out))
    assert len(dataset) == 4 and all(dataset["success"])
    row = dataset[0]
    assert is_conversational(row)
    roles = [m["role"] for m in row["messages"]]
    assert roles[0] == "system" and roles[-1] == "assistant" and roles[1:] == ["user", "assistant"] * ((len(roles) - 1) // 2)
    assert all(m["content"].startswith("<answer>") for m in row["messages"] if m["role"] == "assistant")
    assert tokenizer.apply_chat_template(row["messages"], tokenize=False).endswith("<|im_end|>\n")
    again = CliRunner().invoke(cli, ["export-sft", "frozenlake/FrozenLakeNotSlippery-v0", "--episodes", "1", "--out", str(out)])
    assert again.exit_code != 0 and "not empty" in again.output


@pytest.mark.slow
def test_run_policy_model_path_plays_through_the_hook(tiny_path):
    from envhub.cli import play_episode
    from envhub.play import Player

    player = get_player(str(tiny_path), LAKE, seed=0)
    assert isinstance(player, Player) and player.tokenizer is not None
    manager = player.manager(LAKE, max_turns=3)
    record = play_episode(manager, player, seed=0, echo=False)
    assert record["env_id"] == LAKE and 1 <= record["turns"] <= 3 and len(record["transcript"]) == record["turns"] + 1
    # the model's conversation is the manager's: rendered and judged exactly as in training
    trajectory = manager.trajectories()[0]
    assert [m["role"] for m in trajectory.messages] == ["system"] + ["user", "assistant"] * record["turns"]
    prompt = player.settings.prompt
    assert manager.fmt == get_format(prompt.action_format or "answer") and manager.max_prompt_tokens == prompt.max_prompt_tokens
    for step, turn in zip(record["transcript"][1:], trajectory.turns):
        assert step["info"]["action_is_valid"] == turn.action_is_valid
        if turn.action_is_valid:
            assert step["action"] in {"Left", "Down", "Right", "Up"}
        else:  # judged in the reply format, as in training: the illegal action named, or the whole reply
            assert step["action"] in (turn.action, turn.reply)
            assert step["info"]["invalid_reason"] == parse_reply(turn.reply, ["Left", "Down", "Right", "Up"], manager.fmt).error
    with pytest.raises(PolicyError):
        get_player(str(tiny_path / "missing"), LAKE)


@pytest.mark.slow
def test_completion_text_matches_ids(hf, tokenizer):
    prompt = Prompt(tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=True, return_dict=False), [])
    completion: Completion = hf.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.0))[0]
    assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)


@pytest.mark.slow
def test_eval_prints_only_its_table_on_stdout(cli, tiny_path):
    result = CliRunner().invoke(cli, ["eval", LAKE, "--model", str(tiny_path), "--episodes", "2", "--max-turns", "2", "--no-references"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("env_id ")  # no stray progress label before the table


def test_eval_of_a_folder_without_a_model_names_what_is_missing(cli, tmp_path):
    result = CliRunner().invoke(cli, ["eval", LAKE, "--model", str(tmp_path), "--episodes", "1"])
    assert result.exit_code == 1 and f"{tmp_path} holds no Hugging Face model (no config.json)" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_vllm_takes_its_context_length_from_a_short_context_model(tokenizer, tmp_path):
    """A model with 2048 positions: the generator's default asked vLLM for 4096 and died in its
    config check; now the model's own limit is used, and a larger request is lowered to it."""
    pytest.importorskip("vllm")
    from envhub_trl.generators import VLLMGenerator
    from envhub_trl.generators.vllm_engine import model_context_limit
    from envhub_trl.tiny import build_model

    folder = tmp_path / "short"
    build_model(tokenizer, max_positions=2048).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert model_context_limit(folder) == 2048
    engine = VLLMGenerator(folder, max_model_len=8192, gpu_memory_utilization=0.1, dtype="float32", enforce_eager=True)
    try:
        assert engine.max_model_len == 2048
        manager = EnvGroupManager(LAKE, 1, 2, tokenizer=tokenizer, max_turns=2)
        manager.reset()
        completions = engine.generate(manager.prompts(), SamplingParams(max_new_tokens=4, temperature=1.0, seed=1))
        assert len(completions) == 2
    finally:
        del engine


@pytest.mark.slow
def test_cpu_kv_cache_is_sized_for_the_model_not_a_share_of_the_memory(tiny_path, engine):
    """vLLM's CPU default is a share of the machine's memory whatever the model (7 GiB of 24 for
    a 2-layer model); envhub asks for what 256 full-length sequences take, capped at that share."""
    from transformers import AutoConfig

    from envhub_trl.generators.vllm_engine import KV_CACHE_SEQUENCES, cpu_kv_cache_bytes, kv_cache_bytes

    config = AutoConfig.from_pretrained(tiny_path)
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 4
    assert kv_cache_bytes(tiny_path, 10, "float32") == 10 * per_token
    assert kv_cache_bytes(tiny_path, 10, "bfloat16") == 5 * per_token
    assert cpu_kv_cache_bytes(tiny_path, 512, "float32", 0.3) == KV_CACHE_SEQUENCES * 512 * per_token
    assert cpu_kv_cache_bytes(tiny_path, 512, "float32", 1e-9) < per_token  # capped at the share
    assert kv_cache_bytes(tiny_path.parent / "no-such-model", 10) is None
    vllm_config = engine.llm.llm_engine.vllm_config
    if vllm_config.device_config.device_type == "cpu":
        assert vllm_config.cache_config.kv_cache_memory_bytes == cpu_kv_cache_bytes(tiny_path, engine.max_model_len, "float32", 0.1)


def test_export_sft_of_a_tool_env_keeps_its_tools_and_tool_messages(cli, tmp_path):
    from datasets import load_from_disk

    out = tmp_path / "sft-tools"
    result = CliRunner().invoke(cli, ["export-sft", "tools/Countdown-v0", "--episodes", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    row = load_from_disk(str(out))[0]
    roles = [m["role"] for m in row["messages"]]
    assert roles[:3] == ["system", "user", "assistant"] and roles[3] == "tool" and roles[-1] == "assistant"
    assert row["messages"][2]["content"].startswith("<tool_call>") and row["tools"][0]["function"]["name"] == "calculate"


@pytest.mark.slow
def test_run_policy_model_path_plays_a_tool_env_with_tool_messages(tiny_path):
    from envhub.cli import play_episode

    env_id = "tools/Countdown-v0"
    player = get_player(str(tiny_path), env_id, seed=0)
    manager = player.manager(env_id, max_turns=3)
    record = play_episode(manager, player, seed=0, echo=False)
    trajectory = manager.trajectories()[0]
    assert manager.fmt == get_format("tool-call") and trajectory.tools == envhub.make(env_id).tool_schemas()
    assert [m["role"] for m in trajectory.messages] == ["system", "user", "assistant"] + ["tool", "assistant"] * (record["turns"] - 1)
    for step in record["transcript"][1:]:
        assert step["info"]["action_is_valid"] or step["info"]["invalid_reason"]
