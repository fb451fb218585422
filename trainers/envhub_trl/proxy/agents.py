"""Playing a user's agent against the proxy: groups of sessions per task, and their episodes.

An agent is a callable ``agent(base_url, api_key, task) -> reward``: an agent loop written with any
OpenAI-compatible client, given the proxy's base URL, an API key that is its session id, and a
task (anything the tasks file holds). :func:`play_agents` runs it ``group_size`` times per task,
every session at once, each in its own thread, of this process or of a worker process
(:class:`~envhub_trl.proxy.agent_processes.AgentProcesses`). Sessions of one task form one group, so GRPO,
GiGPO and RLOO compare them as they compare the members of an env group.

The reward is the callable's return value, or else the one the agent posted to
``/v1/envhub/sessions/ID/reward``; an agent that played an env the proxy hosts
(:class:`~envhub_trl.proxy.client.ProxyEnv`) is scored by that env, and what it returns is added.
An agent that raises, runs past the deadline or ends without a reward ends only its own session,
with the reason in :attr:`~envhub_trl.proxy.sessions.Session.error`; its episode is then set aside
as a failed env's is (the step goes on with the rest of its group, within ``max_env_error_rate``),
and the session is closed so a hung agent's later calls are refused.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from envhub.error import PolicyError
from envhub.generation import RandomToolCallGenerator
from envhub.trajectory import Sample, Trajectory, to_samples
from envhub_trl.proxy.agent_processes import REFERENCE_ATTRIBUTE, AgentProcesses, raised
from envhub_trl.proxy.engine import ChatProxy
from envhub_trl.proxy.server import ProxyServer
from envhub_trl.proxy.sessions import Session, is_reward, session_trajectory

#: ``agent(base_url, api_key, task) -> reward`` (None: the reward was posted to the proxy).
Agent = Callable[[str, str, Any], "float | None"]


@dataclasses.dataclass(frozen=True)
class AgentBatch:
    """One batch of agent sessions: ``sessions[g][m]`` is member ``m`` of task ``g``'s group.

    Attributes:
        tasks: the tasks played, one per group.
        sessions: per group, its members' sessions.
        seconds: how long the batch took.
    """

    tasks: tuple[Any, ...]
    sessions: tuple[tuple[Session, ...], ...]
    seconds: float

    def trajectories(self) -> list[Trajectory]:
        """The sessions as episodes, group by group (:func:`agent_trajectories`)."""
        return agent_trajectories(self.sessions, seeds=range(len(self.sessions)))

    def metrics(self) -> dict[str, float]:
        """``agent/`` metrics: calls per session, the share of calls that broke the fold (a history
        rewritten, a template that drops earlier turns), the share of sessions that failed, sessions
        per second; and what the replies were: the share that made a tool call the request's
        schemas accept, the share cut at ``max_tokens``, and their mean length in tokens (a model
        that has not learnt the agent's call format shows here before it shows in any reward)."""
        flat = [s for group in self.sessions for s in group]
        calls = sum(len(s.calls) for s in flat)
        later = sum(max(len(s.calls) - 1, 0) for s in flat)
        choices = [choice for s in flat for call in s.calls for choice in call.choices]
        replies = max(len(choices), 1)
        return {
            "agent/calls_per_session": calls / len(flat),
            "agent/tool_call_rate": sum(bool(c.tool_calls) for c in choices) / replies,
            "agent/length_cut_rate": sum(c.finish_reason == "length" for c in choices) / replies,
            "agent/reply_tokens": sum(len(c.token_ids) for c in choices) / replies,
            "agent/fold_break_rate": sum(s.breaks for s in flat) / later if later else 0.0,
            "agent/failed_sessions": sum(s.error is not None for s in flat) / len(flat),
            "agent/sessions_per_s": len(flat) / self.seconds if self.seconds > 0 else 0.0,
        }


def _reward_of(value: Any, session: Session) -> tuple[float | None, str | None]:
    """The session's reward (the agent's return value, else the posted one), or why there is none.
    A session that played an env the proxy hosts needs neither: the env's rewards are on its turns,
    and what the agent returns or posts is added on its last."""
    if value is None:
        value = session.reward
    if value is None and session.env_id is not None:
        value = 0.0
    if value is None:
        return None, "the agent returned no reward, posted none and played no env on the proxy"
    if not is_reward(value):
        return None, f"the agent's reward is not a finite number: {value!r}"
    return float(value), None


def play_agents(agent: Agent, tasks: Sequence[Any], group_size: int, server: ProxyServer, *, deadline: float = 600.0,
                batch: str | None = None, processes: AgentProcesses | None = None) -> AgentBatch:
    """Run ``agent`` ``group_size`` times on each of ``tasks``, all at once, against ``server``.

    Args:
        agent: the agent callable.
        tasks: one task per group.
        group_size: sessions per task.
        server: the running proxy, whose store records the sessions (they are taken out of it).
        deadline: seconds the whole batch may take; an agent still running then fails its session.
        batch: names the batch in its session ids, ``agent-{batch}-g{group}-m{member}``. The proxy
            keys its sampler seeds by session id, so a batch named the same way in another run
            samples the same replies; a random name when None. A proxy plays each name once.
        processes: run the sessions in these worker processes (:class:`AgentProcesses`) instead
            of threads of this one; ``agent`` is then the one they were made for.

    Raises:
        ValueError: for a ``batch`` name this proxy has played already.
    """
    store = server.proxy.store
    batch = batch if batch is not None else uuid.uuid4().hex[:12]
    keys = [[f"agent-{batch}-g{g}-m{m}" for m in range(group_size)] for g in range(len(tasks))]
    if any(store.is_closed(key) for row in keys for key in row):
        raise ValueError(f"the batch {batch!r} was played already on this proxy; name each batch once")
    results: dict[str, tuple[Any, str | None]] = {}  # key -> (the agent's return value, why it failed)

    def ended(key: str, value: Any, error: str | None) -> None:
        results[key] = (value, error)
        store.close(key)  # its agent is done: the proxy's worker no longer waits for its next call

    def run(key: str, task: Any) -> None:
        value, error = None, None
        try:
            value = agent(server.base_url, key, task)
        except BaseException as exc:  # the agent's own failure ends its session only
            error = raised(exc)
        finally:
            ended(key, value, error)

    start = time.monotonic()
    jobs = [(key, task) for task, row in zip(tasks, keys) for key in row]
    store.expect(key for key, _ in jobs)  # their first calls share a batch
    if processes is not None:
        processes.run(server.base_url, jobs, start + deadline, ended)
    else:
        # Daemon threads, not a pool: an agent that hangs must not keep the process alive at exit.
        threads = [threading.Thread(target=run, args=job, daemon=True, name=job[0]) for job in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, deadline - (time.monotonic() - start)))
    outcome: dict[str, tuple[float | None, str | None]] = {}
    for key, _ in jobs:
        store.close(key)  # a hung agent's later calls are refused
        if key not in results:
            outcome[key] = (None, f"the agent ran past the batch's deadline of {deadline:g} s")
        elif results[key][1] is not None:
            outcome[key] = (None, results[key][1])
        else:
            outcome[key] = _reward_of(results[key][0], store.get(key))
    seconds = time.monotonic() - start
    groups = []
    for task, row in zip(tasks, keys):
        members = []
        for key in row:
            session = store.pop(key) or Session(key)
            reward, error = outcome[key]
            session.reward, session.error, session.task = reward, error or session.error, task
            members.append(session)
        groups.append(tuple(members))
    return AgentBatch(tasks=tuple(tasks), sessions=tuple(groups), seconds=seconds)


