"""Legal moves and exact solvers for the TextArena games that have cheap ones.

Every function takes the TextArena env (unwrapped, mid-game) and the id of the player to move,
and reads only the game's state; none changes it. Moves are spelled in the game's own syntax.

- Tower of Hanoi: the optimal plan from any legal position (move the largest misplaced disk
  once the smaller ones are out of its way), recomputed each turn.
- Guess the number: bisection of the numbers the hints so far leave open.
- Tic-tac-toe: minimax over the remaining cells (at most 9! leaves, memoised by board).
- Nim (normal play: taking the last object wins): move to a zero nim-sum when one exists, else
  take one object from the largest pile.
"""

from __future__ import annotations

import functools
from typing import Any

PEGS = ("A", "B", "C")


# ---------------------------------------------------------------------- Tower of Hanoi


def hanoi_moves(ta_env: Any, player_id: int) -> list[str]:
    """Every move of a top disk onto an empty peg or a larger disk: ``[A C]``."""
    towers = ta_env.state.game_state["towers"]
    return [
        f"[{a} {b}]"
        for a in PEGS
        for b in PEGS
        if a != b and towers[a] and (not towers[b] or towers[b][-1] > towers[a][-1])
    ]


def hanoi_plan(towers: dict[str, list[int]], target: str = "C") -> list[tuple[str, str]]:
    """The shortest sequence of moves that stacks every disk on ``target`` from ``towers``."""
    where = {disk: peg for peg, disks in towers.items() for disk in disks}
    moves: list[tuple[str, str]] = []

    def place(disk: int, goal: str) -> None:
        # Put disks 1..disk on ``goal``: the standard recursion from an arbitrary position.
        if disk == 0:
            return
        if where[disk] == goal:
            place(disk - 1, goal)
            return
        spare = next(p for p in PEGS if p not in (where[disk], goal))
        place(disk - 1, spare)
        moves.append((where[disk], goal))
        where[disk] = goal
        place(disk - 1, goal)

    place(len(where), target)
    return moves


def hanoi_expert(ta_env: Any, player_id: int) -> str | None:
    """The first move of the optimal plan from the current position."""
    plan = hanoi_plan(ta_env.state.game_state["towers"])
    return f"[{plan[0][0]} {plan[0][1]}]" if plan else None


# ---------------------------------------------------------------------- guess the number


def _open_range(ta_env: Any) -> tuple[int, int]:
    low, high = ta_env.min_number, ta_env.max_number
    for guess, hint in ta_env.state.game_state["guess_history"]:
        if hint == "higher":
            low = max(low, guess + 1)
        else:
            high = min(high, guess - 1)
    return low, high


@functools.lru_cache(maxsize=None)
def _guesses(low: int, high: int) -> tuple[tuple[int, str], ...]:
    return tuple((n, f"[{n}]") for n in range(low, high + 1))


def guess_moves(ta_env: Any, player_id: int) -> list[str]:
    """Every number in the game's range not guessed yet: ``[7]``."""
    guessed = ta_env.guessed_numbers
    return [move for n, move in _guesses(ta_env.min_number, ta_env.max_number) if n not in guessed]


def guess_expert(ta_env: Any, player_id: int) -> str | None:
    """The middle of the numbers the hints leave open."""
    low, high = _open_range(ta_env)
    return f"[{(low + high) // 2}]" if low <= high else None


# ---------------------------------------------------------------------- tic-tac-toe

_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def _cells(ta_env: Any) -> tuple[str, ...]:
    return tuple(cell for row in ta_env.state.game_state["board"] for cell in row)


def _mark(player_id: int) -> str:
    # TextArena's TicTacToe: player 1 plays X, player 0 plays O.
    return "X" if player_id == 1 else "O"


def tictactoe_moves(ta_env: Any, player_id: int) -> list[str]:
    """Every empty cell: ``[4]``."""
    return [f"[{i}]" for i, cell in enumerate(_cells(ta_env)) if cell == ""]


def _winner(cells: tuple[str, ...]) -> str:
    for a, b, c in _LINES:
        if cells[a] and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return ""


@functools.lru_cache(maxsize=None)
def _value(cells: tuple[str, ...], mark: str) -> int:
    """The game value for ``mark`` to move: 1 win, 0 draw, -1 loss."""
    if _winner(cells):
        return -1  # the previous mover won
    empty = [i for i, c in enumerate(cells) if c == ""]
    if not empty:
        return 0
    other = "O" if mark == "X" else "X"
    return max(-_value(cells[:i] + (mark,) + cells[i + 1 :], other) for i in empty)


def tictactoe_expert(ta_env: Any, player_id: int) -> str | None:
    """A minimax-optimal cell (the lowest-numbered among equals)."""
    cells, mark = _cells(ta_env), _mark(player_id)
    if _winner(cells):
        return None
    other = "O" if mark == "X" else "X"
    empty = [i for i, c in enumerate(cells) if c == ""]
    if not empty:
        return None
    best = max(empty, key=lambda i: (-_value(cells[:i] + (mark,) + cells[i + 1 :], other), -i))
    return f"[{best}]"


# ---------------------------------------------------------------------- Nim


def nim_moves(ta_env: Any, player_id: int) -> list[str]:
    """Every (pile, quantity) removal: ``[1 3]``."""
    piles = ta_env.state.game_state["piles"]
    return [f"[{i} {q}]" for i, size in enumerate(piles) for q in range(1, size + 1)]


def nim_expert(ta_env: Any, player_id: int) -> str | None:
    """A move to zero nim-sum (winning under normal play), else one object from the largest pile."""
    piles = ta_env.state.game_state["piles"]
    if not any(piles):
        return None
    total = 0
    for size in piles:
        total ^= size
    if total:
        for i, size in enumerate(piles):
            if size ^ total < size:
                return f"[{i} {size - (size ^ total)}]"
    largest = max(range(len(piles)), key=lambda i: piles[i])
    return f"[{largest} 1]"
