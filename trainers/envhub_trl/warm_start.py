"""Supervised warm start on expert episodes, token-exact, before RL.

The expert's episodes are rolled out through the same manager and chat rendering as training, so
the tokens the model learns from are exactly those it will see; the loss covers the reply tokens
only (``env_mask`` 1), as in the RL phase.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from envhub.generation import ExpertGenerator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.rollout import Sample, rollout, to_samples


def expert_samples(
    tokenizer: Any, env_id: str, seeds: Sequence[int], epsilon: float = 0.0, seed: int = 0, **manager_kwargs: Any
) -> list[Sample]:
    """The expert's episodes on ``seeds`` as samples, in the manager's layout (``manager_kwargs`` go to the manager).

    With ``epsilon`` the demonstrator takes a uniformly random legal move that often (noise seeded
    with ``seed``). Those moves are played but not imitated (their tokens get ``env_mask`` 0, as
    in DART, Laskey et al. 2017): the samples show states off the expert's path, such as dead ends,
    each labelled with the expert's move out of it.
    """
    manager = EnvGroupManager(env_id, len(seeds), 1, tokenizer=tokenizer, **manager_kwargs)
    expert = ExpertGenerator(epsilon=epsilon, seed=seed, tokenizer=tokenizer)
    with manager:
        trajectories = rollout(manager, expert, SamplingParams(), seeds=list(seeds))
    samples = []
    for sample in to_samples(trajectories):
        turns = trajectories[sample.trajectory_index].turns
        imitated = [turn.action == turn.expert_action for turn in turns]
        mask = [int(m and imitated[turn]) for m, turn in zip(sample.env_mask, sample.turn_ids)]
        if any(mask):
            samples.append(dataclasses.replace(sample, env_mask=mask))
    return samples


def supervised_steps(
    model: Any,
    samples: Sequence[Sample],
    steps: int,
    *,
    batch_size: int = 16,
    learning_rate: float = 1e-3,
    pad_id: int = 0,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` for ``steps`` AdamW steps of cross-entropy on the samples' reply tokens.

    Each step draws ``batch_size`` samples at random (from ``seed``). Returns each step's loss.
    """
    if not samples:
        raise ValueError("no samples to learn from")
    rng = np.random.default_rng(seed)
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    losses = []
    for _ in range(steps):
        batch = [samples[i] for i in rng.integers(len(samples), size=batch_size)]
        width = max(len(s.prompt_ids) + len(s.completion_ids) for s in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, s in enumerate(batch):
            tokens = torch.tensor(s.prompt_ids + s.completion_ids)
            ids[row, : len(tokens)] = tokens
            attention[row, : len(tokens)] = 1
            mask = torch.tensor([0] * len(s.prompt_ids) + list(s.env_mask), dtype=torch.bool)
            labels[row, : len(tokens)] = torch.where(mask, tokens, torch.tensor(-100))
        loss = model(input_ids=ids.to(device), attention_mask=attention.to(device), labels=labels.to(device)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """Supervised steps on the expert's episodes before RL: the ``warm_start`` mapping of an
    ``envhub train`` config file (``envhub train --warm-start-*`` flags override its keys).

    Attributes:
        steps: AdamW steps of cross-entropy on the demonstrator's replies (0: no warm start).
        episodes: demonstrator episodes, on training seeds ``0 .. episodes - 1``.
        learning_rate: the AdamW learning rate.
        batch_size: samples per step.
        epsilon: the probability that the demonstrator takes a uniformly random legal move instead
            of the expert's; such moves are played, not imitated (:func:`expert_samples`). A model
            that imitates the clean expert never sees the states a mistake leads to, and gives ~0
            probability to the moves that get out of them (backing out of a FrozenLake dead end),
            which RL then cannot find: it only reinforces moves it samples.
    """

    steps: int = 0
    episodes: int = 512
    learning_rate: float = 1e-3
    batch_size: int = 16
    epsilon: float = 0.0

    def __post_init__(self) -> None:
        for name, kind in (("steps", int), ("episodes", int), ("batch_size", int), ("learning_rate", float), ("epsilon", float)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
                raise ValueError(f"warm_start.{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
            object.__setattr__(self, name, kind(value))
        if self.steps < 0 or self.episodes < 1 or self.batch_size < 1 or self.learning_rate <= 0:
            raise ValueError("warm_start needs steps >= 0, episodes >= 1, batch_size >= 1 and learning_rate > 0")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"warm_start.epsilon is a probability, between 0 and 1; got {self.epsilon}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> "WarmStart":
        """From a config file's ``warm_start`` mapping; numbers written as strings (PyYAML reads
        ``1e-3`` as one) are converted, and an unknown key is an error that lists the known ones."""
        if values is None:
            return cls()
        if not isinstance(values, Mapping):
            raise ValueError(f"warm_start must be a mapping of {[f.name for f in dataclasses.fields(cls)]}, got {values!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown warm_start keys {unknown}; known: {sorted(known)}")
        converted = {}
        for key, value in values.items():
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    raise ValueError(f"warm_start.{key} must be a number, got {value!r}") from None
            converted[key] = value
        return cls(**converted)

    def run(self, model: Any, tokenizer: Any, env_id: str, seed: int = 0, **manager_kwargs: Any) -> list[float]:
        """Train ``model`` on the demonstrator's episodes (noise and batches seeded with ``seed``);
        returns each step's loss (empty when ``steps`` is 0)."""
        return self.run_on(model, tokenizer, [(env_id, manager_kwargs)], seed)

    def run_on(self, model: Any, tokenizer: Any, envs: Sequence[tuple[str, Mapping[str, Any]]], seed: int = 0) -> list[float]:
        """:meth:`run` on a mix: ``episodes`` demonstrator episodes of each ``(env_id,
        manager_kwargs)``, rendered with that env's settings, drawn from in one pool."""
        if not self.steps:
            return []
        samples = [
            sample
            for env_id, manager_kwargs in envs
            for sample in expert_samples(tokenizer, env_id, range(self.episodes), epsilon=self.epsilon, seed=seed, **manager_kwargs)
        ]
        return supervised_steps(
            model, samples, self.steps, batch_size=self.batch_size, learning_rate=self.learning_rate,
            pad_id=tokenizer.pad_token_id, seed=seed,
        )

    def describe(self) -> str:
        """In words, for progress messages."""
        noise = f", the expert taking a random move with probability {self.epsilon:g}" if self.epsilon else ""
        return f"{self.steps} supervised steps on {self.episodes} expert episodes{noise}"
