"""Exact planning on FrozenLake: finite-horizon value iteration on Gymnasium's transition table.

``success_values`` gives, for every horizon ``k``, the highest probability of reaching the goal
within ``k`` moves from each tile. That is the physical limit any agent, learned or not, can reach
on a map under a turn limit; on slippery ice it is well below 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

#: Horizon used when an episode has no turn limit: long enough for values to converge on 8x8 maps.
UNLIMITED_HORIZON = 400


def transition_tensor(desc: Sequence[str], is_slippery: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(T, goal, terminal)``: ``T[s, a, s']`` probabilities and boolean tile masks.

    The table is Gymnasium's own (``FrozenLakeEnv.P``), so planning and dynamics cannot disagree.
    """
    env = FrozenLakeEnv(desc=list(desc), is_slippery=is_slippery)
    n_states, n_actions = env.observation_space.n, env.action_space.n
    table = np.zeros((n_states, n_actions, n_states))
    for s in range(n_states):
        for a in range(n_actions):
            for prob, s_next, _, _ in env.P[s][a]:
                table[s, a, s_next] += prob
    flat = np.array([c for row in desc for c in row])
    return table, flat == "G", (flat == "G") | (flat == "H")


def success_values(desc: Sequence[str], is_slippery: bool, horizon: int) -> np.ndarray:
    """Return ``Q`` of shape ``(horizon + 1, S, A)``: ``Q[k, s, a]`` is the best probability of
    reaching the goal within ``k`` moves when the first move from ``s`` is ``a``.
    """
    table, goal, terminal = transition_tensor(desc, is_slippery)
    n_states, n_actions = table.shape[:2]
    q = np.zeros((horizon + 1, n_states, n_actions))
    value = goal.astype(float)
    for k in range(1, horizon + 1):
        q[k] = table @ value
        q[k][terminal] = goal[terminal, None]
        value = np.where(terminal, goal.astype(float), q[k].max(axis=1))
    return q


def optimal_success_probability(desc: Sequence[str], is_slippery: bool = True, horizon: int | None = None) -> float:
    """The highest probability any policy reaches the goal from the start within ``horizon`` moves.

    Args:
        desc: the map as rows of ``S``, ``F``, ``H``, ``G``.
        is_slippery: Gymnasium's slippery dynamics (intended move with probability 1/3).
        horizon: the turn limit; None for no limit.
    """
    horizon = UNLIMITED_HORIZON if horizon is None else horizon
    if horizon == 0:
        return 0.0
    start = "".join(desc).index("S")
    return float(success_values(desc, is_slippery, horizon)[horizon, start].max())


def best_action(q: np.ndarray, state: int, moves_left: int, tol: float = 1e-12) -> int:
    """Pick the action that maximises success within ``moves_left`` moves.

    Ties are broken towards success within fewer moves (then fewer still), so the expert never
    idles against a wall when a move that gets there sooner is just as safe.
    """
    candidates = np.arange(q.shape[2])
    for k in range(min(moves_left, q.shape[0] - 1), 0, -1):
        values = q[k, state, candidates]
        candidates = candidates[values >= values.max() - tol]
        if len(candidates) == 1:
            break
    return int(candidates[0])
