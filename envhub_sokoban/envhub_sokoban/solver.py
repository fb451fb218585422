"""Optimal Sokoban solving: exact move counts, as gym-sokoban's reward counts them (every step).

Two searches share one idea: a breadth-first search whose layers are dicts from a box
configuration (a bit mask) to the set of player cells first reached at that depth (another bit
mask). All player positions of one configuration advance together with a few shifts, which is
what makes exhaustive search affordable in pure Python.

- :class:`DistanceTable` searches backwards from every solved position (the player pulls boxes
  off their targets), so its layer ``k`` holds exactly the positions whose optimal solution takes
  ``k`` steps. Every position it reaches is solvable. The level generator is built on it.
- :class:`Oracle` answers "what is the best next step?" for any position: from the table when the
  position is in it, otherwise by a forward search (pushes onto dead squares and into frozen 2x2
  blocks pruned) until it meets the table, whose completeness up to its depth makes the meeting
  point optimal.
"""

from __future__ import annotations

from envhub.error import EnvhubError
from envhub_sokoban.board import ACTIONS, Board

#: Positions a forward search may visit before it gives up (a few seconds of pure Python).
DEFAULT_MAX_STATES = 2_000_000


class SearchLimit(EnvhubError):
    """A search visited more positions than it was allowed to; the level may still be solvable."""


def _offsets(width: int) -> tuple[int, int, int, int]:
    return (-width, width, -1, 1)


def _spread(mask: int, width: int) -> int:
    """Every cell one step from a cell of ``mask`` (unmasked: the caller intersects with floor)."""
    return (mask << 1) | (mask >> 1) | (mask << width) | (mask >> width)


def _shift(mask: int, by: int) -> int:
    """``mask`` moved by ``by`` cells: bit ``i`` goes to ``i + by``."""
    return mask << by if by >= 0 else mask >> -by


class DistanceTable:
    """Exact distances to the solution, by breadth-first search backwards from the solved boxes.

    Layer 0 is every position with all boxes on their targets (the player anywhere free). One
    backward step either walks the player back or pulls a box (the undo of a push). A position
    first reached in layer ``k`` needs exactly ``k`` steps to solve.

    Args:
        width: the board's width (row offset).
        floor: mask of non-wall cells.
        targets: mask of target cells (the solved box configuration).
    """

    def __init__(self, width: int, floor: int, targets: int):
        self.width = width
        self.floor = floor
        self.targets = targets
        start = floor & ~targets
        #: ``layers[k][boxes]``: player cells whose position needs exactly ``k`` steps.
        self.layers: list[dict[int, int]] = [{targets: start}]
        #: ``arrivals[k][boxes]``: the cells of ``layers[k]`` entered by a pull (player next to a box).
        self.arrivals: list[dict[int, int]] = [{}]
        self.visited: dict[int, int] = {targets: start}
        self.states = start.bit_count()
        self.exhausted = False

    @property
    def depth(self) -> int:
        """The deepest complete layer: every position solvable in at most this many steps is known."""
        return len(self.layers) - 1

    def grow(self, depth: int, max_states: int | None = None) -> None:
        """Add layers until ``depth``, until no new position is reachable, or until more than
        ``max_states`` positions are known (the layer in progress is always completed, so the
        table stays exact)."""
        width, floor = self.width, self.floor
        offsets = _offsets(width)
        while self.depth < depth and not self.exhausted:
            if max_states is not None and self.states > max_states:
                return
            nxt: dict[int, int] = {}
            pulled: dict[int, int] = {}
            for boxes, frontier in self.layers[-1].items():
                free = floor & ~boxes
                walked = _spread(frontier, width) & free
                if walked:
                    nxt[boxes] = nxt.get(boxes, 0) | walked
                for step in offsets:
                    # The player at p pulls the box at p + step while stepping back to p - step.
                    pulls = frontier & _shift(boxes, -step) & _shift(free, step)
                    while pulls:
                        low = pulls & -pulls
                        pulls ^= low
                        p = low.bit_length() - 1
                        after = boxes ^ (1 << (p + step)) ^ low
                        back = 1 << (p - step)
                        nxt[after] = nxt.get(after, 0) | back
                        pulled[after] = pulled.get(after, 0) | back
            layer: dict[int, int] = {}
            arrivals: dict[int, int] = {}
            for boxes, reached in nxt.items():
                seen = self.visited.get(boxes, 0)
                new = reached & ~seen
                if new:
                    self.visited[boxes] = seen | new
                    layer[boxes] = new
                    self.states += new.bit_count()
                    by_pull = pulled.get(boxes, 0) & new
                    if by_pull:
                        arrivals[boxes] = by_pull
            if not layer:
                self.exhausted = True
                return
            self.layers.append(layer)
            self.arrivals.append(arrivals)

    def distance(self, boxes: int, player: int) -> int | None:
        """The optimal number of steps from this position, or None if it is not in the table
        (it then needs more than ``depth`` steps, or cannot be solved)."""
        bit = 1 << player
        if not self.visited.get(boxes, 0) & bit:
            return None
        for k, layer in enumerate(self.layers):
            if layer.get(boxes, 0) & bit:
                return k
        raise AssertionError("visited and layers disagree")  # pragma: no cover - internal invariant

    def best_action(self, board: Board) -> str | None:
        """An action that brings ``board`` one step closer to the solution, if it is in the table."""
        d = self.distance(board.boxes, board.player)
        if not d:
            return None
        for action in ACTIONS:
            after, moved, _ = board.move(action)
            if moved and self.distance(after.boxes, after.player) == d - 1:
                return action
        raise AssertionError("a table position has no successor one step closer")  # pragma: no cover


