"""The OpenAI-compatible proxy through the real ``openai`` client: concurrent agents' sessions are
token-exact against what the generator sampled, calls that extend each other fold into one
trajectory, and a history that is rewritten (by the agent, or by a template that drops earlier
thinking as Qwen3's does) falls back to step samples and is counted."""

from __future__ import annotations

import copy
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from envhub.chat import end_of_turn_ids
from envhub.generation import Completion
from envhub_trl.generators import HFGenerator
from envhub_trl.proxy import ChatProxy, ProxyServer, session_trajectory
from envhub_trl.tiny import CHAT_TEMPLATE, build_tiny

#: Qwen3's rule for earlier turns, on ChatML: a reply is shown without its ``<think>`` block, and
#: the generation prompt opens an empty one (Qwen3 with ``enable_thinking=False``).
THINK_STRIPPING_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
)


class Recording:
    """A generator that records what the wrapped one was asked and returned, by prompt ids."""

    def __init__(self, generator):
        self.generator = generator
        self.model = generator.model
        self.seen: dict[tuple[int, ...], list[Completion]] = {}
        self.lock = threading.Lock()

    def generate_each(self, prompts, samplings):
        completions = self.generator.generate_each(prompts, samplings)
        with self.lock:
            for prompt, completion in zip(prompts, completions):
                self.seen.setdefault(tuple(prompt.token_ids), []).append(completion)
        return completions


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return HFGenerator.from_pretrained(build_tiny(tmp_path_factory.mktemp("proxy") / "tiny", env_ids=["frozenlake/FrozenLake-v0"]), device="cpu")


def _served(generator, tokenizer):
    recording = Recording(generator)
    return ProxyServer(ChatProxy(recording, tokenizer, model="tiny")), recording


def _play(base_url: str, session: str, task: int, turns: int = 3, rewrite: bool = False) -> list:
    """An agent loop written with the OpenAI client: resend the history and append to it (or,
    with ``rewrite``, keep only the last exchange, as agents that trim their context do)."""
    client = openai.OpenAI(base_url=base_url, api_key=session, max_retries=0)
    system = {"role": "system", "content": "You play FrozenLake."}
    messages = [system, {"role": "user", "content": f"Task {task}: reach the goal."}]
    responses = []
    for turn in range(turns):
        response = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=8, temperature=1.0, seed=100 * task + turn, logprobs=True,
            extra_body={"return_token_ids": True},
        )
        responses.append(response)
        reply = response.choices[0].message.model_dump(exclude_none=True)
        messages = [*messages, reply, {"role": "user", "content": f"Turn {turn + 2}."}]
        if rewrite:
            messages = [system, *messages[-3:]]
    return responses


def test_concurrent_agents_are_recorded_token_exact_and_fold(tiny):
    server, recording = _served(tiny, tiny.tokenizer)
    with server:
        with ThreadPoolExecutor(8) as pool:
            played = list(pool.map(lambda i: _play(server.base_url, f"agent-{i}", i), range(8)))
        store = server.proxy.store
        stats = httpx.get(f"{server.base_url}/envhub/stats").json()
    turn_end = end_of_turn_ids(tiny.tokenizer)[0]
    folded = 0
    for i, responses in enumerate(played):
        session = store.find(f"agent-{i}")
        assert len(session.calls) == 3 and f"Task {i}:" in session.calls[0].new_messages[-1]["content"]
        for call, response in zip(session.calls, responses):
            (sampled,) = recording.seen[call.prompt_ids]  # the generator was prompted with exactly these ids
            choice = call.choices[0]
            assert list(choice.token_ids) == sampled.token_ids and list(choice.logprobs) == sampled.logprobs
            assert response.model_extra["prompt_token_ids"] == list(call.prompt_ids)
            assert response.choices[0].model_extra["token_ids"] == sampled.token_ids
            assert [entry.logprob for entry in response.choices[0].logprobs.content] == sampled.logprobs
        # A reply that ended on another stop token (the tokenizer's eos) is rendered back with the
        # template's turn end, which the model did not sample: that session cannot fold.
        clean = all(c.choices[0].finish_reason == "length" or c.choices[0].token_ids[-1] == turn_end for c in session.calls[:-1])
        if not clean:
            continue
        folded += 1
        assert session.breaks == 0 and [c.parent for c in session.calls] == [None, (0, 0), (1, 0)]
        trajectory = session_trajectory(session)
        sample = trajectory.sample()
        last = session.calls[-1]
        assert sample.prompt_ids + sample.completion_ids == [*last.prompt_ids, *last.choices[0].token_ids]
        model_tokens = [t for t, m in zip(sample.completion_ids, sample.env_mask) if m]
        assert model_tokens == [t for c in session.calls for t in c.choices[0].token_ids]
        assert [lp for lp, m in zip(sample.logprobs, sample.env_mask) if m] == [lp for c in session.calls for lp in c.choices[0].logprobs]
    assert folded >= 6, "too few sessions ended their replies cleanly for the folding test to mean anything"
    assert stats["calls"] == 24 and stats["breaks"] == sum(store.find(f"agent-{i}").breaks for i in range(8))


