"""envhub environments served over OpenEnv's HTTP/WebSocket protocol (``envhub serve ID``).

The server is OpenEnv's own (``openenv.core``'s FastAPI app) around :class:`EnvhubEnvironment`, so
every OpenEnv client works against it unchanged, ``GenericEnvClient`` included::

    from openenv.core import GenericEnvClient

    with GenericEnvClient(base_url="http://localhost:8000").sync() as client:
        result = client.reset(seed=0)
        result = client.step({"text": "<answer>Up</answer>"})
        result.observation["text"], result.reward, result.done

The action is ``{"text": reply}``: a model's reply, read with an envhub reply format
(``<answer>...</answer>`` by default; ``action_format=None`` takes the text as the action). The
observation carries ``text`` (the env's observation), ``valid_actions`` and ``info`` (envhub's info,
with ``terminated``, ``truncated`` and, after a reset, the task's ``instructions``); reward and done
are OpenEnv's own fields. Each WebSocket session gets its own environment.

The WebSocket route ``/ws`` speaks OpenEnv's message protocol, served here by envhub rather than
by OpenEnv's handler, so that no client can exhaust the server:

- a session that sends nothing for ``idle_timeout`` seconds gets an ``IDLE_TIMEOUT`` error and is
  closed, freeing its slot;
- a reset or step that takes longer than ``step_timeout`` seconds gets a ``STEP_TIMEOUT`` error and
  the session is closed, freeing its slot at once (the stuck call is left to finish in its own
  daemon thread: Python cannot stop a thread, so the environment is closed when, if ever, it returns);
- a frame that is not a JSON object gets an error and the session goes on;
- a client that goes away is logged in one line.

Every HTTP request body is limited to ``max_body_bytes`` (1 MiB by default, ``--max-body-bytes``):
a larger one is answered 413 without being read past the limit.

Sessions live only on the WebSocket: ``POST /step`` answers 400 naming ``/ws`` (each HTTP request
would meet a fresh environment that was never reset), and ``POST /reset`` plays nothing either (it
shows a first observation and forgets it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import queue
import threading
import uuid
from collections.abc import Callable
from typing import Any

from envhub.actions import apply_reply, get_format
from envhub.core import TextEnv, jsonable
from envhub.error import MissingDependency
from envhub.executors import DEFAULT_STEP_TIMEOUT
from envhub.registration import make, spec

try:
    from fastapi import WebSocket
    from fastapi.responses import JSONResponse
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.serialization import deserialize_action, serialize_observation
    from openenv.core.env_server.types import (
        Action,
        EnvironmentMetadata,
        Observation,
        State,
        WSErrorResponse,
        WSObservationResponse,
        WSStateResponse,
    )
    from pydantic import Field, ValidationError
    from starlette.websockets import WebSocketDisconnect, WebSocketState
except ImportError as exc:  # pragma: no cover - exercised only where openenv-core is absent
    raise MissingDependency(f"envhub.integrations.openenv needs OpenEnv: pip install 'envhub[openenv]' ({exc})") from exc

__all__ = ["DEFAULT_IDLE_TIMEOUT", "DEFAULT_MAX_BODY_BYTES", "EnvhubEnvironment", "EnvhubState", "TextAction", "TextObservation", "create_app"]

#: Seconds a WebSocket session may stay silent before the server closes it (``--idle-timeout``).
DEFAULT_IDLE_TIMEOUT = 600.0

#: The largest HTTP request body the server reads, in bytes (``--max-body-bytes``).
DEFAULT_MAX_BODY_BYTES = 1 << 20

#: Session events (a client gone, a session closed for silence or a stuck step), one line each.
log = logging.getLogger("envhub.serve")


class TextAction(Action):
    """One reply of the agent."""

    text: str = Field(description="The agent's reply, e.g. '<answer>Up</answer>' (or the bare action where the server takes text as it is)")


class TextObservation(Observation):
    """What the agent sees after a reset or a step."""

    text: str = Field(default="", description="The environment's observation")
    valid_actions: list[str] | None = Field(default=None, description="The actions legal now, where the set is finite")
    info: dict[str, Any] = Field(default_factory=dict, description="envhub's info: action_is_valid, success, state_key, ...")


class EnvhubState(State):
    """The session's episode: OpenEnv's ``episode_id`` and ``step_count``, and envhub's own."""

    env_id: str = ""
    seed: int | None = None
    episode_return: float = 0.0
    success: bool = False
    done: bool = True


