"""Where the environments of a manager live and step: in-process, a process pool, or Ray actors.

Every executor holds environments in numbered *slots* and answers two batched calls, ``reset`` and
``step``; an :class:`EnvWorker` does the work wherever it runs. An environment that raises ends
only its own episode: its result carries the error and the slot is emptied.

The pool executors keep each slot's history (reset seed and replies). When a worker dies, they
start a new one and replay the histories of its slots; environments are deterministic per seed,
so the replayed state is the lost one and no episode of the batch is lost. A request that kills
its worker a second time ends the episodes it carried, with the error, rather than looping.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import traceback
from collections.abc import Sequence
from typing import Any

from envhub.actions import ParsedReply, ReplyFormat, apply_reply
from envhub.core import TextEnv, ToolEnv, shorten
from envhub.error import EnvhubError
from envhub.registration import EnvSpec


class WorkerDied(EnvhubError):
    """A pool worker process or actor died while holding environments."""


class StepTimedOut(WorkerDied):
    """A worker did not answer within ``step_timeout``: it is killed like a dead one.

    ``answers`` holds what it answered before (the process pool answers slot by slot, so the
    slot at position ``len(answers)`` is the one that hung); None where that is not known (Ray).
    """

    def __init__(self, message: str, answers: list[EnvState] | None = None):
        super().__init__(message)
        self.answers = answers


#: Seconds a pool worker may take over one environment's reset or step before its episode ends
#: with a time-out error (the in-process executor cannot preempt, and has none).
DEFAULT_STEP_TIMEOUT = 300.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResetRequest:
    """Make (or reuse) the environment of ``slot`` from ``spec`` and reset it with ``seed``.

    The spec travels with the request, so a worker can make environments registered at run time
    in the parent (its entry point must be importable in the worker).
    """

    slot: int
    spec: EnvSpec
    seed: int
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_turns: int | None = None
    expert: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepRequest:
    """Apply the replies ``replies`` to the environments of ``slots`` (same order) with the format ``fmt``.

    One request per batch, not per environment: a turn of a thousand envs allocates little.
    ``cut`` marks replies the token limit cut off before they ended their turn, which are invalid
    (empty: none are; see ``EnvGroupManager``'s ``unfinished_replies``).
    """

    slots: Sequence[int]
    replies: Sequence[str]
    fmt: ReplyFormat
    expert: bool = False
    cut: Sequence[bool] = ()

    def __post_init__(self) -> None:
        if len(self.slots) != len(self.replies):
            raise ValueError(f"a step needs one reply per slot: {len(self.slots)} slots, {len(self.replies)} replies")
        if self.cut and len(self.cut) != len(self.slots):
            raise ValueError(f"cut needs one flag per slot: {len(self.slots)} slots, {len(self.cut)} flags")

    def subset(self, positions: Sequence[int]) -> StepRequest:
        """The request restricted to the slots at ``positions``."""
        cut = [self.cut[p] for p in positions] if self.cut else ()
        return StepRequest(
            slots=[self.slots[p] for p in positions],
            replies=[self.replies[p] for p in positions],
            fmt=self.fmt,
            expert=self.expert,
            cut=cut,
        )


@dataclasses.dataclass(slots=True, kw_only=True)
class EnvState:
    """An environment's answer to a reset or a step.

    Attributes:
        observation: the new observation ('' when the environment raised).
        reward: the step's reward (0 on reset).
        terminated: Gymnasium's terminated.
        truncated: Gymnasium's truncated (the turn limit).
        info: the step's info (``action_is_valid``, ``success``, ``state_key``, ...).
        valid_actions: the legal actions now, or None.
        expert_action: the oracle's action now, when asked for and the episode goes on.
        format_valid: whether the reply followed the action format (True on reset).
        action: the first action the reply named.
        invalid_reason: why the reply was invalid, or None.
        instructions: the environment's instructions (on reset).
        max_turns: the environment's turn limit (on reset).
        error: the environment's exception and where it was raised, when it raised.
        tools: a tool env's tool schemas (on reset), else None.
        observations: each step's observation when the reply carried several actions (tool
            calls), in order; empty when it carried one.
    """

    observation: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    valid_actions: list[str] | None = None
    expert_action: str | None = None
    format_valid: bool = True
    action: str | None = None
    invalid_reason: str | None = None
    instructions: str = ""
    max_turns: int | None = None
    error: str | None = None
    tools: list[dict[str, Any]] | None = None
    observations: tuple[str, ...] = ()


def _describe_error(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {shorten(str(exc), 300)}{where}"


class MemoizedFormat:
    """An action format whose parses are remembered, keyed by reply and legal actions.

    Policies repeat their replies (``<answer>Left</answer>`` again and again), and parsing costs
    about half of a fast environment's step; a dictionary hit costs almost nothing.
    ``ParsedReply`` is immutable, so sharing one between turns is safe.

    Args:
        fmt: the format to parse with.
        max_entries: the cache is emptied when it reaches this size.
        max_reply_length: longer replies are parsed every time (they rarely repeat).
    """

    def __init__(self, fmt: ReplyFormat, max_entries: int = 4096, max_reply_length: int = 256):
        self.fmt = fmt
        self.max_entries = max_entries
        self.max_reply_length = max_reply_length
        # reply -> [(legal actions, tools, parse)]: a hit compares lists and allocates nothing.
        # Tool schemas are one read-only mapping per env class, so they compare by identity.
        self._cache: dict[str, list[tuple[list[str] | None, Any, ParsedReply]]] = {}

    def parse(self, reply: str, valid_actions: Sequence[str] | None = None, tools: Any = None) -> ParsedReply:
        """``fmt.parse(reply, valid_actions, tools)``, from the cache when seen before."""
        if not isinstance(reply, str) or len(reply) > self.max_reply_length:
            return self.fmt.parse(reply, valid_actions, tools)
        entries = self._cache.get(reply)
        if entries is not None:
            for legal, known_tools, parsed in entries:
                if legal == valid_actions and known_tools is tools:
                    return parsed
        parsed = self.fmt.parse(reply, valid_actions, tools)
        if len(self._cache) >= self.max_entries:
            self._cache.clear()
        self._cache.setdefault(reply, []).append((list(valid_actions) if valid_actions is not None else None, tools, parsed))
        return parsed


class EnvWorker:
    """Holds environments by slot and resets or steps them in batches; never raises for an env's error."""

    def __init__(self) -> None:
        self.envs: dict[int, TextEnv] = {}
        self._formats: dict[Any, MemoizedFormat] = {}
        self._made_with: dict[int, tuple[str, str, str, int | None]] = {}

    def reset(self, requests: Sequence[ResetRequest]) -> list[EnvState]:
        """Reset every requested slot, making its environment when the id or kwargs changed."""
        return [self._reset_one(request) for request in requests]

    def step(self, request: StepRequest) -> list[EnvState]:
        """Apply each reply to its slot's environment."""
        fmt = self._formats.get(request.fmt)
        if fmt is None:
            fmt = self._formats[request.fmt] = MemoizedFormat(request.fmt)
        expert = request.expert
        envs = self.envs
        states = []
        # One loop body per env per turn, inlined: at a thousand envs a call costs as much as parsing.
        cut = request.cut
        for position, (slot, reply) in enumerate(zip(request.slots, request.replies)):
            env = envs.get(slot)
            if env is None:
                states.append(EnvState(error=f"slot {slot} holds no environment; reset it first"))
                continue
            try:
                outcome = apply_reply(env, reply, fmt, cut=bool(cut) and cut[position])  # type: ignore[arg-type]  (duck-typed format)
                over = outcome.terminated or outcome.truncated
                info = outcome.info
                parsed = outcome.parsed
                states.append(
                    EnvState(
                        observation=outcome.observation,
                        reward=outcome.reward,
                        terminated=outcome.terminated,
                        truncated=outcome.truncated,
                        info=info,
                        valid_actions=None if over else env.valid_actions(),
                        expert_action=env.expert_action() if expert and not over else None,
                        format_valid=parsed.format_valid,
                        action=parsed.action,
                        invalid_reason=None if info["action_is_valid"] else info.get("invalid_reason"),
                        observations=outcome.observations if len(outcome.observations) > 1 else (),
                    )
                )
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # an env's failure (sys.exit() included) ends its own episode, never the batch
                self._drop(slot)
                states.append(EnvState(error=_describe_error(exc)))
        return states

    def _reset_one(self, request: ResetRequest) -> EnvState:
        spec = request.spec
        recipe = (spec.id, spec.entry_point_str, repr(sorted(request.env_kwargs.items())), request.max_turns)
        try:
            env = self.envs.get(request.slot)
            if env is None or self._made_with.get(request.slot) != recipe:
                env = spec.make(max_turns=request.max_turns, **request.env_kwargs)
                self.envs[request.slot], self._made_with[request.slot] = env, recipe
            observation, info = env.reset(seed=request.seed)
            return EnvState(
                observation=observation,
                info=info,
                valid_actions=env.valid_actions(),
                expert_action=env.expert_action() if request.expert else None,
                instructions=env.instructions,
                max_turns=env.max_turns,
                tools=env.tool_schemas() if isinstance(env, ToolEnv) else None,
            )
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # an env's failure (sys.exit() included) ends its own episode, never the batch
            self._drop(request.slot)
            return EnvState(error=_describe_error(exc))

    def _drop(self, slot: int) -> None:
        self.envs.pop(slot, None)
        self._made_with.pop(slot, None)

    def call(self, method: str, request: Any) -> list[EnvState]:
        """Dispatch ``method`` (``"reset"`` or ``"step"``) by name: the entry point of remote workers."""
        if method == "reset":
            return self.reset(request)
        if method == "step":
            return self.step(request)
        raise ValueError(f"unknown worker method {method!r}")


