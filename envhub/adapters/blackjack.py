"""Gymnasium's Blackjack as text, with an exact expert.

Gymnasium's Blackjack has no text rendering; this module gives one (your cards, the dealer's
showing card, and the dealer's hand once the game is over). The expert plays the policy that
maximises the expected reward under Gymnasium's rules (infinite deck, the dealer draws to 17 and
stands on soft 17), computed by dynamic programming over the player's total and usable ace.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium

#: Blackjack's actions in Gymnasium's index order.
ACTION_NAMES = ("Stick", "Hit")
STICK, HIT = 0, 1

#: Card values and their probabilities on Gymnasium's infinite deck (10, J, Q, K all count 10).
CARD_PROBABILITIES: dict[int, float] = {**{v: 1 / 13 for v in range(1, 10)}, 10: 4 / 13}

DEALER_STANDS_AT = 17

INSTRUCTIONS = (
    "You play Blackjack against the dealer. Cards 2-10 count their value, J, Q and K count 10, and "
    "an ace counts 11 unless that would take you over 21, then 1. Hit to take another card; going "
    "over 21 loses at once. Stick to stop: the dealer then draws until reaching 17 or more, and "
    "whoever is closer to 21 without going over wins.\n"
    "Actions: Hit, Stick. Reward: +1 for a win, 0 for a draw, -1 for a loss."
)


def hand_total(cards: list[int]) -> int:
    """The best total of ``cards`` (an ace counts 11 when that does not exceed 21)."""
    raw = sum(cards)
    return raw + 10 if 1 in cards and raw + 10 <= 21 else raw


def _card_names(cards: list[int]) -> str:
    return ", ".join("A" if c == 1 else str(c) for c in cards)


def observation_to_text(env: gymnasium.Env, observation: Any, terminated: bool) -> str:
    """Your cards and total, the dealer's showing card, and the dealer's hand at the end."""
    base = env.unwrapped
    total, showing, usable_ace = (int(x) for x in observation)
    ace = " (with an ace counted as 11)" if usable_ace else ""
    lines = [f"Your cards: {_card_names(base.player)}. Your total: {total}{ace}."]
    if terminated:
        lines.append(f"Dealer's cards: {_card_names(base.dealer)}. Dealer's total: {hand_total(base.dealer)}.")
    else:
        lines.append(f"Dealer shows: {'A' if showing == 1 else showing}.")
    return "\n".join(lines)


def _total(raw: int, ace: bool) -> int:
    return raw + 10 if ace and raw + 10 <= 21 else raw


@functools.cache
def _dealer_final(raw: int, ace: bool) -> dict[int, float]:
    """Distribution of the dealer's final total (0 for bust) from a hand of ``raw`` points."""
    total = _total(raw, ace)
    if total >= DEALER_STANDS_AT:
        return {total if total <= 21 else 0: 1.0}
    out: dict[int, float] = {}
    for card, p in CARD_PROBABILITIES.items():
        for final, q in _dealer_final(raw + card, ace or card == 1).items():
            out[final] = out.get(final, 0.0) + p * q
    return out


@functools.cache
def dealer_outcomes(showing: int) -> dict[int, float]:
    """Distribution of the dealer's final total (0 for bust) given the showing card."""
    out: dict[int, float] = {}
    for hidden, p in CARD_PROBABILITIES.items():
        for final, q in _dealer_final(showing + hidden, showing == 1 or hidden == 1).items():
            out[final] = out.get(final, 0.0) + p * q
    return out


def stick_value(total: int, showing: int) -> float:
    """Expected reward of sticking on ``total`` against the dealer's ``showing`` card."""
    return sum(p * ((total > final) - (total < final)) for final, p in dealer_outcomes(showing).items())


@functools.cache
def _values(raw: int, ace: bool, showing: int) -> tuple[float, float]:
    """(stick value, hit value) of a hand of ``raw`` points that is not bust."""
    hit = 0.0
    for card, p in CARD_PROBABILITIES.items():
        raw_next, ace_next = raw + card, ace or card == 1
        if raw_next > 21:
            hit -= p
        else:
            hit += p * max(_values(raw_next, ace_next, showing))
    return stick_value(_total(raw, ace), showing), hit


def best_action(total: int, showing: int, usable_ace: bool) -> int:
    """The action (``STICK`` or ``HIT``) with the higher expected reward; Stick on ties."""
    raw = total - 10 if usable_ace else total
    stick, hit = _values(raw, bool(usable_ace), showing)
    return HIT if hit > stick else STICK


def expert(env: gymnasium.Env) -> Any:
    """The Blackjack expert factory: returns ``policy(observation, turns_left) -> action index``."""

    def policy(observation: Any, turns_left: int | None) -> int:
        total, showing, usable_ace = (int(x) for x in observation)
        return best_action(total, showing, bool(usable_ace))

    return policy
