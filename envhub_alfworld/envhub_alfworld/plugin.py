"""Registers ALFWorld with envhub: the generated tasks always, the official splits where
``$ALFWORLD_DATA`` holds them (alfworld is imported only when an env is made)."""

from __future__ import annotations

from typing import Any

from envhub import hookimpl
from envhub_alfworld.tasks import DOWNLOAD, data_root

ENTRY = "envhub_alfworld.env:ALFWorldEnv"

#: verl-agent's and GiGPO's turn limit for ALFWorld.
TURNS = 50

#: (id, split, description) of the official games.
OFFICIAL = (
    ("alfworld/ALFWorld-v0", "train", "ALFWorld's training games (3,553 tasks, 6 types; movable-receptacle games dropped)"),
    ("alfworld/ALFWorldEvalInDistribution-v0", "eval_in_distribution", "ALFWorld's valid_seen games (140): seen rooms"),
    ("alfworld/ALFWorldEvalOutOfDistribution-v0", "eval_out_of_distribution", "ALFWorld's valid_unseen games (134): unseen rooms"),
)


@hookimpl
def register_envs(register: Any) -> None:
    """The generated tasks, and the official splits when their data is present."""
    register(
        "alfworld/ALFWorldGenerated-v0",
        ENTRY,
        kwargs={"source": "generated"},
        max_turns=TURNS,
        description=f"ALFWorld tasks of all six types built offline from ALFRED's floor plans; {TURNS} turns; planner expert",
    )
    if data_root() is None:
        return
    for env_id, split, description in OFFICIAL:
        register(env_id, ENTRY, kwargs={"source": "official", "split": split, "expert": "handcoded"}, max_turns=TURNS,
                 description=f"{description}; {TURNS} turns; ALFWorld's hand-coded expert")


@hookimpl
def unavailable_envs() -> dict[str, str]:
    """The official splits, while their data is not downloaded."""
    if data_root() is not None:
        return {}
    return {env_id: f"ALFWorld's games are not downloaded (ALFWORLD_DATA): {DOWNLOAD}" for env_id, _, _ in OFFICIAL}