class InProcessExecutor:
    """Every environment in this process (the default): no copying, no parallelism.

    It cannot preempt: an environment whose step hangs holds the whole batch. Use
    :class:`ProcessPoolExecutor` (``step_timeout``) for environments that may hang.

    Steps of distinct slots may run in separate threads at once (``concurrent_steps``): the
    continuous rollout steps each env in a thread as soon as its reply is done.
    """

    concurrent_steps = True

    def __init__(self) -> None:
        self.worker = EnvWorker()

    def reset(self, requests: Sequence[ResetRequest]) -> list[EnvState]:
        """Reset the requested slots."""
        return self.worker.reset(requests)

    def step(self, request: StepRequest) -> list[EnvState]:
        """Step the requested slots."""
        return self.worker.step(request)

    def env(self, slot: int) -> TextEnv | None:
        """The environment object of ``slot`` (to draw it), or None when the slot holds none."""
        return self.worker.envs.get(slot)

    def close(self) -> None:
        """Drop the environments."""
        self.worker.envs.clear()


class _PoolExecutor:
    """Slots spread over ``num_workers`` remote workers (slot ``s`` on worker ``s % num_workers``).

    One executor serves one manager (the slots are its environment indices). Subclasses say how
    to start a worker, send it a batch and wait for the answer.
    """

    def __init__(self, num_workers: int, step_timeout: float | None = DEFAULT_STEP_TIMEOUT):
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        if step_timeout is not None and step_timeout <= 0:
            raise ValueError(f"step_timeout must be positive seconds (or None for no limit), got {step_timeout}")
        self.num_workers = num_workers
        self.step_timeout = step_timeout
        self.workers: list[Any] = [self._start(i) for i in range(num_workers)]
        self.histories: dict[int, tuple[ResetRequest, list[StepRequest]]] = {}
        #: Each slot's observations so far (after its reset and each step), to check replays.
        self.observed: dict[int, list[str]] = {}
        #: Slots whose replay did not reach the recorded state, with the error their episode ends with.
        self.diverged: dict[int, str] = {}
        self.restarts = 0

    # -- what a backend provides
    def _start(self, index: int) -> Any:
        raise NotImplementedError

    def _send(self, worker: Any, method: str, request: Any) -> Any:
        raise NotImplementedError

    def _receive(self, worker: Any, pending: Any) -> list[EnvState]:
        """Wait for the answer to ``pending``; raise ``WorkerDied`` if the worker died."""
        raise NotImplementedError

    def _stop(self, worker: Any) -> None:
        raise NotImplementedError

    # -- the shared logic
    def reset(self, requests: Sequence[ResetRequest]) -> list[EnvState]:
        """Start a new batch: reset the requested slots on their workers, in parallel.

        Histories of the previous batch are dropped: a worker that dies from now on is rebuilt
        from these resets.
        """
        self.histories = {request.slot: (request, []) for request in requests}
        self.observed = {request.slot: [] for request in requests}
        self.diverged = {}
        shards = self._shards([r.slot for r in requests])
        return self._run("reset", shards, len(requests), lambda positions: [requests[p] for p in positions])

    def step(self, request: StepRequest) -> list[EnvState]:
        """Step the requested slots on their workers, in parallel."""
        for position, (slot, reply) in enumerate(zip(request.slots, request.replies)):
            if slot in self.histories:
                self.histories[slot][1].append(StepRequest(slots=[slot], replies=[reply], fmt=request.fmt, expert=request.expert, cut=request.cut[position : position + 1]))
        shards = self._shards(request.slots)
        return self._run("step", shards, len(request.slots), request.subset)

    def _shards(self, slots: Sequence[int]) -> dict[int, list[int]]:
        """Positions in ``slots`` grouped by the worker that holds each slot."""
        shards: dict[int, list[int]] = {}
        for position, slot in enumerate(slots):
            shards.setdefault(slot % self.num_workers, []).append(position)
        return shards

    def _run(self, method: str, shards: dict[int, list[int]], total: int, part: Any) -> list[EnvState]:
        parts = {w: part(positions) for w, positions in shards.items()}
        pending = {w: self._send(self.workers[w], method, parts[w]) for w in shards}
        results: list[EnvState] = [EnvState(error="lost result")] * total
        for w, positions in shards.items():
            try:
                answers = self._receive(self.workers[w], pending[w])
            except StepTimedOut as exc:
                answers = self._after_timeout(w, method, parts[w], exc)
            except WorkerDied:
                answers = self._recover(w, method, parts[w])
            slots = self._slots_of(parts[w])
            for position, slot, answer in zip(positions, slots, answers):
                if slot in self.diverged:
                    answer = EnvState(error=self.diverged.pop(slot))
                results[position] = answer
                if answer.error is not None:
                    self.histories.pop(slot, None)
                    self.observed.pop(slot, None)
                elif slot in self.observed:
                    self.observed[slot].append(answer.observation)
        return results

    @staticmethod
    def _slots_of(part: Any) -> list[int]:
        return list(part.slots) if isinstance(part, StepRequest) else [r.slot for r in part]

    def _recover(self, w: int, method: str, part: Any) -> list[EnvState]:
        """Replace dead worker ``w``, replay its slots' histories, and retry ``part``.

        If the retry kills the worker again, the slots are retried one by one, so that only the
        episodes whose own reply kills a worker end (with the error).
        """
        slots = self._slots_of(part)
        try:
            self._replace(w)
            self._replay(w, set(slots))
            return self._receive(self.workers[w], self._send(self.workers[w], method, part))
        except WorkerDied:
            pass
        answers: list[EnvState] = []
        try:
            self._replace(w)
            self._replay(w, set(slots))
            for position, slot in enumerate(slots):
                single = part.subset([position]) if isinstance(part, StepRequest) else [part[position]]
                try:
                    answers.append(self._receive(self.workers[w], self._send(self.workers[w], method, single))[0])
                except WorkerDied:
                    self.histories.pop(slot, None)
                    answers.append(EnvState(error=f"WorkerDied: this {method} killed its worker twice"))
                    self._replace(w)
                    self._replay(w, set(slots[position + 1 :]))
        except WorkerDied:  # replaying histories that ran before killed it: give the rest up
            answers += [EnvState(error=f"WorkerDied: the worker kept dying while recovering this {method}")] * (len(slots) - len(answers))
            for slot in slots:
                self.histories.pop(slot, None)
            try:
                self._replace(w)  # back, empty, for the next batch: only these episodes are lost
            except Exception:  # noqa: S110  (the next request on this worker tries again)
                pass
        return answers

    def _after_timeout(self, w: int, method: str, part: Any, exc: StepTimedOut) -> list[EnvState]:
        """Worker ``w`` hung: end the episode it hung on, rebuild the worker with the others'
        histories, and finish the rest of ``part`` there.

        Without slot-by-slot answers (Ray) the hung slot is not known: the generic recovery
        (retry, then one slot at a time) finds it, each try bounded by the deadline.
        """
        if exc.answers is None:
            return self._recover(w, method, part)
        slots = self._slots_of(part)
        answers = list(exc.answers)
        hung = len(answers)
        self.histories.pop(slots[hung], None)
        answers.append(EnvState(error=f"TimeoutError: this {method} took longer than step_timeout={self.step_timeout:g}s; the episode ends here"))
        rest = list(range(hung + 1, len(slots)))
        self._replace(w)
        if not rest:
            try:
                self._replay(w, set())
            except WorkerDied:
                pass  # the next request on this worker recovers it
            return answers
        remaining = part.subset(rest) if isinstance(part, StepRequest) else [part[i] for i in rest]
        try:
            self._replay(w, set(slots[hung + 1 :]))
            return answers + self._receive(self.workers[w], self._send(self.workers[w], method, remaining))
        except StepTimedOut as again:
            return answers + self._after_timeout(w, method, remaining, again)
        except WorkerDied:
            return answers + self._recover(w, method, remaining)

    def _replace(self, w: int) -> None:
        try:
            self._stop(self.workers[w])
        except Exception:  # the worker is already dead; its handle may be unusable
            pass
        self.workers[w] = self._start(w)
        self.restarts += 1

    def _replay(self, w: int, current: set[int]) -> None:
        """Rebuild the worker's environments: reset with the same seeds, then the same replies.

        The replies of the request being retried (slots in ``current``) are not replayed: the
        retry applies them.
        """
        slots = [s for s in self.histories if s % self.num_workers == w]
        if not slots:
            return
        worker = self.workers[w]
        states = self._receive(worker, self._send(worker, "reset", [self.histories[s][0] for s in slots]))
        for slot, state in zip(slots, states):
            self._check_replay(slot, 0, state)
        todo = {s: self.histories[s][1][: len(self.histories[s][1]) - (s in current)] for s in slots}
        for i in range(max(len(steps) for steps in todo.values())):
            batch = [(s, steps[i]) for s, steps in todo.items() if i < len(steps) and s not in self.diverged]
            if not batch:
                break
            cut = [bool(r.cut) and r.cut[0] for _, r in batch]
            merged = StepRequest(
                slots=[r.slots[0] for _, r in batch],
                replies=[r.replies[0] for _, r in batch],
                fmt=batch[0][1].fmt,
                expert=batch[0][1].expert,
                cut=cut if any(cut) else (),
            )
            for (slot, _), state in zip(batch, self._receive(worker, self._send(worker, "step", merged))):
                self._check_replay(slot, i + 1, state)

    def _check_replay(self, slot: int, index: int, state: EnvState) -> None:
        """Mark ``slot`` diverged when its replayed observation ``index`` (0: after reset) differs
        from the one recorded: the env is not deterministic, and going on would record moves
        from a state the episode never was in."""
        recorded = self.observed.get(slot, [])
        if index < len(recorded) and (state.error is not None or state.observation != recorded[index]):
            self.diverged.setdefault(
                slot,
                "non-deterministic env: replaying this episode's seed and replies after its worker was restarted "
                f"gave another observation {'after reset' if index == 0 else f'after turn {index}'}",
            )

    def close(self) -> None:
        """Stop every worker."""
        for worker in self.workers:
            try:
                self._stop(worker)
            except Exception:  # stopping an already-dead worker must not mask the caller's error
                pass
        self.workers = []

    def __enter__(self) -> _PoolExecutor:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _process_main(conn: Any) -> None:
    """A pool process: answer ``(method, request)`` messages until ``None`` or the pipe closes."""
    import envhub  # noqa: F401  (loads the plugins, so every registered id can be made)

    worker = EnvWorker()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        method, request = message
        # One answer per slot, as each is ready: the parent's deadline then applies to each
        # environment, and a hang is pinned on the slot that caused it.
        singles = [request.subset([i]) for i in range(len(request.slots))] if isinstance(request, StepRequest) else [[r] for r in request]
        for single in singles:
            conn.send(_picklable(worker.call(method, single))[0])


