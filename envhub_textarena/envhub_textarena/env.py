"""Any TextArena game as an envhub text environment.

The game runs unwrapped (TextArena's observation wrappers are replaced by envhub's conversation):
each observation is the text TextArena addressed to the model's player since its last move, the
first one carrying the game's own rules and move syntax. A reply is handed to the game as the move
(reached through envhub's reply formats: ``<answer>[A C]</answer>`` plays ``[A C]``).

TextArena judges its own moves. A move it refuses is an envhub invalid action: the game is
restored exactly as it was before the move (TextArena would otherwise count the error and end
the game after its error allowance), the reward is 0, and the next observation gives the game's
reason. Where a game's legal moves can be listed (:mod:`envhub_textarena.solvers`),
``valid_actions()`` lists them and an unlisted move is refused before the game sees it.

Randomness: TextArena draws from Python's global ``random`` (and a few games from NumPy's global
generator). Every instance has generators of its own and puts them in the games' way around each
call into the game, so envs interleaved in one process (a manager's group) do not disturb each
other or the caller's global stream, and the same seed gives the same game in any process.

Two-player games: the model plays one seat; the other is played by an opponent policy (see
:mod:`envhub.adapters.opponents`: ``"random"``, ``"expert"``, a policy or factory, a model), or,
with ``opponent="self"``, every seat's turn is handed to the caller, as in the PettingZoo adapter.
"""

from __future__ import annotations

import copy
import enum
import functools
import importlib
import io
import json
import operator
import pickle
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from envhub.adapters.opponents import opponent_factory, opponent_move
from envhub.adapters.references import resolve
from envhub.adapters import seats
from envhub.adapters.seats import SeatLedger, SeatTrajectory, outcome_of
from envhub.core import TextEnv, shorten, stable_key
from envhub.error import AdapterError, InvalidAction, MissingDependency
from envhub.generation import Policy
from envhub_textarena.games import UNAVAILABLE

INSTALL = "pip install envhub-textarena (it pins textarena==0.7.4)"

#: The longest move handed to a game; TextArena echoes moves into every player's history.
MAX_MOVE_CHARS = 4096

#: ``seat`` value that draws the model's seat at every reset.
RANDOM_SEAT = "random"

#: TextArena's id of the game itself as a message's sender.
GAME_ID = -1



class _Discard(io.TextIOBase):
    """A text stream that drops what is written: where the games' own prints go."""

    def write(self, text: str) -> int:
        return len(text)


_SINK = _Discard()

#: The module functions of ``random`` that draw from its hidden global generator: each is a method
#: bound to ``random._inst`` (``random.choice`` is ``random._inst.choice``). TextArena calls them
#: as ``random.choice(...)``, so putting an instance's own bound methods under these names hands
#: the game that instance's generator, at the cost of two dict updates instead of copying the
#: 625-word Mersenne Twister state in and out (``getstate``/``setstate``: ~15 us a call).
_RANDOM_NAMES: tuple[str, ...] = tuple(
    name for name, value in vars(random).items() if getattr(value, "__self__", None) is random._inst
)
_RANDOM_NAMESPACE = vars(random)
_random_functions = operator.itemgetter(*_RANDOM_NAMES)
_GLOBAL_FUNCTIONS = _random_functions(_RANDOM_NAMESPACE)
_GLOBAL_BY_NAME = dict(zip(_RANDOM_NAMES, _GLOBAL_FUNCTIONS))

Moves = Callable[[Any, int], list[str]]
Expert = Callable[[Any, int], "str | None"]


