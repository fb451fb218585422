"""Who picks the actions: policies and generators.

A *policy* maps an environment and its latest observation to an action string: Gymnasium-style
play, and the opponents of two-player games. A *generator* completes a batch of token-id
prompts, returning token ids, their sampling logprobs and text; the environment managers drive
generators (training, evaluation, and ``envhub run`` through :mod:`envhub.play`). Model-free ones
(random, expert) live here, the human one in :mod:`envhub.play`; model-backed ones (transformers,
vLLM) live in the trainer package, so the core never imports torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from envhub.actions import ReplyFormat
from envhub.chat import end_of_turn_ids
from envhub.core import TextEnv
from envhub.error import PolicyError
from envhub.tools import ToolCall


class Policy(Protocol):
    """Anything that chooses an action for ``env`` given its latest ``observation``."""

    def act(self, env: TextEnv, observation: str) -> str:
        """Return the next action as text."""
        ...


class RandomPolicy:
    """Uniform over ``env.valid_actions()``, from its own seeded generator."""

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def act(self, env: TextEnv, observation: str) -> str:
        """Return a uniformly random legal action."""
        legal = env.valid_actions()
        if not legal:
            raise PolicyError(f"{env.spec.id if env.spec else type(env).__name__} has no finite action list; the random policy needs one")
        return legal[int(self.rng.integers(len(legal)))]


class ExpertPolicy:
    """The environment's own oracle (``expert_action()``)."""

    def act(self, env: TextEnv, observation: str) -> str:
        """Return the oracle's action."""
        action = env.expert_action()
        if action is None:
            raise PolicyError(f"{env.spec.id if env.spec else type(env).__name__} has no expert; use --policy random or human")
        return action


# ---------------------------------------------------------------------- generators


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How a generator samples one completion per prompt.

    Attributes:
        max_new_tokens: the most tokens a completion may have.
        temperature: softmax temperature; 0 means greedy decoding.
        top_p: nucleus sampling mass (1.0 keeps every token).
        top_k: keep only the k likeliest tokens (0 or less keeps every token).
        seed: seeds the sampler for reproducible completions; None draws fresh randomness.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def cut_at_stop(text: str, stop_strings: Sequence[str]) -> int | None:
    """The length of ``text`` up to and including the first of ``stop_strings`` it contains
    (the earliest-ending one), or None when it contains none."""
    ends = [text.find(stop) + len(stop) for stop in stop_strings if stop in text]
    return min(ends) if ends else None


def request_seeds(seed: int | None, count: int) -> list[int | None]:
    """Distinct per-prompt sampler seeds derived from ``seed`` (all None when ``seed`` is None).

    Members of a group share their first prompt; one seed for the whole batch would make every
    member sample the same reply.
    """
    if seed is None:
        return [None] * count
    state = np.random.SeedSequence(seed).generate_state(count, dtype=np.uint32)
    return [int(s) & 0x7FFFFFFF for s in state]


@dataclasses.dataclass
class Prompt:
    """One prompt handed to a generator.

    Model generators read ``token_ids`` only. The other fields let model-free generators (random,
    expert) answer without a model.

    Attributes:
        token_ids: the prompt as token ids (empty when the manager has no tokenizer).
        messages: the conversation as chat messages (``{"role", "content"}``), the last one the user's.
        valid_actions: the actions legal now, or None for open action spaces.
        expert_action: the environment's oracle action, when the manager was asked for it.
        tools: a tool env's tool schemas (for chat APIs that take ``tools=``), else None.
        reply_format: the reply format the env is played in (model-free generators write their
            action in it); None for ``<answer>...</answer>``.
        reply_prefix: the start of the reply, already written for the model at the end of
            ``token_ids`` (:class:`~envhub.prompts.PromptSettings`' ``reply_prefix``); a
            completion is what follows it.
        stop_strings: a completion ends as soon as its text contains one of these (kept in it).
    """

    token_ids: list[int]
    messages: list[dict[str, str]]
    valid_actions: list[str] | None = None
    expert_action: str | None = None
    tools: list[dict[str, Any]] | None = None
    reply_format: ReplyFormat | None = None
    reply_prefix: str = ""
    stop_strings: tuple[str, ...] = ()

    def continued(self, reply: str) -> str:
        """``reply`` (a whole reply, as a model-free policy writes it) less the ``reply_prefix``
        already written for it: the completion this prompt asks for."""
        return reply[len(self.reply_prefix) :] if self.reply_prefix and reply.startswith(self.reply_prefix) else reply