def _picklable(states: list[EnvState]) -> list[EnvState]:
    """``states`` with any that cannot be pickled (an env's info holding a lock, a generator...)
    replaced by an error naming the key, so the episode ends with the real cause instead of the
    pipe failing and the worker being restarted as if it had died."""
    import pickle

    out = []
    for state in states:
        try:
            pickle.dumps(state)
        except Exception as exc:  # pickling raises TypeError, AttributeError, PicklingError...
            culprit = ""
            for key, value in (state.info or {}).items():
                try:
                    pickle.dumps(value)
                except Exception:
                    culprit = f" (info key {key!r}, a {type(value).__name__})"
                    break
            state = EnvState(error=f"the env's step result cannot be sent between processes{culprit}: {type(exc).__name__}: {exc}")
        out.append(state)
    return out


@dataclasses.dataclass
class _Process:
    process: Any
    conn: Any


class ProcessPoolExecutor(_PoolExecutor):
    """Environments in ``num_workers`` separate processes, for slow envs or ones that must be isolated.

    Args:
        num_workers: how many processes.
        start_method: the multiprocessing start method (``"spawn"`` is safe with threads and torch).
    """

    def __init__(self, num_workers: int = 2, start_method: str = "spawn", step_timeout: float | None = DEFAULT_STEP_TIMEOUT):
        self.context = multiprocessing.get_context(start_method)
        super().__init__(num_workers, step_timeout)

    def _start(self, index: int) -> _Process:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_process_main, args=(child,), daemon=True, name=f"envhub-env-{index}")
        process.start()
        child.close()  # so that recv sees EOF when the worker dies
        return _Process(process, parent)

    def _send(self, worker: _Process, method: str, request: Any) -> int:
        try:
            worker.conn.send((method, request))
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the worker is dead: _receive reports it
        return len(request.slots) if isinstance(request, StepRequest) else len(request)

    def _receive(self, worker: _Process, pending: int) -> list[EnvState]:
        answers: list[EnvState] = []
        try:
            for _ in range(pending):
                if self.step_timeout is not None and not worker.conn.poll(self.step_timeout):
                    worker.process.kill()  # it is busy, not listening: no point asking it to stop
                    raise StepTimedOut(f"env worker {worker.process.name} took over {self.step_timeout:g}s", answers)
                answers.append(worker.conn.recv())
        except (EOFError, ConnectionResetError, OSError) as exc:
            raise WorkerDied(f"env worker {worker.process.name} died (exit code {worker.process.exitcode})") from exc
        return answers

    def _stop(self, worker: _Process) -> None:
        if worker.process.is_alive():
            try:
                worker.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        worker.conn.close()


