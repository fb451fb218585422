"""Envs the proxy hosts: an agent plays an envhub env through the proxy (``ProxyEnv``), and the env,
not the agent, scores its session: its rewards on the calls whose replies earned them, its state
keys as GiGPO's anchors, its success. Bad env requests get OpenAI-style 4xx errors, never a 5xx."""

from __future__ import annotations

import json

import httpx
import pytest

import envhub
from envhub_trl.proxy import ChatProxy, HostedEnvs, ProxyEnv, ProxyEnvError, ProxyServer, create_app, session_trajectory
from envhub_trl.proxy.agents import load_agent, play_agents
from envhub_trl.tiny import build_tiny, build_tokenizer
from proxy_helpers import Echo, Scripted, expert_moves, openai_error as _error

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["hello there, a tiny corpus for the tests of the envs the proxy hosts"] * 4, vocab_size=300)


@pytest.fixture()
def server(tokenizer):
    with ProxyServer(ChatProxy(Echo(tokenizer), tokenizer, model="m")) as running:
        yield running


def _post(server, path, body, session="s"):
    return httpx.post(f"{server.base_url}/envhub/sessions/{session}/env/{path}", json=body)


def _chat(server, session="s"):
    return httpx.post(f"{server.base_url}/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4},
                      headers={"Authorization": f"Bearer {session}"})


def test_an_env_played_on_the_proxy_is_the_env_played_here(server):
    """Same seed, same episode: the observations, rewards and infos over HTTP are the local env's."""
    local = envhub.make(LAKE)
    remote = ProxyEnv(server.base_url, "s", LAKE)
    assert remote.reset(seed=11) == local.reset(seed=11)
    assert remote.instructions == local.instructions and remote.valid_actions() == local.valid_actions()
    for action in ["Down", "Jump", "Right", "Down", "Down", "Right", "Right"]:
        here = local.step(action)
        assert remote.step(action) == here
        if here[2] or here[3]:
            break
    assert remote.valid_actions() is None  # the episode ended
    assert len(server.envs) == 1


def test_the_env_scores_the_session_on_the_calls_that_earned_it(server):
    """Each step's reward goes on the session's latest call (a step before the first call, on the
    first), a call's state key is the env's state when it was made, and the episode's success and
    ending are the env's."""
    env = ProxyEnv(server.base_url, "won", LAKE)
    _, info = env.reset(seed=5)
    local = envhub.make(LAKE)
    local.reset(seed=5)
    moves = []
    while not moves or not local.step(moves[-1])[2]:
        moves.append(local.expert_action())
    boards = [info["state_key"]]
    assert env.step("Jump")[4]["action_is_valid"] is False  # before any call: charged to call 0
    _chat(server, "won")
    for move in moves:  # calls 1..: one move each
        _chat(server, "won")
        boards.append(env.step(move)[4]["state_key"])
    session = server.proxy.store.find("won")
    assert session.env_id == LAKE and session.env_success and session.env_terminated
    last = len(moves)
    assert len(session.calls) == last + 1 and session.env_rewards == {**{i: 0.0 for i in range(last)}, last: 1.0}
    assert session.env_invalid == {0}
    episode = session_trajectory(session)
    assert episode.success and episode.terminated and episode.end_reason == "terminated"
    assert episode.episode_return == pytest.approx(1.0) and episode.turns[-1].env_reward == 1.0
    assert [t.state_key for t in episode.turns] == [boards[0], *boards[:-1]]  # "Jump" moved nothing
    assert episode.turns[-1].next_state_key == boards[-1]
    assert [t.action_is_valid for t in episode.turns] == [False] + [True] * last
    recorded = httpx.get(f"{server.base_url}/envhub/sessions/won").json()
    assert recorded["env"]["success"] and recorded["env"]["rewards"][str(last)] == 1.0 and recorded["env"]["invalid_calls"] == [0]
    assert [c["state_key"] for c in recorded["calls"]] == [boards[0], *boards[:-1]]


