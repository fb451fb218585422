"""Chat rendering of environments, and token-exact chat-template continuation.

:class:`ChatRenderer` writes an environment's conversation as chat messages: a system message
with the task's rules and the reply format, then one user message per turn with the turn
number, the actions left and the observation (an invalid reply's explanation leads it).

:class:`ChatTokens` turns those messages into token ids without ever re-tokenising what the model
sampled: the first prompt is the chat template's rendering, and after each reply only the
template's rendering of the *new* messages is appended, computed as the difference between two
renderings of a fixed reference conversation. The sampled ids stay exactly as sampled, and when
they are the canonical tokenisation of the reply, the concatenation equals the template's own
rendering of the whole conversation.

:func:`end_of_turn_ids` reads from the same template which tokens end a reply (``<|im_end|>`` in
ChatML), since a tokenizer's ``eos_token`` is often another token (``<|endoftext|>`` in Qwen2.5's
base models, ``<|im_start|>`` in SmolLM2's GGUF); generators stop replies on :func:`stop_token_ids`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from envhub.error import EnvhubError
from envhub.tools import tools_text

if TYPE_CHECKING:
    from envhub.actions import ReplyFormat


class ChatTemplateError(EnvhubError):
    """A tokenizer's chat template cannot be continued turn by turn (it rewrites earlier turns)."""


_MARK = "\x00envhub-reply\x00"
_REFERENCE = ({"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK})
#: A tool no template knows, to tell whether a template renders ``tools=``.
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "envhub_probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}},
}
_TOOL_MARK = "\x00envhub-tool-result\x00"


def _render_reference(tokenizer: Any, tools: Sequence[dict[str, Any]] | None = None) -> tuple[str, str]:
    """The template's rendering of a reference conversation ending in a reply, and what it writes after that reply."""
    extra = {"tools": list(tools)} if tools else {}
    rendered = tokenizer.apply_chat_template(list(_REFERENCE), tokenize=False, add_generation_prompt=False, **extra)
    end = rendered.rfind(_MARK)
    if end < 0:
        raise ChatTemplateError("the chat template drops the assistant's reply; it cannot be used for multi-turn rollouts")
    return rendered, rendered[end + len(_MARK) :]


def _eos_ids(tokenizer: Any) -> list[int]:
    eos = tokenizer.eos_token_id
    return list(eos) if isinstance(eos, list) else [] if eos is None else [eos]


def _special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens, added ones marked special included (they may be missing
    from ``all_special_ids``: SmolLM2's GGUF tokenizer lists ``<|im_end|>`` only there)."""
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special.update(i for i, token in added.items() if getattr(token, "special", False))
    return special


def _leading_special(tokenizer: Any, turn_end: str) -> list[int]:
    ids = list(tokenizer.encode(turn_end, add_special_tokens=False)) if turn_end else []
    special = _special_ids(tokenizer)
    leading = []
    for token in ids:
        if token not in special:
            break
        leading.append(int(token))
    return leading or _eos_ids(tokenizer)


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The token ids that end a reply's turn, read from the tokenizer's chat template.

    They are the special tokens the template writes right after a reply's content (``<|im_end|>``
    in ChatML, ``<|eot_id|>`` in Llama 3, ``<end_of_turn>`` in Gemma); a model that ends its turn
    samples the first. The tokenizer's ``eos_token`` is not used, since it is often another token.
    Where the template writes no special token after a reply, the eos ids are returned.

    Raises:
        ChatTemplateError: if the template drops the assistant's reply.
    """
    return _leading_special(tokenizer, _render_reference(tokenizer)[1])


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders tool schemas passed as ``tools=`` (Qwen2.5,
    Llama 3.1, Hermes do; plain ChatML, as in SmolLM2-135M, ignores them)."""
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "u"}], tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template that rejects the argument does not render tools
        return False
    return isinstance(rendered, str) and "envhub_probe_tool" in rendered


