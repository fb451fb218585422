"""``PromptSettings``: everything that shapes what a model sees, as one value saved with checkpoints.

A model is only as good as the prompts it was trained on: a policy trained with a short system
message, no list of legal actions and a 2,048-token budget is a different policy when evaluated
with the environment's long rules and the legal actions listed. The manager, the trainer, ``envhub
eval``, ``envhub run --policy PATH`` and ``envhub export-sft`` therefore all take one
:class:`PromptSettings`, and every checkpoint the trainer writes carries it in ``envhub.json``
beside ``config.json``, inside the :class:`~envhub.settings.EnvSettings` of the environment it
trained on (:class:`~envhub.settings.TrainedOn`), so that evaluation renders exactly the prompts
training rendered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envhub.bounds import AT_LEAST_ONE, NON_NEGATIVE, Bounds, check_bounds
from envhub.error import EnvhubError

class SettingsError(EnvhubError):
    """A checkpoint's ``envhub.json`` cannot be read as prompt settings."""


@dataclass(frozen=True)
class PromptSettings:
    """What the model sees, and how its replies are read.

    Attributes:
        instructions: replaces the environment's own instructions in the system message (a short
            prompt for a small model); None keeps the environment's.
        system_prompt: text put before the instructions in the system message.
        action_format: the reply format, by name (``"answer"``, ``"think-answer"``, ``"tool-call"``,
            or one a plugin registered); None plays each env in its own (``tool-call`` for a
            tool env, ``answer`` otherwise).
        show_legal_actions: list the legal actions in every user message.
        show_turns: start every user message with the turn count (``Turn 2 of 8; 7 actions left.``).
            A tiny model trained from scratch can fit the expert's moves to the turn number
            instead of reading its observation.
        max_prompt_tokens: the context budget in tokens: an episode whose next prompt is longer
            ends, truncated. None for no budget. Its default, 2048, is what training, ``envhub
            eval`` and a checkpoint without the field use; a manager or player given no settings
            plays without a budget (:data:`BARE_PROMPT`).
        history_turns: in the step layout, how many earlier turns each prompt shows.
        format_penalty: added to the reward of every invalid reply.
        unfinished_replies: ``"parse"`` reads a reply the token limit cut off like any other;
            ``"invalid"`` refuses it (an invalid action, with the format penalty), so a policy
            cannot learn to run past its answer and leave the limit to end its turn.
        reply_prefix: text written at the start of every reply for the model (an assistant
            prefill, such as ``"<answer>"``): its tokens end the prompt, so they are neither
            sampled nor trained, and the reply is read as the prefix plus what the model wrote.
            Empty: the model writes the whole reply.
        stop_strings: a reply ends as soon as it contains one of these (kept in the reply, as
            vLLM's ``include_stop_str_in_output``), e.g. ``["</answer>"]``; the end-of-turn token
            still ends a reply too. With ``reply_prefix`` ``"<answer>"`` the model samples the
            action and the closing tag only: the format can neither drift nor take the credit.
    """

    instructions: str | None = None
    system_prompt: str | None = None
    action_format: str | None = None
    show_legal_actions: bool = True
    max_prompt_tokens: int | None = 2048
    history_turns: int = 2
    format_penalty: float = 0.0
    unfinished_replies: str = "parse"
    show_turns: bool = True  # positional construction of the older fields keeps working
    reply_prefix: str = ""
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # The one place these rules are checked: the manager, the player and the trainer's config
        # (whose FIELD_BOUNDS include PROMPT_BOUNDS) all build or check their settings with them.
        if self.unfinished_replies not in UNFINISHED_REPLIES:
            raise ValueError(f"unfinished_replies must be one of {UNFINISHED_REPLIES}, got {self.unfinished_replies!r}")
        check_bounds(self, PROMPT_BOUNDS)
        if not isinstance(self.reply_prefix, str):
            raise ValueError(f"reply_prefix must be text, got {self.reply_prefix!r}")
        stops = (self.stop_strings,) if isinstance(self.stop_strings, str) else tuple(self.stop_strings or ())
        if not all(isinstance(stop, str) and stop for stop in stops):
            raise ValueError(f"stop_strings must be non-empty strings, got {self.stop_strings!r}")
        object.__setattr__(self, "stop_strings", stops)  # a YAML or JSON list becomes a tuple: settings stay hashable
        if self.history_turns is None:
            raise ValueError("history_turns must be >= 0, got None")

    def without_budget(self) -> PromptSettings:
        """These settings with no context budget (``max_prompt_tokens`` None): a budget counts
        tokens, so a manager without a tokenizer plays with none."""
        return dataclasses.replace(self, max_prompt_tokens=None)

    def replace(self, **changes: Any) -> PromptSettings:
        """A copy with ``changes`` applied (None values are ignored: "not given")."""
        given = {name: value for name, value in changes.items() if value is not None}
        return dataclasses.replace(self, **given) if given else self

    def changes_from(self, other: PromptSettings) -> dict[str, tuple[Any, Any]]:
        """``{field: (other's value, this value)}`` for every field that differs from ``other``."""
        return {
            f.name: (getattr(other, f.name), getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(other, f.name) != getattr(self, f.name)
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PromptSettings:
        """Settings from a mapping; unknown keys are an error that names them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SettingsError(f"unknown prompt settings {unknown}; known: {sorted(known)}")
        return cls(**values)


#: What becomes of a reply the token limit cut off before it ended its turn.
UNFINISHED_REPLIES = ("parse", "invalid")

#: The bounds of the numeric prompt settings (:mod:`envhub.bounds`), checked by
#: :class:`PromptSettings` and, before anything loads, by the trainer's config.
PROMPT_BOUNDS: dict[str, Bounds] = {
    "max_prompt_tokens": AT_LEAST_ONE,
    "history_turns": NON_NEGATIVE,
    "format_penalty": Bounds(),
}

#: The settings of a manager (:class:`~envhub.manager.EnvGroupManager`) or player
#: (:class:`~envhub.play.Player`) given none: :class:`PromptSettings`' defaults without a context
#: budget. Why the budget differs from the 2048 that training and evaluation use: a budget counts
#: tokens and a bare manager may have no tokenizer, and managers and players built by hand have
#: always played without one, so their episodes stay what they were.
BARE_PROMPT = PromptSettings().without_budget()

#: The prompt settings an env of a mix may set for itself (the rest shape the model's replies and
#: its context, so they are one per run).
ENV_PROMPT_FIELDS = ("instructions", "system_prompt", "show_legal_actions")