def load_game(game: str) -> Callable[[], Any]:
    """Return a function making the unwrapped TextArena env registered as ``game``.

    Raises:
        MissingDependency: TextArena is not installed, or the game cannot run here (the reason).
        AdapterError: TextArena registers no such game.
    """
    if game in UNAVAILABLE:
        # Checked before importing the game's module: some download data when imported.
        raise MissingDependency(f"TextArena's {game} is not available offline: {UNAVAILABLE[game]}")
    try:
        from textarena.envs.registration import ENV_REGISTRY
    except ImportError as exc:
        raise MissingDependency(f"TextArena is not installed: {INSTALL}") from exc
    ta_spec = ENV_REGISTRY.get(game)
    if ta_spec is None:
        raise AdapterError(f"TextArena registers no game {game!r}; see textarena.envs.registration.ENV_REGISTRY")
    module_name, _, class_name = str(ta_spec.entry_point).partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, SyntaxError, AttributeError) as exc:
        raise MissingDependency(f"TextArena's {game} cannot be imported: {type(exc).__name__}: {exc}") from exc
    kwargs = dict(ta_spec.kwargs)
    make = lambda: cls(**kwargs)  # noqa: E731
    make.uses_numpy_random = _uses_numpy_random(module_name)  # type: ignore[attr-defined]
    return make


@functools.lru_cache(maxsize=None)
def _uses_numpy_random(module_name: str) -> bool:
    """Whether the game's package draws from NumPy's global generator (a few do, e.g. Sokoban's
    level generator); swapping that generator's state costs more than the rest of a step."""
    package = Path(importlib.import_module(module_name).__file__ or "").parent
    return any("np.random" in path.read_text(errors="replace") or "numpy.random" in path.read_text(errors="replace")
               for path in package.rglob("*.py"))


class SeatView(seats.SeatView):
    """The game seen from one seat (:class:`envhub.adapters.seats.SeatView`), which also gives
    scripted opponents the TextArena env and the seat's player id."""

    @property
    def player_id(self) -> int:
        """TextArena's id of the seat."""
        return self.seat

    @property
    def game(self) -> Any:
        """The unwrapped TextArena env."""
        return self._env.game