def tool_message_role(tokenizer: Any) -> str:
    """``"tool"`` where the chat template renders ``tool`` messages after a reply, else ``"user"``
    (the fallback: :meth:`ChatRenderer.tool_messages` then wraps each result in ``<tool_response>`` tags)."""
    try:
        rendered = tokenizer.apply_chat_template(
            [*_REFERENCE, {"role": "tool", "content": _TOOL_MARK}], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # templates that enforce user/assistant alternation raise on other roles
        return "user"
    return "tool" if isinstance(rendered, str) and _TOOL_MARK in rendered else "user"


def stop_token_ids(tokenizer: Any) -> list[int]:
    """The token ids a generator stops a reply at: :func:`end_of_turn_ids`, then the tokenizer's eos ids."""
    ids = end_of_turn_ids(tokenizer)
    return ids + [i for i in _eos_ids(tokenizer) if i not in ids]


class ChatRenderer:
    """How an environment's text becomes chat messages.

    Args:
        fmt: the reply format, whose instructions close the system message.
        system_prompt: text put before the environment's instructions.
        show_legal_actions: list the legal actions in every user message (finite action sets).
        show_turns: start every user message with the turn count (``Turn 2 of 8; 7 actions left.``).
    """

    def __init__(self, fmt: ReplyFormat, system_prompt: str | None = None, show_legal_actions: bool = True, show_turns: bool = True):
        self.fmt = fmt
        self.system_prompt = system_prompt
        self.show_legal_actions = show_legal_actions
        self.show_turns = show_turns
        self._headers: dict[tuple[int, int | None], str] = {}
        self._legal: list[str] = []
        self._legal_line = ""

    def system(self, instructions: str, tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The system message: the optional preamble, the task's rules, the reply format, and
        ``tools`` written out (:func:`envhub.tools.tools_text`) when given: the fallback for a
        chat template that does not render ``tools=`` itself."""
        parts = [self.system_prompt, instructions.strip(), self.fmt.instructions(), tools_text(tools) if tools else None]
        return "\n\n".join(part for part in parts if part)

    @staticmethod
    def tool_messages(results: Sequence[str], role: str = "tool") -> list[dict[str, str]]:
        """One message per tool result; with ``role="user"`` (a template without a ``tool`` role)
        each result is wrapped in ``<tool_response>`` tags, as Hermes and Qwen2.5 templates do."""
        if role == "tool":
            return [{"role": "tool", "content": result} for result in results]
        return [{"role": role, "content": f"<tool_response>\n{result}\n</tool_response>"} for result in results]

    def user(self, observation: str, turn: int, max_turns: int | None, valid_actions: Sequence[str] | None) -> str:
        """The user message of turn ``turn`` (from 0): where we are, what is left, what is legal."""
        header = self._headers.get((turn, max_turns)) if self.show_turns else ""
        if header is None:
            if max_turns is None:
                header = f"Turn {turn + 1}.\n"
            else:
                left = max_turns - turn
                header = f"Turn {turn + 1} of {max_turns}; {left} action{'s' if left != 1 else ''} left.\n"
            self._headers[(turn, max_turns)] = header
        if not (self.show_legal_actions and valid_actions):
            return header + observation
        if valid_actions != self._legal:  # most envs offer the same list turn after turn
            self._legal = list(valid_actions)
            self._legal_line = "\nLegal actions: " + ", ".join(valid_actions)
        return header + observation + self._legal_line


class ChatTokens:
    """Token ids of a conversation through a Hugging Face tokenizer's chat template, turn by turn.

    Args:
        tokenizer: a tokenizer with a chat template (``apply_chat_template``, ``encode``,
            ``eos_token_id``, ``decode``; ``added_tokens_decoder`` to tell special tokens).
        cache_size: how many encoded texts to remember (the memory is emptied when full).

    Raises:
        ChatTemplateError: if the template renders a conversation differently once messages are
            appended (such templates cannot be continued token-exactly).
    """

    def __init__(self, tokenizer: Any, cache_size: int = 8192):
        self.tokenizer = tokenizer
        self.cache_size = cache_size
        self._encoded: dict[str, tuple[int, ...]] = {}
        self._reference = list(_REFERENCE)
        #: What the template writes after a reply's content (e.g. ``<|im_end|>\n``).
        self._reference_text, self.turn_end = _render_reference(tokenizer)
        #: The reference rendering per tool list (templates put the tools in the system block).
        self._tool_references: dict[str, str] = {}
        #: The tokens that end a reply's turn (:func:`end_of_turn_ids`).
        self.end_of_turn_ids = _leading_special(tokenizer, self.turn_end)
        self._stop_ids = set(self.end_of_turn_ids) | set(_eos_ids(tokenizer))
        #: Whether the template renders ``tools=`` (else the manager writes them into the system message).
        self.renders_tools = renders_tools(tokenizer)
        #: The role tool results take in this template (:func:`tool_message_role`).
        self.tool_role = tool_message_role(tokenizer)

    def _render(self, messages: Sequence[dict[str, str]], generation_prompt: bool, tools: Sequence[dict[str, Any]] | None = None) -> str:
        extra = {"tools": list(tools)} if tools and self.renders_tools else {}
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt, **extra)

    def _reference_for(self, tools: Sequence[dict[str, Any]] | None) -> str:
        if not (tools and self.renders_tools):
            return self._reference_text
        key = json.dumps(list(tools), sort_keys=True)
        text = self._tool_references.get(key)
        if text is None:
            text = self._tool_references[key] = _render_reference(self.tokenizer, tools)[0]
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special tokens added.

        Remembered by text: the members of a group share their first prompt and often meet the
        same observations, and tokenizing costs more than stepping a fast environment.
        """
        ids = self._encoded.get(text)
        if ids is None:
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            if len(self._encoded) >= self.cache_size:
                self._encoded.clear()
            self._encoded[text] = ids
        return list(ids)

    def prompt(self, messages: Sequence[dict[str, str]], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of ``messages`` rendered with the generation prompt (a whole prompt), with
        ``tools`` passed to the template where it renders them."""
        return self.encode(self._render(messages, True, tools))

    def continuation(
        self,
        completion_ids: Sequence[int],
        finish_reason: str,
        new_messages: Sequence[dict[str, str]],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids the environment appends after a sampled reply: the end of the reply's turn
        that the model did not sample, then ``new_messages`` (user or tool messages) and the
        generation prompt. ``tools`` are the conversation's tools, as in :meth:`prompt`.
        """
        reference_text = self._reference_for(tools)
        rendered = self._render([*self._reference, *new_messages], True, tools)
        if not rendered.startswith(reference_text):
            raise ChatTemplateError(
                "the chat template renders earlier turns differently once messages are appended; "
                "use the step layout or a template that only appends"
            )
        tail = self.turn_end
        if finish_reason == "stop" and completion_ids and completion_ids[-1] in self._stop_ids:
            sampled_end = self.tokenizer.decode([completion_ids[-1]], skip_special_tokens=False)
            if tail.startswith(sampled_end):
                tail = tail[len(sampled_end) :]
        return self.encode(tail + rendered[len(reference_text) :])
