"""``ModelPolicy``: a language model playing one environment turn by turn (``envhub run --policy PATH``)."""

from __future__ import annotations

from typing import Any

from envhub.actions import env_format_name, env_tools, get_format, parse_reply
from envhub.chat import ChatRenderer, ChatTokens
from envhub.core import TextEnv, ToolEnv
from envhub.generation import Generator, Prompt, SamplingParams
from envhub.prompts import PromptSettings, TrainedOn


class ModelPolicy:
    """Chats with ``env`` through a generator, rendering the conversation as the manager does.

    ``act`` returns the action the reply names, so callers can pass it to ``env.step``; a reply
    that does not parse is returned whole, and the environment answers it as an invalid action.
    A new episode (``env.turn == 0``) starts a new conversation. A tool env's schemas go through
    the chat template's ``tools=`` (or the system message where the template ignores them), and
    its results come back as ``tool`` messages, as in the manager.

    Args:
        generator: completes token-id prompts.
        tokenizer: the model's tokenizer, with a chat template.
        sampling: sampling settings (greedy by default).
        prompt: what the model sees (instructions, system prompt, reply format, legal actions);
            :class:`~envhub.prompts.PromptSettings` defaults when None.
        env_kwargs: the env settings the model trained with (``envhub run`` makes the env with them).
        max_turns: the turn limit it trained with.
    """

    def __init__(
        self,
        generator: Generator,
        tokenizer: Any,
        sampling: SamplingParams | None = None,
        prompt: PromptSettings | None = None,
        env_kwargs: dict[str, Any] | None = None,
        max_turns: int | None = None,
    ):
        self.generator = generator
        self.sampling = sampling or SamplingParams(temperature=0.0)
        self.prompt = prompt or PromptSettings()
        #: The reply format; with ``action_format`` None, set from each env at its first turn.
        self.fmt = get_format(self.prompt.action_format or "answer")
        self.renderer = ChatRenderer(self.fmt, self.prompt.system_prompt, self.prompt.show_legal_actions)
        self.tokens = ChatTokens(tokenizer)
        self.tools: list[dict[str, Any]] | None = None
        self.env_kwargs = dict(env_kwargs or {})
        self.max_turns = max_turns
        self.messages: list[dict[str, str]] = []
        self.last_reply: str | None = None

    def respond(self, env: TextEnv, observation: str) -> str:
        """The model's whole reply to ``observation`` (``envhub run`` applies it with
        :func:`envhub.actions.apply_reply` in :attr:`fmt`, as training does)."""
        self.act(env, observation)
        return self.last_reply or ""

    def act(self, env: TextEnv, observation: str) -> str:
        """Return the action named by the model's reply to ``observation``."""
        legal = env.valid_actions()
        if env.turn == 0:
            if self.prompt.action_format is None and get_format(env_format_name(env)) != self.fmt:
                self.fmt = get_format(env_format_name(env))
                self.renderer = ChatRenderer(self.fmt, self.prompt.system_prompt, self.prompt.show_legal_actions)
            self.tools = env.tool_schemas() if isinstance(env, ToolEnv) else None
            instructions = env.instructions if self.prompt.instructions is None else self.prompt.instructions
            written = self.tools if self.tools and not self.tokens.renders_tools else None
            self.messages = [{"role": "system", "content": self.renderer.system(instructions, written)}]
        if self.tools is not None and env.turn > 0:
            self.messages.extend(self.renderer.tool_messages([observation], self.tokens.tool_role))
        else:
            self.messages.append({"role": "user", "content": self.renderer.user(observation, env.turn, env.max_turns, legal)})
        prompt = Prompt(self.tokens.prompt(self.messages, self.tools), list(self.messages), legal, None, self.tools, self.fmt)
        reply = self.generator.generate([prompt], self.sampling)[0].text
        self.messages.append({"role": "assistant", "content": reply})
        self.last_reply = reply
        parsed = parse_reply(reply, legal, self.fmt, env_tools(env))
        return parsed.action if parsed.valid and parsed.action is not None else reply


def load_model_policy(name: str, env_id: str | None = None, seed: int | None = None) -> ModelPolicy:
    """A greedy :class:`ModelPolicy` on the transformers model ``name`` (``tiny``, ``smollm2-135m``,
    a folder or a hub id; :func:`envhub_trl.models.resolve_model`), on the prompts and env settings
    it trained with when its folder has an ``envhub.json``."""
    from envhub_trl.generators import make_generator
    from envhub_trl.models import resolve_model

    env_ids = [env_id] if env_id else None
    path = resolve_model(name, env_ids, seed or 0)
    trained = TrainedOn.load(path) or TrainedOn()
    prompt, env_kwargs, max_turns = trained.for_env(env_id) if env_id else (trained.prompt, {}, None)
    generator = make_generator("hf", path, env_ids=env_ids, seed=seed or 0)
    return ModelPolicy(generator, generator.tokenizer, SamplingParams(temperature=0.0, seed=seed), prompt, env_kwargs, max_turns)
