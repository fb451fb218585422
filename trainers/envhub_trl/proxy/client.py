"""An envhub env played on the proxy, from the agent's side: the Gymnasium calls, over HTTP.

An agent that plays ``ProxyEnv(base_url, api_key, env_id)`` instead of ``envhub.make(env_id)``
plays the same env, hosted by the proxy under its session (:mod:`envhub_trl.proxy.hosted`), and the
env scores the session: the agent need not compute its reward, and GiGPO's anchors are the env's
own state keys. The same ``base_url`` and ``api_key`` as the agent's OpenAI client::

    env = ProxyEnv(base_url, api_key, "frozenlake/FrozenLakeNotSlippery-v0")
    board, info = env.reset(seed=7)
    board, reward, terminated, truncated, info = env.step("Down")

Only the standard library: an agent needs nothing more than what it already runs with.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from envhub.error import EnvhubError


class ProxyEnvError(EnvhubError):
    """The proxy refused an env request (its OpenAI-style error message), or could not be reached."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ProxyEnv:
    """The env ``env_id``, hosted by the proxy at ``base_url`` under the session ``api_key``.

    Args:
        base_url: the proxy's OpenAI base URL, ``http://HOST:PORT/v1``.
        api_key: the session id (the API key the agent's OpenAI client sends).
        env_id: the envhub id to play.
        timeout: seconds a request may take.
        **kwargs: the env's keyword arguments (as ``envhub.make`` takes them).

    Attributes:
        instructions: the env's instructions (after the first :meth:`reset`).
        tools: a tool env's tool schemas, else None (after the first :meth:`reset`).
    """

    def __init__(self, base_url: str, api_key: str, env_id: str, *, timeout: float = 300.0, **kwargs: Any):
        self.env_id, self.kwargs, self.timeout = env_id, kwargs, timeout
        self._url = f"{base_url.rstrip('/')}/envhub/sessions/{urllib.parse.quote(api_key, safe='')}/env"
        self._headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
        self.instructions = ""
        self.tools: list[dict[str, Any]] | None = None
        self._valid_actions: list[str] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; returns the first observation and its info."""
        answer = self._post("reset", {"env_id": self.env_id, "seed": seed, "kwargs": self.kwargs, "options": options})
        self.instructions, self.tools, self._valid_actions = answer["instructions"], answer["tools"], answer["valid_actions"]
        return answer["observation"], answer["info"]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Act; returns ``(observation, reward, terminated, truncated, info)``."""
        answer = self._post("step", {"action": action})
        self._valid_actions = answer["valid_actions"]
        return answer["observation"], answer["reward"], answer["terminated"], answer["truncated"], answer["info"]

    def valid_actions(self) -> list[str] | None:
        """The legal actions now (None where actions are free-form, or once the episode ended)."""
        return self._valid_actions

    def tool_schemas(self) -> list[dict[str, Any]]:
        """A tool env's tools, as the chat API takes them (after :meth:`reset`)."""
        return list(self.tools or [])

    def close(self) -> None:
        """Nothing to close: the proxy closes the env when the session ends."""

    def _post(self, what: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"{self._url}/{what}", data=json.dumps(body).encode(), headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = exc.reason
            raise ProxyEnvError(f"{self.env_id} {what}: {message}", status=exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ProxyEnvError(f"{self.env_id} {what}: the proxy at {self._url} did not answer ({exc})") from None
