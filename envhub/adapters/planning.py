"""An exact expert for Gymnasium envs that publish their transition table (``env.P``).

Gymnasium's toy-text environments (Taxi, CliffWalking, FrozenLake) expose ``P[s][a]``, a list of
``(probability, next_state, reward, terminated)``. Finite-horizon value iteration on that table
gives the action that maximises the expected return in the turns left, so the expert and the
dynamics cannot disagree.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from envhub.error import AdapterError

#: Values closer than this count as a tie.
TIE_TOLERANCE = 1e-9


class TablePlanner:
    """Finite-horizon value iteration on a Gymnasium transition table.

    ``Q[k][s, a]`` is the best expected return within ``k`` moves when the first move from ``s``
    is ``a``. Horizons are computed on demand and stop growing once values converge (every
    reachable goal is then within reach), so long turn limits cost nothing extra.

    Args:
        env: a Gymnasium env with a ``Discrete`` observation space, a ``Discrete`` action space
            and a transition table ``P`` (on the env or its ``unwrapped`` env).

    Raises:
        AdapterError: when the env has no such table.
    """

    def __init__(self, env: gymnasium.Env):
        base = env.unwrapped
        table = getattr(base, "P", None)
        if not isinstance(table, dict) or not isinstance(base.observation_space, spaces.Discrete):
            raise AdapterError(
                f"TablePlanner needs an env with a Discrete observation space and a transition table P "
                f"(like Gymnasium's toy-text envs); {type(base).__name__} has none: pass another expert or none"
            )
        n_states, n_actions = int(base.observation_space.n), int(base.action_space.n)
        rows: list[tuple[int, int, float, float, bool]] = [
            (s * n_actions + a, int(s_next), float(p), float(r), bool(done))
            for s in range(n_states)
            for a in range(n_actions)
            for p, s_next, r, done in table[s][a]
        ]
        pair, nxt, prob, reward, done = (np.array(column) for column in zip(*rows))
        self.n_states, self.n_actions = n_states, n_actions
        self._pair = pair.astype(np.int64)
        self._next = nxt.astype(np.int64)
        self._continue = prob * ~done.astype(bool)
        self._reward = np.bincount(self._pair, weights=prob * reward, minlength=n_states * n_actions)
        self._q: list[np.ndarray] = [np.zeros((n_states, n_actions))]
        self._converged = False

    def q_values(self, horizon: int) -> np.ndarray:
        """Return ``Q[horizon]``, shape ``(states, actions)``."""
        while len(self._q) <= horizon and not self._converged:
            value = self._q[-1].max(axis=1)
            future = np.bincount(self._pair, weights=self._continue * value[self._next], minlength=self.n_states * self.n_actions)
            q = (self._reward + future).reshape(self.n_states, self.n_actions)
            self._converged = len(self._q) > 1 and np.allclose(q, self._q[-1], rtol=0.0, atol=TIE_TOLERANCE)
            self._q.append(q)
        return self._q[min(horizon, len(self._q) - 1)]

    def __call__(self, observation: Any, turns_left: int | None) -> int:
        """Return the best action index in state ``observation`` with ``turns_left`` moves to go.

        Ties are broken towards the best return within fewer moves, then the lowest index.
        ``turns_left=None`` (no turn limit) plans until the values converge.
        """
        state = int(observation)
        horizon = self.n_states if turns_left is None else max(1, turns_left)
        self.q_values(horizon)
        candidates = np.arange(self.n_actions)
        for k in range(min(horizon, len(self._q) - 1), 0, -1):
            values = self._q[k][state, candidates]
            candidates = candidates[values >= values.max() - TIE_TOLERANCE]
            if len(candidates) == 1:
                break
        return int(candidates[0])
