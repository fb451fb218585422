"""Any turn-based PettingZoo (AEC) game with action masks as an envhub text environment.

The model plays one seat; the other seats are played by an opponent policy between the model's
turns (see :mod:`envhub.adapters.opponents`). With ``opponent="self"`` every seat's turn is handed
to the caller instead, so one policy (or one model through the manager) plays all seats, and
:meth:`PettingZooTextEnv.seat_trajectories` splits the game into one trajectory per seat.

Legal moves come from the action mask; a move outside it is an invalid action (state unchanged),
never a PettingZoo illegal-move loss or a crash. The text board comes from the env's ``ansi``
rendering or from a ``board(aec_env) -> str`` function you pass; action names are yours to give.
With ``render_mode="rgb_array"`` pictures come from the game's own ``rgb_array`` rendering.

PettingZoo is an optional dependency: ``pip install 'envhub[pettingzoo]'``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from envhub.adapters.opponents import opponent_factory, opponent_move
from envhub.adapters.references import resolve
from envhub.adapters import seats
from envhub.adapters.seats import SeatLedger, SeatTrajectory, outcome_of
from envhub.core import TextEnv, normalize_action
from envhub.error import AdapterError, MissingDependency
from envhub.generation import Policy

PETTINGZOO_INSTALL = "pip install 'envhub[pettingzoo]'"

#: Success criteria by name: a test of the seat's total reward at the end of the game.
SUCCESS_CRITERIA: dict[str, Callable[[float], bool]] = {
    "win": lambda total: total > 0,
    "not_lose": lambda total: total >= 0,
}

#: ``seat`` value that draws the model's seat at every reset.
RANDOM_SEAT = "random"

BoardText = Callable[[Any], str]
Expert = Callable[[Any, str], int]


class SeatView(seats.SeatView):
    """The PettingZoo adapter seen from one seat (:class:`envhub.adapters.seats.SeatView`), which
    also gives scripted opponents the PettingZoo env and the board as the seat sees it."""

    @property
    def aec(self) -> Any:
        """The PettingZoo env."""
        return self._env.aec

    def render_text(self) -> str:
        """The game as the seat sees it."""
        return self._env.text_for(self.seat)


class PettingZooTextEnv(TextEnv):
    """A turn-based PettingZoo game in which the model plays one seat.

    Args:
        env_fn: ``"package.module:function"`` (or a callable) returning a PettingZoo ``AECEnv``.
        env_kwargs: keyword arguments for ``env_fn``.
        board: ``board(aec_env) -> str``, the board as text; default: the env's ``ansi`` rendering.
        action_names: one name per action index.
        seat_labels: how each seat is called in the text (e.g. ``{"player_1": "X"}``).
        seat: the model's seat: an agent name, ``"random"`` (drawn at every reset), or None for
            the first agent.
        opponent: who plays the other seats (see :mod:`envhub.adapters.opponents`), or ``"self"``.
        expert: ``expert(aec_env, seat) -> action index`` for the seat to move, or None.
        success: ``"win"`` or ``"not_lose"``: what counts as success at the end of the game,
            judged for the model's seat (in self-play, for the seat that moved last).
        instructions: the game's rules for the model; default: a generic description.
        render_mode: ``"ansi"``, ``"rgb_array"`` (the game's own pictures; needs ``board``) or None.

    Raises:
        MissingDependency: when PettingZoo (or what the game imports) is not installed.
        AdapterError: when the game cannot be adapted as given; the message says what to pass.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 1}

    def __init__(
        self,
        env_fn: str | Callable[..., Any],
        *,
        env_kwargs: dict[str, Any] | None = None,
        board: str | BoardText | None = None,
        action_names: Sequence[str] | None = None,
        seat_labels: dict[str, str] | None = None,
        seat: str | None = None,
        opponent: str | Policy | Callable[..., Policy] = "random",
        expert: str | Expert | None = None,
        success: str = "win",
        instructions: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        self.source = env_fn if isinstance(env_fn, str) else getattr(env_fn, "__qualname__", repr(env_fn))
        aec_base = _pettingzoo_aec_class(self.source)
        try:
            creator = resolve(env_fn, "env_fn")
        except MissingDependency as exc:
            raise MissingDependency(f"{self.source}: {exc}; install the PettingZoo extra: {PETTINGZOO_INSTALL}") from exc
        kwargs = dict(env_kwargs or {})
        self._board: BoardText | None = resolve(board, "board")
        aec = creator(**kwargs)
        if not isinstance(aec, aec_base):
            raise AdapterError(
                f"{self.source} made a {type(aec).__name__}, not a turn-based PettingZoo AECEnv; "
                "parallel envs have no turns to take (convert with pettingzoo.utils.parallel_to_aec)"
            )
        modes = list(aec.metadata.get("render_modes", []))
        if render_mode == "rgb_array":
            if "rgb_array" not in modes or self._board is None:
                raise AdapterError(
                    f"render_mode='rgb_array' needs {self.source} to render rgb_array (its render modes are {modes}) "
                    "and a board function for the text"
                )
            aec.close()
            aec = creator(**{**kwargs, "render_mode": "rgb_array"})
        elif self._board is None:
            if "ansi" not in modes:
                raise AdapterError(
                    f"{self.source} has no text rendering (its render modes are {modes}); pass "
                    "board='package.module:function' (or a callable) taking the PettingZoo env and "
                    "returning the board as text"
                )
            aec.close()
            aec = creator(**{**kwargs, "render_mode": "ansi"})
            self._board = _ansi_board
        self.aec = aec
        self.seats: tuple[str, ...] = tuple(aec.possible_agents)
        self.action_names = _action_names(self.source, aec, self.seats, action_names)
        # Legal moves are listed numerically when every name is a number (cells, columns).
        numeric = all(name.isdigit() for name in self.action_names)
        self._listing_order = sorted(range(len(self.action_names)), key=lambda i: int(self.action_names[i]) if numeric else i)
        self.labels = {s: (seat_labels or {}).get(s, s) for s in self.seats}
        if seat is not None and seat != RANDOM_SEAT and seat not in self.seats:
            raise AdapterError(f"seat={seat!r} is not a seat of {self.source}; choose one of {list(self.seats)} or 'random'")
        self.seat_choice = seat
        self._expert: Expert | None = resolve(expert, "expert")
        if opponent == "expert" and self._expert is None:
            raise AdapterError("opponent='expert' needs an expert: pass expert='package.module:function'")
        self._opponent_factory = opponent_factory(opponent)
        self.self_play = self._opponent_factory is None
        if success not in SUCCESS_CRITERIA:
            raise AdapterError(f"success={success!r}: choose one of {sorted(SUCCESS_CRITERIA)}")
        self.success = success
        name = aec.metadata.get("name", self.source)
        self.instructions = instructions or (
            f"You play the PettingZoo game {name}. Each observation shows the board and your legal moves; "
            "reply with one legal move."
        )
        self.seat = seat if seat in self.seats else self.seats[0]
        self._opponent: Policy | None = None
        self._fallback_rng = np.random.default_rng(0)
        self._ledger = SeatLedger(self.seats)
        self._last_actor: str | None = None
        self.opponent_fallbacks = 0

    # ------------------------------------------------------------------ seats

    def legal_for(self, seat: str) -> list[str]:
        """The names of ``seat``'s legal moves now: empty unless it is that seat's turn."""
        if self.game_over() or seat != self.aec.agent_selection:
            return []
        mask = self._mask(seat)
        return [self.action_names[i] for i in self._listing_order if mask[i]]

    def expert_for(self, seat: str) -> str | None:
        """The expert's move for ``seat`` when it is that seat's turn, else None."""
        if self._expert is None or not self.legal_for(seat):
            return None
        return self.action_names[int(self._expert(self.aec, seat))]

    def game_over(self) -> bool:
        """Whether the game is over for the model (every seat's game, in self-play)."""
        done = [self._seat_done(s) for s in self.seats]
        return all(done) if self.self_play else done[self.seats.index(self.seat)]

    def text_for(self, seat: str) -> str:
        """The observation ``seat`` reads: its mark, the others' moves since its last one, the
        board, and its legal moves or the result."""
        label = self.labels[seat]
        lines = [f"You play {label}."]
        moves = self._ledger.moves_since(seat)
        if moves:
            lines.append(" ".join(f"{self.labels[who]} played {move}." for who, move in moves))
        lines.append(self._board(self.aec))
        if self.game_over():
            result = {"win": "you won", "loss": "you lost", "draw": "it is a draw"}[outcome_of(self._ledger.totals[seat])]
            lines.append(f"Game over: {result}.")
        elif seat == self.aec.agent_selection:
            lines.append(f"Your legal moves: {', '.join(self.legal_for(seat))}.")
        return "\n".join(lines)

    def seat_trajectories(self) -> dict[str, SeatTrajectory]:
        """Every seat's moves and rewards in the current game (see :mod:`envhub.adapters.seats`)."""
        played_by = {s: "model" if self.self_play or s == self.seat else "opponent" for s in self.seats}
        return self._ledger.trajectories(played_by, self.game_over())

    # ------------------------------------------------------------------ TextEnv hooks

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if self.seat_choice == RANDOM_SEAT:
            self.seat = self.seats[int(self.np_random.integers(len(self.seats)))]
        elif self.seat_choice is not None:
            self.seat = self.seat_choice
        self.aec.reset(seed=int(self.np_random.integers(2**31 - 1)))
        opponent_seed, fallback_seed = (int(x) for x in self.np_random.integers(2**31 - 1, size=2))
        self._opponent = None if self._opponent_factory is None else self._opponent_factory(opponent_seed)
        self._fallback_rng = np.random.default_rng(fallback_seed)
        self._ledger = SeatLedger(self.seats)
        self._last_actor = None
        self.opponent_fallbacks = 0
        self._mask(self.aec.agent_selection)
        self._let_opponents_play()
        if self.game_over():
            raise AdapterError(f"{self.source}: the game ended before seat {self.seat} moved; choose another seat")
        to_move = self.aec.agent_selection
        return self.text_for(self._perspective()), {"seat": to_move, "to_move": to_move}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        actor = self.aec.agent_selection
        before = dict(self._ledger.totals)
        self._play(actor, self._observation or "", self.action_names.index(action))
        self._let_opponents_play()
        step_rewards = {s: self._ledger.totals[s] - before[s] for s in self.seats}
        over = self.game_over()
        extra = {"seat": actor, "to_move": None if over else self.aec.agent_selection, "seat_rewards": step_rewards}
        return self.text_for(self._perspective()), step_rewards[actor], over, extra

    def reject(self, reason: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Spend a turn on an invalid action (state unchanged); the info names the seat to move."""
        observation, reward, terminated, truncated, info = super().reject(reason)
        seat = None if self.game_over() else self.aec.agent_selection
        info.update({"seat": seat, "to_move": seat, "seat_rewards": {s: 0.0 for s in self.seats}})
        return observation, reward, terminated, truncated, info

    def valid_actions(self) -> list[str]:
        """The legal moves of the seat to move (the model's seat, or any seat in self-play)."""
        return [] if self.game_over() else self.legal_for(self.aec.agent_selection)

    def expert_action(self) -> str | None:
        """The expert's move for the seat to move, or None without an expert or after the game."""
        return None if self.game_over() else self.expert_for(self.aec.agent_selection)

    def state_key(self) -> str:
        """The seat to move and the board text."""
        to_move = "-" if self.game_over() else self.aec.agent_selection
        return f"{to_move}\n{self._board(self.aec)}"

    def is_success(self) -> bool:
        """Whether the game is over and the success criterion holds for the model's seat."""
        if not self.game_over():
            return False
        return SUCCESS_CRITERIA[self.success](self._ledger.totals[self._perspective()])

    def render_text(self) -> str:
        """The game as the model's seat (in self-play, the seat to move) sees it."""
        return self.text_for(self._perspective())

    def render_rgb(self) -> np.ndarray:
        """The game's own ``rgb_array`` picture."""
        return np.asarray(self.aec.render(), dtype=np.uint8)

    def close(self) -> None:
        """Close the PettingZoo env."""
        self.aec.close()

    # ------------------------------------------------------------------ internals

    def _perspective(self) -> str:
        if not self.self_play:
            return self.seat
        if self.game_over():
            return self._last_actor or self.seats[0]
        return self.aec.agent_selection

    def _seat_done(self, seat: str) -> bool:
        return bool(self.aec.terminations.get(seat, True) or self.aec.truncations.get(seat, False))

    def _mask(self, seat: str) -> np.ndarray:
        observation = self.aec.observe(seat)
        if isinstance(observation, dict) and "action_mask" in observation:
            return np.asarray(observation["action_mask"]).astype(bool)
        info = self.aec.infos.get(seat, {})
        if "action_mask" in info:
            return np.asarray(info["action_mask"]).astype(bool)
        raise AdapterError(
            f"{self.source} gives no action mask (neither observation['action_mask'] nor info['action_mask']); "
            "the PettingZoo adapter needs one to know the legal moves"
        )

    def _play(self, seat: str, observation: str, index: int) -> None:
        self._ledger.record(seat, observation, self.action_names[index])
        self.aec.step(index)
        self._ledger.credit(self.aec.rewards)
        self._last_actor = seat
        while not self.game_over() and self.aec.agents and self._seat_done(self.aec.agent_selection):
            self.aec.step(None)  # PettingZoo's protocol for removing a finished agent

    def _let_opponents_play(self) -> None:
        if self._opponent is None:
            return
        while not self.game_over() and self.aec.agent_selection != self.seat:
            seat = self.aec.agent_selection
            observation = self.text_for(seat)
            reply = self._opponent.act(SeatView(self, seat), observation)
            move, own = opponent_move(reply, self.legal_for(seat), self._fallback_rng)
            self.opponent_fallbacks += not own
            self._play(seat, observation, self.action_names.index(move))


def _pettingzoo_aec_class(source: str) -> type:
    try:
        from pettingzoo import AECEnv
    except ImportError as exc:
        raise MissingDependency(f"{source} needs PettingZoo, which is not installed: {PETTINGZOO_INSTALL}") from exc
    return AECEnv


def _ansi_board(aec: Any) -> str:
    return str(aec.render()).rstrip()


def _action_names(source: str, aec: Any, seats: Sequence[str], given: Sequence[str] | None) -> tuple[str, ...]:
    sizes = {int(getattr(aec.action_space(s), "n", -1)) for s in seats}
    if len(sizes) != 1 or -1 in sizes:
        raise AdapterError(f"{source}: every seat needs the same Discrete action space, got {[str(aec.action_space(s)) for s in seats]}")
    n = sizes.pop()
    if given is None:
        raise AdapterError(f"{source}: pass action_names=[...] with {n} names, one per action index")
    names = tuple(str(name) for name in given)
    keys = [normalize_action(name) for name in names]
    if len(names) != n or "" in keys or len(set(keys)) != n:
        raise AdapterError(f"{source}: action_names must be {n} distinct non-empty names, got {list(names)}")
    return names
