"""Tic-tac-toe on PettingZoo's ``tictactoe_v3``: a text board, cell names, and perfect play.

Cells are numbered 1-9 in reading order. PettingZoo stores the board column by column (action
``3 * column + row``); :data:`ACTION_NAMES` maps each PettingZoo action to its cell number. The
first seat (``player_1``) plays X.

Perfect play comes from negamax over the whole game tree (a few thousand positions, cached):
a move's score is positive when it wins, larger for quicker wins, and negative when it loses,
smaller for quicker losses.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from envhub.adapters.pettingzoo import SeatView

EMPTY, X, O = 0, 1, 2
MARKS = {EMPTY: " ", X: "X", O: "O"}
SEAT_LABELS = {"player_1": "X", "player_2": "O"}
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def action_to_cell(action: int) -> int:
    """The reading-order cell index (0-8) of PettingZoo action ``action`` (``3 * column + row``)."""
    return 3 * (action % 3) + action // 3


def cell_to_action(cell: int) -> int:
    """The PettingZoo action that marks reading-order cell ``cell`` (0-8)."""
    return 3 * (cell % 3) + cell // 3


#: The name of each PettingZoo action: its cell number, 1-9 in reading order.
ACTION_NAMES = tuple(str(action_to_cell(a) + 1) for a in range(9))

INSTRUCTIONS = (
    "You play tic-tac-toe. Players take turns marking an empty cell with their mark (X moves first); "
    "three marks in a row, column or diagonal win. Empty cells show their number, 1-9 in reading order. "
    "Each observation says whether you are X or O, what your opponent just played, and the legal moves. "
    "Reply with the number of the cell you mark. Reward: +1 for a win, 0 for a draw, -1 for a loss."
)


def cells_of(aec: Any) -> tuple[int, ...]:
    """The board of a PettingZoo tic-tac-toe env in reading order (0 empty, 1 X, 2 O)."""
    squares = aec.unwrapped.board.squares
    return tuple(int(squares[cell_to_action(cell)]) for cell in range(9))


def board_text(aec: Any) -> str:
    """The board as text: marks, and the number of each empty cell."""
    cells = cells_of(aec)
    shown = [MARKS[c] if c != EMPTY else str(i + 1) for i, c in enumerate(cells)]
    rows = [f" {shown[r]} | {shown[r + 1]} | {shown[r + 2]}" for r in (0, 3, 6)]
    return "\n---+---+---\n".join(rows)


def winner(cells: tuple[int, ...]) -> int:
    """The mark with three in a line, or ``EMPTY``."""
    for a, b, c in LINES:
        if cells[a] != EMPTY and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return EMPTY


def to_move(cells: tuple[int, ...]) -> int:
    """Whose mark goes next: X when both have as many marks, else O."""
    return X if cells.count(X) == cells.count(O) else O


@functools.cache
def _negamax(cells: tuple[int, ...]) -> int:
    """The value of ``cells`` for the player to move under perfect play."""
    if winner(cells) != EMPTY:
        return -(1 + cells.count(EMPTY))  # the previous move won
    if EMPTY not in cells:
        return 0
    return max(-_negamax(_play(cells, i)) for i, c in enumerate(cells) if c == EMPTY)


def _play(cells: tuple[int, ...], cell: int) -> tuple[int, ...]:
    return cells[:cell] + (to_move(cells),) + cells[cell + 1 :]


def move_scores(cells: tuple[int, ...]) -> dict[int, int]:
    """The perfect-play score of each empty cell for the player to move."""
    return {i: -_negamax(_play(cells, i)) for i, c in enumerate(cells) if c == EMPTY}


def best_cells(cells: tuple[int, ...]) -> list[int]:
    """Every empty cell with the best perfect-play score, in reading order."""
    scores = move_scores(cells)
    top = max(scores.values())
    return [cell for cell, score in scores.items() if score == top]


def expert(aec: Any, seat: str) -> int:
    """The expert's PettingZoo action: the first best cell in reading order."""
    return cell_to_action(best_cells(cells_of(aec))[0])


class MinimaxPolicy:
    """A perfect opponent: a uniformly random choice among the best cells.

    Args:
        seed: seeds the choice among equally good cells.
    """

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def act(self, env: SeatView, observation: str) -> str:
        """Return the name of a best cell for the seat ``env`` (a seat view) plays."""
        best = best_cells(cells_of(env.aec))
        return ACTION_NAMES[cell_to_action(best[int(self.rng.integers(len(best)))])]