def agent_trajectories(groups: Sequence[Sequence[Session]], seeds: Sequence[int] | range | None = None, env_id: str = "agent") -> list[Trajectory]:
    """The sessions as envhub episodes, group ``g``'s member ``m`` at index ``g * group_size + m``:
    :func:`~envhub_trl.proxy.sessions.session_trajectory`, or, for a session that made no call,
    an episode with no turn and its error (set aside as a failed env's episode is)."""
    seeds = list(seeds) if seeds is not None else list(range(len(groups)))
    out = []
    for g, members in enumerate(groups):
        for m, session in enumerate(members):
            index = g * len(members) + m
            if session.calls:
                out.append(session_trajectory(session, group_id=g, member=m, index=index, seed=seeds[g], env_id=env_id))
            else:
                error = session.error or "the agent made no call to the proxy"
                out.append(Trajectory(env_id=env_id, group_id=g, member=m, seed=seeds[g], index=index, error=error, end_reason="error"))
    return out


class _Watched:
    """A generator that remembers the first :class:`~envhub.error.PolicyError` it raised (the proxy
    answers it as a server error, which the agent sees without the reason)."""

    def __init__(self, generator: Any):
        self.generator, self.error = generator, None

    def generate(self, prompts: Sequence[Any], sampling: Any) -> list[Any]:
        try:
            return self.generator.generate(prompts, sampling)
        except PolicyError as exc:
            self.error = self.error or str(exc)
            raise


