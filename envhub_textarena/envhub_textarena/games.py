"""Which TextArena games envhub registers, under which ids, and which it cannot offer and why.

Every single-player variant TextArena 0.7.4 registers (its default version: the ``-raw`` and
``-train`` versions differ only in TextArena's observation wrappers, which envhub replaces) is
either in :data:`SINGLE_PLAYER` or in :data:`UNAVAILABLE` with the reason; ``tests/test_textarena.py``
checks that against TextArena's own registry. TextArena's ``Game-v0-variant`` becomes envhub's
``textarena/Game-variant-v0``.
"""

from __future__ import annotations

import dataclasses

#: Games whose legal moves envhub can list, and how: ``module:function(ta_env, player_id)``.
LEGAL = {
    "TowerOfHanoi": "envhub_textarena.solvers:hanoi_moves",
    "GuessTheNumber": "envhub_textarena.solvers:guess_moves",
    "TicTacToe": "envhub_textarena.solvers:tictactoe_moves",
    "Nim": "envhub_textarena.solvers:nim_moves",
}

#: Games with a cheap exact solver: ``module:function(ta_env, player_id) -> move``.
EXPERTS = {
    "TowerOfHanoi": "envhub_textarena.solvers:hanoi_expert",
    "GuessTheNumber": "envhub_textarena.solvers:guess_expert",
    "TicTacToe": "envhub_textarena.solvers:tictactoe_expert",
    "Nim": "envhub_textarena.solvers:nim_expert",
}

#: Games whose full ``envhub check`` takes minutes on 2 cores, with why: the test suite leaves them
#: to the measured run in docs/environments.md (they pass it).
SLOW_CHECK = {
    "RushHour": "each reset searches for a solvable level by breadth-first search, up to 20 times (~1 s each)",
    "Sokoban": "each reset generates a level by reverse play (~0.25 s, minutes for the medium size)",
    "Set": "each move, refused ones included, takes ~80 ms in TextArena's Set",
}

#: envhub turn limit per game when TextArena sets none of its own (its own limit, plus room for
#: rejected replies, is used otherwise).
DEFAULT_TURNS = 100


@dataclasses.dataclass(frozen=True)
class Game:
    """One TextArena variant as envhub registers it.

    Attributes:
        ta_id: TextArena's id, e.g. ``Sudoku-v0-easy``.
        max_turns: envhub's turn limit (rejected replies count; TextArena's own limit counts
            only accepted moves and ends the game by itself).
    """

    ta_id: str
    max_turns: int

    @property
    def family(self) -> str:
        """The game's name without version and variant: ``Sudoku``."""
        return self.ta_id.split("-v", 1)[0]

    @property
    def envhub_id(self) -> str:
        """``textarena/Sudoku-easy-v0`` for ``Sudoku-v0-easy``."""
        return envhub_id(self.ta_id)


def envhub_id(ta_id: str) -> str:
    """Map TextArena's ``Name-vN[-variant]`` to envhub's ``textarena/Name[-variant]-vN``."""
    name, _, rest = ta_id.partition("-v")
    version, _, variant = rest.partition("-")
    return f"textarena/{name}{'-' + variant if variant else ''}-v{version}"


def _turns(game_limit: int | None) -> int:
    return DEFAULT_TURNS if game_limit is None else 2 * game_limit