def dead_squares(board: Board) -> int:
    """Mask of floor cells from which a box can never reach any target, whatever the other boxes do.

    A box can reach a target from cell ``c`` exactly when pulling it backwards from some target
    can bring it to ``c``; every floor cell that no pull sequence reaches is dead.
    """
    floor, width = board.floor, board.width
    live = board.targets
    frontier = live
    while frontier:
        grown = 0
        for step in _offsets(width):
            # The box moves from c to c + step; the player needs c + step and c + 2 step free.
            grown |= _shift(frontier, step) & floor & _shift(floor, -step)
        frontier = grown & ~live
        live |= frontier
    return floor & ~live


class Oracle:
    """Optimal next steps on one level's walls and targets.

    Args:
        board: any position of the level (its walls and targets are used).
        table: a :class:`DistanceTable` of the level, e.g. the generator's; a new depth-0 table
            (just the solved positions) when None.
        max_states: positions a forward search may visit before giving up.
    """

    def __init__(self, board: Board, table: DistanceTable | None = None, max_states: int = DEFAULT_MAX_STATES):
        self.width = board.width
        self.walls = board.walls
        self.floor = board.floor
        self.targets = board.targets
        self.table = table if table is not None else DistanceTable(board.width, board.floor, board.targets)
        self.max_states = max_states
        self.dead = dead_squares(board)
        self._plan: dict[tuple[int, int], str] = {}
        self._hopeless: set[tuple[int, int]] = set()  # positions already searched in vain
        self._blocks = self._two_by_two_blocks()

    def action(self, board: Board) -> str | None:
        """The first step of an optimal solution from ``board``; None when ``board`` is solved,
        cannot be solved, or needs a search beyond ``max_states``."""
        if board.solved:
            return None
        key = (board.boxes, board.player)
        if key not in self._plan and key not in self._hopeless:
            try:
                path = self.solve(board)
            except SearchLimit:
                path = None
            if path is None:
                self._hopeless.add(key)
        return self._plan.get(key)

    def solve(self, board: Board) -> list[str] | None:
        """An optimal action sequence from ``board`` to the solution; None if there is none.

        Raises:
            SearchLimit: when the forward search visits more than ``max_states`` positions.
        """
        if board.solved:
            return []
        head = self._forward(board)
        if head is None:
            return None
        path = []
        for action in head:
            self._plan[(board.boxes, board.player)] = action
            path.append(action)
            board = board.move(action)[0]
        while not board.solved:
            action = self.table.best_action(board)
            self._plan[(board.boxes, board.player)] = action
            path.append(action)
            board = board.move(action)[0]
        return path

    # ------------------------------------------------------------------ forward search

    def _two_by_two_blocks(self) -> dict[int, tuple[int, ...]]:
        width = self.width
        blocks: dict[int, tuple[int, ...]] = {}
        floor_cells = self.floor
        while floor_cells:
            low = floor_cells & -floor_cells
            floor_cells ^= low
            c = low.bit_length() - 1
            blocks[c] = tuple(
                low | (1 << (c + dc)) | (1 << (c + dr)) | (1 << (c + dr + dc)) for dc in (-1, 1) for dr in (-width, width)
            )
        return blocks

    def _frozen(self, boxes: int, cell: int) -> bool:
        """Whether the box just pushed to ``cell`` closes a 2x2 block of walls and boxes with a
        box off target in it: none of those boxes can ever move again."""
        solid = self.walls | boxes
        for block in self._blocks[cell]:
            if block & solid == block and block & boxes & ~self.targets:
                return True
        return False

    def _forward(self, board: Board) -> list[str] | None:
        """Search forwards from ``board`` to the first layer that meets the table, and return the
        steps to the met position with the smallest total distance."""
        table, width, floor = self.table, self.width, self.floor
        offsets = _offsets(width)
        start = 1 << board.player
        if table.visited.get(board.boxes, 0) & start:
            return []
        layers: list[dict[int, int]] = [{board.boxes: start}]
        visited = {board.boxes: start}
        states = 1
        box_free = floor & ~self.dead
        while True:
            nxt: dict[int, int] = {}
            for boxes, frontier in layers[-1].items():
                free = floor & ~boxes
                walked = _spread(frontier, width) & free
                if walked:
                    nxt[boxes] = nxt.get(boxes, 0) | walked
                landing_ok = box_free & ~boxes
                for step in offsets:
                    # The player at p pushes the box at p + step onto p + 2 step.
                    pushes = frontier & _shift(boxes, -step) & _shift(landing_ok, -2 * step)
                    while pushes:
                        low = pushes & -pushes
                        pushes ^= low
                        p = low.bit_length() - 1
                        after = boxes ^ (1 << (p + step)) ^ (1 << (p + 2 * step))
                        if self._frozen(after, p + 2 * step):
                            continue
                        nxt[after] = nxt.get(after, 0) | (1 << (p + step))
            layer: dict[int, int] = {}
            best: tuple[int, int, int] | None = None
            for boxes, reached in nxt.items():
                seen = visited.get(boxes, 0)
                new = reached & ~seen
                if not new:
                    continue
                visited[boxes] = seen | new
                layer[boxes] = new
                states += new.bit_count()
                met = table.visited.get(boxes, 0) & new
                while met:
                    low = met & -met
                    met ^= low
                    p = low.bit_length() - 1
                    d = table.distance(boxes, p)
                    if best is None or d < best[0]:
                        best = (d, boxes, p)
            if not layer:
                return None
            layers.append(layer)
            if best is not None:
                return self._backtrack(layers, best[1], best[2])
            if states > self.max_states:
                raise SearchLimit(
                    f"no solution within {self.max_states} searched positions; raise max_states to search further"
                )

    def _backtrack(self, layers: list[dict[int, int]], boxes: int, player: int) -> list[str]:
        offsets = _offsets(self.width)
        path: list[str] = []
        for k in range(len(layers) - 1, 0, -1):
            before = layers[k - 1]
            for action, step in zip(ACTIONS, offsets):
                q = player - step
                if before.get(boxes, 0) >> q & 1:
                    player = q
                    break
                pushed_from = boxes ^ (1 << (player + step)) ^ (1 << player)
                if boxes >> (player + step) & 1 and before.get(pushed_from, 0) >> q & 1:
                    boxes, player = pushed_from, q
                    break
            else:  # pragma: no cover - internal invariant
                raise AssertionError("a forward layer has a position without a predecessor")
            path.append(action)
        path.reverse()
        return path


def solve(board: Board, max_states: int = DEFAULT_MAX_STATES) -> list[str] | None:
    """An optimal (fewest steps) action sequence that solves ``board``; None if it cannot be solved.

    Raises:
        SearchLimit: when more than ``max_states`` positions were searched without an answer.
    """
    return Oracle(board, max_states=max_states).solve(board)