def test_a_session_that_stops_before_the_env_ends_is_truncated(server):
    env = ProxyEnv(server.base_url, "short", LAKE)
    env.reset(seed=3)
    _chat(server, "short")
    env.step("Up")
    episode = session_trajectory(server.proxy.store.find("short"))
    assert not episode.success and not episode.terminated and episode.truncated and episode.end_reason == "truncated"


def test_the_env_closes_when_its_session_ends(server):
    ProxyEnv(server.base_url, "a", LAKE).reset(seed=0)
    ProxyEnv(server.base_url, "b", LAKE).reset(seed=0)
    env = ProxyEnv(server.base_url, "a", LAKE)
    env.reset(seed=1)  # the same env again: reused, not a third
    assert len(server.envs) == 2
    server.proxy.store.close("a")
    assert len(server.envs) == 1
    _error(_post(server, "step", {"action": "Down"}, session="a"), 409, "env_not_reset")
    _error(_post(server, "reset", {"env_id": LAKE}, session="a"), 409, "session_ended")
    _chat(server, "b")
    assert httpx.delete(f"{server.base_url}/envhub/sessions/b").status_code == 200
    assert len(server.envs) == 0


@pytest.mark.parametrize(
    "path, body, status, code",
    [
        ("reset", {"env_id": "nowhere/Nothing-v0"}, 404, "env_not_found"),
        ("reset", {"env_id": LAKE, "kwargs": {"no_such_argument": 1}}, 400, None),
        ("reset", {"env_id": LAKE, "seed": -1}, 400, None),
        ("reset", {"env_id": LAKE, "seed": "seven"}, 400, None),
        ("reset", {"env_id": LAKE, "seed": 2**70}, 400, None),
        ("reset", {"env_id": LAKE, "kwargs": [1]}, 400, None),
        ("reset", {"seed": 1}, 400, None),
        ("reset", ["not", "an", "object"], 400, None),
        ("step", {"action": "Down"}, 409, "env_not_reset"),
        ("step", {"action": 3}, 400, None),
        ("step", {}, 400, None),
    ],
)
def test_bad_env_requests_get_openai_errors(server, path, body, status, code):
    _error(_post(server, path, body, session="bad"), status, code)


def test_a_step_after_the_episode_ended_is_refused(server):
    env = ProxyEnv(server.base_url, "over", LAKE)
    env.reset(seed=5)
    local = envhub.make(LAKE)
    local.reset(seed=5)
    done = False
    while not done:
        move = local.expert_action()
        done = local.step(move)[2]
        env.step(move)
    with pytest.raises(ProxyEnvError, match="has ended") as raised:
        env.step("Down")
    assert raised.value.status == 409
    assert env.reset(seed=5)[0] == local.reset(seed=5)[0]  # a reset starts the next episode


def test_only_the_envs_allowed_and_at_most_max_envs(tokenizer):
    with ProxyServer(ChatProxy(Echo(tokenizer), tokenizer, model="m"), env_ids=[LAKE], max_envs=1) as running:
        _error(_post(running, "reset", {"env_id": "sokoban/Sokoban6x6-v0"}), 404, "env_not_found")
        assert _post(running, "reset", {"env_id": LAKE}, session="one").status_code == 200
        _error(_post(running, "reset", {"env_id": LAKE}, session="two"), 429, "too_many_envs")
    assert len(running.envs) == 0  # closed with the server


class Broken:
    """An env that fails in each way it can: its step raises, or returns a reward that is no number;
    made as ``no-list``, its ``valid_actions`` raises too; and it will not close."""

    instructions = "Break."

    def __init__(self, env_id):
        self.lists = env_id != "no-list"

    def reset(self, seed=None, options=None):
        return "start", {"state_key": "0", "success": False, "action_is_valid": True}

    def step(self, action):
        if action == "nan":
            return "x", float("nan"), False, False, {}
        if action == "text":
            return "x", "one", False, False, {}
        raise RuntimeError("the engine fell over")

    def valid_actions(self):
        if not self.lists:
            raise KeyError("no list today")
        return None

    def close(self):
        raise OSError("and would not close")