_SINGLE = {
    # TextArena id: its own turn limit (None where it has none)
    **{f"2048-v0{v}": None for v in ("-ultra-easy", "-mega-easy", "-super-easy", "-very-easy", "-easy", "", "-hard", "-very-hard", "-extreme", "-3x3", "-5x5", "-6x6", "-8x8", "-10x10")},
    "Bandit-v0": 20, "Bandit-v0-hard": 40,
    "Blackjack-v0": None, "Blackjack-v0-long": None,
    "Countdown-v0": None,
    "Crosswords-v0": 30, "Crosswords-v0-hardcore": 30,
    "Cryptarithm-v0": 100,
    "FifteenPuzzle-v0": 200,
    "FrozenLake-v0": None, "FrozenLake-v0-random": None, "FrozenLake-v0-hardcore": None,
    "GuessTheNumber-v0": 10, "GuessTheNumber-v0-hardcore": 10,
    "LightsOut-v0": 20,
    "LogicPuzzle-v0": None, "LogicPuzzle-v0-hard": None,
    "Mastermind-v0": 20, "Mastermind-v0-hard": 30, "Mastermind-v0-extreme": 50,
    "Minesweeper-v0": None, "Minesweeper-v0-small": None, "Minesweeper-v0-medium": None, "Minesweeper-v0-hard": None,
    "PegJump-v0": None,
    "RushHour-v0": None,
    "Secretary-v0": None, "Secretary-v0-long": None,
    "Set-v0": None,
    "Slitherlink-v0": None,
    "Sokoban-v0": None, "Sokoban-v0-medium": None,
    **{f"Sudoku-v0{v}": None for v in ("-very-easy", "-easy", "", "-medium", "-hard")},
    "ThreeCardMonte-v0": None,
    "TowerOfHanoi-v0": 14, "TowerOfHanoi-v0-medium": 30, "TowerOfHanoi-v0-hard": 62,
    "TowerOfHanoi-v0-hardcore": 126, "TowerOfHanoi-v0-extreme": 254,
}

#: Every single-player variant envhub registers.
SINGLE_PLAYER: tuple[Game, ...] = tuple(Game(ta_id, _turns(limit)) for ta_id, limit in _SINGLE.items())

_NLTK = "needs the nltk 'words' corpus, which TextArena downloads at run time (nltk.download); no PyPI package ships it"
_GAMEMASTER = "its game master is an LLM reached through OpenRouter (network and an API key)"
_PY312 = "its module does not parse on Python 3.11 (nested f-string quotes need Python 3.12)"

#: TextArena single-player variants envhub does not register, with the reason.
UNAVAILABLE: dict[str, str] = {
    "GuessWho-v0": _GAMEMASTER,
    "TwentyQuestions-v0": _GAMEMASTER,
    "TwentyQuestions-v0-hardcore": _GAMEMASTER,
    "Hangman-v0": _NLTK,
    "Hangman-v0-hardcore": _NLTK,
    "WordLadder-v0": _NLTK,
    "WordLadder-v0-medium": _NLTK,
    "WordLadder-v0-hard": _NLTK,
    "Wordle-v0": _NLTK + " (and its part-of-speech tagger)",
    "Wordle-v0-hardcore": _NLTK + " (and its part-of-speech tagger)",
    "Wordle-v0-long": _NLTK + " (and its part-of-speech tagger)",
    "Wordle-v0-long-hardcore": _NLTK + " (and its part-of-speech tagger)",
    "WordSearch-v0": _NLTK,
    "WordSearch-v0-hardcore": _NLTK,
    "Klondike-v0": _PY312,
    "UltimateTexasHoldem-v0": _PY312,
}


@dataclasses.dataclass(frozen=True)
class Duel:
    """A two-player game registered against an opponent and in self-play.

    Attributes:
        ta_id: TextArena's id.
        opponent: the rule-based opponent's ``module:name`` (a policy factory taking ``seed=``).
        max_turns: envhub's turn limit for one seat; self-play gets twice as many.
        opponent_words: how ``envhub list`` names the opponent.
    """

    ta_id: str
    opponent: str
    max_turns: int
    opponent_words: str


#: Two-player games with listed legal moves, an exact expert and a rule-based opponent.
TWO_PLAYER: tuple[Duel, ...] = (
    Duel("TicTacToe-v0", "random", 10, "a random player (minimax is the expert)"),
    Duel("Nim-v0", "expert", 15, "perfect play (nim-sum)"),
    Duel("Nim-v0-medium", "expert", 20, "perfect play (nim-sum)"),
    Duel("Nim-v0-large", "expert", 40, "perfect play (nim-sum)"),
)
