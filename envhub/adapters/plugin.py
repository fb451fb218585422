"""The built-in plugin ``envhub-adapters``: Gymnasium and PettingZoo games as envhub environments.

Every registration names its functions as ``module:name`` strings, so ``envhub list`` works
without PettingZoo installed; making a PettingZoo game without it says what to install.
"""

from __future__ import annotations

from typing import Any

from envhub import hookimpl
from envhub.adapters import blackjack, cliffwalking, connect_four, taxi, tictactoe

GYMNASIUM = "envhub.adapters.gymnasium_text:GymnasiumTextEnv"
PETTINGZOO = "envhub.adapters.pettingzoo:PettingZooTextEnv"
PLANNER = "envhub.adapters.planning:TablePlanner"

#: Gymnasium's own time limit for Taxi.
TAXI_TIME_LIMIT = 200


def _tictactoe(**kwargs: Any) -> dict[str, Any]:
    return {
        "env_fn": "pettingzoo.classic.tictactoe.tictactoe:env",
        "board": "envhub.adapters.tictactoe:board_text",
        "action_names": list(tictactoe.ACTION_NAMES),
        "seat_labels": tictactoe.SEAT_LABELS,
        "expert": "envhub.adapters.tictactoe:expert",
        "instructions": tictactoe.INSTRUCTIONS,
        **kwargs,
    }


def _connect_four(**kwargs: Any) -> dict[str, Any]:
    return {
        "env_fn": "pettingzoo.classic.connect_four.connect_four:env",
        "board": "envhub.adapters.connect_four:board_text",
        "action_names": list(connect_four.ACTION_NAMES),
        "seat_labels": connect_four.SEAT_LABELS,
        "instructions": connect_four.INSTRUCTIONS,
        **kwargs,
    }


@hookimpl
def register_envs(register: Any) -> None:
    """Register the Gymnasium and PettingZoo adapters."""
    register(
        "gym/Taxi-v3",
        GYMNASIUM,
        kwargs={
            # Gymnasium's TaxiEnv class with its default (v3) rules: Gymnasium >= 1.3 registers
            # the same dynamics as Taxi-v4 and deprecates the v3 id.
            "entry_point": "gymnasium.envs.toy_text.taxi:TaxiEnv",
            "action_names": list(taxi.ACTION_NAMES),
            "observation_to_text": "envhub.adapters.taxi:observation_to_text",
            "expert": PLANNER,
            "instructions": taxi.INSTRUCTIONS,
        },
        max_turns=TAXI_TIME_LIMIT,
        description="Gymnasium Taxi: pick up and drop off a passenger, 200 turns (Gymnasium's limit); value-iteration expert",
    )
    register(
        "gym/CliffWalking-v1",
        GYMNASIUM,
        kwargs={
            "gym_id": "CliffWalking-v1",
            "action_names": list(cliffwalking.ACTION_NAMES),
            "observation_to_text": "envhub.adapters.cliffwalking:observation_to_text",
            "success": "envhub.adapters.cliffwalking:reached_goal",
            "expert": PLANNER,
            "instructions": cliffwalking.INSTRUCTIONS,
        },
        max_turns=50,
        description="Gymnasium CliffWalking: walk to the goal along a cliff, 50 turns; value-iteration expert",
    )
    register(
        "gym/Blackjack-v1",
        GYMNASIUM,
        kwargs={
            "gym_id": "Blackjack-v1",
            "action_names": list(blackjack.ACTION_NAMES),
            "observation_to_text": "envhub.adapters.blackjack:observation_to_text",
            "expert": "envhub.adapters.blackjack:expert",
            "instructions": blackjack.INSTRUCTIONS,
        },
        max_turns=10,
        description="Gymnasium Blackjack (Sutton & Barto rules), 10 turns; success = a win; exact DP expert",
    )
    register(
        "pettingzoo/TicTacToe-v0",
        PETTINGZOO,
        kwargs=_tictactoe(seat="random", opponent="envhub.adapters.tictactoe:MinimaxPolicy", success="not_lose"),
        max_turns=10,
        description="tic-tac-toe as X or O against perfect play; success = not losing (needs envhub[pettingzoo])",
    )
    register(
        "pettingzoo/TicTacToeSelfPlay-v0",
        PETTINGZOO,
        kwargs=_tictactoe(opponent="self"),
        max_turns=20,
        description="tic-tac-toe, the model plays both seats; success = the last mover won (needs envhub[pettingzoo])",
    )
    register(
        "pettingzoo/ConnectFour-v0",
        PETTINGZOO,
        kwargs=_connect_four(seat="random", opponent="envhub.adapters.connect_four:HeuristicPolicy"),
        max_turns=30,
        description="Connect Four as X or O against a win/block heuristic; success = a win (needs envhub[pettingzoo])",
    )
    register(
        "pettingzoo/ConnectFourSelfPlay-v0",
        PETTINGZOO,
        kwargs=_connect_four(opponent="self"),
        max_turns=60,
        description="Connect Four, the model plays both seats; success = the last mover won (needs envhub[pettingzoo])",
    )