class RayExecutor(_PoolExecutor):
    """Environments in ``num_workers`` Ray actors, on this machine or across a Ray cluster.

    Needs ``pip install envhub[ray]``; starts a local Ray if none is running.

    Args:
        num_workers: how many actors.
        num_cpus: CPUs each actor reserves.
        step_timeout: seconds an actor may take over one batch of resets or steps; past it the
            actor is killed and its slots retried, then tried one at a time, so that only the
            episode that hangs ends (each try bounded by the deadline).
    """

    def __init__(self, num_workers: int = 2, num_cpus: float = 1.0, step_timeout: float | None = DEFAULT_STEP_TIMEOUT):
        try:
            import ray
        except ImportError as exc:
            raise EnvhubError("the Ray executor needs Ray: pip install 'envhub[ray]'") from exc
        self.ray = ray
        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
        self.actor_class = ray.remote(num_cpus=num_cpus, max_restarts=0)(_RayEnvWorker)
        super().__init__(num_workers, step_timeout)

    def _start(self, index: int) -> Any:
        return self.actor_class.remote()

    def _send(self, worker: Any, method: str, request: Any) -> Any:
        return worker.call.remote(method, request)

    def _receive(self, worker: Any, pending: Any) -> list[EnvState]:
        try:
            return self.ray.get(pending, timeout=self.step_timeout)
        except self.ray.exceptions.GetTimeoutError as exc:
            raise StepTimedOut(f"env actor took over {self.step_timeout:g}s") from exc
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.WorkerCrashedError) as exc:
            raise WorkerDied(f"env actor died: {shorten(str(exc), 200)}") from exc

    def _stop(self, worker: Any) -> None:
        self.ray.kill(worker, no_restart=True)


