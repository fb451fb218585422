"""Sokoban for envhub: gym-sokoban's rules as text, fast reverse-play levels, an optimal solver."""

from envhub_sokoban.board import ACTIONS, ALT_LEGEND, LEGENDS, RAGEN_LEGEND, Board, InvalidLevel, Legend
from envhub_sokoban.env import SokobanEnv
from envhub_sokoban.generator import GenerationError, Level, generate_level
from envhub_sokoban.interop import board_from_rooms, board_to_rooms
from envhub_sokoban.solver import DistanceTable, Oracle, SearchLimit, solve

__all__ = [
    "ACTIONS",
    "ALT_LEGEND",
    "LEGENDS",
    "RAGEN_LEGEND",
    "Board",
    "DistanceTable",
    "GenerationError",
    "InvalidLevel",
    "Legend",
    "Level",
    "Oracle",
    "SearchLimit",
    "SokobanEnv",
    "board_from_rooms",
    "board_to_rooms",
    "generate_level",
    "solve",
]

# Importing the package registers its ids with envhub and Gymnasium (Gymnasium 1.x loads no plugins).
from envhub.plugins import load_on_import as _load_on_import  # noqa: E402

_load_on_import("sokoban")
