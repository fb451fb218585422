"""``ModelPolicy``: a language model playing one environment turn by turn (``envhub run --policy PATH``)."""

from __future__ import annotations

from typing import Any

from envhub.actions import TagFormat, get_format, parse_reply
from envhub.chat import ChatRenderer, ChatTokens
from envhub.core import TextEnv
from envhub.generation import Generator, Prompt, SamplingParams


class ModelPolicy:
    """Chats with ``env`` through a generator, rendering the conversation as the manager does.

    ``act`` returns the action the reply names, so callers can pass it to ``env.step``; a reply
    that does not parse is returned whole, and the environment answers it as an invalid action.
    A new episode (``env.turn == 0``) starts a new conversation.

    Args:
        generator: completes token-id prompts.
        tokenizer: the model's tokenizer, with a chat template.
        sampling: sampling settings (greedy by default).
        action_format: the reply format, by name or a ``TagFormat``.
    """

    def __init__(
        self,
        generator: Generator,
        tokenizer: Any,
        sampling: SamplingParams | None = None,
        action_format: str | TagFormat = "answer",
    ):
        self.generator = generator
        self.sampling = sampling or SamplingParams(temperature=0.0)
        self.fmt = get_format(action_format) if isinstance(action_format, str) else action_format
        self.renderer = ChatRenderer(self.fmt)
        self.tokens = ChatTokens(tokenizer)
        self.messages: list[dict[str, str]] = []
        self.last_reply: str | None = None

    def act(self, env: TextEnv, observation: str) -> str:
        """Return the action named by the model's reply to ``observation``."""
        legal = env.valid_actions()
        if env.turn == 0:
            self.messages = [{"role": "system", "content": self.renderer.system(env.instructions)}]
        self.messages.append({"role": "user", "content": self.renderer.user(observation, env.turn, env.max_turns, legal)})
        prompt = Prompt(self.tokens.prompt(self.messages), list(self.messages), legal)
        reply = self.generator.generate([prompt], self.sampling)[0].text
        self.messages.append({"role": "assistant", "content": reply})
        self.last_reply = reply
        parsed = parse_reply(reply, legal, self.fmt)
        return parsed.action if parsed.valid and parsed.action is not None else reply


def load_model_policy(name: str, env_id: str | None = None, seed: int | None = None) -> ModelPolicy:
    """A greedy :class:`ModelPolicy` on the transformers model ``name`` (``tiny``, ``smollm2-135m``,
    a folder or a hub id; :func:`envhub_trl.models.resolve_model`)."""
    from envhub_trl.generators import make_generator

    generator = make_generator("hf", name, env_ids=[env_id] if env_id else None, seed=seed or 0)
    return ModelPolicy(generator, generator.tokenizer, SamplingParams(temperature=0.0, seed=seed))