class _RayEnvWorker(EnvWorker):
    """An ``EnvWorker`` that loads the plugins first (a fresh Ray worker has not imported envhub)."""

    def __init__(self) -> None:
        import envhub  # noqa: F401

        super().__init__()

    def call(self, method: str, request: Any) -> list[EnvState]:
        """As ``EnvWorker.call``, with unpicklable results reported as errors (see ``_picklable``)."""
        return _picklable(super().call(method, request))


#: The executors ``make_executor`` builds by name.
EXECUTORS = ("inprocess", "process", "ray")


def make_executor(
    name: str, num_workers: int = 2, step_timeout: float | None = DEFAULT_STEP_TIMEOUT
) -> InProcessExecutor | ProcessPoolExecutor | RayExecutor:
    """Build an executor by name: ``"inprocess"``, ``"process"`` or ``"ray"`` (``step_timeout``:
    the pool executors' deadline per reset or step; the in-process executor cannot preempt)."""
    if name == "inprocess":
        return InProcessExecutor()
    if name == "process":
        return ProcessPoolExecutor(num_workers, step_timeout=step_timeout)
    if name == "ray":
        return RayExecutor(num_workers, step_timeout=step_timeout)
    raise ValueError(f"unknown executor {name!r}; choose {', '.join(EXECUTORS)}")
