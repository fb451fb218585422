"""Agents played through the proxy: sessions of one task form a group, their episodes go through
the trainer's stages unchanged (folded sessions one row, the others one row per call), and an
agent that raises, hangs or gives no reward ends only its own session."""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np
import openai
import pytest

from envhub_trl import pipeline
from envhub_trl.generators import HFGenerator
from envhub_trl.proxy import ChatProxy, ProxyServer, session_trajectory
from envhub_trl.proxy.agent_processes import AgentProcesses
from envhub_trl.proxy.agents import load_agent, play_agents
from envhub_trl.tiny import build_tiny
from proxy_helpers import expert_moves


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    generator = HFGenerator.from_pretrained(build_tiny(tmp_path_factory.mktemp("agents") / "tiny", env_ids=["frozenlake/FrozenLake-v0"]), device="cpu")
    with ProxyServer(ChatProxy(generator, generator.tokenizer, model="*", temperature=1.0, seed=0)) as running:
        yield running


def talker(base_url: str, api_key: str, task: dict) -> float:
    """Three calls; with ``trim`` it keeps only the last exchange (its history no longer extends).
    The reward is read off the replies, so members of a group differ."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": f"Task {task['id']}."}]
    replies = []
    for turn in range(3):
        reply = client.chat.completions.create(model="any", messages=messages, max_tokens=6).choices[0].message
        replies.append(reply.content or "")
        messages = [*messages, reply.model_dump(exclude_none=True), {"role": "user", "content": f"Turn {turn + 2}."}]
        if task.get("trim"):
            messages = messages[-3:]
    return float(sum(map(len, replies)) % 4)


def test_sessions_of_a_task_form_a_group_through_the_stages(server):
    tokenizer = server.proxy.tokenizer
    batch = play_agents(talker, [{"id": 0}, {"id": 1, "trim": True}], 3, server)
    assert [len(g) for g in batch.sessions] == [3, 3] and all(s.error is None for g in batch.sessions for s in g)
    episodes = batch.trajectories()
    assert [t.layout for t in episodes] == ["trajectory"] * 3 + ["step"] * 3
    assert [t.group_id for t in episodes] == [0, 0, 0, 1, 1, 1]
    assert batch.metrics()["agent/fold_break_rate"] == pytest.approx(3 / 12)  # each trimmed session breaks at its third call
    gathered = pipeline.gather(episodes, group_size=3)
    rows = pipeline.to_rows(gathered, [{"prompt": ""}] * 6, layout="step", decode=tokenizer.decode)
    # One row per folded session, one per call of a session that did not fold.
    assert [s.trajectory_index for s in rows.samples] == [0, 1, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5]
    for sample, episode in zip(rows.samples[:3], episodes[:3]):
        session = batch.sessions[0][episode.member]
        assert sample.prompt_ids + sample.completion_ids == [*session.calls[-1].prompt_ids, *session.calls[-1].choices[0].token_ids]
    width = max(len(s.completion_ids) for s in rows.samples)
    done = pipeline.spread(pipeline.estimate(rows, "grpo"), width)
    rewards = np.array([t.episode_return for t in episodes]).reshape(2, 3)
    for row, sample in enumerate(done.samples):
        g, m = divmod(sample.trajectory_index, 3)
        model = np.asarray(sample.env_mask, dtype=bool)
        advantage = done.advantages[row, : len(model)]
        session = batch.sessions[g][m]
        sampled = sum(len(c.choices[0].token_ids) for c in session.calls) if episodes[sample.trajectory_index].layout == "trajectory" else None
        assert sampled is None or model.sum() == sampled  # env tokens out of the loss (env_mask 0)
        expected = np.sign(rewards[g, m] - rewards[g].mean()) if rewards[g].std() > 0 else 0.0
        assert np.all(np.sign(advantage[model]) == expected)


def test_a_batch_samples_the_same_whatever_order_its_calls_arrive_in(server):
    """Sampler seeds are keyed by session id and call number, not drawn in arrival order: the same
    batch played again through another proxy of the same seed (its sessions racing differently)
    samples the same replies, and a batch of another name does not. A name is used once per proxy."""
    tasks = [{"id": 0}, {"id": 1}]

    def replies(running, batch: str) -> list[list[tuple[int, ...]]]:
        played = play_agents(talker, tasks, 3, running, batch=batch)
        return [[call.choices[0].token_ids for call in s.calls] for group in played.sessions for s in group]

    first = replies(server, "same")
    proxy = server.proxy
    with ProxyServer(ChatProxy(proxy.generator, proxy.tokenizer, model="*", temperature=1.0, seed=0)) as again:
        assert replies(again, "same") == first
    assert replies(server, "other") != first
    assert len({tuple(r) for r in first[:3]}) > 1  # members of a group sample apart
    with pytest.raises(ValueError, match="'same' was played already"):
        play_agents(talker, tasks, 3, server, batch="same")


def test_an_agent_that_fails_ends_only_its_own_session(server):
    late: list[BaseException] = []
    release = threading.Event()

    def agent(base_url: str, api_key: str, task: int) -> float | None:
        member = int(api_key.rsplit("-m", 1)[1])
        if member == 0:
            raise RuntimeError("the agent's tool crashed")
        if member == 1:  # hangs past the deadline, then calls again: refused
            release.wait(60)
            try:
                talker(base_url, api_key, {"id": task})
            except openai.APIStatusError as exc:
                late.append(exc)
            return 1.0
        if member == 2:
            talker(base_url, api_key, {"id": task})
            return None  # and posts nothing
        if member == 3:
            talker(base_url, api_key, {"id": task})
            httpx.post(f"{base_url}/envhub/sessions/{api_key}/reward", json={"reward": 0.5}).raise_for_status()
            return None
        return talker(base_url, api_key, {"id": task})

    batch = play_agents(agent, [7], 5, server, deadline=5.0)
    release.set()
    errors = [s.error for s in batch.sessions[0]]
    assert "RuntimeError: the agent's tool crashed" in errors[0]
    assert "deadline" in errors[1] and "no reward" in errors[2] and errors[3] is None and errors[4] is None
    assert batch.sessions[0][3].reward == 0.5
    episodes = batch.trajectories()
    gathered = pipeline.gather(episodes, group_size=5, max_error_rate=0.8)
    assert gathered.aside.tolist() == [True, True, True, False, False]
    for thread in threading.enumerate():
        if thread.name.endswith("-m1"):
            thread.join(10)
    assert len(late) == 1 and late[0].status_code == 409


def test_agents_in_worker_processes_sample_what_threads_sample(server):
    """``agent_processes``: the sessions run in spawned workers that load the agent from its
    reference, and they are the sessions threads play (the sampler seeds are the session's)."""
    tasks = [{"id": 0}, {"id": 1, "trim": True}]
    agent = load_agent(f"{__file__}:talker")

    def replies(played):
        return [[call.choices[0].token_ids for call in s.calls] for group in played.sessions for s in group]

    threads = play_agents(agent, tasks, 3, server, batch="workers")
    proxy = server.proxy
    with ProxyServer(ChatProxy(proxy.generator, proxy.tokenizer, model="*", temperature=1.0, seed=0)) as again, AgentProcesses(agent, 2) as workers:
        processes = play_agents(agent, tasks, 3, again, batch="workers", processes=workers)
        assert replies(processes) == replies(threads) and len(replies(threads)[0]) == 3
        assert [s.reward for g in processes.sessions for s in g] == [s.reward for g in threads.sessions for s in g]
        assert [s.breaks for g in processes.sessions for s in g] == [0, 0, 0, 1, 1, 1]
        workers_pids = {worker[0].pid for worker in workers._workers}
        play_agents(agent, tasks, 3, again, processes=workers)
        assert {worker[0].pid for worker in workers._workers} == workers_pids  # a worker outlives its batch
    with pytest.raises(ValueError, match="agent_processes runs the agent in worker processes"):
        AgentProcesses(lambda base_url, api_key, task: 1.0, 2)


def test_an_agent_in_a_worker_process_that_fails_ends_only_its_own_session(server, tmp_path):
    """Raised, hung past the deadline (its worker is ended, a thread could not be), a return value
    that is no number, a worker that exits: each fails its own sessions, and the next batch plays."""
    path = tmp_path / "failing.py"
    path.write_text(
        "import os, time\nimport openai\n\n"
        "def play(base_url, api_key, task):\n"
        "    if task == 'raise':\n        raise RuntimeError(\"the agent's tool crashed\")\n"
        "    if task == 'hang':\n        time.sleep(120)\n"
        "    if task == 'object':\n        return {'reward': 1}\n"
        "    if task == 'exit':\n        os._exit(3)\n"
        "    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)\n"
        "    client.chat.completions.create(model='any', messages=[{'role': 'user', 'content': 'Hi.'}], max_tokens=3)\n"
        "    return 1.0\n"
    )
    agent = load_agent(f"{path}:play")
    with AgentProcesses(agent, 2) as workers:
        batch = play_agents(agent, ["talk", "raise", "hang", "object"], 1, server, deadline=8.0, processes=workers)
        talk, crashed, hung, odd = (group[0] for group in batch.sessions)
        assert talk.error is None and talk.reward == 1.0 and len(talk.calls) == 1
        assert crashed.error == "the agent raised RuntimeError: the agent's tool crashed"
        assert "deadline of 8 s" in hung.error and workers._workers[0] is None  # "talk" and "hang" went to worker 0
        assert odd.error == "the agent's reward is not a finite number: {'reward': 1}"
        batch = play_agents(agent, ["exit", "talk"], 1, server, processes=workers)
        assert batch.sessions[0][0].error == "the agent's worker process exited (exit code 3)"
        assert batch.sessions[1][0].error is None
        assert all(group[0].reward == 1.0 for group in play_agents(agent, ["talk", "talk"], 1, server, processes=workers).sessions)
    path.write_text("raise ImportError('a module this agent needs is missing')\n")  # what a new worker finds now
    with AgentProcesses(agent, 1) as workers:
        batch = play_agents(agent, ["talk"], 1, server, processes=workers)
        assert batch.sessions[0][0].error == (
            "the agent's worker process could not load it: ImportError: a module this agent needs is missing"
        )


def test_load_agent_from_a_file_or_a_module(tmp_path):
    path = tmp_path / "my_agent.py"
    path.write_text("def play(base_url, api_key, task):\n    return 1.0\n")
    assert load_agent(f"{path}:play")("u", "k", None) == 1.0
    assert load_agent("json:dumps") is json.dumps
    for bad in ["nocolon", f"{path}:missing", "no_such_module_xyz:play", f"{tmp_path}/absent.py:play"]:
        with pytest.raises(ValueError, match="--agent"):
            load_agent(bad)


def test_the_frozenlake_example_agent_plays_through_the_proxy(server):
    import envhub
    from envhub_trl.proxy.agents import load_agent

    play = load_agent("examples/agents/frozenlake_openai.py:play")
    env = envhub.make("frozenlake/FrozenLakeNotSlippery-v0")
    env.reset(seed=5)
    moves = []
    while len(moves) < 8:
        moves.append(env.expert_action())
        if env.step(moves[-1])[2]:
            break
    tokenizer = server.proxy.tokenizer
    with ProxyServer(ChatProxy(expert_moves(tokenizer, moves), tokenizer, model="*")) as lake:
        batch = play_agents(play, [{"seed": 5}], 1, lake)
    with ProxyServer(ChatProxy(expert_moves(tokenizer, moves), tokenizer, model="*")) as lake:
        again = play_agents(play, [{"seed": 5}], 1, lake).sessions[0][0]
    session = batch.sessions[0][0]
    # The same boards give the same state keys (GiGPO's anchors), though each tool result names
    # its call by an id of its own.
    ids = [[m.get("tool_call_id") for c in s.calls for m in c.new_messages if m["role"] == "tool"] for s in (session, again)]
    assert ids[0] and set(ids[0]).isdisjoint(ids[1])
    keys = [[t.state_key for t in session_trajectory(s).turns] for s in (session, again)]
    assert keys[0] == keys[1] and len(set(keys[0])) == len(keys[0])
    assert session.reward == pytest.approx(0.9) and session.error is None  # won, less the cost of its text reply
    assert len(session.calls) == 1 + len(moves) and session.breaks == 0
    sample = session_trajectory(session).sample()
    assert sum(sample.env_mask) == sum(len(c.choices[0].token_ids) for c in session.calls)
    assert "Call the move tool" in tokenizer.decode(list(session.calls[1].env_ids))
    metrics = batch.metrics()  # the first reply was text, every later one a call that ended its turn
    assert metrics["agent/tool_call_rate"] == pytest.approx(len(moves) / (1 + len(moves)))
    assert metrics["agent/length_cut_rate"] == 0.0
    assert metrics["agent/reply_tokens"] == pytest.approx(sum(len(c.choices[0].token_ids) for c in session.calls) / len(session.calls))


def test_a_format_only_start_records_the_agents_sessions_with_random_tool_calls(server):
    from envhub_trl.proxy.agents import format_samples

    play = load_agent("examples/agents/frozenlake_openai.py:play")
    tokenizer = server.proxy.tokenizer
    samples, sessions = format_samples(play, [{"seed": s} for s in range(6)], tokenizer, seed=1)
    assert all(s.error is None and s.reward in (0.0, 1.0) and s.breaks == 0 for s in sessions)
    assert len(samples) == 6  # each session folded into one sample
    for sample, session in zip(samples, sessions):
        learnt = [t for t, m in zip(sample.completion_ids, sample.env_mask) if m]
        assert learnt == [t for call in session.calls for t in call.choices[0].token_ids]
        assert all(call.choices[0].tool_calls and call.choices[0].tool_calls[0]["function"]["name"] == "move" for call in session.calls)
    again, _ = format_samples(play, [{"seed": s} for s in range(6)], tokenizer, seed=1)
    assert [s.completion_ids for s in again] == [s.completion_ids for s in samples]  # seeded
    with pytest.raises(ValueError, match="needs the prompt's tools"):
        format_samples(talker, [{"id": 0}], tokenizer)


def test_a_random_tool_caller_behind_the_proxy_calls_the_tool_that_tool_choice_names(server):
    from envhub.generation import RandomToolCallGenerator

    def tool(name):
        return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}

    tokenizer = server.proxy.tokenizer
    proxy = ChatProxy(RandomToolCallGenerator(seed=0, tokenizer=tokenizer), tokenizer, model="*")
    for k in range(8):
        body = {"model": "m", "messages": [{"role": "user", "content": "Go."}], "tools": [tool("lamp"), tool("door")],
                "tool_choice": {"type": "function", "function": {"name": "door"}}}
        call = proxy.complete(body, f"named-{k}")["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "door" and json.loads(call["arguments"])["on"] in (True, False)
