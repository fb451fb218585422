"""Pictures of Sokoban boards: 16x16-pixel tiles drawn with numpy, assembled in one gather."""

from __future__ import annotations

import numpy as np

from envhub_sokoban.board import Board

TILE = 16

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = range(7)

_FLOOR_RGB = (238, 232, 213)
_WALL_RGB = (96, 86, 80)
_MORTAR_RGB = (64, 56, 52)
_TARGET_RGB = (220, 50, 47)
_BOX_RGB = (181, 137, 0)
_BOX_EDGE_RGB = (110, 80, 10)
_BOX_DONE_RGB = (133, 153, 0)
_BOX_DONE_EDGE_RGB = (70, 90, 0)
_PLAYER_RGB = (38, 139, 210)
_PLAYER_EDGE_RGB = (7, 54, 66)


def _tiles() -> np.ndarray:
    """The seven tiles, shape ``(7, TILE, TILE, 3)``."""
    y, x = np.mgrid[0:TILE, 0:TILE]
    cy = cx = (TILE - 1) / 2
    radius = np.hypot(y - cy, x - cx)
    tiles = np.empty((7, TILE, TILE, 3), dtype=np.uint8)
    floor = np.empty((TILE, TILE, 3), dtype=np.uint8)
    floor[:] = _FLOOR_RGB

    wall = np.empty_like(floor)
    wall[:] = _WALL_RGB
    mortar = (y % 8 == 7) | ((x + 4 * ((y // 8) % 2)) % 8 == 7)
    wall[mortar] = _MORTAR_RGB

    target = floor.copy()
    target[(radius >= 3.5) & (radius <= 5.5)] = _TARGET_RGB

    def box(fill: tuple[int, int, int], edge: tuple[int, int, int]) -> np.ndarray:
        tile = floor.copy()
        inside = (y >= 2) & (y <= TILE - 3) & (x >= 2) & (x <= TILE - 3)
        border = inside & ((y <= 3) | (y >= TILE - 4) | (x <= 3) | (x >= TILE - 4))
        cross = inside & ((np.abs(y - x) <= 0.5) | (np.abs(y + x - (TILE - 1)) <= 0.5))
        tile[inside] = fill
        tile[border | cross] = edge
        return tile

    def player(base: np.ndarray) -> np.ndarray:
        tile = base.copy()
        tile[radius <= 5.5] = _PLAYER_EDGE_RGB
        tile[radius <= 4.2] = _PLAYER_RGB
        return tile

    tiles[WALL] = wall
    tiles[FLOOR] = floor
    tiles[TARGET] = target
    tiles[BOX] = box(_BOX_RGB, _BOX_EDGE_RGB)
    tiles[BOX_ON_TARGET] = box(_BOX_DONE_RGB, _BOX_DONE_EDGE_RGB)
    tiles[PLAYER] = player(floor)
    # The target ring stays visible around the player standing on it.
    tiles[PLAYER_ON_TARGET] = player(target)
    tiles[PLAYER_ON_TARGET][(radius > 5.5) & (radius <= 6.8)] = _TARGET_RGB
    return tiles


TILES = _tiles()


def unpack(mask: int, n: int) -> np.ndarray:
    """The first ``n`` bits of ``mask`` as a bool array (bit ``i`` at index ``i``)."""
    packed = np.frombuffer(mask.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(packed, bitorder="little")[:n].astype(bool)


def tile_ids(board: Board) -> np.ndarray:
    """The tile kind of every cell, shape ``(height, width)``."""
    n = board.height * board.width
    walls, targets, boxes = unpack(board.walls, n), unpack(board.targets, n), unpack(board.boxes, n)
    ids = np.full(n, FLOOR, dtype=np.intp)
    ids[targets] = TARGET
    ids[boxes] = BOX
    ids[boxes & targets] = BOX_ON_TARGET
    ids[walls] = WALL
    ids[board.player] = PLAYER_ON_TARGET if targets[board.player] else PLAYER
    return ids.reshape(board.height, board.width)


def board_to_rgb(board: Board) -> np.ndarray:
    """The board as an ``(height * 16, width * 16, 3)`` uint8 picture."""
    picture = TILES[tile_ids(board)]  # (height, width, TILE, TILE, 3)
    return np.ascontiguousarray(picture.transpose(0, 2, 1, 3, 4).reshape(board.height * TILE, board.width * TILE, 3))
