"""A TextWorld text adventure as an envhub text environment.

Each registered id is a pool of ``num_games`` games from one TextWorld challenge and its settings
(game seeds ``first_seed ...``); ``reset(seed=...)`` draws the game from ``np_random``. Games are
generated and compiled on first use and cached on disk (:mod:`envhub_textworld.generator`).

- Observations are TextWorld's feedback (its banner and the interpreter's prompt lines removed).
- ``valid_actions()`` are the admissible commands; a command outside them is an invalid action.
- ``expert_action()`` is the first command of TextWorld's winning policy from the current state,
  which TextWorld re-plans after every command (so it follows the agent off the walkthrough), or
  None where no winning policy remains (the game is lost or over).
- The reward is the score gained by the command (TextWorld's intermediate rewards); success is
  TextWorld's ``won``; the state key is a digest of the game's logical facts.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from envhub.core import TextEnv, stable_key
from envhub.error import AdapterError, MissingDependency
from envhub_textworld.generator import INSTALL, game_file

#: Lines with no letter at all (TextWorld's ASCII-art banner), and the interpreter's end-of-game prompt.
_BANNER = re.compile(r"^[^A-Za-z\n]+$\n?", re.MULTILINE)
_ENDING = re.compile(r"\n*Would you like to RESTART.*\Z", re.DOTALL)
_PROMPT = re.compile(r"^\s*>.*$", re.MULTILINE)


def clean_feedback(text: str) -> str:
    """TextWorld's feedback without its banner, end-of-game question and prompt lines."""
    text = _ENDING.sub("", text)
    text = _BANNER.sub("", text)
    text = _PROMPT.sub("", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


class TextWorldEnv(TextEnv):
    """A pool of TextWorld games from one challenge.

    Args:
        challenge: ``"tw-simple"`` or ``"tw-cooking"`` (any challenge TextWorld registers).
        settings: the challenge's difficulty settings.
        num_games: how many games the pool holds.
        first_seed: the game seed of the pool's first game (pools with other first seeds are
            disjoint sets of games, e.g. for held-out evaluation).
        render_mode: ``"ansi"`` or None.

    Raises:
        MissingDependency: TextWorld is not installed.
        AdapterError: a setting out of range.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        challenge: str = "tw-simple",
        *,
        settings: dict[str, Any] | None = None,
        num_games: int = 4,
        first_seed: int = 0,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        try:
            import textworld
        except ImportError as exc:
            raise MissingDependency(f"TextWorld is not installed: {INSTALL}") from exc
        if not isinstance(num_games, int) or num_games < 1:
            raise AdapterError(f"num_games must be a positive integer, got {num_games!r}")
        self.challenge = challenge
        self.settings = dict(settings or {})
        self.seeds = list(range(first_seed, first_seed + num_games))
        self._infos = textworld.EnvInfos(
            admissible_commands=True, policy_commands=True, won=True, lost=True, score=True,
            max_score=True, facts=True, objective=True,
        )
        self._games: dict[int, Any] = {}
        self._state: Any = None
        self.game_seed: int | None = None
        self.instructions = (
            "You play a TextWorld text adventure. Each observation describes what you see and what "
            "happened; your goal is in the first one. Reply with one command from the admissible "
            "commands listed (e.g. 'open fridge', 'go east', 'take apple from counter')."
        )

    def _game(self, seed: int) -> Any:
        if seed not in self._games:
            import textworld

            story = game_file(self.challenge, self.settings, seed, batch=self.seeds)
            self._games[seed] = textworld.start(str(story), request_infos=self._infos)
        return self._games[seed]

    # ------------------------------------------------------------------ TextEnv hooks

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.game_seed = self.seeds[int(self.np_random.integers(len(self.seeds)))]
        self._state = self._game(self.game_seed).reset()
        info = {"game_seed": self.game_seed, "score": self._state.score, "max_score": self._state.max_score}
        return clean_feedback(self._state.feedback), info

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        before = self._state.score
        self._state, _, done = self._game(self.game_seed).step(action)
        gained = float(self._state.score - before)
        over = bool(done or self._state.won or self._state.lost)
        info = {"score": self._state.score, "max_score": self._state.max_score, "won": bool(self._state.won), "lost": bool(self._state.lost)}
        return clean_feedback(self._state.feedback), gained, over, info

    def valid_actions(self) -> list[str]:
        """The admissible commands now (empty once the game is over)."""
        if self._state is None or self._state.won or self._state.lost:
            return []
        return list(self._state.admissible_commands or [])

    def expert_action(self) -> str | None:
        """The next command of TextWorld's winning policy from here, or None without one."""
        if self._state is None or self._state.won or self._state.lost:
            return None
        policy = self._state.policy_commands or []
        return policy[0] if policy and policy[0] in self.valid_actions() else None

    def state_key(self) -> str:
        """The game seed and a digest of the world's logical facts."""
        facts = sorted(str(fact) for fact in (self._state.facts or [])) if self._state is not None else []
        digest = stable_key("\n".join(facts), 32)
        return f"{self.game_seed}:{digest}"

    def is_success(self) -> bool:
        """Whether TextWorld says the game is won."""
        return bool(self._state is not None and self._state.won)

    def render_text(self) -> str:
        """The latest feedback and the score."""
        if self._state is None:
            return ""
        return f"{clean_feedback(self._state.feedback)}\n[score {self._state.score}/{self._state.max_score}]"

    def close(self) -> None:
        """Close every started game."""
        for game in self._games.values():
            game.close()
        self._games.clear()
