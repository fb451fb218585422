"""Sokoban as a text environment, with gym-sokoban's dynamics and rewards."""

from __future__ import annotations

from typing import Any

import numpy as np

from envhub.core import DiscreteTextEnv
from envhub_sokoban.board import ACTIONS, LEGENDS, Board, InvalidLevel, cells
from envhub_sokoban.generator import check_settings, generate_level
from envhub_sokoban.render import board_to_rgb
from envhub_sokoban.solver import Oracle, SearchLimit

# gym-sokoban's rewards (SokobanEnv.__init__), applied in its order in _calc_reward.
PENALTY_FOR_STEP = -0.1
REWARD_BOX_ON_TARGET = 1.0
PENALTY_BOX_OFF_TARGET = -1.0
REWARD_FINISHED = 10.0

#: Observation views: the whole grid, the board described from the player in words, or both.
VIEWS = ("grid", "local", "grid+local")


def step_reward(on_target_before: int, on_target_after: int, solved: bool) -> float:
    """gym-sokoban's reward for one step: -0.1, +1 if a box reached a target, -1 if one left a
    target, +10 when every box is on a target. A blocked move still pays the -0.1."""
    reward = PENALTY_FOR_STEP
    if on_target_after > on_target_before:
        reward += REWARD_BOX_ON_TARGET
    elif on_target_after < on_target_before:
        reward += PENALTY_BOX_OFF_TARGET
    if solved:
        reward += REWARD_FINISHED
    return reward