def format_samples(agent: Agent, tasks: Sequence[Any], tokenizer: Any, *, seed: int = 0, deadline: float = 600.0) -> tuple[list[Sample], list[Session]]:
    """The agent's sessions on ``tasks`` (one each) with every call answered by a random tool caller
    (:class:`~envhub.generation.RandomToolCallGenerator`), as samples whose replies are the caller's:
    a format-only warm start, which teaches the model the agent's tool-call format in the agent's own
    prompts, and nothing of the task. Each reply is learnt whatever the session's reward.

    The sessions run one after another (the caller answers at once), so the caller's draws, and
    the samples, are the same in every run with the same ``seed``. Returns the samples and the sessions.

    Raises:
        ValueError: if no session made a call the caller could answer (the caller's reason, or the
            first session's error).
    """
    caller = _Watched(RandomToolCallGenerator(seed=seed, tokenizer=tokenizer))
    sessions: list[Session] = []
    with ProxyServer(ChatProxy(caller, tokenizer, model="*")) as server:
        for task in tasks:
            sessions.append(play_agents(agent, [task], 1, server, deadline=deadline).sessions[0][0])
    samples = [sample for sample in to_samples(agent_trajectories([[s] for s in sessions])) if any(sample.env_mask)]
    if not samples:
        errors = [s.error for s in sessions if s.error]
        raise ValueError(f"the format-only warm start has no reply to learn: {caller.error or (errors[0] if errors else 'no session made a call')}")
    return samples, sessions


def load_agent(reference: str) -> Agent:
    """The agent callable ``reference`` names: ``package.module:function`` or ``path/to/file.py:function``.

    Raises:
        ValueError: naming what is wrong with the reference.
    """
    where, _, name = reference.rpartition(":")
    if not where or not name:
        raise ValueError(f"--agent {reference!r}: give module:function or path/to/file.py:function")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"--agent {reference!r}: no file {where}")
        spec = importlib.util.spec_from_file_location(f"envhub_agent_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise ValueError(f"--agent {reference!r}: cannot import {where} ({exc})") from None
    agent = getattr(module, name, None)
    if not callable(agent):
        raise ValueError(f"--agent {reference!r}: {where} has no callable {name!r}")
    try:  # what worker processes load it from (agent_processes): a file's module cannot be pickled by name
        setattr(agent, REFERENCE_ATTRIBUTE, str(Path(where).resolve()) + ":" + name if where.endswith(".py") else reference)
    except (AttributeError, TypeError):
        pass
    return agent
