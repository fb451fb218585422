"""``PromptSettings``: everything that shapes what a model sees, as one value saved with checkpoints.

A model is only as good as the prompts it was trained on: a policy trained with a short system
message, no list of legal actions and a 2,048-token budget is a different policy when evaluated
with the environment's long rules and the legal actions listed. The manager, the trainer, ``envhub
eval``, ``envhub run --policy PATH`` and ``envhub export-sft`` therefore all take one
:class:`PromptSettings`, and every checkpoint the trainer writes carries it in ``envhub.json``
beside ``config.json``, together with the environment it trained on (id, keyword arguments, turn
limit), so that evaluation renders exactly the prompts training rendered.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.bounds import AT_LEAST_ONE, NON_NEGATIVE, Bounds, check_bounds
from envhub.error import EnvhubError

#: The file a checkpoint folder keeps its prompt settings and training env in.
SETTINGS_FILE = "envhub.json"


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
    """

    instructions: str | None = None
    system_prompt: str | None = None
    action_format: str | None = None
    show_legal_actions: bool = True
    max_prompt_tokens: int | None = 2048
    history_turns: int = 2
    format_penalty: float = 0.0
    unfinished_replies: str = "parse"
    show_turns: bool = True  # last: positional construction of the older fields keeps working

    def __post_init__(self) -> None:
        # The one place these rules are checked: the manager, the player and the trainer's config
        # (whose FIELD_BOUNDS include PROMPT_BOUNDS) all build or check their settings with them.
        if self.unfinished_replies not in UNFINISHED_REPLIES:
            raise ValueError(f"unfinished_replies must be one of {UNFINISHED_REPLIES}, got {self.unfinished_replies!r}")
        check_bounds(self, PROMPT_BOUNDS)
        if self.history_turns is None:
            raise ValueError("history_turns must be >= 0, got None")

    def without_budget(self) -> PromptSettings:
        """These settings with no context budget (``max_prompt_tokens`` None): a budget counts
        tokens, so a manager without a tokenizer plays with none."""
        return dataclasses.replace(self, max_prompt_tokens=None)

    def manager_kwargs(self) -> dict[str, Any]:
        """The :class:`~envhub.manager.EnvGroupManager` keyword arguments of these settings."""
        return dataclasses.asdict(self)

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


#: The keys of :attr:`TrainedOn.held_out`.
HELD_OUT_KEYS = ("seed_offset", "episodes", "max_invalid_streak", "generator")


def _held_out(body: Any) -> dict[str, Any] | None:
    """A settings file's ``held_out`` mapping, checked (None stays None)."""
    if body is None:
        return None
    if not isinstance(body, dict) or set(body) != set(HELD_OUT_KEYS):
        raise ValueError(f"held_out must map exactly {list(HELD_OUT_KEYS)}, got {body!r}")
    streak = body["max_invalid_streak"]
    return {
        "seed_offset": int(body["seed_offset"]), "episodes": int(body["episodes"]),
        "max_invalid_streak": None if streak is None else int(streak), "generator": str(body["generator"]),
    }


@dataclass(frozen=True)
class TrainedOn:
    """What a checkpoint was trained on: the prompt settings and the environment(s).

    Attributes:
        prompt: the prompt settings.
        env_id: the environment id (the first one of a mix; None when unknown).
        env_kwargs: its ``envhub.make`` keyword arguments.
        max_turns: the turn limit of its training episodes (None: the env's registered one).
        envs: with a mix of environments, each one's ``{"kwargs", "max_turns", "prompt"}``, where
            ``prompt`` holds its overrides of :data:`ENV_PROMPT_FIELDS`; empty for a single env.
        max_reply_tokens: the most tokens a reply had in training (``max_turn_tokens``); a model
            played with a larger budget meets replies it never learned to end. None when unknown.
        held_out: how the run measured held-out success, so that ``envhub eval`` can repeat it:
            ``seed_offset`` and ``episodes`` (seeds ``seed_offset .. + episodes - 1``),
            ``max_invalid_streak`` (a model's episode ends after that many invalid replies in a
            row; None: at its turn limit) and ``generator`` (the backend that sampled); None when unknown.
        layout: the sample layout its prompts were built in (``"trajectory"``: the episode so far;
            ``"step"``: one turn with ``history_turns`` before it); a folder that does not say was
            trained in the trajectory layout, the only one before ``step``.
    """

    prompt: PromptSettings = field(default_factory=PromptSettings)
    env_id: str | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_turns: int | None = None
    envs: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_reply_tokens: int | None = None
    held_out: dict[str, Any] | None = None
    layout: str = "trajectory"

    def save(self, folder: str | Path) -> Path:
        """Write ``envhub.json`` into ``folder`` and return its path."""
        path = Path(folder) / SETTINGS_FILE
        body: dict[str, Any] = {
            "prompt_settings": self.prompt.manager_kwargs(),
            "env": {"id": self.env_id, "kwargs": dict(self.env_kwargs), "max_turns": self.max_turns},
        }
        if self.envs:
            body["envs"] = self.envs
        if self.max_reply_tokens is not None:
            body["max_reply_tokens"] = self.max_reply_tokens
        if self.held_out is not None:
            body["held_out"] = dict(self.held_out)
        body["layout"] = self.layout
        path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, folder: str | Path) -> TrainedOn | None:
        """Read ``folder/envhub.json``; None when the folder has none (a model envhub did not train)."""
        path = Path(folder) / SETTINGS_FILE
        if not path.is_file():
            return None
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
            env = body.get("env") or {}
            envs = {str(i): dict(entry) for i, entry in (body.get("envs") or {}).items()}
            for i, entry in envs.items():
                unknown = sorted(set(entry.get("prompt") or {}) - set(ENV_PROMPT_FIELDS))
                if unknown:
                    raise ValueError(f"env {i}: unknown prompt overrides {unknown}; known: {list(ENV_PROMPT_FIELDS)}")
            return cls(
                prompt=PromptSettings.from_dict(body.get("prompt_settings") or {}),
                env_id=env.get("id"),
                env_kwargs=dict(env.get("kwargs") or {}),
                max_turns=env.get("max_turns"),
                envs=envs,
                max_reply_tokens=None if body.get("max_reply_tokens") is None else int(body["max_reply_tokens"]),
                held_out=_held_out(body.get("held_out")),
                layout=str(body.get("layout") or "trajectory"),
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise SettingsError(f"{path} is not a valid envhub settings file: {exc}") from exc

    def for_env(self, env_id: str) -> tuple[PromptSettings, dict[str, Any], int | None]:
        """``(prompt settings, env_kwargs, max_turns)`` to play ``env_id`` as in training: for an
        env of a mix, the run's prompt settings with that env's overrides; for an env the model
        did not train on, the run's prompt settings and the env's defaults."""
        if env_id in self.envs:
            entry = self.envs[env_id]
            return self.prompt.replace(**(entry.get("prompt") or {})), dict(entry.get("kwargs") or {}), entry.get("max_turns")
        if env_id == self.env_id:
            return self.prompt, dict(self.env_kwargs), self.max_turns
        return self.prompt, {}, None