class EnvhubEnvironment(Environment[TextAction, TextObservation, EnvhubState]):
    """One envhub environment as an OpenEnv ``Environment``; the server makes one per session.

    Args:
        env_id: the envhub id.
        max_turns: overrides the registered turn limit.
        action_format: the reply format (``"answer"``, ``"think-answer"``), or None to take the
            action text as it is.
        env_kwargs: keyword arguments of the environment.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session owns its own TextEnv; nothing is shared

    def __init__(
        self,
        env_id: str,
        max_turns: int | None = None,
        action_format: str | None = "answer",
        env_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.env: TextEnv = make(env_id, max_turns=max_turns, **(env_kwargs or {}))
        self.fmt = get_format(action_format) if action_format is not None else None
        self._state = EnvhubState(env_id=env_id)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        """Start an episode (``seed`` as Gymnasium's); the info carries the task's instructions."""
        observation, info = self.env.reset(seed=seed)
        episode_id = episode_id or uuid.uuid4().hex
        self._state = EnvhubState(env_id=self._state.env_id, episode_id=episode_id, seed=seed, success=bool(info["success"]), done=False)
        parts = [self.env.instructions.strip(), self.fmt.instructions() if self.fmt is not None else ""]
        info = {**info, "instructions": "\n\n".join(part for part in parts if part)}
        return self._observation(observation, 0.0, False, False, info)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        """Apply one reply; ``done`` is Gymnasium's ``terminated or truncated``."""
        if self.fmt is None:
            observation, reward, terminated, truncated, info = self.env.step(action.text)
        else:
            outcome = apply_reply(self.env, action.text, self.fmt)
            observation, reward, terminated, truncated, info = (
                outcome.observation, outcome.reward, outcome.terminated, outcome.truncated, outcome.info
            )
        state = self._state
        state.step_count = self.env.turn
        state.episode_return += float(reward)
        state.success = bool(info["success"])
        state.done = bool(terminated or truncated)
        return self._observation(observation, float(reward), terminated, truncated, info)

    @property
    def state(self) -> EnvhubState:
        """The session's episode."""
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        """The env's id, description and plugin version."""
        env_spec = spec(self._state.env_id)
        return EnvironmentMetadata(name=env_spec.id, description=env_spec.description or env_spec.id, version=env_spec.version)

    def close(self) -> None:
        """Close the envhub environment."""
        self.env.close()

    def _observation(self, text: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> TextObservation:
        done = bool(terminated or truncated)
        return TextObservation(
            text=text,
            valid_actions=None if done else self.env.valid_actions(),
            info=jsonable({**info, "terminated": bool(terminated), "truncated": bool(truncated)}),
            reward=reward,
            done=done,
        )


class _SessionThread:
    """One daemon thread that runs a session's environment calls, in order.

    Not a ``ThreadPoolExecutor``: its threads are joined when the interpreter exits, so one
    environment stuck in a step would keep a stopped server from exiting. A daemon thread can be
    abandoned: the session goes, and the thread ends whenever the stuck call returns.
    """

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        """Queue ``fn(*args)``; the future holds its result or exception."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        return future

    def stop(self) -> None:
        """End the thread after the calls already queued."""
        self._jobs.put(None)

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the awaiting session, which reports it
                future.set_exception(exc)


class _StepTimeout(Exception):
    """An environment call took longer than the server's step timeout."""


class _Session:
    """One WebSocket client's environment and the protocol around it (OpenEnv's messages:
    ``reset``, ``step``, ``state``, ``close``)."""

    def __init__(self, websocket: WebSocket, step_timeout: float, name: str):
        self.websocket = websocket
        self.step_timeout = step_timeout
        self.thread = _SessionThread(f"envhub-serve-{name}")
        self.env: EnvhubEnvironment | None = None
        self.steps = 0

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the session's thread, within ``step_timeout`` seconds.

        Raises:
            _StepTimeout: when it takes longer (the session must then end).
        """
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.thread.submit(fn, *args)), self.step_timeout)
        except asyncio.TimeoutError:
            raise _StepTimeout(
                f"the environment took longer than the server's step timeout ({self.step_timeout:g} s); "
                "this session is closed: connect again for a new one"
            ) from None

    async def send(self, response: Any) -> None:
        await self.websocket.send_text(response.model_dump_json())

    async def error(self, message: str, code: str, **extra: Any) -> None:
        await self.send(WSErrorResponse(data={"message": message, "code": code, **extra}))

    async def handle(self, raw: str) -> bool:
        """Answer one frame; False when the session should end (a ``close`` message)."""
        try:
            message = json.loads(raw)
        except json.JSONDecodeError as exc:
            await self.error(f"Invalid JSON: {exc}", "INVALID_JSON")
            return True
        if not isinstance(message, dict):
            await self.error(
                f'a message must be a JSON object such as {{"type": "step", "data": {{"text": "..."}}}}, got {type(message).__name__}',
                "INVALID_MESSAGE",
            )
            return True
        kind = message.get("type")
        data = message.get("data", {})
        if kind == "close":
            return False
        if kind not in ("reset", "step", "state"):
            await self.error(f"Unknown message type: {kind!r}; send reset, step, state or close", "UNKNOWN_TYPE")
            return True
        if not isinstance(data, dict):
            await self.error(f"the data of a {kind} message must be a JSON object, got {type(data).__name__}", "VALIDATION_ERROR")
            return True
        assert self.env is not None
        try:
            if kind == "reset":
                options = {k: data[k] for k in ("seed", "episode_id") if k in data}
                observation = await self.call(functools.partial(self.env.reset, **options))
                await self.send(WSObservationResponse(data=serialize_observation(observation)))
            elif kind == "step":
                action = deserialize_action(data, TextAction)
                observation = await self.call(self.env.step, action)
                self.steps += 1
                await self.send(WSObservationResponse(data=serialize_observation(observation)))
            else:
                await self.send(WSStateResponse(data=self.env.state.model_dump()))
        except ValidationError as exc:
            await self.error("Invalid message", "VALIDATION_ERROR", errors=json.loads(exc.json()))
        except (_StepTimeout, WebSocketDisconnect):  # the session ends: the endpoint says why
            raise
        except Exception as exc:  # the env's own error: the client sees it, the session goes on
            await self.error(str(exc), "EXECUTION_ERROR")
        return True

    def close(self) -> None:
        """Close the environment in its thread (after a stuck call, whenever that returns) and end the thread."""
        if self.env is not None:
            self.thread.submit(self.env.close)
        self.thread.stop()


def _session_routes(
    app: Any, factory: Callable[[], EnvhubEnvironment], *, max_sessions: int, idle_timeout: float, step_timeout: float
) -> None:
    """Replace OpenEnv's ``/ws`` handler, its stateless ``POST /step`` and its MCP routes (envhub
    environments speak no MCP) with envhub's: bounded sessions (see the module docstring)."""
    def replaced(route: Any) -> bool:
        path, methods = getattr(route, "path", None), getattr(route, "methods", None) or set()
        return path in ("/ws", "/mcp") or (path == "/step" and "POST" in methods)

    app.router.routes[:] = [r for r in app.router.routes if not replaced(r)]
    open_sessions: set[str] = set()

    @app.post("/step", status_code=400, tags=["Environment Control"], summary="Not served: step over the WebSocket route /ws")
    async def step_over_http() -> JSONResponse:
        return JSONResponse(
            status_code=400,
            content={
                "detail": "this server keeps episodes only on WebSocket sessions: connect to /ws (OpenEnv's GenericEnvClient "
                "does) and send reset, then step; over HTTP every request would meet a fresh environment that was never reset"
            },
        )

    @app.websocket("/ws")
    async def websocket_endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        name = uuid.uuid4().hex[:8]
        if len(open_sessions) >= max_sessions:
            await websocket.send_text(WSErrorResponse(data={
                "message": f"the server holds its maximum of {max_sessions} sessions; try again later",
                "code": "CAPACITY_REACHED", "active_sessions": len(open_sessions), "max_sessions": max_sessions,
            }).model_dump_json())
            await websocket.close()
            return
        open_sessions.add(name)
        session = _Session(websocket, step_timeout, name)
        why = "closed"
        try:
            session.env = await session.call(factory)
            while True:
                try:
                    frame = await asyncio.wait_for(websocket.receive(), idle_timeout)
                except asyncio.TimeoutError:
                    why = f"closed after {idle_timeout:g} s without a message"
                    await session.error(f"no message for {idle_timeout:g} s (the server's idle timeout); this session is closed", "IDLE_TIMEOUT")
                    break
                if frame["type"] == "websocket.disconnect":
                    raise WebSocketDisconnect(frame.get("code", 1000))
                text = frame.get("text")
                if text is None:
                    text = (frame.get("bytes") or b"").decode("utf-8", errors="replace")
                if not await session.handle(text):
                    break
        except WebSocketDisconnect as exc:
            why = f"client went away (code {exc.code})"
        except _StepTimeout as exc:
            why = f"closed: a call took longer than {step_timeout:g} s"
            await _quietly(session.error(str(exc), "STEP_TIMEOUT"))
        except Exception as exc:  # the environment could not be made: the client is told, the server goes on
            why = f"closed: {type(exc).__name__}: {exc}"
            await _quietly(session.error(f"cannot make the environment: {exc}", "FACTORY_ERROR"))
        finally:
            open_sessions.discard(name)
            session.close()
            log.info("session %s: %s after %d steps (%d sessions open)", name, why, session.steps, len(open_sessions))
            if websocket.application_state == WebSocketState.CONNECTED:
                await _quietly(websocket.close())


class _BodyLimit:
    """ASGI middleware: an HTTP request whose body is over ``limit`` bytes gets 413, read no further
    than the limit (one that declares a longer ``Content-Length`` is refused before its first byte;
    one sent in chunks is held up to the limit, then passed on whole)."""

    def __init__(self, app: Any, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:  # the HTTP parser holds the body to its declared length
            if declared.strip().isdigit() and int(declared) > self.limit:
                await self._refuse(send)
            else:
                await self.app(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self._refuse(send)
                return
            if not message.get("more_body"):
                break
        whole = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Any:
            return whole.pop() if whole else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Callable[[Any], Any]) -> None:
        body = json.dumps({"detail": f"the request body is over this server's limit of {self.limit} bytes (envhub serve --max-body-bytes)"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _quietly(send: Any) -> None:
    """Await a send or close to a client that may have gone meanwhile (that is no error)."""
    try:
        await send
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass


def create_app(
    env_id: str,
    *,
    max_turns: int | None = None,
    action_format: str | None = "answer",
    env_kwargs: dict[str, Any] | None = None,
    max_sessions: int = 64,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    step_timeout: float = DEFAULT_STEP_TIMEOUT,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Any:
    """OpenEnv's FastAPI app serving ``env_id``, one environment per WebSocket session.

    Args:
        env_id: the envhub id.
        max_turns: overrides the registered turn limit.
        action_format: the reply format, or None to take the action text as it is.
        env_kwargs: keyword arguments of the environment.
        max_sessions: WebSocket sessions at once; one more is refused with ``CAPACITY_REACHED``.
        idle_timeout: seconds a session may send nothing before it is closed.
        step_timeout: seconds one reset or step may take before its session is closed.
        max_body_bytes: the largest HTTP request body read; a larger one is answered 413.

    Raises:
        UnknownEnv: when no environment is registered under ``env_id``.
        TypeError, ValueError: when the environment refuses ``env_kwargs``, or a limit is not positive.
    """
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
    if not idle_timeout > 0 or not step_timeout > 0:
        raise ValueError(f"idle_timeout and step_timeout must be > 0 seconds, got {idle_timeout} and {step_timeout}")
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be at least 1, got {max_body_bytes}")
    settings = {"env_id": env_id, "max_turns": max_turns, "action_format": action_format, "env_kwargs": dict(env_kwargs or {})}
    EnvhubEnvironment(**settings).close()  # refuse an unknown id or bad keywords before serving
    factory = functools.partial(EnvhubEnvironment, **settings)
    app = create_fastapi_app(factory, TextAction, TextObservation, max_concurrent_envs=max_sessions)
    _session_routes(app, factory, max_sessions=max_sessions, idle_timeout=idle_timeout, step_timeout=step_timeout)
    app.add_middleware(_BodyLimit, limit=max_body_bytes)
    return app
