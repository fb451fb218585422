"""Supervised warm start on expert episodes, token-exact, before RL.

The expert's episodes are rolled out through the same manager and chat rendering as training, so
the tokens the model learns from are exactly those it will see; the loss covers the reply tokens
only (``env_mask`` 1), as in the RL phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from envhub.generation import ExpertGenerator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.rollout import Sample, rollout, to_samples


def expert_samples(tokenizer: Any, env_id: str, seeds: Sequence[int], **manager_kwargs: Any) -> list[Sample]:
    """The expert's episodes on ``seeds`` as samples, in the manager's layout (``manager_kwargs`` go to the manager)."""
    manager = EnvGroupManager(env_id, len(seeds), 1, tokenizer=tokenizer, **manager_kwargs)
    with manager:
        trajectories = rollout(manager, ExpertGenerator(tokenizer=tokenizer), SamplingParams(), seeds=list(seeds))
    return to_samples(trajectories)


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