class TextArenaEnv(TextEnv):
    """A TextArena game in which the model plays one player (or, in self-play, every player).

    Args:
        game: TextArena's id of the game, e.g. ``"TowerOfHanoi-v0-medium"``.
        num_players: how many players the game is played with.
        seat: the model's player id, ``"random"`` (drawn at every reset) or None for player 0.
        opponent: who plays the other seats (see :mod:`envhub.adapters.opponents`), or ``"self"``.
        legal: ``legal(ta_env, player_id) -> moves`` listing the legal moves, or None where the
            game's moves are open text.
        expert: ``expert(ta_env, player_id) -> move`` of an exact solver, or None.
        instructions: the rules shown once; default: a generic line (the game's own rules come in
            the first observation).
        render_mode: ``"ansi"`` or None.

    Raises:
        MissingDependency: TextArena is missing or the game cannot run offline (the reason).
        AdapterError: a setting the game cannot take; the message says what to pass.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        game: str,
        *,
        num_players: int = 1,
        seat: int | str | None = None,
        opponent: str | Policy | Callable[..., Policy] = "random",
        legal: str | Moves | None = None,
        expert: str | Expert | None = None,
        instructions: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        self.game_id = game
        self._make_game = load_game(game)
        self._numpy_random = bool(getattr(self._make_game, "uses_numpy_random", True))
        from textarena.core import ObservationType  # importable: load_game imported textarena

        self._player_action = ObservationType.PLAYER_ACTION
        self._rng = random.Random(0)
        self._rng_functions = {name: getattr(self._rng, name) for name in _RANDOM_NAMES}
        self._np_state: Any = np.random.RandomState(0).get_state() if self._numpy_random else None
        self.game = self._in_game(self._make_game)
        if not isinstance(num_players, int) or num_players < 1:
            raise AdapterError(f"num_players must be a positive integer, got {num_players!r}")
        self.num_players = num_players
        self.seats = tuple(range(num_players))
        if seat is not None and seat != RANDOM_SEAT and seat not in self.seats:
            raise AdapterError(f"seat={seat!r} is not a player of {game} with {num_players} players; choose one of {list(self.seats)} or 'random'")
        self.seat_choice = seat
        self.seat = seat if isinstance(seat, int) else 0
        self._legal: Moves | None = resolve(legal, "legal")
        self._expert: Expert | None = resolve(expert, "expert")
        if num_players > 1 and opponent == "expert" and self._expert is None:
            raise AdapterError(f"opponent='expert' needs an expert for {game}: pass expert='package.module:function'")
        self._opponent_factory = opponent_factory(opponent) if num_players > 1 else None
        self.self_play = num_players > 1 and self._opponent_factory is None
        if num_players > 1 and not self.self_play and self._legal is None:
            raise AdapterError(f"an opponent for {game} needs its legal moves to fall back on: pass legal='package.module:function'")
        name = game.split("-v", 1)[0]
        who = "one player" if num_players == 1 else ("every player in turn" if self.self_play else "one of the players")
        self.instructions = instructions or (
            f"You play TextArena's game {name} ({game}) as {who}. The first observation gives the game's "
            "rules and how to write a move; later ones show what happened since your last move. "
            "Reply with one move written exactly as the rules say (most games take it in square brackets)."
        )
        self._opponent: Policy | None = None
        self._fallback_rng = np.random.default_rng(0)
        self._seat_labels = {s: f"Player {s}" for s in self.seats}
        self._ledger = SeatLedger(list(self._seat_labels.values()))
        self._mover: int | None = None
        self._last_actor: int | None = None
        self._key: str | None = None
        self.game_seed: int | None = None
        self.opponent_fallbacks = 0

    # ------------------------------------------------------------------ seats

    def legal_for(self, player_id: int) -> list[str] | None:
        """``player_id``'s legal moves now (empty when it is not its turn), or None where the game's
        moves cannot be listed."""
        if self._legal is None:
            return None
        state = self.game.state
        if state.done or player_id != state.current_player_id:
            return []
        return list(self._legal(self.game, player_id))

    def expert_for(self, player_id: int) -> str | None:
        """The solver's move for ``player_id`` when it is its turn, else None."""
        if self._expert is None or self.game_over() or player_id != self.to_move():
            return None
        return self._expert(self.game, player_id)

    def to_move(self) -> int:
        """The id of the player whose turn it is."""
        return int(self.game.state.current_player_id)

    def game_over(self) -> bool:
        """Whether TextArena has ended the game."""
        return bool(self.game.state.done)

    def outcome(self) -> dict[int, float]:
        """Every player's reward from TextArena once the game is over (empty before)."""
        rewards = self.game.state.rewards if self.game_over() else None
        return {int(pid): float(r) for pid, r in (rewards or {}).items()}

    def seat_trajectories(self) -> dict[str, SeatTrajectory]:
        """Every seat's moves and rewards in the current game (see :mod:`envhub.adapters.seats`)."""
        labels = self._seat_labels
        played_by = {labels[s]: "model" if self.self_play or s == self.seat else "opponent" for s in self.seats}
        return self._ledger.trajectories(played_by, self.game_over())

    # ------------------------------------------------------------------ TextEnv hooks

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if self.seat_choice == RANDOM_SEAT:
            self.seat = int(self.np_random.integers(self.num_players))
        game_seed, opponent_seed, fallback_seed = (int(x) for x in self.np_random.integers(2**31 - 1, size=3))
        self.game_seed = game_seed
        self._rng.seed(game_seed)
        # NumPy's legacy state costs ~0.1 ms to make: only for the games that draw from it.
        self._np_state = np.random.RandomState(game_seed).get_state() if self._numpy_random else None
        # Made in the game's randomness too: a game may keep a module function (Secretary keeps
        # ``random.random``), which must be this instance's.
        self.game = self._in_game(self._make_game)
        self._in_game(self.game.reset, num_players=self.num_players, seed=game_seed)
        self._key = None
        self._opponent = None if self._opponent_factory is None else self._opponent_factory(opponent_seed)
        if self._opponent is not None:  # its generator (~7 us to make) serves only the opponent
            self._fallback_rng = np.random.default_rng(fallback_seed)
        self._ledger = SeatLedger(list(self._seat_labels.values()))
        self._mover = None
        self._last_actor = None
        self.opponent_fallbacks = 0
        self._let_opponents_play()
        if self.game_over():
            raise AdapterError(f"{self.game_id}: the game ended before player {self.seat} moved; choose another seat")
        to_move = self.to_move()
        return self._take_text(self._perspective()), {"seat": to_move, "to_move": to_move}

    def parse_action(self, action: str) -> str:
        """Hand ``action`` to the game as the move of the player to move.

        A move the game accepts is played (``step`` then lets the opponents answer); a move it
        refuses leaves the game exactly as it was.

        Raises:
            InvalidAction: the move is not text, empty, too long, unlisted, or the game refused
                it (with the game's reason).
        """
        move = super().parse_action(action)
        if len(move) > MAX_MOVE_CHARS:
            raise InvalidAction(f"the move is {len(move)} characters long; moves are at most {MAX_MOVE_CHARS}")
        self._mover = self.to_move()
        self._play(move)
        return move

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        actor = self._mover if self._mover is not None else self.to_move()
        labels = self._seat_labels
        totals = self._ledger.totals
        before = dict(totals)
        self._ledger.record(labels[actor], self._observation or "", action)
        self._credit()
        self._last_actor = actor
        self._let_opponents_play()
        over = self.game_over()
        step_rewards = {label: totals[label] - before[label] for label in labels.values()}
        extra = {"seat": actor, "to_move": None if over else self.to_move(), "seat_rewards": step_rewards}
        if over:
            extra["outcome"] = self.outcome()
        return self._take_text(self._perspective()), step_rewards[labels[actor]], over, extra

    def reject(self, reason: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Spend a turn on an invalid move (the game unchanged); the info names the seat to move."""
        observation, reward, terminated, truncated, info = super().reject(reason)
        seat = None if self.game_over() else self.to_move()
        info.update({"seat": seat, "to_move": seat, "seat_rewards": {label: 0.0 for label in self._seat_labels.values()}})
        return observation, reward, terminated, truncated, info

    def valid_actions(self) -> list[str] | None:
        """The legal moves of the player to move, where the game's moves can be listed."""
        return self.legal_for(self.game.state.current_player_id) if self._legal is not None else None

    def expert_action(self) -> str | None:
        """The exact solver's move for the player to move, or None without one."""
        return self.expert_for(self.to_move())

    def state_key(self) -> str:
        """The player to move and a digest of the game's whole state (TextArena's game state and
        the game object's own fields, turn counters and message logs left out)."""
        if self._key is None:
            self._key = self._compute_key()
        return self._key

    def _compute_key(self) -> str:
        # Recomputed only after reset and accepted moves: rejected ones leave the game as it was.
        state = self.game.state
        fields = {k: v for k, v in vars(self.game).items() if k not in _NOT_FIELDS}
        # A list, not a dict: its order is fixed, so there are no keys to sort (~0.5 us a step).
        content = [state.game_state, fields, bool(state.done), state.rewards]
        digest = stable_key(_canonical_json(content), 32)
        to_move = "-" if state.done else str(state.current_player_id)
        return f"{to_move}:{digest}"

    def is_success(self) -> bool:
        """Whether the game is over and won: a single-player game's outcome reward is 1 (TextArena
        gives the fraction achieved otherwise); a multi-player game's reward is positive."""
        if not self.game_over():
            return False
        reward = self.outcome().get(self._perspective(), 0.0)
        return reward >= 1.0 if self.num_players == 1 else reward > 0

    def render_text(self) -> str:
        """The game's board as TextArena draws it, else the latest observation."""
        board = getattr(self.game, "get_board_str", None)
        if board is not None:
            try:
                return str(board())
            except Exception:  # a game whose board drawing fails mid-game still renders
                pass
        return self._observation or ""

    # ------------------------------------------------------------------ internals

    def _perspective(self) -> int:
        if not self.self_play:
            return self.seat
        if self.game_over():
            return self._last_actor if self._last_actor is not None else 0
        return self.to_move()

    def _in_game(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Return ``call(*args, **kwargs)`` run with this instance's generators in the global
        ``random`` (and NumPy's, for the games that use it), and its prints (some games print
        progress) kept off the caller's stdout."""
        outside = _random_functions(_RANDOM_NAMESPACE)
        _RANDOM_NAMESPACE.update(self._rng_functions)
        numpy = self._numpy_random
        if numpy:
            outside_np = np.random.get_state()
            np.random.set_state(self._np_state)
        stdout, sys.stdout = sys.stdout, _SINK
        try:
            return call(*args, **kwargs)
        finally:
            sys.stdout = stdout
            # Usually random's own functions (a prepared dict is quicker to put back); a nested
            # call or a caller's patch gets back exactly what was there.
            _RANDOM_NAMESPACE.update(_GLOBAL_BY_NAME if outside == _GLOBAL_FUNCTIONS else zip(_RANDOM_NAMES, outside))
            if numpy:
                self._np_state = np.random.get_state()
                np.random.set_state(outside_np)

    def _play(self, move: str) -> None:
        """Play ``move`` for the player to move; restore the game and raise if it refuses it.

        Where the legal moves are listed, ``move`` is one of them (``parse_action`` and
        ``opponent_move`` see to it), so the game is not copied first: a refusal then means the
        listing is wrong, an error in this plugin, not the player's.
        """
        snapshot = None if self._legal is not None else (_snapshot(self.game), self._rng.getstate(), self._np_state)
        state = self.game.state
        refused: list[str] = []
        original = state.set_invalid_move

        def record(*args: Any, **kwargs: Any) -> Any:
            refused.append(str(kwargs.get("reason", args[0] if args else "") or "the game refused the move"))
            return original(*args, **kwargs)

        state.set_invalid_move = record
        try:
            self._in_game(self.game.step, move)
        except Exception as exc:  # a game that crashes on odd text has refused it
            refused.append(f"the game could not read it ({type(exc).__name__}: {shorten(str(exc))})")
        finally:
            vars(state).pop("set_invalid_move", None)
        self._key = None
        if not refused:
            return
        if snapshot is None:
            raise AdapterError(f"{self.game_id} refused the listed move '{move}': {refused[0]}; its legal-move function is wrong")
        game, rng_state, self._np_state = snapshot
        self._rng.setstate(rng_state)
        self.game = _restore(game)
        self._key = None
        raise InvalidAction(f"the game refused '{shorten(move)}': {refused[0]}")

    def _credit(self) -> None:
        if self.game_over():
            labels = self._seat_labels
            self._ledger.credit({labels[pid]: r for pid, r in self.outcome().items()})

    def _let_opponents_play(self) -> None:
        if self._opponent is None:
            return
        while not self.game_over() and self.to_move() != self.seat:
            seat = self.to_move()
            observation = self._take_text(seat)
            reply = self._opponent.act(SeatView(self, seat), observation)
            legal = self.legal_for(seat) or []
            move, own = opponent_move(reply, legal, self._fallback_rng)
            self.opponent_fallbacks += not own
            self._ledger.record(self._seat_labels[seat], observation, move)
            self._play(move)
            self._credit()
            self._last_actor = seat

    def _take_text(self, player_id: int) -> str:
        """The messages the game addressed to ``player_id`` since it last read them, as text;
        with the result appended once the game is over."""
        state = self.game.state
        messages, state.observations[player_id] = state.observations[player_id], []
        names = state.role_mapping
        lines = []
        for sender, text, kind in messages:
            if kind is self._player_action and sender in (player_id, GAME_ID):
                continue  # the player's own move (some games echo it as the game's), which it knows
            lines.append(str(text) if sender == GAME_ID else f"[{names.get(sender, f'Player {sender}')}] {text}")
        if self.game_over():
            reward = self.outcome().get(player_id, 0.0)
            reason = state.game_info.get(player_id, {}).get("reason") or "the game ended"
            result = f"reward {reward:g}" if self.num_players == 1 else outcome_of(reward)
            lines.append(f"Game over: {reason} ({result}).")
        return "\n".join(lines).strip()


def _snapshot(game: Any) -> bytes | Any:
    """A copy of ``game`` to restore after a refused move: pickled (several times faster than
    ``deepcopy`` on TextArena's games), or deep-copied where the game cannot be pickled."""
    try:
        return pickle.dumps(game, pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return copy.deepcopy(game)


def _restore(snapshot: bytes | Any) -> Any:
    return pickle.loads(snapshot) if isinstance(snapshot, bytes) else snapshot


#: The game object's attributes that are not part of its state.
_NOT_FIELDS = frozenset(("state", "env_id", "entry_point"))


def _jsonable(value: Any) -> Any:
    """What JSON cannot encode, as something it can, with no process-dependent parts (addresses,
    set order): the ``default`` of :data:`_ENCODER`."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:  # mixed or unorderable items: order by their JSON text
            return sorted(value, key=_ENCODER.encode)
    if callable(value) or isinstance(value, (random.Random, np.random.Generator, np.random.RandomState)):
        return type(value).__name__
    if hasattr(value, "fen") and callable(value.fen):
        return value.fen()
    if hasattr(value, "__dict__"):
        return [type(value).__name__, vars(value)]
    text = repr(value)
    return type(value).__name__ if " at 0x" in text else text


#: Canonical JSON: dict keys sorted, compact, other types through ``_jsonable``.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=_jsonable)

#: The same encoder as json's C encoder, made once (``JSONEncoder.encode`` makes one per call, a
#: third of the cost on a small state), without the cycle check: a cyclic state exceeds the
#: recursion limit instead, and is walked. None where json has no C encoder.
_C_ENCODER = (
    json.encoder.c_make_encoder(None, _jsonable, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True)
    if json.encoder.c_make_encoder is not None
    else None
)


def _canonical_json(content: Any) -> str:
    """The canonical JSON text of a game's state: equal states give equal text in any process.

    The C encoder takes ~2 us on Tower of Hanoi's state where walking it in Python took ~35 us;
    states it cannot take (dict keys of mixed or non-JSON types, reference cycles) are walked by
    :func:`_canonical` and marked, so the two forms never collide.
    """
    try:
        return "".join(_C_ENCODER(content, 0)) if _C_ENCODER is not None else _ENCODER.encode(content)
    except (TypeError, ValueError, RecursionError):
        return "walked:" + json.dumps(_canonical(content), sort_keys=True)


def _canonical(value: Any, depth: int = 0) -> Any:
    """A JSON-ready form of ``value`` with no process-dependent parts (addresses, set order)."""
    if depth > 12:
        return "..."
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, np.generic):
        return _canonical(value.item(), depth + 1)
    if isinstance(value, np.ndarray):
        return _canonical(value.tolist(), depth + 1)
    if isinstance(value, dict):
        return sorted(([_key(k), _canonical(v, depth + 1)] for k, v in value.items()), key=lambda kv: kv[0])
    if isinstance(value, (list, tuple)):
        return [_canonical(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [_canonical(v, depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:  # mixed or nested items: order by their JSON text
            return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if callable(value) or isinstance(value, (random.Random, np.random.Generator, np.random.RandomState)):
        return type(value).__name__
    if hasattr(value, "fen") and callable(value.fen):
        return value.fen()
    if hasattr(value, "__dict__"):
        return [type(value).__name__, _canonical(vars(value), depth + 1)]
    text = repr(value)
    return type(value).__name__ if " at 0x" in text else text


def _key(key: Any) -> str:
    return key if isinstance(key, str) else json.dumps(_canonical(key), sort_keys=True)
