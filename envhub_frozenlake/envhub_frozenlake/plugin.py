"""Registers the FrozenLake environments with envhub."""

from envhub import hookimpl

ENTRY = "envhub_frozenlake.env:FrozenLakeTextEnv"

#: (name, map size, slippery, turn limit, description); every map is random from the seed, each tile frozen with probability p=0.8 (else a hole).
VARIANTS = (
    ("FrozenLake-v0", 4, True, 20, "4x4 random map, slippery ice, 80% of tiles frozen (p=0.8), 20 turns (ROLL/RAGEN setting)"),
    ("FrozenLakeNotSlippery-v0", 4, False, 20, "4x4 random map, deterministic moves, 80% of tiles frozen (p=0.8), 20 turns"),
    ("FrozenLake8x8-v0", 8, True, 100, "8x8 random map, slippery ice, 80% of tiles frozen (p=0.8), 100 turns"),
    ("FrozenLake8x8NotSlippery-v0", 8, False, 50, "8x8 random map, deterministic moves, 80% of tiles frozen (p=0.8), 50 turns"),
)


@hookimpl
def register_envs(register):
    for name, size, slippery, turns, description in VARIANTS:
        register(
            f"frozenlake/{name}",
            ENTRY,
            kwargs={"size": size, "p": 0.8, "is_slippery": slippery},
            max_turns=turns,
            description=description,
        )
