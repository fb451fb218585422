"""Gymnasium's CliffWalking as text: a grid of ground, cliff, start, goal and the player."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

#: CliffWalking's actions in Gymnasium's index order.
ACTION_NAMES = ("Up", "Right", "Down", "Left")

PLAYER, GROUND, CLIFF, START, GOAL = "P", ".", "C", "S", "G"

INSTRUCTIONS = (
    "You walk on a 4x12 grid from the start S (bottom left) to the goal G (bottom right). The cells "
    f"marked {CLIFF} along the bottom edge are a cliff: stepping onto one costs -100 and puts you back "
    f"at the start. {PLAYER} is you and {GROUND} is safe ground; moving off the grid leaves you where "
    "you are.\n"
    "Actions: Up, Right, Down, Left. Every move costs -1; reaching the goal ends the episode."
)


def observation_to_text(env: gymnasium.Env, observation: Any, terminated: bool) -> str:
    """Draw the grid, one row per line, with the player's position."""
    base = env.unwrapped
    height, width = base.shape
    grid = np.full((height, width), GROUND)
    grid[height - 1, 1:-1] = CLIFF  # Gymnasium's cliff: the bottom row between start and goal
    grid[np.unravel_index(base.start_state_index, base.shape)] = START
    grid[height - 1, width - 1] = GOAL
    row, col = np.unravel_index(int(observation), base.shape)
    grid[row, col] = PLAYER
    lines = ["".join(line) for line in grid]
    lines.append(f"You are at row {row}, column {col} (rows 0-{height - 1} from the top, columns 0-{width - 1} from the left).")
    return "\n".join(lines)


def reached_goal(env: gymnasium.Env, observation: Any, reward: float, terminated: bool) -> bool:
    """Success on CliffWalking: the episode terminated, which happens only at the goal."""
    return terminated