class SokobanEnv(DiscreteTextEnv):
    """Push every box onto a target. Each reset generates a new level from ``self.np_random``.

    Levels come from :func:`envhub_sokoban.generator.generate_level` (reverse play, every level
    solvable and unsolved); ``reset`` reports the level's optimal solution length in
    ``info["optimal_length"]``. A fixed hand-written level can be given as ``level`` or per
    episode as ``reset(options={"level": text})``, in the env's symbols; its optimal length comes
    from the solver, and is None when the level cannot be solved (or the search gives up).

    Args:
        height: rows of generated rooms, outer walls included.
        width: columns of generated rooms, outer walls included.
        num_boxes: boxes (and targets) per generated level.
        search_depth: steps of reverse play; the optimal solution is never longer.
        num_steps: random-walk steps that carve a room (gym-sokoban's ``1.7 * (height + width)`` when None).
        p_change_directions: chance per walk step that the carving walk turns.
        symbols: the text legend, ``"ragen"`` (``# _ O X √ P S``) or ``"alt"`` (``W . G B C A @``).
        level: a fixed level to play every episode instead of generated ones.
        view: what an observation shows: ``"grid"`` (the whole board, one symbol per cell),
            ``"local"`` (in words, from the player: where each box lies, where its nearest free
            target lies from it, and what is one step Up, Down, Left and Right, a box with whether
            it can be pushed) or ``"grid+local"`` (both). The state, the dynamics and
            ``state_key`` are the same in every view.
        render_mode: ``"ansi"`` (text, the default) or ``"rgb_array"`` (a picture).

    Raises:
        ValueError: on generation settings that cannot make a level, or unknown ``symbols`` or ``view``.
        InvalidLevel: when a given level cannot be played (also from ``reset``).
    """

    action_names = ACTIONS
    metadata: dict[str, Any] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(
        self,
        height: int = 6,
        width: int = 6,
        num_boxes: int = 1,
        search_depth: int = 10,
        num_steps: int | None = None,
        p_change_directions: float = 0.35,
        symbols: str = "ragen",
        level: str | None = None,
        view: str = "grid",
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if symbols not in LEGENDS:
            raise ValueError(f"unknown symbols {symbols!r}; choose one of {sorted(LEGENDS)}")
        if view not in VIEWS:
            raise ValueError(f"unknown view {view!r}; choose one of {VIEWS}")
        self.view = view
        self.legend = LEGENDS[symbols]
        check_settings(height, width, num_boxes, search_depth)
        self.generation = {
            "height": height,
            "width": width,
            "num_boxes": num_boxes,
            "search_depth": search_depth,
            "num_steps": num_steps,
            "p_change_directions": p_change_directions,
        }
        self.fixed_level = self._parse(level) if level is not None else None
        self.board: Board | None = None
        self.optimal_length: int | None = None
        self._solver_gave_up = False
        self._oracle: Oracle | None = None
        self._grid = ""
        local = (
            "Each turn you are told where each box lies from you, where the nearest free target lies from "
            "that box, and what is one step Up, Down, Left and Right of you: wall, floor, target, or a box "
            "with whether it can be pushed.\n"
        )
        self.instructions = (
            "You are playing Sokoban in a warehouse seen from above. Push every box onto a target.\n"
            + (f"Legend: {self.legend.describe()}.\n" if view != "local" else "")
            + (local if view != "grid" else "")
            + "Actions: Up, Down, Left, Right move you one cell. Walking into a box pushes it one cell in "
            "the same direction if the cell behind it is free; you cannot push a box into a wall or into "
            "another box, you cannot push two boxes at once, and you can never pull a box. A move that is "
            "blocked leaves everything where it was but still costs a step. A box pushed into a corner "
            "away from the targets can never be recovered.\n"
            f"Rewards: {PENALTY_FOR_STEP:g} per step, {REWARD_BOX_ON_TARGET:+g} when a box lands on a target, "
            f"{PENALTY_BOX_OFF_TARGET:+g} when a box leaves one, {REWARD_FINISHED:+g} when all boxes are on "
            "targets, which ends the game."
        )

    # ------------------------------------------------------------------ TextEnv hooks

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        given = options.get("level")
        board = self._parse(given) if given is not None else self.fixed_level
        if board is None:
            level = generate_level(self.np_random, **self.generation)
            self.board, self.optimal_length = level.board, level.optimal_length
            self._solver_gave_up = False
            self._oracle = Oracle(level.board, level.table)
        else:
            self.board = board
            self._oracle = Oracle(board)
            self._solver_gave_up = False
            try:
                path = self._oracle.solve(board)
            except SearchLimit:
                path, self._solver_gave_up = None, True
            self.optimal_length = None if path is None else len(path)
        self._grid = self.board.to_text(self.legend)
        return self._draw(), {"optimal_length": self.optimal_length, "num_boxes": self.board.num_boxes}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        before = self.board.boxes_on_target
        self.board, moved_player, moved_box = self.board.move(action)
        solved = self.board.solved
        reward = step_reward(before, self.board.boxes_on_target, solved)
        self._grid = self.board.to_text(self.legend)
        extra: dict[str, Any] = {"moved_player": moved_player, "moved_box": moved_box, "boxes_on_target": self.board.boxes_on_target}
        if not moved_player:  # what envhub run shows after the move (envhub.core.OUTCOME_KEY)
            extra["outcome"] = "blocked: you did not move"
        return self._draw(), reward, solved, extra

    def state_key(self) -> str:
        """The grid as drawn: walls, targets, boxes and the player."""
        return self._grid

    def is_success(self) -> bool:
        """Whether every box is on a target."""
        return self.board is not None and self.board.solved

    def render_text(self) -> str:
        """The grid in the env's symbols, one row per line."""
        return self._grid

    def render_rgb(self) -> np.ndarray:
        """The board as an ``(H, W, 3)`` uint8 picture, 16 pixels per cell."""
        return board_to_rgb(self.board)

    def expert_action(self) -> str:
        """The first step of an optimal solution.

        Where none exists (the board is solved, a box is stuck for good, or the search is too
        large), every action is as good as any other and the expert says ``"Up"``.
        """
        action = self._oracle.action(self.board) if self._oracle is not None else None
        return action if action is not None else ACTIONS[0]

    def optimal_success_probability(self) -> float | None:
        """1.0 when the level's optimal solution fits the turn limit (generated levels always
        do: they are solvable in at most ``search_depth`` steps), 0.0 when it does not or the
        level cannot be solved, None when the solver gave up on a given level."""
        if self._solver_gave_up:
            return None
        if self.optimal_length is None:
            return 0.0
        return float(self.max_turns is None or self.optimal_length <= self.max_turns)

    # ------------------------------------------------------------------ helpers

    def _draw(self) -> str:
        if self.view == "grid":
            return self._grid
        local = local_view(self.board)
        return local if self.view == "local" else f"{self._grid}\n{local}"

    def _parse(self, text: str) -> Board:
        board = Board.from_text(text, self.legend)
        if board.solved:
            raise InvalidLevel("the level is already solved: move at least one box off its target")
        return board


def _offset(board: Board, origin: int, cell: int) -> str:
    """Where ``cell`` lies from ``origin`` in words: ``"1 down, 2 left"``, or ``"here"``."""
    (r0, c0), (r1, c1) = divmod(origin, board.width), divmod(cell, board.width)
    parts = []
    if r1 != r0:
        parts.append(f"{abs(r1 - r0)} {'down' if r1 > r0 else 'up'}")
    if c1 != c0:
        parts.append(f"{abs(c1 - c0)} {'right' if c1 > c0 else 'left'}")
    return ", ".join(parts) or "here"


def _distance(board: Board, a: int, b: int) -> int:
    (r0, c0), (r1, c1) = divmod(a, board.width), divmod(b, board.width)
    return abs(r1 - r0) + abs(c1 - c0)


def local_view(board: Board) -> str:
    """The board in words from the player (the ``local`` view).

    One line per box: where it lies from the player, and where the nearest target without a box
    lies from it (ties go to the first target in reading order), or that it stands on a target.
    Then what is one step in each direction; a box there is ``box (can push)`` when the cell
    behind it is free floor or target, else ``box (blocked)``.
    """
    row, col = divmod(board.player, board.width)
    lines = [f"Row {row + 1}, column {col + 1}."]
    free_targets = cells(board.targets & ~board.boxes)
    for box in cells(board.boxes):
        where = f"Box: {_offset(board, board.player, box)}."
        if board.targets >> box & 1:
            lines.append(f"{where} It is on a target.")
        elif free_targets:
            target = min(free_targets, key=lambda t: _distance(board, box, t))
            lines.append(f"{where} Target: {_offset(board, box, target)} of the box.")
        else:  # unreachable: a box off target leaves a target free
            lines.append(where)
    around = []
    for action in ACTIONS:
        step = board.offset(action)
        cell = board.player + step
        if board.walls >> cell & 1:
            thing = "wall"
        elif board.boxes >> cell & 1:
            beyond = cell + step
            thing = "box (blocked)" if (board.walls | board.boxes) >> beyond & 1 else "box (can push)"
        else:
            thing = "target" if board.targets >> cell & 1 else "floor"
        around.append(f"{action}: {thing}.")
    lines.append(" ".join(around))
    return "\n".join(lines)