@dataclasses.dataclass
class Completion:
    """What a generator returned for one prompt.

    Attributes:
        token_ids: the sampled token ids, the end-of-sequence token included when one was sampled.
        logprobs: the sampling log-probability of each of ``token_ids`` (same length).
        text: the completion decoded, special tokens skipped.
        finish_reason: ``"stop"`` (an end-of-sequence or stop token) or ``"length"`` (hit
            ``max_new_tokens``).
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str = "stop"

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"a completion needs one logprob per token: {len(self.token_ids)} tokens, {len(self.logprobs)} logprobs"
            )


@runtime_checkable
class Generator(Protocol):
    """Anything that completes a batch of token-id prompts.

    Implementations: :class:`RandomGenerator`, :class:`RandomToolCallGenerator` and :class:`ExpertGenerator` here; ``HFGenerator``
    and ``VLLMGenerator`` in the trainer package (``envhub_trl.generators``). A generator that
    needs ``Prompt.expert_action`` sets the class attribute ``uses_expert = True``.
    """

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[Completion]:
        """Return one completion per prompt, in order."""
        ...


class _ActionGenerator:
    """Shared body of the model-free generators: reply ``<answer>ACTION</answer>``, or the action
    in the prompt's reply format (a ``<tool_call>`` for a tool env)."""

    uses_expert = False

    def __init__(self, tokenizer: Any | None = None):
        self.tokenizer = tokenizer
        self._turn_end: list[int] | None = None

    def _action(self, prompt: Prompt) -> str:
        raise NotImplementedError

    def _reply(self, prompt: Prompt) -> str:
        """The whole reply: the action in the prompt's reply format, or ``<answer>ACTION</answer>``."""
        action = self._action(prompt)
        return prompt.reply_format.render(action) if prompt.reply_format is not None else f"<answer>{action}</answer>"

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[Completion]:
        """Return one reply per prompt, tokenised (ending with the token that ends a turn, as a model's
        reply does: :func:`envhub.chat.end_of_turn_ids`) if a tokenizer was given."""
        if self.tokenizer is not None and self._turn_end is None:
            self._turn_end = end_of_turn_ids(self.tokenizer)[:1]
        completions = []
        for prompt in prompts:
            text = prompt.continued(self._reply(prompt))
            ids: list[int] = []
            if self.tokenizer is not None:
                ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + (self._turn_end or [])
            completions.append(Completion(ids, [0.0] * len(ids), text, "stop"))
        return completions


def _random_legal(prompt: Prompt, rng: np.random.Generator) -> str:
    """A uniformly random one of the prompt's legal actions."""
    return prompt.valid_actions[int(rng.integers(len(prompt.valid_actions)))]


class RandomGenerator(_ActionGenerator):
    """Replies with a uniformly random legal action, from its own seeded generator.

    Args:
        seed: seeds the choice of actions.
        tokenizer: a Hugging Face tokenizer to turn replies into token ids (None: text only).
    """

    def __init__(self, seed: int | None = None, tokenizer: Any | None = None):
        super().__init__(tokenizer)
        self.rng = np.random.default_rng(seed)

    def _action(self, prompt: Prompt) -> str:
        if not prompt.valid_actions:
            raise PolicyError("the random generator needs a finite list of legal actions")
        return _random_legal(prompt, self.rng)


