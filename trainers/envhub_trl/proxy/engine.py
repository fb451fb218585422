"""The proxy's core, with no HTTP: a chat-completions call in, a recorded call and its response out.

:class:`ChatProxy` renders a request (:class:`~envhub_trl.proxy.render.TemplateView`), finds the
reply of its session that it extends (:meth:`~envhub_trl.proxy.sessions.Session.find_parent`),
builds the prompt's token ids from that reply's ids without re-tokenising them, and queues one
generation request per choice. One worker thread owns the generator: it hands every request queued
meanwhile to it together (:func:`envhub.generation.as_stream`: the HF generator completes them in
one batch, each with its own sampling settings; vLLM's engine takes them into its running batch),
so concurrent agents share batches as envhub's own continuous rollout does.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import hashlib
import itertools
import queue
import threading
import time
from typing import Any

import numpy as np

from envhub.chat import stop_token_ids
from envhub.generation import Completion, Generator, Prompt, SamplingParams, as_stream, request_seeds
from envhub_trl.proxy.render import TemplateView, prefill
from envhub_trl.proxy.requests import ChatRequest, ProxyRequestError, parse_request
from envhub_trl.proxy.responses import chat_response, make_choice
from envhub_trl.proxy.sessions import CallRecord, SessionStore


_WAKE = object()  # queued when a session ends, so a worker waiting for its caller counts again


@dataclasses.dataclass(frozen=True, kw_only=True)
class PendingCall:
    """A call prepared and waiting for its completions: what its record will hold but the choices
    (see :class:`~envhub_trl.proxy.sessions.CallRecord`, whose fields these are; ``text`` is its
    ``prompt_text``)."""

    text: str
    prompt_ids: tuple[int, ...]
    parent: tuple[int, int] | None
    env_ids: tuple[int, ...]
    new_messages: tuple[dict[str, Any], ...]
    system: str
    tools: tuple[dict[str, Any], ...] | None
    state_key: str | None = None


def call_seed(root: int, session_id: str, number: int) -> int:
    """The sampler seed of call ``number`` of session ``session_id`` under ``root``: a hash of all
    three, so it is the same in every process whatever else the proxy serves meanwhile."""
    digest = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
    return int(np.random.SeedSequence([root & (2**63 - 1), int.from_bytes(digest, "little"), number]).generate_state(1, np.uint64)[0])


def _context_of(generator: Any) -> int | None:
    """The longest sequence ``generator``'s model takes, where it says (``max_position_embeddings``)."""
    config = getattr(getattr(generator, "model", None), "config", None)
    return getattr(config, "max_position_embeddings", None)


