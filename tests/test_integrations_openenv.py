"""``envhub serve``: an envhub env over OpenEnv's protocol, played by OpenEnv's own GenericEnvClient
(the real openenv-core) against a server on localhost."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("openenv")

from click.testing import CliRunner  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

from envhub.cli import cli  # noqa: E402
from serve_helpers import serving  # noqa: E402

ENV = "sokoban/Sokoban-v0"


@pytest.fixture(scope="module")
def server():
    """``envhub serve ENV`` in a child process on a free port, up to 2 sessions; stopped at the end."""
    with serving(ENV, "--max-sessions", "2") as url:
        yield url


def expert_record(seed: int) -> dict:
    result = CliRunner().invoke(cli, ["run", ENV, "--policy", "expert", "--seed", str(seed), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def play(client, seed: int, record: dict, pause_s: float = 0.0) -> list[dict]:
    """Play ``record``'s actions as answer-format replies; return the transcript as ``envhub run`` writes it."""
    result = client.reset(seed=seed)
    assert result.done is False and result.observation["info"]["instructions"]
    info = {k: v for k, v in result.observation["info"].items() if k not in ("instructions", "terminated", "truncated")}
    transcript = [{"observation": result.observation["text"], "action": None, "reward": 0.0, "info": info}]
    for turn in record["transcript"][1:]:
        time.sleep(pause_s)
        result = client.step({"text": f"<answer>{turn['action']}</answer>"})
        info = {k: v for k, v in result.observation["info"].items() if k not in ("terminated", "truncated")}
        transcript.append({"observation": result.observation["text"], "action": turn["action"], "reward": result.reward, "info": info})
    assert result.done is True and result.observation["valid_actions"] is None
    return transcript


@pytest.mark.slow
def test_the_openenv_client_plays_an_expert_episode(server):
    record = expert_record(0)
    with GenericEnvClient(base_url=server).sync() as client:
        assert play(client, 0, record) == record["transcript"]
        state = client.state()
        assert state["env_id"] == ENV and state["success"] is True and state["step_count"] == record["turns"]
        assert state["episode_return"] == pytest.approx(record["return"])
        with pytest.raises(RuntimeError, match="no episode running; call reset"):
            client.step({"text": "<answer>Up</answer>"})


@pytest.mark.slow
def test_two_concurrent_clients_do_not_share_state(server):
    """Two sessions at once, each on its own seed, stepping in parallel threads: each plays its
    own episode exactly, so neither saw the other's environment."""
    records = {seed: expert_record(seed) for seed in (1, 2)}
    assert records[1]["transcript"][0]["observation"] != records[2]["transcript"][0]["observation"]
    with GenericEnvClient(base_url=server).sync() as first, GenericEnvClient(base_url=server).sync() as second:
        with ThreadPoolExecutor(2) as pool:
            played = pool.map(lambda job: play(job[0], job[1], records[job[1]], pause_s=0.01), [(first, 1), (second, 2)])
            assert [t for t in played] == [records[1]["transcript"], records[2]["transcript"]]
        assert first.state()["seed"] == 1 and second.state()["seed"] == 2
        assert first.state()["episode_id"] != second.state()["episode_id"]


@pytest.mark.slow
def test_a_bad_reply_is_an_invalid_turn_and_a_bad_action_a_clear_error(server):
    with GenericEnvClient(base_url=server).sync() as client:
        first = client.reset(seed=0)
        result = client.step({"text": "Up"})  # no <answer> tags: a wasted turn, the state unchanged
        assert result.observation["info"]["action_is_valid"] is False and result.done is False
        assert result.observation["info"]["state_key"] == first.observation["info"]["state_key"]
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"reply": "<answer>Up</answer>"})  # the action's field is "text"


def test_serve_refuses_bad_input_in_one_line(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["serve", "sokoban/Sokoban-v9"])
    assert result.exit_code != 0 and "no environment 'sokoban/Sokoban-v9' is registered" in result.output
    result = runner.invoke(cli, ["serve", ENV, "--env-kwarg", "bogus=1"])
    assert result.exit_code != 0 and "refuses --env-kwarg bogus" in result.output and "Traceback" not in result.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = runner.invoke(cli, ["serve", ENV, "--port", str(taken.getsockname()[1])])
    assert result.exit_code != 0 and "is in use; pick another with --port" in result.output


@pytest.mark.slow
def test_integrations_page_openenv_example_plays_against_the_server(server, capsys):
    from docs_pages import DOCS, code_block

    page = DOCS / "integrations.md"
    assert code_block(page, "bash", lambda b: b.startswith("envhub serve")).strip() == f"envhub serve {ENV} --port 8000"
    source = code_block(page, "python", lambda b: "GenericEnvClient(" in b)
    assert '"http://localhost:8000"' in source, "the integrations page's example changed: its URL is gone"
    namespace: dict = {}
    exec(compile(source.replace('"http://localhost:8000"', repr(server)), "docs/integrations.md", "exec"), namespace)  # noqa: S102
    reward, won = capsys.readouterr().out.split()
    assert won == "False" and float(reward) < 0  # pushing Up until the turn limit: a step penalty each turn
    assert "Sokoban" in namespace["system_prompt"] or "box" in namespace["system_prompt"]