class RandomMappingGenerator(_ActionGenerator):
    """Replies with a legal action picked by a fixed random function of the prompt: the same
    prompt always gets the same action, and across prompts the actions are uniformly random (a
    keyed hash of the prompt picks among its legal actions). A random *deterministic* policy: it
    knows nothing of the task, but its reply depends on what it is shown.

    Args:
        seed: keys the hash (another seed, another mapping) and seeds the uniform moves.
        tokenizer: a Hugging Face tokenizer to turn replies into token ids (None: text only).
        share: how often the mapping picks the move; otherwise a uniformly random legal move (so
            each prompt's moves follow a random distribution, ``share + (1 - share) / n`` on its
            mapped move, rather than one move always).
    """

    def __init__(self, seed: int | None = None, tokenizer: Any | None = None, share: float = 1.0):
        super().__init__(tokenizer)
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share is a probability, between 0 and 1; got {share}")
        self.key = str(0 if seed is None else seed).encode()
        self.share = share
        self.rng = np.random.default_rng(seed)

    def _action(self, prompt: Prompt) -> str:
        if not prompt.valid_actions:
            raise PolicyError("the random-mapping generator needs a finite list of legal actions")
        if self.share < 1.0 and self.rng.random() >= self.share:
            return _random_legal(prompt, self.rng)
        shown = repr(prompt.messages[-1]["content"]) if prompt.messages else ",".join(map(str, prompt.token_ids))
        digest = hashlib.blake2b(shown.encode(), key=self.key, digest_size=8).digest()
        return prompt.valid_actions[int.from_bytes(digest, "little") % len(prompt.valid_actions)]


class RandomToolCallGenerator(_ActionGenerator):
    """Replies with one call of a uniformly random tool of the prompt's ``tools``, its required
    arguments drawn uniformly from their JSON schemas: a format-only demonstrator for chat agents
    (the proxy hands it each request's tools), whose replies teach the tool-call format and nothing
    of the task.

    A required parameter must say what its values are: an ``enum``, a ``boolean``, or an
    ``integer`` with ``minimum`` and ``maximum``; optional parameters are left out.

    Args:
        seed: seeds the choice of tools and arguments.
        tokenizer: a Hugging Face tokenizer to turn replies into token ids (None: text only).

    Raises:
        PolicyError: (when generating) for a prompt without tools, or a required parameter whose
            values its schema does not list.
    """

    def __init__(self, seed: int | None = None, tokenizer: Any | None = None):
        super().__init__(tokenizer)
        self.rng = np.random.default_rng(seed)

    def _value(self, tool: str, name: str, schema: Any) -> Any:
        schema = schema if isinstance(schema, dict) else {}
        if schema.get("enum"):
            return schema["enum"][int(self.rng.integers(len(schema["enum"])))]
        if schema.get("type") == "boolean":
            return bool(self.rng.integers(2))
        if schema.get("type") == "integer" and isinstance(schema.get("minimum"), int) and isinstance(schema.get("maximum"), int):
            return int(self.rng.integers(schema["minimum"], schema["maximum"] + 1))
        raise PolicyError(
            f"the random tool caller cannot draw {tool}.{name}: its schema lists no values "
            "(give it an enum, a boolean type, or an integer with minimum and maximum)"
        )

    def _reply(self, prompt: Prompt) -> str:
        if not prompt.tools:
            raise PolicyError("the random tool caller needs the prompt's tools")
        function = prompt.tools[int(self.rng.integers(len(prompt.tools)))].get("function", {})
        name, parameters = function.get("name", ""), function.get("parameters") or {}
        properties = parameters.get("properties") or {}
        arguments = {key: self._value(name, key, properties.get(key)) for key in parameters.get("required") or ()}
        return ToolCall(name, arguments).render()


