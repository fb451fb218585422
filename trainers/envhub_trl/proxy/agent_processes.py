"""Agents in worker processes of their own (``agent_processes: N``).

An agent does client work on every call it makes: the ``openai`` SDK builds and checks the
request and reads the response into its models (about 1 ms a call here), and httpx with h11
writes and parses the HTTP (about 0.8 ms). Run as threads of the trainer's process, a batch's
agents do that work one call at a time under the trainer's interpreter lock, between two of the
generator's batches, when nothing else runs: with 64 sessions on the tiny model it was most of
what the proxy cost over envhub's own loop (``bench/proxy.py``, docs/results.md "Agent proxy").
:class:`AgentProcesses` runs them in ``N`` spawned worker processes instead, each agent a thread
of one of them, so that work is spread over the cores. A worker outlives a batch, so a batch does
not pay for starting interpreters. An agent that runs past the batch's deadline is stopped for
real: its worker process is ended (a thread cannot be) and a new one starts for the next batch.

The workers load the agent themselves: from the reference :func:`~envhub_trl.proxy.agents.load_agent`
read it from (``module:function`` or ``path/to/file.py:function``), or by pickling a module-level
function of an importable module.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

#: The attribute :func:`~envhub_trl.proxy.agents.load_agent` leaves on the agent it loaded: its
#: reference, which a worker process loads again (a file's module cannot be pickled by name).
REFERENCE_ATTRIBUTE = "__envhub_agent_reference__"


class Shown:
    """An agent's return value that cannot cross between processes, kept as its ``repr``; it is no
    number, so the session fails with the value shown as the agent returned it."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def raised(exc: BaseException) -> str:
    """Why a session failed when its agent raised ``exc``."""
    return f"the agent raised {type(exc).__name__}: {exc}"


def portable(agent: Any) -> Any:
    """What a worker process is sent to load ``agent``: its reference, else the agent pickled.

    Raises:
        ValueError: for an agent neither loaded by reference nor picklable (a lambda, a closure).
    """
    reference = getattr(agent, REFERENCE_ATTRIBUTE, None)
    if isinstance(reference, str):
        return reference
    try:
        pickle.dumps(agent)
    except Exception as exc:
        raise ValueError(
            f"agent_processes runs the agent in worker processes, which cannot load {agent!r} ({exc}); give a module-level "
            "function, or a reference that envhub_trl.proxy.agents.load_agent reads (module:function or path/to/file.py:function)"
        ) from None
    return agent


def _serve(connection: Any, agent: Any) -> None:
    """A worker process: load ``agent``, then run each batch of ``(base_url, [(key, task), ...])``
    it receives, every session in a thread of its own, and send ``(key, value, error)`` for each
    as it ends; ``None`` ends the worker. An agent the worker cannot load fails every session it
    is sent, with the reason."""
    unloadable = None
    try:
        if isinstance(agent, str):
            from envhub_trl.proxy.agents import load_agent

            agent = load_agent(agent)
    except Exception as exc:  # the file changed or is not importable here: say so in each session
        unloadable = f"the agent's worker process could not load it: {type(exc).__name__}: {exc}"
    sending = threading.Lock()

    def run(base_url: str, key: str, task: Any) -> None:
        value, error = None, None
        try:
            value = agent(base_url, key, task)
        except BaseException as exc:  # the agent's own failure ends its session only
            error = raised(exc)
        if not (value is None or isinstance(value, (bool, int, float))):
            value = Shown(repr(value))
        with sending:
            connection.send((key, value, error))

    while (batch := connection.recv()) is not None:
        base_url, jobs = batch
        for key, task in jobs:
            if unloadable is not None:
                connection.send((key, None, unloadable))
                continue
            threading.Thread(target=run, args=(base_url, key, task), daemon=True, name=key).start()


class AgentProcesses:
    """``processes`` worker processes that run an agent's sessions (see the module's docstring).

    Args:
        agent: the agent callable (loaded by :func:`~envhub_trl.proxy.agents.load_agent`, or a
            module-level function of an importable module).
        processes: how many worker processes.

    Raises:
        ValueError: for fewer than one process, or an agent a worker cannot load (:func:`portable`).
    """

    def __init__(self, agent: Any, processes: int):
        if processes < 1:
            raise ValueError(f"agent_processes must be at least 1, got {processes}")
        self._agent = portable(agent)
        self._context = multiprocessing.get_context("spawn")  # a fork would copy the trainer's threads' locks
        self._workers: list[tuple[Any, Any] | None] = [None] * processes

    @property
    def processes(self) -> int:
        return len(self._workers)

    def _worker(self, index: int) -> tuple[Any, Any]:
        """Worker ``index`` (started if it is not running): its process and connection."""
        worker = self._workers[index]
        if worker is None or not worker[0].is_alive():
            here, there = self._context.Pipe()
            process = self._context.Process(target=_serve, args=(there, self._agent), daemon=True, name=f"envhub-agents-{index}")
            process.start()
            there.close()
            worker = self._workers[index] = (process, here)
        return worker

    def run(self, base_url: str, jobs: Sequence[tuple[str, Any]], deadline: float, done: Callable[[str, Any, str | None], None]) -> None:
        """Run the sessions ``jobs`` (``(key, task)`` pairs, dealt to the workers in turn) against
        ``base_url``; call ``done(key, value, error)`` as each ends, in this thread. Returns when
        every session has ended or ``deadline`` (a :func:`time.monotonic` time) has passed; the
        workers whose sessions are still running then are ended, and their sessions are not reported."""
        shares: dict[int, list[tuple[str, Any]]] = {}
        for n, job in enumerate(jobs):
            shares.setdefault(n % self.processes, []).append(job)
        running: dict[Any, tuple[int, set[str]]] = {}  # connection -> (worker, its sessions not yet ended)
        for index, share in shares.items():
            _, connection = self._worker(index)
            connection.send((base_url, share))
            running[connection] = (index, {key for key, _ in share})
        while running:
            left = deadline - time.monotonic()
            ready = multiprocessing.connection.wait(list(running), timeout=max(left, 0.0)) if left > 0 else []
            if not ready:
                break
            for connection in ready:
                index, keys = running[connection]
                try:
                    key, value, error = connection.recv()
                except (EOFError, OSError):  # the worker died: its sessions end with the reason
                    process = self._workers[index][0]
                    process.join(timeout=1)
                    self._workers[index] = None
                    for key in sorted(keys):
                        done(key, None, f"the agent's worker process exited (exit code {process.exitcode})")
                    del running[connection]
                    continue
                keys.discard(key)
                done(key, value, error)
                if not keys:
                    del running[connection]
        for index, _ in running.values():  # past the deadline: a thread cannot be stopped, a process can
            self._end(index)

    def _end(self, index: int) -> None:
        worker, self._workers[index] = self._workers[index], None
        if worker is not None:
            process, connection = worker
            process.terminate()
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
            connection.close()

    def close(self) -> None:
        """End every worker (a later :meth:`run` starts them again)."""
        for index, worker in enumerate(self._workers):
            if worker is not None:
                try:
                    worker[1].send(None)
                except (BrokenPipeError, OSError):
                    pass
                worker[0].join(timeout=5)
                self._end(index)

    def __enter__(self) -> AgentProcesses:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
