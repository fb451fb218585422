"""The proxy over HTTP: an OpenAI-compatible ASGI app, and a server that runs it in a thread.

Starlette and uvicorn, the stack ``envhub serve`` (through OpenEnv's FastAPI app) and vLLM's
server already run on, so the trainer brings no new server dependency; the routes are few, and the
body is read and checked by hand so that every refusal is OpenAI's error shape with a 4xx status
(FastAPI's validation would answer 422 in its own shape).

Routes: ``POST /v1/chat/completions``; ``GET /v1/models``; envhub's own ``GET /v1/envhub/stats``,
``GET /v1/envhub/sessions/{id}`` (a session's calls, token-exact; ``DELETE`` returns it and
forgets it, so a long collection does not hold every session) and
``POST /v1/envhub/sessions/{id}/reward`` (``{"reward": r, "step_rewards": {call: r}}``); and a
session's hosted env, ``POST /v1/envhub/sessions/{id}/env/reset`` (``{"env_id", "seed", "kwargs",
"options"}``) and ``.../env/step`` (``{"action": text}``): see :mod:`envhub_trl.proxy.hosted`.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from typing import Any

from envhub_trl.proxy.engine import ChatProxy
from envhub_trl.proxy.hosted import HostedEnvs
from envhub_trl.proxy.requests import ProxyRequestError
from envhub_trl.proxy.responses import session_json
from envhub_trl.proxy.sessions import is_reward

#: The header a client may send its session id in (else the API key is the session id).
SESSION_HEADER = "x-envhub-session"


def session_id_of(headers: Any) -> str | None:
    """The session id a request carries: the ``X-Envhub-Session`` header, else the bearer API key."""
    explicit = headers.get(SESSION_HEADER)
    if explicit:
        return explicit.strip() or None
    auth = headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    return key.strip() or None if scheme.lower() == "bearer" else None


async def _read_json(request: Any, max_body_bytes: int) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise ProxyRequestError(f"the request body is {declared} bytes; this proxy reads at most {max_body_bytes}", status=413, code="body_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > max_body_bytes:
            raise ProxyRequestError(f"the request body is over {max_body_bytes} bytes, the most this proxy reads", status=413, code="body_too_large")
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ProxyRequestError(f"the request body is not JSON: {exc}", code="invalid_json") from None


def create_app(proxy: ChatProxy, *, max_body_bytes: int = 1 << 20, envs: HostedEnvs | None = None) -> Any:
    """The ASGI app serving ``proxy``; a body over ``max_body_bytes`` is answered 413. Its sessions'
    envs are ``envs`` (a :class:`HostedEnvs` over the proxy's store when None)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    envs = envs if envs is not None else HostedEnvs(proxy.store)

    async def completions(request: Request) -> JSONResponse:
        body = await _read_json(request, max_body_bytes)
        return JSONResponse(await proxy.complete_async(body, session_id_of(request.headers)))

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": proxy.model, "object": "model", "created": 0, "owned_by": "envhub"}]})

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(proxy.store.stats())

    async def session(request: Request) -> JSONResponse:
        found = proxy.store.find(request.path_params["session_id"])
        if found is not None and request.method == "DELETE":
            proxy.store.pop(found.session_id)
            envs.release(found.session_id)
        if found is None:
            raise ProxyRequestError(f"no session {request.path_params['session_id']!r} has been recorded", status=404, code="session_not_found")
        with proxy.store.lock():
            calls = list(found.calls)
        return JSONResponse(session_json(found, calls))

    async def reward(request: Request) -> JSONResponse:
        body = await _read_json(request, max_body_bytes)
        value = body.get("reward") if isinstance(body, dict) else None
        if not is_reward(value):
            raise ProxyRequestError("post {'reward': NUMBER} (a finite number)", param="reward")
        steps = body.get("step_rewards") or {}
        try:
            steps = {int(k): float(v) for k, v in dict(steps).items()}
        except (TypeError, ValueError):
            raise ProxyRequestError("step_rewards maps call indices to numbers", param="step_rewards") from None
        posted = proxy.store.set_reward(request.path_params["session_id"], value, steps)
        return JSONResponse({"session_id": posted.session_id, "reward": posted.reward})

    async def env_reset(request: Request) -> JSONResponse:
        body = await _read_json(request, max_body_bytes)
        # In a worker thread: an env's reset or step may take a while (a planner, a game engine),
        # and the event loop serves every session's calls.
        return JSONResponse(await run_in_threadpool(envs.reset, request.path_params["session_id"], body))

    async def env_step(request: Request) -> JSONResponse:
        body = await _read_json(request, max_body_bytes)
        return JSONResponse(await run_in_threadpool(envs.step, request.path_params["session_id"], body))

    async def refused(request: Request, exc: ProxyRequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        error = ProxyRequestError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code)
        return JSONResponse(error.body(), status_code=exc.status_code)

    routes = [
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/envhub/stats", stats, methods=["GET"]),
        Route("/v1/envhub/sessions/{session_id}", session, methods=["GET", "DELETE"]),
        Route("/v1/envhub/sessions/{session_id}/reward", reward, methods=["POST"]),
        Route("/v1/envhub/sessions/{session_id}/env/reset", env_reset, methods=["POST"]),
        Route("/v1/envhub/sessions/{session_id}/env/step", env_step, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={ProxyRequestError: refused, HTTPException: http_error})


class ProxyServer:
    """``proxy`` served over HTTP by uvicorn in a background thread (in-process training, tests).

    Args:
        proxy: the :class:`~envhub_trl.proxy.engine.ChatProxy` to serve.
        host: the address to listen on.
        port: the port; 0 picks a free one (read :attr:`base_url` after :meth:`start`).
        max_body_bytes: the largest request body read.
        env_ids: the env ids its sessions may play on the proxy (:mod:`~envhub_trl.proxy.hosted`);
            None allows every registered env.
        max_envs: the most of those envs held at once; None for no bound.
        freeze_gc: at :meth:`start`, collect and then freeze what the process holds (``gc.freeze``,
            as vLLM's server does after its start): the model, the libraries and the trainer are
            then out of the collector's full passes. Without it, a full pass in a process holding
            torch and transformers took 387-511 ms with every thread stopped, long enough for the
            calls of agents started together to split into two batches (157-192 ms frozen;
            ``bench/proxy.py --no-freeze-gc``).
    """

    def __init__(self, proxy: ChatProxy, *, host: str = "127.0.0.1", port: int = 0, max_body_bytes: int = 1 << 20,
                 env_ids: Any = None, max_envs: int | None = 1024, freeze_gc: bool = True):
        import uvicorn

        self.proxy = proxy
        self.envs = HostedEnvs(proxy.store, env_ids=env_ids, max_envs=max_envs)
        config = uvicorn.Config(create_app(proxy, max_body_bytes=max_body_bytes, envs=self.envs), host=host, port=port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self.host = host
        self.port = port
        self.freeze_gc = freeze_gc

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://HOST:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> ProxyServer:
        """Start serving; return once the port is bound.

        Raises:
            RuntimeError: if the server did not start within ``timeout`` seconds.
        """
        if self.freeze_gc:
            gc.collect()
            gc.freeze()
        self._thread = threading.Thread(target=self._server.run, name="envhub-proxy-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the proxy did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Stop serving, wait for the thread to end, and close the envs the sessions left."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.envs.close()

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
