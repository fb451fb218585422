"""A check shared by the envs that offer observation views (FrozenLake, Sokoban)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import envhub


def assert_views_change_the_text_only(env_id: str, view: str, seeds: int, steps: int, shows: Callable[[str, str], bool]) -> None:
    """Play ``env_id`` in its default view and in ``view`` on the same seeds and random actions:
    the same states, rewards, ends and state keys, with ``shows(grid_text, view_text)`` true of
    every first observation."""
    grid, other = envhub.make(env_id), envhub.make(env_id, view=view)
    rng = np.random.default_rng(1)
    for seed in range(seeds):
        first, _ = grid.reset(seed=seed)
        shown, info = other.reset(seed=seed)
        assert grid.state_key() == info["state_key"]
        assert shows(first, shown), (first, shown)
        for _ in range(steps):
            action = grid.action_names[int(rng.integers(len(grid.action_names)))]
            a, b = grid.step(action), other.step(action)
            assert a[1:4] == b[1:4] and a[4]["state_key"] == b[4]["state_key"]
            if a[2] or a[3]:
                break
