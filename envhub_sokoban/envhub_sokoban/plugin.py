"""Registers the Sokoban environments with envhub."""

from collections.abc import Callable
from typing import Any

from envhub import hookimpl

ENTRY = "envhub_sokoban.env:SokobanEnv"


@hookimpl
def register_envs(register: Callable[..., Any]) -> None:
    """Register RAGEN's 6x6 one-box setting (in two symbol sets) and the 8x8 and 10x10 rooms."""
    register(
        "sokoban/Sokoban-v0",
        ENTRY,
        kwargs={"height": 6, "width": 6, "num_boxes": 1, "search_depth": 10},
        max_turns=10,
        description="6x6 room, 1 box, solvable in at most 10 steps, 10 turns (RAGEN's SimpleSokoban)",
    )
    register(
        "sokoban/SokobanAltSymbols-v0",
        ENTRY,
        kwargs={"height": 6, "width": 6, "num_boxes": 1, "search_depth": 10, "symbols": "alt"},
        max_turns=10,
        description="Sokoban-v0 drawn with another symbol set: W . G B C A @ (RAGEN's SokobanDifferentGridVocab)",
    )
    register(
        "sokoban/Sokoban8x8-v0",
        ENTRY,
        kwargs={"height": 8, "width": 8, "num_boxes": 2, "search_depth": 20},
        max_turns=40,
        description="8x8 room, 2 boxes, solvable in at most 20 steps, 40 turns",
    )
    register(
        "sokoban/Sokoban10x10-v0",
        ENTRY,
        kwargs={"height": 10, "width": 10, "num_boxes": 3, "search_depth": 30},
        max_turns=60,
        description="10x10 room, 3 boxes, solvable in at most 30 steps, 60 turns",
    )