@pytest.mark.parametrize("case", ["template drops earlier thinking", "agent trims its history"])
def test_rewritten_history_falls_back_to_step_samples_and_is_counted(tiny, case):
    tokenizer = tiny.tokenizer
    if case == "template drops earlier thinking":
        tokenizer = copy.deepcopy(tiny.tokenizer)
        tokenizer.chat_template = THINK_STRIPPING_TEMPLATE
    server, recording = _served(HFGenerator(tiny.model, tokenizer), tokenizer)
    with server:
        for i in range(2):
            _play(server.base_url, f"s{i}", i, turns=4, rewrite=case == "agent trims its history")
        stats = httpx.get(f"{server.base_url}/envhub/stats").json()
        store = server.proxy.store
    expected_breaks = 3 if case == "template drops earlier thinking" else 2  # trimming starts after the second reply
    assert stats == {"sessions": 2, "calls": 8, "folded_calls": 6 - 2 * expected_breaks, "breaks": 2 * expected_breaks}
    for i in range(2):
        session = store.find(f"s{i}")
        trajectory = session_trajectory(session)
        assert session.breaks == expected_breaks and trajectory.layout == "step"
        samples = trajectory.step_samples()
        assert len(samples) == 4
        for sample, call in zip(samples, session.calls):
            assert sample.prompt_ids == list(call.prompt_ids) and sample.completion_ids == list(call.choices[0].token_ids)
            assert tuple(sample.prompt_ids) in recording.seen


class Scripted:
    """A generator that writes given replies (a model that calls tools), tokenised as a model would
    sample them, ending its turn; the log-probs are a fixed value per token."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies = tokenizer, list(replies)
        self.turn_end = end_of_turn_ids(tokenizer)[:1]

    def generate(self, prompts, sampling):
        out = []
        for _ in prompts:
            text = self.replies.pop(0)
            ids = self.tokenizer.encode(text, add_special_tokens=False) + self.turn_end
            out.append(Completion(ids, [-0.25] * len(ids), text, "stop"))
        return out


MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move one square.",
        "parameters": {"type": "object", "properties": {"direction": {"type": "string", "enum": ["left", "right", "up", "down"]}}, "required": ["direction"]},
    },
}


def test_tool_calls_round_trip_through_the_openai_client(tiny):
    replies = ['<tool_call>{"name": "move", "arguments": {"direction": "left"}}</tool_call>', '{"direction": "up"}}\n</tool_call>', "Done."]
    proxy = ChatProxy(Scripted(tiny.tokenizer, replies), tiny.tokenizer, model="tiny")
    with ProxyServer(proxy) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="tools", max_retries=0)
        messages = [{"role": "user", "content": "Reach the goal."}]
        first = client.chat.completions.create(model="tiny", messages=messages, tools=[MOVE])
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls" and first.choices[0].message.content is None
        assert call.function.name == "move" and json.loads(call.function.arguments) == {"direction": "left"}
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "You moved left."}]
        forced = client.chat.completions.create(model="tiny", messages=messages, tools=[MOVE], tool_choice={"type": "function", "function": {"name": "move"}})
        assert json.loads(forced.choices[0].message.tool_calls[0].function.arguments) == {"direction": "up"}
        messages += [forced.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": "x", "content": "You moved up."}]
        last = client.chat.completions.create(model="tiny", messages=messages, tools=[MOVE])
        assert last.choices[0].message.content == "Done." and last.choices[0].message.tool_calls is None
    session = proxy.store.find("tools")
    assert [c.parent for c in session.calls] == [None, (0, 0), (1, 0)] and session.breaks == 0
    between = tiny.tokenizer.decode(list(session.calls[1].env_ids))
    assert "<tool_response>\nYou moved left.\n</tool_response>" in between
    assert session.calls[1].prompt_text.endswith('<tool_call>\n{"name": "move", "arguments": ')
    assert "move" in tiny.tokenizer.decode(list(session.calls[0].prompt_ids))  # the tools reached the template
    sample = session_trajectory(session).sample()
    assert sum(sample.env_mask) == sum(len(c.choices[0].token_ids) for c in session.calls)


class _Batches:
    """A batch generator that takes ``seconds`` a batch and records each batch's size."""

    def __init__(self, seconds: float):
        self.seconds, self.sizes, self.started = seconds, [], []

    def generate_each(self, prompts, samplings):
        import time

        self.sizes.append(len(prompts))
        self.started.append(time.perf_counter())
        time.sleep(self.seconds)
        return [Completion(text="x", token_ids=[1], logprobs=[0.0], finish_reason="length") for _ in prompts]


