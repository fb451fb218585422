"""Env mixes: several environments in one run, each env group one environment.

ROLL trains Sokoban and FrozenLake in one run (``custom_envs`` with ``tags`` and ``n_groups``);
envhub's config says the same with ``envs:``, a mapping from env id to that env's settings::

    envs:
      frozenlake/FrozenLakeNotSlippery-v0: {groups_per_step: 4, env_kwargs: {view: local}, instructions: "Reach the goal."}
      sokoban/Sokoban-v0: {groups_per_step: 4, max_turns: 10}

Every generation batch holds each env's ``groups_per_step`` groups, in the mapping's order (or,
with ``weight`` instead, the run's ``groups_per_step`` split in proportion, each env at least one
group), so the mix is the same at every step, as ROLL's ``n_groups`` make it. An env may set its
own ``env_kwargs``, ``max_turns`` and the prompt settings of
:data:`envhub.prompts.ENV_PROMPT_FIELDS`; the rest (reply format, context budget, format
penalty) are the run's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from envhub.prompts import ENV_PROMPT_FIELDS

#: The keys one env of ``envs:`` takes.
ENTRY_KEYS = ("groups_per_step", "weight", "env_kwargs", "max_turns", *ENV_PROMPT_FIELDS)


@dataclasses.dataclass(frozen=True)
class EnvEntry:
    """One environment of a run: its id, its groups per generation batch and its own settings.

    Attributes:
        env_id: the environment id.
        groups: env groups of this env in every generation batch.
        env_kwargs: its ``envhub.make`` keyword arguments.
        max_turns: its turn limit (None: the run's ``max_turns``).
        prompt: its overrides of the run's prompt settings (:data:`envhub.prompts.ENV_PROMPT_FIELDS`).
    """

    env_id: str
    groups: int
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_turns: int | None = None
    prompt: dict[str, Any] = dataclasses.field(default_factory=dict)

    def per_env(self) -> dict[str, Any]:
        """This env's settings in :class:`~envhub.manager.EnvGroupManager`'s ``per_env`` form."""
        own = {"max_turns": self.max_turns} if self.max_turns is not None else {}
        return {**own, **self.prompt}


def check_keys(values: Any, known: Sequence[str], where: str) -> Mapping[str, Any]:
    """``values`` if it is a mapping whose keys are all ``known``; else a ValueError naming ``where``."""
    if not isinstance(values, Mapping):
        raise ValueError(f"{where} must be a mapping of {list(known)}, got {values!r}")
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {list(known)}")
    return values


def split_by_weight(weights: Sequence[float], total: int) -> list[int]:
    """``total`` groups split in proportion to ``weights`` by largest remainder, each at least 1.

    Raises:
        ValueError: when ``total`` is smaller than the number of weights.
    """
    if total < len(weights):
        raise ValueError(f"groups_per_step={total} cannot give each of {len(weights)} envs a group")
    counts = [1] * len(weights)
    spare = total - len(weights)
    shares = [w / sum(weights) * spare for w in weights]
    for i, share in enumerate(shares):
        counts[i] += math.floor(share)
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(shares[i] - math.floor(shares[i])), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def parse_envs(envs: Mapping[str, Any], groups_per_step: int | None) -> tuple[list[EnvEntry], int]:
    """The entries of a config's ``envs:`` mapping, and the run's groups per generation batch.

    Every entry gives ``groups_per_step`` (the run's is then their sum, or must equal it) or
    every entry gives a ``weight`` (the run's ``groups_per_step`` is split by weight).

    Raises:
        ValueError: naming the field, for an unknown key, a bad value or a mix of the two styles.
    """
    if not isinstance(envs, Mapping) or not envs:
        raise ValueError(f"envs must map env ids to their settings, got {envs!r}")
    entries, counts, weights = [], [], []
    for env_id, settings in envs.items():
        where = f"envs[{env_id!r}]"
        settings = check_keys({} if settings is None else settings, ENTRY_KEYS, where)
        if ("groups_per_step" in settings) == ("weight" in settings):
            raise ValueError(f"{where} needs one of groups_per_step or weight")
        if "groups_per_step" in settings:
            count = settings["groups_per_step"]
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{where}.groups_per_step must be an integer >= 1, got {count!r}")
            counts.append(count)
        else:
            weight = settings["weight"]
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
                raise ValueError(f"{where}.weight must be a number > 0, got {weight!r}")
            weights.append(float(weight))
        kwargs = settings.get("env_kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise ValueError(f"{where}.env_kwargs must be a mapping, got {kwargs!r}")
        turns = settings.get("max_turns")
        if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
            raise ValueError(f"{where}.max_turns must be an integer >= 1, got {turns!r}")
        prompt = {key: settings[key] for key in ENV_PROMPT_FIELDS if settings.get(key) is not None}
        if "show_legal_actions" in prompt and not isinstance(prompt["show_legal_actions"], bool):
            raise ValueError(f"{where}.show_legal_actions must be true or false, got {prompt['show_legal_actions']!r}")
        for key in ("instructions", "system_prompt"):
            if key in prompt and not isinstance(prompt[key], str):
                raise ValueError(f"{where}.{key} must be a string, got {prompt[key]!r}")
        entries.append(EnvEntry(str(env_id), 0, dict(kwargs), turns, prompt))
    if counts and weights:
        raise ValueError("envs: give every env groups_per_step, or every env a weight, not a mix of both")
    if counts:
        total = sum(counts)
        if groups_per_step is not None and groups_per_step != total:
            raise ValueError(f"groups_per_step={groups_per_step} disagrees with the envs' groups_per_step, which add up to {total}")
    else:
        if groups_per_step is None:
            raise ValueError("envs with weights need the run's groups_per_step, the total the weights split")
        total, counts = groups_per_step, split_by_weight(weights, groups_per_step)
    return [dataclasses.replace(entry, groups=count) for entry, count in zip(entries, counts)], total


def group_env_ids(entries: Sequence[EnvEntry]) -> list[str]:
    """The env id of each group of a generation batch, in order."""
    return [entry.env_id for entry in entries for _ in range(entry.groups)]
