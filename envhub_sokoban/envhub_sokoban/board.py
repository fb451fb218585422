"""The Sokoban board: bitboard state, gym-sokoban's push rules, and the text legend.

A board of ``height x width`` cells numbers cell ``(row, col)`` as ``row * width + col`` and keeps
walls, targets and boxes as Python-int bit masks, so a move is a shift and a test is an ``&``.
Levels are enclosed by walls, so a shift never carries the player or a box off the board.
"""

from __future__ import annotations

import dataclasses

from envhub.error import EnvhubError

#: Action names in gym-sokoban's push order (its actions 1-4: push up, down, left, right).
ACTIONS: tuple[str, ...] = ("Up", "Down", "Left", "Right")


class InvalidLevel(EnvhubError, ValueError):
    """A hand-written level cannot be played; the message says what to fix."""


@dataclasses.dataclass(frozen=True)
class Legend:
    """One symbol per tile kind; ``Board.to_text`` draws with it and ``Board.from_text`` reads it."""

    wall: str
    floor: str
    target: str
    box: str
    box_on_target: str
    player: str
    player_on_target: str

    def __post_init__(self) -> None:
        symbols = dataclasses.astuple(self)
        if any(len(s) != 1 for s in symbols) or len(set(symbols)) != len(symbols):
            raise ValueError(f"a legend needs seven distinct one-character symbols, got {symbols}")

    def describe(self) -> str:
        """The legend as one line for the instructions."""
        return (
            f"{self.wall} wall, {self.floor} floor, {self.target} target, {self.box} box, "
            f"{self.box_on_target} box on a target, {self.player} you (the player), "
            f"{self.player_on_target} you standing on a target"
        )


#: RAGEN's grid symbols.
RAGEN_LEGEND = Legend(wall="#", floor="_", target="O", box="X", box_on_target="√", player="P", player_on_target="S")
#: The other symbol set RAGEN trains on (its "SokobanDifferentGridVocab").
ALT_LEGEND = Legend(wall="W", floor=".", target="G", box="B", box_on_target="C", player="A", player_on_target="@")
LEGENDS: dict[str, Legend] = {"ragen": RAGEN_LEGEND, "alt": ALT_LEGEND}


@dataclasses.dataclass(frozen=True)
class Board:
    """One Sokoban position.

    Attributes:
        height: rows.
        width: columns; also the index offset of one row.
        walls: mask of wall cells.
        targets: mask of target cells.
        boxes: mask of box cells.
        player: the player's cell index.
    """

    height: int
    width: int
    walls: int
    targets: int
    boxes: int
    player: int

    @property
    def floor(self) -> int:
        """Mask of every cell that is not a wall."""
        return ((1 << (self.height * self.width)) - 1) & ~self.walls

    @property
    def num_boxes(self) -> int:
        """How many boxes (and targets) the level has."""
        return self.boxes.bit_count()

    @property
    def boxes_on_target(self) -> int:
        """How many boxes stand on targets."""
        return (self.boxes & self.targets).bit_count()

    @property
    def solved(self) -> bool:
        """Whether every box stands on a target."""
        return self.boxes == self.targets

    def offset(self, action: str) -> int:
        """The index change of one step in direction ``action`` (one of ``ACTIONS``)."""
        return (-self.width, self.width, -1, 1)[ACTIONS.index(action)]

    def move(self, action: str) -> tuple[Board, bool, bool]:
        """Apply gym-sokoban's push-or-move rule for ``action``.

        The player steps onto free floor; a box in the way is pushed one cell if the cell behind
        it is floor without a box; anything else (a wall, a box against a wall or another box)
        leaves the board unchanged.

        Returns:
            ``(board, moved_player, moved_box)``.
        """
        step = self.offset(action)
        ahead = self.player + step
        ahead_bit = 1 << ahead
        if self.walls & ahead_bit:
            return self, False, False
        if self.boxes & ahead_bit:
            beyond_bit = 1 << (ahead + step)
            if (self.walls | self.boxes) & beyond_bit:
                return self, False, False
            boxes = self.boxes ^ ahead_bit ^ beyond_bit
            return dataclasses.replace(self, boxes=boxes, player=ahead), True, True
        return dataclasses.replace(self, player=ahead), True, False

    def to_text(self, legend: Legend = RAGEN_LEGEND) -> str:
        """The grid, one row per line, in ``legend``'s symbols."""
        rows = []
        for r in range(self.height):
            row = []
            for c in range(self.width):
                i = r * self.width + c
                bit = 1 << i
                on_target = bool(self.targets & bit)
                if self.walls & bit:
                    row.append(legend.wall)
                elif i == self.player:
                    row.append(legend.player_on_target if on_target else legend.player)
                elif self.boxes & bit:
                    row.append(legend.box_on_target if on_target else legend.box)
                else:
                    row.append(legend.target if on_target else legend.floor)
            rows.append("".join(row))
        return "\n".join(rows)

    @classmethod
    def from_text(cls, text: str, legend: Legend = RAGEN_LEGEND) -> Board:
        """Read a grid written in ``legend``'s symbols (one row per line).

        Raises:
            InvalidLevel: on ragged rows, unknown symbols, not exactly one player, a box count
                that differs from the target count, no boxes, or floor on the outer edge.
        """
        if not isinstance(text, str):
            raise InvalidLevel(f"a level is text, got {type(text).__name__}")
        lines = [line for line in text.strip("\n").split("\n")]
        if not lines or not lines[0]:
            raise InvalidLevel("the level is empty")
        width = len(lines[0])
        if any(len(line) != width for line in lines):
            raise InvalidLevel(f"every row of a level must have the same length ({width}); pad rows with walls")
        height = len(lines)
        walls = targets = boxes = 0
        players = []
        kinds = {
            legend.wall: (True, False, False, False),
            legend.floor: (False, False, False, False),
            legend.target: (False, True, False, False),
            legend.box: (False, False, True, False),
            legend.box_on_target: (False, True, True, False),
            legend.player: (False, False, False, True),
            legend.player_on_target: (False, True, False, True),
        }
        for r, line in enumerate(lines):
            for c, symbol in enumerate(line):
                kind = kinds.get(symbol)
                if kind is None:
                    raise InvalidLevel(f"unknown symbol {symbol!r} at row {r}, column {c}; the legend is {legend.describe()}")
                bit = 1 << (r * width + c)
                is_wall, is_target, is_box, is_player = kind
                walls |= bit if is_wall else 0
                targets |= bit if is_target else 0
                boxes |= bit if is_box else 0
                if is_player:
                    players.append(r * width + c)
                if not is_wall and (r in (0, height - 1) or c in (0, width - 1)):
                    raise InvalidLevel(f"row {r}, column {c} is on the edge but not a wall; surround the level with walls")
        if len(players) != 1:
            raise InvalidLevel(f"a level needs exactly one player, found {len(players)}")
        if boxes.bit_count() == 0 or boxes.bit_count() != targets.bit_count():
            raise InvalidLevel(
                f"a level needs as many boxes as targets and at least one; found {boxes.bit_count()} boxes "
                f"and {targets.bit_count()} targets"
            )
        return cls(height=height, width=width, walls=walls, targets=targets, boxes=boxes, player=players[0])


def cells(mask: int) -> list[int]:
    """The cell indices set in ``mask``, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