def test_an_env_that_raises_fails_its_session_with_a_4xx(tokenizer):
    from starlette.testclient import TestClient

    proxy = ChatProxy(Echo(tokenizer), tokenizer, model="m")
    envs = HostedEnvs(proxy.store, make=lambda env_id, **kwargs: Broken(env_id))
    client = TestClient(create_app(proxy, envs=envs))
    _error(client.post("/v1/envhub/sessions/r/env/reset", json={"env_id": "no-list"}), 422, "env_error")
    assert client.post("/v1/envhub/sessions/s/env/reset", json={"env_id": "any"}).json()["observation"] == "start"
    _error(client.post("/v1/envhub/sessions/s/env/step", json={"action": "go"}), 422, "env_error")
    assert "the engine fell over" in proxy.store.find("s").error
    client.post("/v1/envhub/sessions/t/env/reset", json={"env_id": "any"})
    _error(client.post("/v1/envhub/sessions/t/env/step", json={"action": "nan"}), 422, "env_error")
    client.post("/v1/envhub/sessions/u/env/reset", json={"env_id": "any"})
    _error(client.post("/v1/envhub/sessions/u/env/step", json={"action": "text"}), 422, "env_error")
    envs.close()  # an env that fails to close does not take the proxy with it
    assert len(envs) == 0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("hosted") / "tiny", env_ids=[LAKE])


def test_the_frozenlake_agent_on_the_proxy_plays_the_episode_of_its_own_copy(tiny):
    """``play_on_proxy`` and ``play`` make the same calls and earn the same return; the proxy's env
    gives each turn its board as the state key, so a turn that asked again after a text reply shares
    its anchor with the turn before (the board had not changed)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    local = envhub.make(LAKE)
    local.reset(seed=5)
    moves = []
    while not moves or not local.step(moves[-1])[2]:
        moves.append(local.expert_action())
    sessions = {}
    for name in ("play", "play_on_proxy"):
        with ProxyServer(ChatProxy(expert_moves(tokenizer, moves), tokenizer, model="*")) as lake:
            batch = play_agents(load_agent(f"examples/agents/frozenlake_openai.py:{name}"), [{"seed": 5}], 1, lake)
        sessions[name] = batch.sessions[0][0]
    own, hosted = (session_trajectory(sessions[n]) for n in ("play", "play_on_proxy"))
    assert [t.completion_ids for t in own.turns] == [t.completion_ids for t in hosted.turns]
    assert own.episode_return == pytest.approx(hosted.episode_return) == pytest.approx(0.9)
    assert hosted.success and hosted.end_reason == "terminated" and sessions["play_on_proxy"].reward == pytest.approx(-0.1)
    local.reset(seed=5)
    boards = [local.state_key()]
    for move in moves:
        boards.append(local.step(move)[4]["state_key"])
    assert [t.state_key for t in hosted.turns] == [boards[0], *boards[:-1]]
    assert hosted.turns[-1].next_state_key == boards[-1]


def test_the_countdown_agent_is_scored_by_the_env_it_plays_on_the_proxy(tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    env = envhub.make("tools/Countdown-v0")
    env.reset(seed=2)
    solution = json.loads(env.expert_action())["arguments"]["expression"]
    calls = ['<tool_call>\n{"name": "%s", "arguments": {"expression": "%s"}}\n</tool_call>' % (name, solution) for name in ("calculate", "submit")]
    with ProxyServer(ChatProxy(Scripted(tokenizer, calls), tokenizer, model="*")) as countdown:
        batch = play_agents(load_agent("examples/agents/countdown_tools.py:play"), [2], 1, countdown)
    session = batch.sessions[0][0]
    env.reset(seed=2)
    earned = [env.step(json.dumps({"name": name, "arguments": {"expression": solution}}))[1] for name in ("calculate", "submit")]
    assert session.error is None and session.reward == 0.0 and session.env_rewards == {0: earned[0], 1: earned[1]}
    episode = session_trajectory(session)
    assert earned[1] > 0 and episode.success and episode.episode_return == pytest.approx(sum(earned))
    assert [t.reward for t in episode.turns] == pytest.approx(earned)
