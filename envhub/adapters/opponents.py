"""Who plays the seats the model does not: opponent policies for the PettingZoo adapter.

An opponent is any :class:`envhub.generation.Policy`: an object with ``act(env, observation) ->
str``. It is handed a seat view (:class:`envhub.adapters.seats.SeatView`: the legal moves,
the expert and the PettingZoo env, from its seat's side) and the same kind of observation text the
model reads, so a model-backed policy plays the opponent exactly as it would play its own seat.

Opponents are named by:

- ``"random"`` or ``"expert"`` (the env's expert), built in;
- ``"self"``: no opponent, every seat's turn is handed to the caller (self-play);
- a factory (a policy class, say) called as ``factory(seed=...)``, or its ``"package.module:name"``;
- a policy object (or its ``"package.module:name"``), used as it is.

Built-in and factory opponents are rebuilt at every reset with a seed drawn from the env's
``np_random``, so the same env seed gives the same game in any process. A policy object keeps its
own randomness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from envhub.actions import match_action, parse_reply
from envhub.adapters.references import load_reference
from envhub.error import AdapterError
from envhub.generation import ExpertPolicy, Policy, RandomPolicy

SELF_PLAY = "self"

#: Opponents selectable by name: factories called with ``seed=``.
OPPONENTS: dict[str, Callable[..., Policy]] = {
    "random": RandomPolicy,
    "expert": lambda seed=None: ExpertPolicy(),
}


def opponent_factory(opponent: Any) -> Callable[[int], Policy] | None:
    """Turn an opponent spec into ``factory(seed) -> policy``; None for self-play.

    Raises:
        AdapterError: for a spec that is none of the forms in the module docstring.
    """
    if opponent == SELF_PLAY:
        return None
    if isinstance(opponent, str):
        opponent = OPPONENTS.get(opponent) or load_reference(opponent, "opponent")
    if not isinstance(opponent, type) and callable(getattr(opponent, "act", None)):
        return lambda seed: opponent
    if callable(opponent):
        return lambda seed: opponent(seed=seed)
    raise AdapterError(
        f"opponent={opponent!r} must be 'random', 'expert', 'self', a 'package.module:name' string, "
        "a factory taking seed= (such as a policy class), or an object with act(env, observation) -> str"
    )


def opponent_move(reply: Any, legal: Sequence[str], rng: np.random.Generator) -> tuple[str, bool]:
    """Map an opponent's reply to a legal move.

    The reply may be a bare action or an ``<answer>...</answer>`` reply. A reply that names no
    legal move is replaced by a uniformly random legal move, so a weak model-backed opponent can
    never stall or crash the game.

    Returns:
        The legal move and whether it was the opponent's own choice.
    """
    if isinstance(reply, str):
        found = match_action(reply, legal)
        if found is None:
            parsed = parse_reply(reply, legal)
            found = parsed.action if parsed.valid else None
        if found is not None:
            return found, True
    return legal[int(rng.integers(len(legal)))], False
