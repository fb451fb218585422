"""Registers TextArena's games with envhub (TextArena is imported only when a game is made)."""

from __future__ import annotations

from typing import Any

from envhub import hookimpl
from envhub_textarena.games import EXPERTS, LEGAL, SINGLE_PLAYER, TWO_PLAYER, UNAVAILABLE, envhub_id

ENTRY = "envhub_textarena.env:TextArenaEnv"


def _solvers(family: str) -> dict[str, Any]:
    return {key: table[family] for key, table in (("legal", LEGAL), ("expert", EXPERTS)) if family in table}


@hookimpl
def register_envs(register: Any) -> None:
    """One id per single-player variant, and each two-player game against its opponent and in self-play."""
    for game in SINGLE_PLAYER:
        solvers = _solvers(game.family)
        expert = "; exact expert" if "expert" in solvers else ""
        register(
            game.envhub_id,
            ENTRY,
            kwargs={"game": game.ta_id, **solvers},
            max_turns=game.max_turns,
            description=f"TextArena {game.ta_id}, {game.max_turns} turns; success = the game won{expert}",
        )
    for duel in TWO_PLAYER:
        family = duel.ta_id.split("-v", 1)[0]
        base = envhub_id(duel.ta_id)
        common = {"game": duel.ta_id, "num_players": 2, **_solvers(family)}
        register(
            base,
            ENTRY,
            kwargs={**common, "seat": "random", "opponent": duel.opponent},
            max_turns=duel.max_turns,
            description=f"TextArena {duel.ta_id} as either player against {duel.opponent_words}; success = a win",
        )
        register(
            envhub_id(duel.ta_id.replace(family, f"{family}SelfPlay", 1)),
            ENTRY,
            kwargs={**common, "opponent": "self"},
            max_turns=2 * duel.max_turns,
            description=f"TextArena {duel.ta_id}, the model plays both players; success = the last mover won",
        )


@hookimpl
def unavailable_envs() -> dict[str, str]:
    """TextArena's single-player variants that cannot run offline here, with the reason."""
    return {envhub_id(ta_id): f"TextArena's {ta_id}: {reason}" for ta_id, reason in UNAVAILABLE.items()}
