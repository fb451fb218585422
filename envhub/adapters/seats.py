"""Per-seat records of a multi-player game: who moved what, and what each move earned.

A PettingZoo game hands rewards to every seat after every move. A seat's move earns what that
seat receives from that move until its next one (PettingZoo's "reward since you last acted"),
so the loser's last move carries the -1 that the winner's move caused. The records give the
trajectories of every seat, the opponent's included, which is what self-play training needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

class SeatView:
    """A multi-player adapter seen from one seat: what an opponent policy is handed as its ``env``.

    It answers the calls policies make on an env (``valid_actions``, ``expert_action``, ``spec``,
    ``instructions``) for its seat, through the adapter's ``legal_for(seat)`` and
    ``expert_for(seat)``. Each adapter's subclass adds what its scripted opponents need.
    """

    def __init__(self, env: Any, seat: Any):
        self._env = env
        self.seat = seat

    @property
    def spec(self) -> Any:
        """The adapter's spec."""
        return self._env.spec

    @property
    def instructions(self) -> str:
        """The game's rules."""
        return self._env.instructions

    def valid_actions(self) -> list[str] | None:
        """The seat's legal moves now (empty when it is not the seat's turn)."""
        return self._env.legal_for(self.seat)

    def expert_action(self) -> str | None:
        """The expert's move for the seat, or None."""
        return self._env.expert_for(self.seat)


#: Outcome of a finished game for one seat, from its total reward.
WIN, LOSS, DRAW = "win", "loss", "draw"


def outcome_of(total_reward: float) -> str:
    """``"win"`` for a positive total, ``"loss"`` for a negative one, else ``"draw"``."""
    return WIN if total_reward > 0 else LOSS if total_reward < 0 else DRAW


@dataclasses.dataclass
class SeatTurn:
    """One move of one seat.

    Attributes:
        observation: the text the seat saw before moving.
        action: the legal action it played.
        reward: what the seat received from this move until its next move (or the game's end).
    """

    observation: str
    action: str
    reward: float = 0.0


@dataclasses.dataclass
class SeatTrajectory:
    """Every move of one seat in one game.

    Attributes:
        seat: the PettingZoo agent name.
        played_by: ``"model"`` (moves came through ``step``) or ``"opponent"`` (the opponent policy).
        turns: the seat's moves in order.
        total_reward: everything the seat received in the game.
        outcome: ``"win"``, ``"loss"`` or ``"draw"`` once the game is over, else None.
    """

    seat: str
    played_by: str
    turns: list[SeatTurn]
    total_reward: float
    outcome: str | None


class SeatLedger:
    """Accumulates the moves and rewards of every seat during one game."""

    def __init__(self, seats: Sequence[str]):
        self.turns: dict[str, list[SeatTurn]] = {seat: [] for seat in seats}
        self.totals: dict[str, float] = {seat: 0.0 for seat in seats}
        self.moves: list[tuple[str, str]] = []

    def record(self, seat: str, observation: str, action: str) -> None:
        """Note that ``seat`` played ``action`` after seeing ``observation``."""
        self.turns[seat].append(SeatTurn(observation, action))
        self.moves.append((seat, action))

    def credit(self, rewards: Mapping[str, float]) -> None:
        """Add one step's rewards to each seat's total and to its latest move."""
        for seat, reward in rewards.items():
            if seat not in self.totals:
                continue
            self.totals[seat] += float(reward)
            if self.turns[seat]:
                self.turns[seat][-1].reward += float(reward)

    def moves_since(self, seat: str) -> list[tuple[str, str]]:
        """The other seats' moves since ``seat`` last moved (all moves if it never has)."""
        last = max((i for i, (who, _) in enumerate(self.moves) if who == seat), default=-1)
        return self.moves[last + 1 :]

    def trajectories(self, played_by: Mapping[str, str], over: bool) -> dict[str, SeatTrajectory]:
        """One trajectory per seat; outcomes only when the game is ``over``."""
        return {
            seat: SeatTrajectory(
                seat=seat,
                played_by=played_by[seat],
                turns=[dataclasses.replace(turn) for turn in turns],
                total_reward=self.totals[seat],
                outcome=outcome_of(self.totals[seat]) if over else None,
            )
            for seat, turns in self.turns.items()
        }