class ChatProxy:
    """An OpenAI chat-completions endpoint over ``generator``, recording every call by session.

    Args:
        generator: any envhub generator (``hf``, ``vllm``, ``vllm-server``, or one of your own).
        tokenizer: the model's tokenizer, whose chat template renders the requests.
        model: the model name requests must give (``"*"`` takes any).
        store: where sessions are recorded (a new one by default).
        default_max_tokens: a completion's token budget when the request gives none.
        max_context: the longest prompt plus completion served (default: the model's own limit).
        temperature: when set, every call samples at this temperature, whatever it asks (training
            scores the sampled tokens at the run's temperature); an attribute, changed between
            batches (greedy evaluation sets 0).
        top_p: likewise for the nucleus mass.
        seed: the root of the sampler seeds of calls that give none. Every choice is sampled from
            a seed of its own, derived from this root, the session id and the call's number in its
            session, so a session's replies do not depend on the order in which concurrent calls
            arrive: the same sessions replay the same in every run (a random root when None).
        batch_wait_s: how long the generator waits for one more request before it starts a batch
            (each arrival restarts the wait): concurrent agents then share a batch.
        straggler_wait_s: the longer wait between arrivals while callers the last batch answered
            (in sessions that have not ended) have not called again: see :meth:`_gather`.
    """

    def __init__(
        self,
        generator: Generator,
        tokenizer: Any,
        *,
        model: str = "envhub",
        store: SessionStore | None = None,
        default_max_tokens: int = 256,
        max_context: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        batch_wait_s: float = 0.01,
        straggler_wait_s: float = 0.05,
    ):
        self.generator = generator
        self.tokenizer = tokenizer
        self.model = model
        self.store = store or SessionStore()
        self.default_max_tokens = default_max_tokens
        self.max_context = max_context or _context_of(generator)
        self.temperature = temperature
        self.top_p = top_p
        self.seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % 2**63)
        self.batch_wait_s = batch_wait_s
        self.straggler_wait_s = straggler_wait_s
        self.view = TemplateView(tokenizer)
        self._stop_ids = set(stop_token_ids(tokenizer))
        # (prompt, sampling, future, session id), or _WAKE when a session ends
        self._requests: queue.Queue[Any] = queue.Queue()
        self.store.on_end(lambda _: self._requests.put(_WAKE))
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._keys = itertools.count()

    # ------------------------------------------------------------------ generation worker

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="envhub-proxy-generator", daemon=True)
                self._worker.start()

    def _work(self) -> None:
        stream = as_stream(self.generator)
        waiting: dict[int, tuple[concurrent.futures.Future[Completion], str | None]] = {}
        answered: list[str | None] = []  # the sessions of the last batch's completions (when it left nothing running)
        took = 0.0  # and its seconds
        while True:
            self._gather(stream, waiting, answered, took)
            started = time.perf_counter()
            try:
                finished = stream.poll()
            except Exception as exc:  # the generator failed: every request in flight fails with it
                for future, _ in waiting.values():
                    future.set_exception(exc)
                waiting.clear()
                stream = as_stream(self.generator)
                continue
            took = time.perf_counter() - started
            sessions = []
            for key, completion in finished:
                future, session_id = waiting.pop(key)
                future.set_result(completion)
                sessions.append(session_id)
            answered = [] if waiting else sessions

    def _gather(self, stream: Any, waiting: dict[int, tuple[concurrent.futures.Future[Completion], str | None]], answered: list[str | None], took: float) -> None:
        """Submit to ``stream`` the requests that arrive before the next batch starts.

        Idle, the worker waits for a first request, then takes every request that arrives within
        ``batch_wait_s`` of the one before; with requests still running (a streaming engine), it
        takes what is queued without waiting for a first. After a batch that answered ``answered``
        callers, it takes what came in meanwhile, then waits for those callers: the first within
        the batch's own time ``took`` (their responses are being written), each next within
        ``straggler_wait_s``, until each of them has called again, however long that takes in
        all (on the tiny model, 64 agents' client work between two batches took longer than the
        batch, and a batch started without the last few costs a whole batch more). They call back
        at about the same time, but further apart than ``batch_wait_s`` under load; started
        without them, a batch on a small model costs about as much as a whole one, their own batch
        follows it, and the sessions settle into two halves that take turns (`bench/proxy.py`
        logged batches of 31 and 33, and of 41 and 23, for 64 sessions). The callers are counted
        by session, not by number: requests of other sessions that came in meanwhile (the other
        half of a batch that split) do not stand in for them, so a split batch joins again. The
        first calls of sessions the store expects (:meth:`SessionStore.expect`: agents started
        together) are waited for the same way, so the agents' first batch is whole though their
        calls come in spread out. A caller whose session has ended (its agent returned, its reward
        was posted) is not waited for: the store wakes the worker when a session ends, and the
        callers are counted again.
        """
        queued, gathered, fresh, deadline = self._requests.qsize(), 0, 0, time.perf_counter() + took
        awaited = self._live(collections.Counter(answered)) + collections.Counter(self.store.first_calls_due())
        while True:
            if gathered == 0 and not queued:
                wait: float | None = 0.0 if waiting else None
            elif gathered < queued:  # those that came in during the batch
                wait = 0.0
            elif awaited:  # the batch's callers: the first within its time, then each within straggler_wait_s
                wait = max(self.batch_wait_s, deadline - time.perf_counter() if not fresh else self.straggler_wait_s)
            else:
                wait = self.batch_wait_s or 0.0
            try:
                item = self._requests.get(timeout=wait) if wait != 0.0 else self._requests.get_nowait()
            except queue.Empty:
                if gathered < queued:  # another consumer cannot exist; qsize was an estimate
                    queued = gathered
                    continue
                return
            if item is _WAKE:  # a session ended: count the callers again
                if gathered < queued:
                    queued -= 1
                awaited = self._live(awaited)
                continue
            prompt, sampling, future, session_id = item
            self.store.arrived(session_id)
            if gathered == 0 and not queued:  # the first after an idle wait: the callers' time starts now
                deadline = time.perf_counter() + took
                awaited |= collections.Counter(self.store.first_calls_due())  # agents started while it waited
            if awaited[session_id] == 1:
                del awaited[session_id]
            elif awaited[session_id]:
                awaited[session_id] -= 1
            fresh += gathered >= queued
            gathered += 1
            key = next(self._keys)
            waiting[key] = (future, session_id)
            stream.submit(key, prompt, sampling)

    def _live(self, callers: collections.Counter[str | None]) -> collections.Counter[str | None]:
        """``callers`` (calls by session; None: calls with no session) less those whose session has ended."""
        return collections.Counter({s: n for s, n in callers.items() if n > 0 and (s is None or not self.store.has_ended(s))})

    def _submit(self, prompt: Prompt, sampling: SamplingParams, session_id: str | None = None) -> concurrent.futures.Future[Completion]:
        self._ensure_worker()
        future: concurrent.futures.Future[Completion] = concurrent.futures.Future()
        self._requests.put((prompt, sampling, future, session_id))
        return future

    # ------------------------------------------------------------------ calls

    def _check(self, request: ChatRequest, session_id: str | None) -> str:
        if not session_id:
            raise ProxyRequestError(
                "no session id: send it as the API key (Authorization: Bearer SESSION) or the X-Envhub-Session header",
                status=401,
                code="missing_session",
            )
        if self.store.is_closed(session_id):
            raise ProxyRequestError(f"session {session_id!r} is closed: its agent's time is up", status=409, code="session_closed")
        if self.model != "*" and request.model != self.model:
            raise ProxyRequestError(f"the model {request.model!r} does not exist; this proxy serves {self.model!r}", status=404, param="model", code="model_not_found")
        return session_id

    def prepare(self, request: ChatRequest, session_id: str | None) -> tuple[str, PendingCall, list[concurrent.futures.Future[Completion]]]:
        """Render ``request``, build its prompt ids and queue its choices' generation.

        Returns:
            the session id, what :meth:`finish` needs to record the call, and one future per choice.

        Raises:
            ProxyRequestError: (401) without a session id, (404) for another model, (400) for a
                conversation the template refuses or one longer than the context.
        """
        session_id = self._check(request, session_id)
        session = self.store.get(session_id)
        with self.store.lock():
            replies = dict(session.replies)
        text = self.view.text(request, replies)
        with self.store.lock():
            found = session.find_parent(text)
        if found is None:
            parent, env_ids, new_messages = None, self.tokenizer.encode(text, add_special_tokens=False), request.messages
            prompt_ids = list(env_ids)
        else:
            call, k, prefix = found
            env_ids = self.tokenizer.encode(text[len(prefix) :], add_special_tokens=False)
            prompt_ids = [*call.prompt_ids, *call.choices[k].token_ids, *env_ids]
            parent, new_messages = (call.index, k), request.messages[len(call.new_messages) + _depth(session, call) + 1 :]
        budget = request.max_tokens or self.default_max_tokens
        if self.max_context is not None:
            room = self.max_context - len(prompt_ids)
            if room < 1 or (request.max_tokens is not None and budget > room):
                raise ProxyRequestError(
                    f"the prompt is {len(prompt_ids)} tokens and max_tokens {budget}; this model takes {self.max_context} in all",
                    param="messages",
                    code="context_length_exceeded",
                )
            budget = min(budget, room)
        temperature = request.temperature if self.temperature is None else self.temperature
        top_p = request.top_p if self.top_p is None else self.top_p
        with self.store.lock():
            number = session.begun
            session.begun += 1
            state_key = session.env_state_key  # the hosted env's state this call answers (None without one)
        seeds = request_seeds(request.seed if request.seed is not None else call_seed(self.seed, session_id, number), request.n)
        # Model generators read the ids; a model-free one (a random tool caller) reads the request's
        # messages and tools, and writes its whole reply, less the prefilled start.
        shown = self.view.tools(request)
        if shown and request.named_tool is not None:  # the reply calls it
            shown = [tool for tool in shown if tool["function"]["name"] == request.named_tool]
        prompt = Prompt(token_ids=list(prompt_ids), messages=list(request.messages), tools=shown, reply_prefix=prefill(request),
                        stop_strings=request.stop)
        futures = [
            self._submit(prompt, SamplingParams(max_new_tokens=budget, temperature=temperature, top_p=top_p, seed=seed), session_id)
            for seed in seeds
        ]
        system = next((m["content"] for m in request.messages if m["role"] == "system"), "")
        tools = self.view.tools(request)
        pending = PendingCall(text=text, prompt_ids=tuple(prompt_ids), parent=parent, env_ids=tuple(env_ids),
                              new_messages=tuple(new_messages), system=system, tools=tuple(tools) if tools else None,
                              state_key=state_key)
        return session_id, pending, futures

    def finish(self, request: ChatRequest, session_id: str, pending: PendingCall, completions: list[Completion]) -> dict[str, Any]:
        """Record the call with its ``completions`` and return its response."""
        start = prefill(request)
        choices = tuple(make_choice(request, start, c, self._decode(c.token_ids), self._decode(self._body(c))) for c in completions)
        session = self.store.get(session_id)
        with self.store.lock():
            call = CallRecord(
                index=len(session.calls),
                prompt_ids=pending.prompt_ids,
                prompt_text=pending.text,
                parent=pending.parent,
                env_ids=pending.env_ids,
                new_messages=pending.new_messages,
                choices=choices,
                system=pending.system,
                tools=pending.tools,
                state_key=pending.state_key,
            )
            session.add(call)
        return chat_response(request, call, model=request.model, tokenizer=self.tokenizer, session_id=session_id)

    def _decode(self, ids: Any) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _body(self, completion: Completion) -> list[int]:
        """The completion's ids less the token that ended its turn, if one did."""
        ids = list(completion.token_ids)
        return ids[:-1] if ids and completion.finish_reason == "stop" and ids[-1] in self._stop_ids else ids

    def complete(self, body: Any, session_id: str | None) -> dict[str, Any]:
        """Answer one chat-completions request (its decoded JSON ``body``) for ``session_id``,
        blocking until its choices are sampled.

        Raises:
            ProxyRequestError: for a request the proxy refuses (see :meth:`prepare`).
        """
        request = parse_request(body)
        session_id, pending, futures = self.prepare(request, session_id)
        return self.finish(request, session_id, pending, [f.result() for f in futures])

    async def complete_async(self, body: Any, session_id: str | None) -> dict[str, Any]:
        """:meth:`complete` for an event loop: the wait for the generator does not block it."""
        request = parse_request(body)
        session_id, pending, futures = self.prepare(request, session_id)
        completions = [await asyncio.wrap_future(f) for f in futures]
        return self.finish(request, session_id, pending, completions)


def _depth(session: Any, call: CallRecord) -> int:
    """How many messages precede ``call``'s new ones: those of the calls it extends and their replies."""
    depth = 0
    while call.parent is not None:
        parent = session.calls[call.parent[0]]
        depth += len(parent.new_messages) + 1
        call = parent
    return depth