def test_the_callers_a_batch_answered_share_the_next_batch_though_they_call_back_slowly(tiny):
    """Under load, agents answered by one batch call back spread over more than batch_wait_s; the
    worker waits (straggler_wait_s between arrivals) until they are in, instead of starting a half
    batch and leaving the other half to the next."""
    import time

    from envhub.generation import Prompt, SamplingParams

    def call_back(proxy, count: int, gap: float) -> None:
        futures = []
        for _ in range(count):
            futures.append(proxy._submit(Prompt(token_ids=[1], messages=[]), SamplingParams(max_new_tokens=1)))
            time.sleep(gap)
        for future in futures:
            future.result(timeout=10)

    for straggler_wait_s, expected in ((0.2, [6, 6, 3]), (0.0, None)):
        generator = _Batches(seconds=1.0)
        proxy = ChatProxy(generator, tiny.tokenizer, batch_wait_s=0.01, straggler_wait_s=straggler_wait_s)
        call_back(proxy, 6, 0.0)  # six agents start together: one batch
        call_back(proxy, 6, 0.03)  # they call back 30 ms apart, over batch_wait_s
        started = time.perf_counter()
        call_back(proxy, 3, 0.0)  # three of them end their game: the rest never come
        if expected is not None:
            assert generator.sizes == expected
            assert time.perf_counter() - started < 1.0 + 0.2 + 0.5  # the batch, and at most straggler_wait_s for the rest
        else:  # with no straggler wait, the slow callers are taken as they come
            assert generator.sizes[0] == 6 and len(generator.sizes) > 3


def _calls(proxy, sessions, gap=0.0):
    """One call of each of ``sessions`` straight to the proxy's worker, ``gap`` seconds apart; wait for them."""
    import time

    from envhub.generation import Prompt, SamplingParams

    futures = []
    for session in sessions:
        futures.append(proxy._submit(Prompt(token_ids=[1], messages=[]), SamplingParams(max_new_tokens=1), session))
        time.sleep(gap)
    for future in futures:
        future.result(timeout=30)


def test_a_split_batch_joins_again_when_its_other_half_calls_back(tiny):
    """The callers a batch answered are counted by session: the other half's requests, queued
    while the batch ran, do not stand in for them, so the two halves share the next batch instead
    of taking turns (agents in two processes split so at their first calls)."""
    generator = _Batches(seconds=1.0)
    proxy = ChatProxy(generator, tiny.tokenizer, batch_wait_s=0.01, straggler_wait_s=0.2)
    half = threading.Timer(0.3, _calls, args=(proxy, ["b1", "b2", "b3", "b4"]))
    half.start()  # the other half calls while the first half's batch runs
    _calls(proxy, ["a1", "a2", "a3", "a4"])
    _calls(proxy, ["a1", "a2", "a3", "a4"], gap=0.03)  # called back 30 ms apart, over batch_wait_s
    half.join()
    assert generator.sizes == [4, 8]


def test_the_first_calls_of_sessions_started_together_share_a_batch(tiny):
    """Agents started together (``SessionStore.expect``: ``play_agents`` says so) have their first
    calls waited for as a batch's callers are, though they come in further apart than
    batch_wait_s; without it they split. A session that ends before its first call is not waited for."""
    for expect, expected in ((True, [1, 4]), (False, None)):
        generator = _Batches(seconds=0.5)
        proxy = ChatProxy(generator, tiny.tokenizer, batch_wait_s=0.01, straggler_wait_s=0.2)
        _calls(proxy, ["warm-up"])
        proxy.store.close("warm-up")
        if expect:
            proxy.store.expect(["a", "b", "c", "d", "never"])
            proxy.store.close("never")  # its agent failed before calling
            assert sorted(proxy.store.first_calls_due()) == ["a", "b", "c", "d"]
        _calls(proxy, ["a", "b", "c", "d"], gap=0.03)
        if expected is not None:
            assert generator.sizes == expected and proxy.store.first_calls_due() == []
        else:
            assert len(generator.sizes) > 2


@pytest.mark.parametrize("ending", ["reward", "close"])
def test_the_worker_does_not_wait_for_the_callers_of_sessions_that_ended(tiny, ending):
    """After a batch, the worker waits for the sessions it answered; a session whose reward was
    posted or whose agent returned (closed) is not waited for, so the next batch starts as soon as
    the live sessions are back, and ending one mid-wait wakes it."""
    import time

    def end(proxy, session):
        proxy.store.set_reward(session, 1.0) if ending == "reward" else proxy.store.close(session)

    generator = _Batches(seconds=2.0)
    proxy = ChatProxy(generator, tiny.tokenizer, batch_wait_s=0.01, straggler_wait_s=5.0)
    _calls(proxy, ["a", "b", "c", "d"])  # one batch of four sessions
    end(proxy, "c"), end(proxy, "d")
    sent = time.perf_counter()
    _calls(proxy, ["a", "b"])  # the two live sessions are back: nothing else to wait for
    assert generator.sizes == [4, 2] and generator.started[1] - sent < 1.0  # not the batch's 2 s

    threading.Timer(0.5, end, args=(proxy, "b")).start()  # b ends while the worker waits for it
    sent = time.perf_counter()
    _calls(proxy, ["a"])
    assert generator.sizes == [4, 2, 1] and 0.4 < generator.started[2] - sent < 1.5