class ExpertGenerator(_ActionGenerator):
    """Replies with the environment's oracle action (the manager fills ``Prompt.expert_action``).

    Args:
        tokenizer: a Hugging Face tokenizer to turn replies into token ids (None: text only).
        epsilon: the probability of replying with a uniformly random legal action instead (a noisy
            demonstrator, whose episodes visit states off the expert's path; each turn records
            the expert's action in ``Turn.expert_action``).
        seed: seeds the noise.
    """

    uses_expert = True

    def __init__(self, tokenizer: Any | None = None, epsilon: float = 0.0, seed: int | None = None):
        super().__init__(tokenizer)
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon is a probability, between 0 and 1; got {epsilon}")
        self.epsilon = epsilon
        self.rng = np.random.default_rng(seed)

    def _action(self, prompt: Prompt) -> str:
        if prompt.expert_action is None:
            raise PolicyError("this environment has no expert (its expert_action() is None): play it at random, by hand or with a model")
        if self.epsilon and prompt.valid_actions and self.rng.random() < self.epsilon:
            return _random_legal(prompt, self.rng)
        return prompt.expert_action


# ---------------------------------------------------------------------- streaming (continuous batching)


@runtime_checkable
class StreamingGenerator(Protocol):
    """A generator that takes requests as they come and returns completions as they finish, as
    continuous batching does (vLLM's engine: a request joins the running batch at the next
    engine step). The continuous rollout (:func:`envhub.rollout.rollout`, ``mode="continuous"``)
    drives it: it submits an env's next prompt as soon as that env has stepped, and steps an env
    as soon as its reply is done, while the other requests keep generating.

    Implementations: ``VLLMGenerator`` (per engine step); any batch :class:`Generator` through
    :class:`BatchStream` (the simple form: each poll completes what is queued as one batch).
    """

    def submit(self, key: Any, prompt: Prompt, sampling: SamplingParams) -> None:
        """Queue ``prompt`` under ``key`` (a hashable, unique among pending requests)."""
        ...

    def poll(self) -> list[tuple[Any, Completion]]:
        """Advance generation by one unit of work; return the requests that finished, as ``(key, completion)``."""
        ...

    def pending(self) -> int:
        """How many submitted requests have not been returned by :meth:`poll` yet."""
        ...


class BatchStream:
    """A batch :class:`Generator` as a :class:`StreamingGenerator`: each :meth:`poll` completes every
    request queued since the last one in one ``generate`` call (the HF generator's continuous form:
    no request waits for a turn of the whole env batch, only for the batch in flight).

    A generator with ``generate_each(prompts, samplings)`` (the HF one) samples each request with
    its own :class:`SamplingParams`, seed included, so a completion does not depend on which
    requests arrived with it. Any other is called with the first queued request's sampling.
    """

    def __init__(self, generator: Generator):
        self.generator = generator
        self.uses_expert = bool(getattr(generator, "uses_expert", False))
        self._queue: list[tuple[Any, Prompt, SamplingParams]] = []

    def submit(self, key: Any, prompt: Prompt, sampling: SamplingParams) -> None:
        """Queue one request."""
        self._queue.append((key, prompt, sampling))

    def poll(self) -> list[tuple[Any, Completion]]:
        """Complete every queued request in one batch."""
        if not self._queue:
            return []
        queue, self._queue = self._queue, []
        each = getattr(self.generator, "generate_each", None)
        if callable(each):
            completions = each([prompt for _, prompt, _ in queue], [sampling for _, _, sampling in queue])
        else:
            completions = self.generator.generate([prompt for _, prompt, _ in queue], queue[0][2])
        return [(key, completion) for (key, _, _), completion in zip(queue, completions)]

    def pending(self) -> int:
        """Requests queued and not yet completed."""
        return len(self._queue)


def as_stream(generator: Generator | StreamingGenerator) -> StreamingGenerator:
    """``generator`` itself when it streams (has ``submit``/``poll``/``pending``), else a :class:`BatchStream` of it."""
    if all(callable(getattr(generator, name, None)) for name in ("submit", "poll", "pending")):
        return generator  # type: ignore[return-value]
    return BatchStream(generator)  # type: ignore[arg-type]
