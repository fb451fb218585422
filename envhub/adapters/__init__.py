"""Adapters: Gymnasium and PettingZoo games as envhub text environments.

They ship with the core as the built-in plugin ``envhub-adapters`` (:mod:`envhub.adapters.plugin`),
registered through the same ``register_envs`` hook as external plugins. Wrap your own env with
:class:`~envhub.adapters.gymnasium_text.GymnasiumTextEnv` (discrete actions, text rendering) or
:class:`~envhub.adapters.pettingzoo.PettingZooTextEnv` (turn-based AEC game with action masks;
needs ``pip install 'envhub[pettingzoo]'``). Importing this package imports neither Gymnasium's
game modules nor PettingZoo.
"""

from __future__ import annotations

from envhub.adapters.gymnasium_text import GymnasiumTextEnv, canonical_key
from envhub.adapters.pettingzoo import PettingZooTextEnv, SeatView
from envhub.adapters.seats import SeatTrajectory, SeatTurn

__all__ = ["GymnasiumTextEnv", "PettingZooTextEnv", "SeatTrajectory", "SeatTurn", "SeatView", "canonical_key"]
