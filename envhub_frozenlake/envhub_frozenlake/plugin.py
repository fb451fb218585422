"""Registers the FrozenLake environments with envhub."""

from envhub import hookimpl

ENTRY = "envhub_frozenlake.env:FrozenLakeTextEnv"


@hookimpl
def register_envs(register):
    register(
        "frozenlake/FrozenLake-v0",
        ENTRY,
        kwargs={"size": 4, "p": 0.8, "is_slippery": True},
        max_turns=20,
        description="4x4 random map, slippery ice, p=0.8, 20 turns (ROLL/RAGEN setting)",
    )
    register(
        "frozenlake/FrozenLakeNotSlippery-v0",
        ENTRY,
        kwargs={"size": 4, "p": 0.8, "is_slippery": False},
        max_turns=20,
        description="4x4 random map, deterministic moves, p=0.8, 20 turns",
    )
    register(
        "frozenlake/FrozenLake8x8-v0",
        ENTRY,
        kwargs={"size": 8, "p": 0.8, "is_slippery": True},
        max_turns=100,
        description="8x8 random map, slippery ice, p=0.8, 100 turns",
    )
    register(
        "frozenlake/FrozenLake8x8NotSlippery-v0",
        ENTRY,
        kwargs={"size": 8, "p": 0.8, "is_slippery": False},
        max_turns=50,
        description="8x8 random map, deterministic moves, p=0.8, 50 turns",
    )
