"""``envhub serve`` cannot be exhausted: silent and stuck sessions are closed and their slots freed,
frames that are not JSON objects are answered, HTTP ``/step`` is a 400 naming the WebSocket route,
and a client that goes away is one log line. Each test runs a real server (uvicorn, in a thread)
on 127.0.0.1 with timeouts of a second."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

pytest.importorskip("openenv")
uvicorn = pytest.importorskip("uvicorn")
sync_client = pytest.importorskip("websockets.sync.client")

from click.testing import CliRunner  # noqa: E402
from helper_envs import registered  # noqa: E402
from serve_helpers import free_port  # noqa: E402

from envhub.cli import cli  # noqa: E402
from envhub.integrations.openenv import create_app  # noqa: E402

FLAKY = "test/ServeFlaky-v0"
HANG = "test/ServeHang-v0"
#: How long a test waits for what should take about a second.
PATIENCE_S = 15.0
#: How long ``envhub serve`` may take to answer /health: its imports took over 2 minutes on 2 cores shared with training runs.
START_TIMEOUT_S = 360



@contextlib.contextmanager
def serving(env_id: str, **limits: float) -> Iterator[str]:
    """``create_app(env_id, ...)`` served by uvicorn on a free port of 127.0.0.1; yields ``host:port``."""
    app = create_app(env_id, action_format=None, **limits)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, log_level="info"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + PATIENCE_S
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(PATIENCE_S)


@pytest.fixture
def envs() -> Iterator[None]:
    with registered(FLAKY, "helper_envs:FlakyEnv", max_turns=50), registered(HANG, "helper_envs:HangEnv", max_turns=50):
        yield


def connect(address: str):
    return sync_client.connect(f"ws://{address}/ws", open_timeout=PATIENCE_S)


def ask(ws, message) -> dict:
    ws.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(ws.recv(timeout=PATIENCE_S))


def test_a_silent_session_is_closed_after_the_idle_timeout_and_frees_its_slot(envs):
    with serving(FLAKY, max_sessions=1, idle_timeout=1.0) as address:
        with connect(address) as silent:
            started = time.monotonic()  # the silent session's idle clock runs from its connection, not from the refusal's end
            with connect(address) as refused:
                answer = json.loads(refused.recv(timeout=PATIENCE_S))
                assert answer["type"] == "error" and answer["data"]["code"] == "CAPACITY_REACHED"
            answer = json.loads(silent.recv(timeout=PATIENCE_S))
            assert answer["data"]["code"] == "IDLE_TIMEOUT" and "idle timeout" in answer["data"]["message"]
            assert 0.9 <= time.monotonic() - started < PATIENCE_S
        with connect(address) as newcomer:  # the slot is free again
            assert ask(newcomer, {"type": "reset", "data": {"seed": 0}})["type"] == "observation"


def test_a_session_that_keeps_talking_is_not_closed(envs):
    with serving(FLAKY, max_sessions=1, idle_timeout=1.0) as address, connect(address) as ws:
        ask(ws, {"type": "reset", "data": {"seed": 0}})
        for _ in range(4):  # 2 s in all, each message within the timeout
            time.sleep(0.5)
            assert ask(ws, {"type": "step", "data": {"text": "Ok"}})["type"] == "observation"


def test_a_hung_step_ends_with_an_error_and_frees_the_slot(envs):
    with serving(HANG, max_sessions=1, step_timeout=1.0) as address:
        with connect(address) as ws:
            ask(ws, {"type": "reset", "data": {"seed": 0}})
            started = time.monotonic()
            answer = ask(ws, {"type": "step", "data": {"text": "Boom"}})  # sleeps for an hour
            assert answer["data"]["code"] == "STEP_TIMEOUT" and "step timeout (1 s)" in answer["data"]["message"]
            assert time.monotonic() - started < PATIENCE_S
        with connect(address) as newcomer:
            assert ask(newcomer, {"type": "reset", "data": {"seed": 1}})["type"] == "observation"
            assert ask(newcomer, {"type": "step", "data": {"text": "Ok"}})["data"]["done"] is False


@pytest.mark.parametrize("frame", ["[1, 2]", '"x"', "3", "null", "{not json"])
def test_a_frame_that_is_not_a_json_object_gets_an_error_and_the_session_lives_on(envs, frame):
    with serving(FLAKY) as address, connect(address) as ws:
        first = ask(ws, {"type": "reset", "data": {"seed": 0}})
        answer = ask(ws, frame)
        assert answer["type"] == "error" and answer["data"]["code"] in ("INVALID_MESSAGE", "INVALID_JSON")
        answer = ask(ws, {"type": "step", "data": {"text": "Ok"}})
        assert answer["type"] == "observation"
        assert answer["data"]["observation"]["text"] != first["data"]["observation"]["text"]  # the same episode went on


def test_http_step_answers_400_naming_the_websocket_route(envs):
    with serving(FLAKY) as address:
        for body in (json.dumps({"action": {"text": "Ok"}}), "not json", "{}"):
            request = urllib.request.Request(f"http://{address}/step", data=body.encode(), headers={"content-type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(request, timeout=PATIENCE_S)
            assert caught.value.code == 400
            assert "/ws" in json.loads(caught.value.read())["detail"]


def _post(address: str, path: str, body: bytes, *, chunked: bool = False) -> tuple[int, bytes]:
    """POST ``body`` over a real socket (with a Content-Length, or in 4 kB chunks without one) and
    read the answer; a server that answers before the whole body is sent may close its end early."""
    import http.client

    host, port = address.split(":")
    if chunked:
        framing = b"transfer-encoding: chunked"
        payload = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 4096]), body[i : i + 4096]) for i in range(0, len(body), 4096)) + b"0\r\n\r\n"
    else:
        framing, payload = b"content-length: %d" % len(body), body
    request = b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n%s\r\n\r\n" % (path.encode(), host.encode(), framing)
    with socket.create_connection((host, int(port)), timeout=PATIENCE_S) as connection:
        try:
            connection.sendall(request + payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading it all
        response = http.client.HTTPResponse(connection)
        response.begin()
        return response.status, response.read()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_http_body_over_the_limit_is_answered_413_and_one_under_it_is_served(envs, chunked):
    with serving(FLAKY, max_body_bytes=4096) as address:
        small = json.dumps({"seed": 0}).encode()
        status, body = _post(address, "/reset", small, chunked=chunked)
        assert status == 200 and "observation" in json.loads(body)
        large = json.dumps({"seed": 0, "padding": "x" * 64_000}).encode()
        status, body = _post(address, "/reset", large, chunked=chunked)
        assert status == 413 and "limit of 4096 bytes" in json.loads(body)["detail"]
        assert _post(address, "/reset", small, chunked=chunked)[0] == 200  # the server goes on


def test_the_default_http_body_limit_is_one_mebibyte(envs):
    with serving(FLAKY) as address:
        status, body = _post(address, "/reset", json.dumps({"seed": 0, "padding": "x" * (1 << 20)}).encode())
        assert status == 413 and f"limit of {1 << 20} bytes" in json.loads(body)["detail"]


def test_serve_refuses_a_body_limit_that_is_not_positive():
    result = CliRunner().invoke(cli, ["serve", "frozenlake/FrozenLake-v0", "--max-body-bytes", "0"])
    assert result.exit_code == 2 and "Invalid value for '--max-body-bytes'" in result.output


def test_a_client_that_goes_away_is_one_log_line(envs, caplog):
    caplog.set_level(logging.INFO)
    with serving(FLAKY) as address:
        with connect(address) as polite:
            ask(polite, {"type": "reset", "data": {"seed": 0}})
        with connect(address) as abrupt:
            ask(abrupt, {"type": "reset", "data": {"seed": 0}})
            abrupt.socket.shutdown(socket.SHUT_RDWR)  # no closing handshake, as a killed client
            abrupt.socket.close()
        deadline = time.monotonic() + PATIENCE_S
        while len([r for r in caplog.records if r.name == "envhub.serve"]) < 2:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
        time.sleep(0.2)  # anything the server would log after the session ended
    sessions = [r.getMessage() for r in caplog.records if r.name == "envhub.serve"]
    assert len(sessions) == 2 and all("client went away" in line for line in sessions), sessions
    assert not [r for r in caplog.records if r.exc_info or "Exception in ASGI application" in r.getMessage()]


def test_serve_says_the_host_is_not_valid():
    result = CliRunner().invoke(cli, ["serve", FLAKY.replace("test/ServeFlaky", "frozenlake/FrozenLake"), "--host", "999.1.1.1"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "--host 999.1.1.1 is not a valid address" in result.output and "port" not in result.output


@pytest.mark.parametrize("option", ["--idle-timeout", "--step-timeout"])
def test_serve_refuses_a_timeout_that_is_not_positive(option):
    result = CliRunner().invoke(cli, ["serve", "frozenlake/FrozenLake-v0", option, "0"])
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output


def test_envhub_serve_logs_a_vanished_client_in_one_line(tmp_path):
    """The command itself (its log set-up, uvicorn's own handling) over a real socket: a client
    killed mid-session is one line on stderr, not an ASGI traceback."""
    import subprocess
    import sys

    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "envhub", "serve", "frozenlake/FrozenLake-v0", "--port", str(port), "--idle-timeout", "30"],
            stdout=log_file, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        with connect(f"127.0.0.1:{port}") as ws:
            assert ask(ws, {"type": "reset", "data": {"seed": 0}})["type"] == "observation"
            ws.socket.shutdown(socket.SHUT_RDWR)
            ws.socket.close()
        deadline = time.monotonic() + PATIENCE_S
        while "client went away" not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        process.terminate()
        process.wait(timeout=30)
    lines = log_path.read_text().splitlines()
    assert len([line for line in lines if "client went away" in line]) == 1
    assert not [line for line in lines if "Traceback" in line or "Exception in ASGI" in line], lines
