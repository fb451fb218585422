"""Registers TextWorld's generated games with envhub (TextWorld is imported only when a game is made)."""

from __future__ import annotations

from typing import Any

from envhub import hookimpl

ENTRY = "envhub_textworld.env:TextWorldEnv"

#: Games per registered pool; pass ``num_games=`` (``envhub run --env-kwarg num_games=100``) for more.
POOL = 2


def _cooking(recipe: int, take: int, go: int, *, cook: bool, cut: bool, drop: bool) -> dict[str, Any]:
    return {"recipe": recipe, "take": take, "go": go, "open": True, "cook": cook, "cut": cut, "drop": drop,
            "recipe_seed": 0, "split": None}


#: (name, challenge, settings, turn limit, description)
VARIANTS = (
    ("Simple-v0", "tw-simple", {"rewards": "dense", "goal": "detailed", "test": False}, 50,
     "tw-simple: find the food and cook it in a six-room house; dense rewards, detailed goal"),
    ("SimpleSparse-v0", "tw-simple", {"rewards": "sparse", "goal": "brief", "test": False}, 50,
     "tw-simple with sparse rewards (only for winning) and a brief goal"),
    ("Cooking-level1-v0", "tw-cooking", _cooking(1, 1, 1, cook=False, cut=False, drop=False), 50,
     "tw-cooking: one ingredient in the kitchen, containers to open, then prepare and eat the meal"),
    ("Cooking-level2-v0", "tw-cooking", _cooking(2, 2, 6, cook=True, cut=False, drop=False), 80,
     "tw-cooking: two ingredients over six rooms, some to cook"),
    ("Cooking-level3-v0", "tw-cooking", _cooking(3, 3, 9, cook=True, cut=True, drop=True), 100,
     "tw-cooking: three ingredients over nine rooms, to cook and cut, with a limited inventory"),
)


@hookimpl
def register_envs(register: Any) -> None:
    """One id per challenge setting; each a pool of generated games."""
    for name, challenge, settings, turns, description in VARIANTS:
        register(
            f"textworld/{name}",
            ENTRY,
            kwargs={"challenge": challenge, "settings": settings, "num_games": POOL},
            max_turns=turns,
            description=f"{description}; {POOL} games (num_games=), {turns} turns; walkthrough expert",
        )
