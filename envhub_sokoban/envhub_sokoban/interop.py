"""Conversions between boards and gym-sokoban's room arrays (as RAGEN and gym-sokoban store levels).

gym-sokoban keeps two integer arrays: ``room_fixed`` (0 wall, 1 floor, 2 target) and
``room_state`` (0 wall, 1 floor, 2 empty target, 3 box on target, 4 box off target, 5 player).
"""

from __future__ import annotations

import numpy as np

from envhub_sokoban.board import Board

WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER = range(6)


def board_from_rooms(room_fixed: np.ndarray, room_state: np.ndarray) -> Board:
    """The board that gym-sokoban's ``room_fixed`` and ``room_state`` describe.

    Raises:
        InvalidLevel: when the arrays do not make a playable level (see ``Board.from_text``).
    """
    fixed, state = np.asarray(room_fixed, dtype=int), np.asarray(room_state, dtype=int)
    rows = []
    for fixed_row, state_row in zip(fixed.tolist(), state.tolist()):
        row = []
        for f, s in zip(fixed_row, state_row):
            on_target = f == TARGET
            if f == WALL:
                row.append("#")
            elif s == PLAYER:
                row.append("S" if on_target else "P")
            elif s in (BOX, BOX_ON_TARGET):
                row.append("√" if on_target else "X")
            else:
                row.append("O" if on_target else "_")
        rows.append("".join(row))
    return Board.from_text("\n".join(rows))


def board_to_rooms(board: Board) -> tuple[np.ndarray, np.ndarray]:
    """gym-sokoban's ``(room_fixed, room_state)`` for ``board``, each ``(height, width)`` ints."""
    n = board.height * board.width
    fixed = np.full(n, FLOOR, dtype=int)
    state = np.full(n, FLOOR, dtype=int)
    for i in range(n):
        bit = 1 << i
        if board.walls & bit:
            fixed[i] = state[i] = WALL
            continue
        on_target = bool(board.targets & bit)
        if on_target:
            fixed[i] = state[i] = TARGET
        if board.boxes & bit:
            state[i] = BOX_ON_TARGET if on_target else BOX
    state[board.player] = PLAYER
    shape = (board.height, board.width)
    return fixed.reshape(shape), state.reshape(shape)
