"""Sokoban level generation by reverse play, with the optimal solution length for free.

The recipe is gym-sokoban's: carve a room with a random walk of mask stamps, put the boxes on
random targets, then play backwards (the player pulls boxes off their targets) and keep a
position with every box off its target. Where gym-sokoban explores reverse play with a recursive
depth-first search over numpy arrays (up to 300,000 states, re-tried up to 4 times and then
failing), this generator runs one breadth-first :class:`~envhub_sokoban.solver.DistanceTable` on
bitboards, up to ``search_depth`` steps. That search is exhaustive, so:

- every level it returns is solvable (it was reached from the solution) and not solved (no box
  on a target), and a room or target placement with no such position is simply redrawn;
- the layer a position sits in is its exact optimal solution length, so no solver runs after.

The level kept is the hardest the search reached: a position just after a pull (the player next
to the box it moved, as in gym-sokoban, whose best state also ends on a pull) with every box off
target, in the deepest layer that has one, drawn uniformly among those. ``search_depth`` is thus
an upper bound on the optimal solution length.

All randomness comes from the ``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from envhub.error import EnvhubError
from envhub_sokoban.board import Board, cells
from envhub_sokoban.solver import DistanceTable

#: gym-sokoban's floor stamps, applied centred on each step of the random walk.
MASKS: tuple[tuple[tuple[int, int, int], ...], ...] = (
    ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
    ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
    ((0, 0, 0), (0, 1, 1), (0, 1, 0)),
)
_MASK_CELLS = tuple(tuple((r - 1, c - 1) for r in range(3) for c in range(3) if m[r][c]) for m in MASKS)
_DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))


class GenerationError(EnvhubError):
    """No level could be generated with these settings (the room is too small for the boxes)."""


@dataclasses.dataclass(frozen=True)
class Level:
    """A generated level.

    Attributes:
        board: the starting position.
        optimal_length: the fewest steps that solve it.
        table: the reverse search that found it: exact distances of every position that needs at
            most ``table.depth`` steps (the expert reuses it).
        attempts: rooms drawn until one gave a level (1 unless a room had no usable position).
    """

    board: Board
    optimal_length: int
    table: DistanceTable
    attempts: int


def room_topology(rng: np.random.Generator, height: int, width: int, num_steps: int, p_change_directions: float = 0.35) -> int:
    """Carve a room as gym-sokoban does: a random walk that stamps a random floor mask at each step.

    Returns:
        The mask of floor cells (the outer ring is always wall).
    """
    direction = _DIRECTIONS[int(rng.integers(4))]
    r, c = int(rng.integers(1, height)), int(rng.integers(1, width))
    floor = 0
    for _ in range(num_steps):
        if rng.random() < p_change_directions:
            direction = _DIRECTIONS[int(rng.integers(4))]
        r = max(min(r + direction[0], height - 2), 1)
        c = max(min(c + direction[1], width - 2), 1)
        for dr, dc in _MASK_CELLS[int(rng.integers(len(MASKS)))]:
            rr, cc = r + dr, c + dc
            if 0 < rr < height - 1 and 0 < cc < width - 1:
                floor |= 1 << (rr * width + cc)
    return floor


def check_settings(height: int, width: int, num_boxes: int, search_depth: int) -> None:
    """Refuse generation settings that cannot describe a level.

    Raises:
        ValueError: naming the setting to change.
    """
    if height < 3 or width < 3:
        raise ValueError(f"a room needs at least 3x3 cells including its walls, got {height}x{width}")
    if num_boxes < 1 or (height - 2) * (width - 2) < num_boxes + 2:
        raise ValueError(
            f"{num_boxes} boxes need 1 <= num_boxes <= {(height - 2) * (width - 2) - 2} in a {height}x{width} room"
        )
    if search_depth < 1:
        raise ValueError(f"search_depth must be at least 1, got {search_depth}")


def generate_level(
    rng: np.random.Generator,
    *,
    height: int = 10,
    width: int = 10,
    num_boxes: int = 3,
    search_depth: int = 30,
    num_steps: int | None = None,
    p_change_directions: float = 0.35,
    max_states: int = 200_000,
    max_attempts: int = 1000,
) -> Level:
    """Generate a solvable, unsolved level and its optimal solution length.

    Args:
        rng: the only source of randomness; the same generator state gives the same level.
        height: rows, including the outer walls.
        width: columns, including the outer walls.
        num_boxes: boxes (and targets).
        search_depth: how many steps the reverse search plays; the optimal solution is at most this.
        num_steps: random-walk steps that carve the room; gym-sokoban's ``1.7 * (height + width)``
            when None.
        p_change_directions: chance per step that the walk turns.
        max_states: positions the reverse search may hold before it stops at the end of a layer.
        max_attempts: rooms to draw before giving up.

    Raises:
        ValueError: on settings that cannot describe a level.
        GenerationError: if ``max_attempts`` rooms all failed.
    """
    check_settings(height, width, num_boxes, search_depth)
    steps = int(1.7 * (height + width)) if num_steps is None else num_steps
    walls_all = (1 << (height * width)) - 1
    for attempt in range(1, max_attempts + 1):
        floor = room_topology(rng, height, width, steps, p_change_directions)
        free = cells(floor)
        if len(free) <= num_boxes + 1:
            continue
        targets = 0
        for i in rng.choice(len(free), size=num_boxes, replace=False):
            targets |= 1 << free[int(i)]
        table = DistanceTable(width, floor, targets)
        table.grow(search_depth, max_states)
        chosen = _pick(rng, table)
        if chosen is None:
            continue
        depth, boxes, player = chosen
        board = Board(height=height, width=width, walls=walls_all & ~floor, targets=targets, boxes=boxes, player=player)
        return Level(board=board, optimal_length=depth, table=table, attempts=attempt)
    raise GenerationError(
        f"no {height}x{width} room with {num_boxes} boxes in {max_attempts} attempts; use a larger room or fewer boxes"
    )


def _pick(rng: np.random.Generator, table: DistanceTable) -> tuple[int, int, int] | None:
    """A uniformly drawn post-pull position with no box on a target, from the deepest layer that has one."""
    for depth in range(table.depth, 0, -1):
        choices = [(boxes, bits) for boxes, bits in table.arrivals[depth].items() if not boxes & table.targets]
        total = sum(bits.bit_count() for _, bits in choices)
        if not total:
            continue
        index = int(rng.integers(total))
        for boxes, bits in choices:
            count = bits.bit_count()
            if index < count:
                return depth, boxes, cells(bits)[index]
            index -= count
    return None
