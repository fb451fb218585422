"""The proxy refuses bad requests with OpenAI-style 4xx errors, never a 5xx: an unknown model, a
missing session id, malformed messages or fields, an oversized body, a prompt past the context."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest

from envhub_trl.proxy import ChatProxy, ProxyServer
from envhub_trl.tiny import build_tokenizer
from proxy_helpers import Echo, openai_error as _error

VALID = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def server():
    tokenizer = build_tokenizer(["hello there, this is a tiny corpus for the proxy's error tests"] * 4, vocab_size=300)
    with ProxyServer(ChatProxy(Echo(tokenizer), tokenizer, model="m", max_context=64), max_body_bytes=4096) as running:
        yield running


def _post(server, body, session="s", raw=None, path="/chat/completions"):
    headers = {"Authorization": f"Bearer {session}"} if session else {}
    content = raw if raw is not None else json.dumps(body)
    return httpx.post(server.base_url + path, content=content, headers={**headers, "content-type": "application/json"})


def test_a_valid_request_is_answered(server):
    response = _post(server, VALID)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "ok"
    assert _post(server, VALID, session=None, raw=json.dumps(VALID), path="/chat/completions").status_code == 401


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({**VALID, "model": "gpt-9"}, 404, "model_not_found"),
        ({**VALID, "messages": "hello"}, 400, None),
        ({**VALID, "messages": []}, 400, None),
        ({**VALID, "messages": [{"content": "no role"}]}, 400, None),
        ({**VALID, "messages": [{"role": "robot", "content": "x"}]}, 400, None),
        ({**VALID, "messages": [{"role": "user", "content": 7}]}, 400, None),
        ({**VALID, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, None),
        ({**VALID, "messages": [{"role": "user"}]}, 400, None),
        ({**VALID, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]}, 400, None),
        ({**VALID, "temperature": 5}, 400, None),
        ({**VALID, "top_p": 0}, 400, None),
        ({**VALID, "n": 0}, 400, None),
        ({**VALID, "max_tokens": 0}, 400, None),
        ({**VALID, "max_tokens": "ten"}, 400, None),
        ({**VALID, "stop": ["a", "b", "c", "d", "e"]}, 400, None),
        ({**VALID, "top_logprobs": 3}, 400, None),
        ({**VALID, "tools": "move"}, 400, None),
        ({**VALID, "tool_choice": "required"}, 400, None),
        ({**VALID, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, None),
        ({**VALID, "messages": [{"role": "user", "content": "hello " * 80}]}, 400, "context_length_exceeded"),
        ({**VALID, "max_tokens": 60}, 400, "context_length_exceeded"),
        ([VALID], 400, None),
    ],
)
def test_bad_requests_get_openai_errors(server, body, status, code):
    _error(_post(server, body), status, code)


def test_missing_session_id_oversized_body_and_bad_json(server):
    _error(_post(server, VALID, session=None), 401, "missing_session")
    _error(_post(server, None, raw=json.dumps({**VALID, "pad": "x" * 5000})), 413, "body_too_large")
    _error(_post(server, None, raw="{not json"), 400, "invalid_json")
    _error(_post(server, None, raw=b"\xff\xfe"), 400, "invalid_json")
    _error(httpx.get(server.base_url + "/nothing"), 404)
    _error(httpx.put(server.base_url + "/chat/completions"), 405)
    _error(httpx.get(server.base_url + "/envhub/sessions/never"), 404, "session_not_found")
    _error(_post(server, {"reward": "high"}, path="/envhub/sessions/s/reward"), 400)
    _error(_post(server, {"reward": True}, path="/envhub/sessions/s/reward"), 400)
    _error(_post(server, None, raw='{"reward": NaN}', path="/envhub/sessions/s/reward"), 400)  # Python's json reads NaN
    assert _post(server, {"reward": 1.5}, path="/envhub/sessions/s/reward").json()["reward"] == 1.5


def test_the_openai_client_raises_its_own_errors(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="client", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=VALID["messages"])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="m", messages=VALID["messages"], temperature=3)


def test_mangled_requests_never_get_a_5xx(server):
    rng = np.random.default_rng(0)
    values = [None, 0, -1, 1.5, "x", [], {}, [1], {"role": "user"}, True, "auto", [{"type": "text", "text": 3}]]
    keys = ["model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens", "stop", "n", "seed", "logprobs"]
    for _ in range(30):
        body = json.loads(json.dumps(VALID))
        for key in rng.choice(keys, size=2, replace=False):
            body[str(key)] = values[int(rng.integers(len(values)))]
        response = _post(server, body)
        assert response.status_code < 500, (body, response.text)
