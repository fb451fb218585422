"""FrozenLake as a text environment, on Gymnasium's own FrozenLake dynamics."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import MAPS, FrozenLakeEnv, generate_random_map

from envhub.core import DiscreteTextEnv
from envhub_frozenlake.planning import UNLIMITED_HORIZON, best_action, optimal_success_probability, success_values
from envhub_frozenlake.view_planning import MAX_SIZE, PLAN_HORIZON, view_planner

#: How each map tile is drawn when the player is elsewhere.
TILE_SYMBOLS = {"S": "_", "F": "_", "H": "O", "G": "G"}
PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = "P", "X", "√"
#: Observation views: the whole grid, what lies one step away in each direction, or both.
VIEWS = ("grid", "local", "grid+local")
#: Whose moves ``expert_action`` gives: one who sees the whole map, or one who knows only what the
#: player has seen (Bayes-optimal on random maps; see :mod:`envhub_frozenlake.view_planning`).
EXPERTS = ("map", "view")
#: How the local view names a neighbouring tile.
TILE_NAMES = {"S": "ice", "F": "ice", "H": "hole", "G": "goal"}


@functools.lru_cache(maxsize=4096)
def random_map(size: int, p: float, seed: int) -> tuple[str, ...]:
    """Gymnasium's ``generate_random_map`` (a map with a path to the goal), memoised: it is a pure
    function of its arguments, and its path search dominates a reset."""
    return tuple(generate_random_map(size=size, p=p, seed=seed))


@functools.lru_cache(maxsize=256)
def _plan(desc: tuple[str, ...], is_slippery: bool, horizon: int) -> np.ndarray:
    return success_values(desc, is_slippery, horizon)


class FrozenLakeTextEnv(DiscreteTextEnv):
    """Cross a frozen lake from the start to the goal without falling into a hole.

    Each reset draws a new map from ``self.np_random`` (unless ``desc`` or ``map_name`` fixes one)
    and seeds a Gymnasium ``FrozenLakeEnv`` that does the stepping, so transitions are exactly
    Gymnasium's. On slippery ice the player moves in the intended direction with probability 1/3
    and to either side with 1/3 each.

    Args:
        size: side of random maps.
        p: probability that a random tile is frozen (walkable) rather than a hole.
        is_slippery: Gymnasium's slippery dynamics.
        desc: a fixed map as rows of ``S``, ``F``, ``H``, ``G``.
        map_name: one of Gymnasium's named maps (``"4x4"``, ``"8x8"``).
        view: what an observation shows: ``"grid"`` (the whole map, one character per tile),
            ``"local"`` (the player's row and column, and what lies one step Left, Down, Right
            and Up: ice, hole, goal or edge) or ``"grid+local"`` (both). The state, the dynamics
            and ``state_key`` are the same in every view.
        expert: whose moves :meth:`expert_action` gives. ``"map"`` (the default): the best move
            knowing the whole map, which wins every map but cannot be imitated from the local view.
            ``"view"``: the best move knowing only the tiles the player has seen, under the prior
            of random maps (non-slippery random maps of side <= 4); imitating it is what a
            model that sees the local view can learn exactly.
        render_mode: ``"ansi"`` or None.
    """

    action_names = ("Left", "Down", "Right", "Up")

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = True,
        desc: list[str] | None = None,
        map_name: str | None = None,
        view: str = "grid",
        expert: str = "map",
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if view not in VIEWS:
            raise ValueError(f"unknown view {view!r}; choose one of {VIEWS}")
        if expert not in EXPERTS:
            raise ValueError(f"unknown expert {expert!r}; choose one of {EXPERTS}")
        if expert == "view" and (desc is not None or map_name is not None or is_slippery or not 2 <= size <= MAX_SIZE):
            raise ValueError(
                f"expert='view' plans over every random map, so it needs random maps (no desc or map_name), "
                f"is_slippery=False and 2 <= size <= {MAX_SIZE}"
            )
        if desc is None and map_name is not None:
            if map_name not in MAPS:
                raise ValueError(f"unknown map_name {map_name!r}; choose one of {sorted(MAPS)} or pass desc")
            desc = MAPS[map_name]
        if desc is None and not (size >= 2 and 0.0 < p <= 1.0):
            raise ValueError(f"random maps need size >= 2 and 0 < p <= 1, got size={size}, p={p}")
        self.size, self.p, self.is_slippery, self.view, self.expert = size, p, is_slippery, view, expert
        self._seen: frozenset = frozenset()  # the tiles the player has seen, for the view expert
        self.fixed_desc = tuple(desc) if desc is not None else None
        self.desc: tuple[str, ...] = ()
        self._lake: FrozenLakeEnv | None = None
        self._rows: list[str] = []
        self._grid = ""
        self._here = "S"
        slip = (
            "The ice is slippery: you move in the direction you choose only 1/3 of the time, "
            "otherwise to one of the two sides."
            if is_slippery
            else "The ice is not slippery: you always move where you choose."
        )
        legend = (
            f"Legend: {PLAYER} you, _ frozen ice, O hole, G goal, {PLAYER_IN_HOLE} you in a hole, "
            f"{PLAYER_ON_GOAL} you on the goal.\n"
        )
        local = (
            "Each turn you are told your row and column (counted from 1 at the top-left corner) and what "
            "lies one step Left, Down, Right and Up of you: ice, hole, goal or edge.\n"
        )
        self.instructions = (
            "You are on a frozen lake and must walk from your position to the goal without falling "
            "into a hole. Moving off the edge leaves you where you are. "
            f"{slip}\n"
            + (legend if view != "local" else "")
            + (local if view != "grid" else "")
            + "Actions: Left, Down, Right, Up. Reaching the goal gives reward 1; anything else gives 0."
        )

    # ------------------------------------------------------------------ TextEnv hooks

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        desc = options.get("desc") or self.fixed_desc
        if desc is None:
            desc = random_map(self.size, self.p, int(self.np_random.integers(2**31 - 1)))
        desc = tuple(desc)
        if desc != self.desc or self._lake is None:
            self.desc = desc
            self._lake = FrozenLakeEnv(desc=list(desc), is_slippery=self.is_slippery)
            self._rows = ["".join(TILE_SYMBOLS[c] for c in row) for row in desc]
        self._lake.reset(seed=int(self.np_random.integers(2**31 - 1)))
        self._seen = frozenset()
        self._look()
        return self._draw(), {"map": "\n".join(desc)}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        width = len(self.desc[0])
        before = divmod(int(self._lake.s), width)
        _, reward, terminated, _, _ = self._lake.step(self.action_index(action))
        after = divmod(int(self._lake.s), width)
        step = (after[0] - before[0], after[1] - before[1])
        # Where the player went, which slippery ice can make another direction than the one chosen.
        moved = {(0, -1): "Left", (1, 0): "Down", (0, 1): "Right", (-1, 0): "Up"}.get(step, "nowhere")
        self._look()
        info: dict[str, Any] = {"moved": moved}
        if moved != action:  # what envhub run shows after the move (envhub.core.OUTCOME_KEY)
            info["outcome"] = "you did not move" if moved == "nowhere" else f"you slid: moved {moved}"
        return self._draw(), float(reward), bool(terminated), info

    def state_key(self) -> str:
        """The grid as drawn: map and player position."""
        return self._grid

    def is_success(self) -> bool:
        """Whether the player stands on the goal."""
        return self._here == "G"

    def render_text(self) -> str:
        """The grid with the legend's symbols, one row per line."""
        return self._grid

    @property
    def phrases(self) -> tuple[str, ...]:
        """The local view's clauses: each direction with each tile ("Down: hole."), and each row
        and column ("Row 2," and "column 3."); none for the grid view."""
        if self.view == "grid":
            return ()
        side = max(self.size, len(self.desc) if self.desc else 0, len(self.fixed_desc or ()))
        tiles = sorted(set(TILE_NAMES.values())) + ["edge"]
        return (
            tuple(f"{name}: {tile}." for name in self.action_names for tile in tiles)
            + tuple(f"Row {k}," for k in range(1, side + 1))
            + tuple(f"column {k}." for k in range(1, side + 1))
        )

    def expert_action(self) -> str:
        """The move that maximises the chance of reaching the goal in the turns left: knowing the
        whole map (``expert="map"``) or only the tiles seen so far (``expert="view"``)."""
        if self.expert == "view":
            left = self.max_turns - self.turn if self.max_turns is not None else PLAN_HORIZON
            planner = view_planner(self.size, self.p)
            return self.action_names[planner.best_action(divmod(int(self._lake.s), self.size), left, self._seen)]
        horizon = self.max_turns if self.max_turns is not None else UNLIMITED_HORIZON
        q = _plan(self.desc, self.is_slippery, horizon)
        return self.action_names[best_action(q, int(self._lake.s), horizon - self.turn)]

    # ------------------------------------------------------------------ extras

    @property
    def position(self) -> int:
        """The player's tile index (row * width + column)."""
        return int(self._lake.s)

    def optimal_success_probability(self) -> float:
        """The best success probability any agent has on this map under this turn limit."""
        return optimal_success_probability(self.desc, self.is_slippery, self.max_turns)

    def _look(self) -> None:
        """Add the tiles next to the player to what it has seen (the view expert's belief)."""
        if self.expert == "view":
            self._seen = view_planner(self.size, self.p).observe(self._seen, divmod(int(self._lake.s), self.size), self.desc)

    def _draw(self) -> str:
        width = len(self.desc[0])
        row, col = divmod(int(self._lake.s), width)
        self._here = here = self.desc[row][col]
        symbol = PLAYER_IN_HOLE if here == "H" else PLAYER_ON_GOAL if here == "G" else PLAYER
        rows = list(self._rows)
        rows[row] = rows[row][:col] + symbol + rows[row][col + 1 :]
        self._grid = "\n".join(rows)
        if self.view == "grid":
            return self._grid
        local = self._local_view(row, col)
        return local if self.view == "local" else f"{self._grid}\n{local}"

    def _local_view(self, row: int, col: int) -> str:
        """The player's tile and its four neighbours in words (the ``local`` view)."""
        height, width = len(self.desc), len(self.desc[0])
        where = f"Row {row + 1}, column {col + 1}."
        if self._here == "H":
            return f"{where} You fell into a hole."
        if self._here == "G":
            return f"{where} You reached the goal."
        around = []
        for name, (dr, dc) in zip(self.action_names, ((0, -1), (1, 0), (0, 1), (-1, 0))):
            r, c = row + dr, col + dc
            around.append(f"{name}: {TILE_NAMES[self.desc[r][c]] if 0 <= r < height and 0 <= c < width else 'edge'}.")
        return f"{where}\n" + " ".join(around)
