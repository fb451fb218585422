"""``envhub proxy``: the command serves a model folder to the real OpenAI client and records the session."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner

from envhub.cli import cli
from envhub_trl.proxy.client import ProxyEnv, ProxyEnvError
from serve_helpers import free_port


def test_proxy_command_refuses_an_unknown_generator_and_model():
    result = CliRunner().invoke(cli, ["proxy", "--model", "tiny", "--generator", "nope"])
    assert result.exit_code == 2 and "cannot load a model folder" in result.output
    result = CliRunner().invoke(cli, ["proxy", "--model", "/no/such/model-folder", "--port", "8765"])
    assert result.exit_code == 1 and "Error" in result.output
    result = CliRunner().invoke(cli, ["proxy", "--model", "tiny", "--env", "nowhere/Nothing-v0"])
    assert result.exit_code == 2 and "--env" in result.output and "nowhere/Nothing-v0" in result.output



@pytest.mark.slow
def test_envhub_proxy_serves_a_model_folder(tmp_path: Path):
    from envhub_trl.tiny import build_tiny

    folder = build_tiny(tmp_path / "tiny", env_ids=["frozenlake/FrozenLake-v0"])
    port = free_port()
    command = [sys.executable, "-m", "envhub", "proxy", "--model", str(folder), "--served-name", "tiny", "--port", str(port),
               "--env", "frozenlake/FrozenLakeNotSlippery-v0"]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/v1/models").raise_for_status()
                break
            except httpx.HTTPError:
                assert server.poll() is None and time.monotonic() < deadline, server.stderr.read() if server.poll() is not None else "no answer"
                time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="collect-1", max_retries=0)
        lake = ProxyEnv(f"http://127.0.0.1:{port}/v1", "collect-1", "frozenlake/FrozenLakeNotSlippery-v0")
        lake.reset(seed=4)
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Go."}], max_tokens=5, seed=1)
        lake.step("Down")
        with pytest.raises(ProxyEnvError, match="hosts"):  # only the --env ids
            ProxyEnv(f"http://127.0.0.1:{port}/v1", "collect-2", "frozenlake/FrozenLake-v0").reset(seed=0)
        session = httpx.delete(f"http://127.0.0.1:{port}/v1/envhub/sessions/collect-1").json()
        assert httpx.get(f"http://127.0.0.1:{port}/v1/envhub/sessions/collect-1").status_code == 404  # collected and forgotten
        assert reply.usage.completion_tokens == len(session["calls"][0]["choices"][0]["token_ids"]) >= 1
        assert len(session["calls"][0]["prompt_ids"]) == reply.usage.prompt_tokens
        assert session["env"]["env_id"] == "frozenlake/FrozenLakeNotSlippery-v0" and list(session["env"]["rewards"]) == ["0"]
    finally:
        server.terminate()
        server.wait(timeout=30)
