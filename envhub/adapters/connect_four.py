"""Connect Four on PettingZoo's ``connect_four_v3``: a text board and a simple scripted opponent.

Columns are numbered 1-7 from the left; the first seat (``player_0``) plays X. The opponent wins
when it can, blocks an immediate win of yours, avoids moves that hand you an immediate win, and
otherwise picks a column at random, favouring the centre.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from envhub.adapters.pettingzoo import SeatView

ROWS, COLUMNS = 6, 7
EMPTY, X, O = 0, 1, 2
MARKS = {EMPTY: ".", X: "X", O: "O"}
SEAT_LABELS = {"player_0": "X", "player_1": "O"}

#: The name of each PettingZoo action: its column number, 1-7 from the left.
ACTION_NAMES = tuple(str(column + 1) for column in range(COLUMNS))

#: How much the opponent favours each column when it has no better reason: more towards the centre.
CENTRE_WEIGHTS = np.array([COLUMNS // 2 + 1 - abs(c - COLUMNS // 2) for c in range(COLUMNS)], dtype=float)

INSTRUCTIONS = (
    "You play Connect Four on a board of 6 rows and 7 columns. Players take turns dropping a disc into "
    "a column (X moves first); it falls to the lowest empty cell. Four of your discs in a row, column or "
    "diagonal win. The board is drawn top row first, '.' is empty, and the columns are numbered 1-7. "
    "Each observation says whether you are X or O, what your opponent just played, and the legal moves. "
    "Reply with the number of the column. Reward: +1 for a win, 0 for a draw, -1 for a loss."
)


def grid_of(aec: Any) -> np.ndarray:
    """The board of a PettingZoo Connect Four env, shape (6, 7), top row first (0 empty, 1 X, 2 O)."""
    return np.array(aec.unwrapped.board, dtype=np.int8).reshape(ROWS, COLUMNS)


def board_text(aec: Any) -> str:
    """The board as text, top row first, with the column numbers underneath."""
    grid = grid_of(aec)
    lines = [" ".join(MARKS[int(v)] for v in row) for row in grid]
    lines.append(" ".join(ACTION_NAMES))
    return "\n".join(lines)


def legal_columns(grid: np.ndarray) -> list[int]:
    """Columns whose top cell is empty."""
    return [c for c in range(COLUMNS) if grid[0, c] == EMPTY]


def drop(grid: np.ndarray, column: int, mark: int) -> np.ndarray:
    """A copy of ``grid`` with ``mark`` dropped into ``column``."""
    out = grid.copy()
    row = int(np.flatnonzero(out[:, column] == EMPTY)[-1])
    out[row, column] = mark
    return out


def wins(grid: np.ndarray, mark: int) -> bool:
    """Whether ``mark`` has four in a line."""
    own = grid == mark
    return bool(
        (own[:, :-3] & own[:, 1:-2] & own[:, 2:-1] & own[:, 3:]).any()
        or (own[:-3] & own[1:-2] & own[2:-1] & own[3:]).any()
        or (own[:-3, :-3] & own[1:-2, 1:-2] & own[2:-1, 2:-1] & own[3:, 3:]).any()
        or (own[3:, :-3] & own[2:-1, 1:-2] & own[1:-2, 2:-1] & own[:-3, 3:]).any()
    )


def to_move(grid: np.ndarray) -> int:
    """Whose disc goes next: X when both have as many discs, else O."""
    return X if int((grid == X).sum()) == int((grid == O).sum()) else O


def heuristic_columns(grid: np.ndarray) -> list[int]:
    """The columns the scripted opponent considers: winning ones, else blocking ones, else safe ones."""
    me = to_move(grid)
    you = O if me == X else X
    legal = legal_columns(grid)
    winning = [c for c in legal if wins(drop(grid, c, me), me)]
    if winning:
        return winning
    blocking = [c for c in legal if wins(drop(grid, c, you), you)]
    if blocking:
        return blocking
    safe = [c for c in legal if not _hands_over_a_win(grid, c, me, you)]
    return safe or legal


def _hands_over_a_win(grid: np.ndarray, column: int, me: int, you: int) -> bool:
    after = drop(grid, column, me)
    return any(wins(drop(after, d, you), you) for d in legal_columns(after))


class HeuristicPolicy:
    """The simple scripted Connect Four opponent (see the module docstring).

    Args:
        seed: seeds its random choices.
    """

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def act(self, env: SeatView, observation: str) -> str:
        """Return the column name to play for the seat ``env`` views."""
        columns = heuristic_columns(grid_of(env.aec))
        weights = CENTRE_WEIGHTS[columns] / CENTRE_WEIGHTS[columns].sum()
        return ACTION_NAMES[int(self.rng.choice(columns, p=weights))]
