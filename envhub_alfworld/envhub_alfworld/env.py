"""ALFWorld as an envhub text environment.

One env class plays both sources of games:

- ``source="official"``: the official split's tasks under ``$ALFWORLD_DATA`` (``alfworld-download``),
  filtered as ALFWorld's ``AlfredTWEnv`` filters them; ``reset(seed=...)`` picks one from ``np_random``.
- ``source="generated"``: a task built by :func:`envhub_alfworld.tasks.generate_task` from a seed
  drawn from ``np_random`` (no download needed).

Both are played by TextWorld's ``PddlEnv`` over ALFWorld's domain and grammar, with ALFWorld's own
name demangling (``apple 1``), so observations are ALFWorld's text.

- ``valid_actions()`` are the admissible commands; anything else is an invalid action that leaves
  the state unchanged (the observation says so).
- ``expert_action()`` is the first step of Fast Downward's plan from the current state (ALFWorld's
  ``planner`` expert), or with ``expert="handcoded"`` ALFWorld's hand-coded TextWorld expert
  (``HandCodedTWAgent``, driven as its ``AlfredExpert`` wrapper drives it: told every command
  actually taken). The planner knows where every object is; the hand-coded expert looks for them.
  ``expert="search"`` is the planner where the agent could know its step, and a search where it
  could not: where the plan would fetch an object the agent has not seen, it goes through the
  receptacles in the order the admissible commands list them, opening the closed ones. Each of
  its commands follows from the current observation, admissible commands and task alone, so a
  policy whose prompt holds no history can imitate it.
- The reward is 1 when the task is done (ALFWorld's ``won``), which ends the episode.
- ``state_key()`` is the task's name and a digest of the PDDL facts, so GiGPO's anchors repeat
  exactly when the world's state does.
"""

from __future__ import annotations

import functools
import random
import re
import threading
from pathlib import Path
from typing import Any, ClassVar

from envhub.core import TextEnv, stable_key
from envhub.error import AdapterError, MissingDependency
from envhub_alfworld import tasks as alf_tasks

INSTALL = "pip install ./envhub_alfworld   (alfworld and textworld[pddl]: its planner compiles with cmake and a C++ compiler)"

#: verl-agent's ALFWorld instructions, for envhub's turn loop (the admissible actions and the reply
#: format come with every observation).
INSTRUCTIONS = (
    "You are an expert agent operating in the ALFRED Embodied Environment. The first observation "
    "describes the room and ends with your task ('Your task is to: ...'). Each turn, choose one of "
    "the admissible actions of the current situation (e.g. 'go to countertop 1', 'take apple 1 from "
    "countertop 1', 'open fridge 1', 'heat apple 1 with microwave 1', 'move apple 1 to diningtable 1', "
    "'use desklamp 1'). The episode ends when the task is done."
)

EXPERTS = ("handcoded", "planner", "search")

_ARRIVED = re.compile(r"^You arrive at (.+?)\.")

_TASK = re.compile(r"Your task is to: (.*)$", re.MULTILINE)


class ALFWorldEnv(TextEnv):
    """ALFWorld's household tasks.

    Args:
        source: ``"generated"`` (built offline from a seed) or ``"official"`` (the download).
        split: for ``source="official"``: ``"train"``, ``"eval_in_distribution"`` (valid_seen) or
            ``"eval_out_of_distribution"`` (valid_unseen).
        task_types: ALFWorld's task type numbers to play (1-6, as in its configs).
        expert: ``"planner"`` (Fast Downward's plan from the current state, which knows where
            every object is), ``"search"`` (the planner, searching the receptacles in turn for the
            objects the agent has not seen) or ``"handcoded"`` (ALFWorld's TextWorld expert, which
            searches and remembers what it saw).
        data_root: the folder holding ``json_2.1.1`` (default: ``$ALFWORLD_DATA``).
        task_reminder: end every observation after the first with the task's sentence ("Your task
            is to: ..."), as verl-agent's prompt carries it every turn; without it the task is only
            in the first observation, which a prompt with little history drops.
        render_mode: ``"ansi"`` or None.

    Raises:
        MissingDependency: alfworld or its planner is not installed, or the official data is absent.
        AdapterError: a bad argument.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
    #: The open-loop reference is left out: the engine's state lives in Fast Downward (no copies),
    #: and a fixed command sequence cannot carry over between tasks whose commands differ.
    searchable = False

    def __init__(
        self,
        source: str = "generated",
        *,
        split: str = "train",
        task_types: tuple[int, ...] | list[int] = tuple(alf_tasks.TASK_TYPES),
        expert: str = "planner",
        data_root: str | None = None,
        task_reminder: bool = True,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        if source not in ("generated", "official"):
            raise AdapterError(f"source must be 'generated' or 'official', got {source!r}")
        if expert not in EXPERTS:
            raise AdapterError(f"expert must be one of {', '.join(EXPERTS)}, got {expert!r}")
        types = tuple(sorted(set(task_types)))
        if not types or any(t not in alf_tasks.TASK_TYPES for t in types):
            raise AdapterError(f"task_types must be ALFWorld's numbers 1-6, got {list(task_types)!r}")
        try:
            import textworld
            from textworld.envs import PddlEnv  # noqa: F401  (raises without the planner)
            from textworld.envs.pddl.pddl import fast_downward_missing
            import alfworld  # noqa: F401
        except ImportError as exc:
            raise MissingDependency(f"ALFWorld is not installed: {INSTALL}") from exc
        if fast_downward_missing:
            raise MissingDependency(f"TextWorld's PDDL planner (fast-downward-textworld) is missing: {INSTALL}")
        self.source, self.split, self.task_types, self.expert = source, split, types, expert
        self.task_reminder = bool(task_reminder)
        self._official: tuple[alf_tasks.OfficialTask, ...] = ()
        if source == "official":
            root = alf_tasks.data_root() if data_root is None else Path(data_root) / "json_2.1.1"
            if root is None or not root.is_dir():
                raise MissingDependency(f"ALFWorld's games are not downloaded: {alf_tasks.DOWNLOAD}")
            try:
                self._official = alf_tasks.official_tasks(str(root), split, types)
            except ValueError as exc:
                raise AdapterError(str(exc)) from None
            if not self._official:
                raise MissingDependency(f"no playable ALFWorld games under {root / alf_tasks.SPLITS[split]}")
        # The planner's plan is computed when asked for (``expert_action``), not after every step.
        self._infos = textworld.EnvInfos(admissible_commands=True, won=True, facts=True)
        self._game: Any = None
        self._state: Any = None
        self._expert: Any = None
        self._expert_rng = random.Random(0)
        self._next_expert: str | None = None
        self._plan: tuple[str, list[str]] | None = None  # (state key, plan) of the last replan
        self._at: str | None = None  # the receptacle the agent last arrived at (None: the room's middle)
        self.task_name = ""
        self.task_type = ""
        self.pddl_problem = ""  # the game's PDDL problem
        self.task = ""  # the task's sentence, from the first observation
        self.instructions = INSTRUCTIONS

    # ------------------------------------------------------------------ TextEnv hooks

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler

        if self.source == "official":
            task = self._official[int(self.np_random.integers(len(self._official)))]
            self.task_name = task.name
            try:
                data, traj_data = task.load()
            except (OSError, ValueError, KeyError) as exc:
                raise AdapterError(f"ALFWorld game {task.folder} cannot be read: {type(exc).__name__}: {exc}") from None
        else:
            seed = int(self.np_random.integers(2**31))
            kind = alf_tasks.TASK_TYPES[self.task_types[int(self.np_random.integers(len(self.task_types)))]]
            generated = alf_tasks.generate_task(seed, kind)
            data, traj_data = generated.data, generated.traj_data
            self.task_name = f"generated/{seed}"
        self.task_type = traj_data["task_type"]
        self.pddl_problem = data["pddl_problem"]
        if self._game is None:  # one PddlEnv for every game this env plays, as TextWorld's gym env loads them
            self._game = AlfredDemangler(_pddl_env_class()(self._infos))
        try:
            self._game.load(data)
        except Exception as exc:  # the PDDL parser's and the planner's errors have no common base
            self.close()
            raise AdapterError(f"ALFWorld game {self.task_name} does not load: {type(exc).__name__}: {str(exc)[:200]}") from None
        self._state = self._game.reset()
        self._at = None
        self._expert_rng = random.Random(int(self.np_random.integers(2**31)))
        self._start_expert(traj_data)
        found = _TASK.search(self._state.feedback)
        self.task = found.group(1).strip() if found else ""
        info = {"task": self.task_name, "task_type": self.task_type}
        return self._state.feedback, info

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self._state, _, _ = self._game.step(action)
        self._follow_expert(action)
        arrived = _ARRIVED.match(self._state.feedback or "")
        if arrived:
            self._at = arrived.group(1)
        won = bool(self._state.won)
        observation = self._state.feedback
        if self.task_reminder and self.task:
            observation = f"{observation}\n\nYour task is to: {self.task}"
        return observation, float(won), won, {"task": self.task_name, "task_type": self.task_type, "won": won}

    def valid_actions(self) -> list[str]:
        """The admissible commands now (empty once the task is done)."""
        if self._state is None or self._state.won:
            return []
        return list(self._state.admissible_commands or [])

    def expert_action(self) -> str | None:
        """The expert's next command, or None where it has none (the task is done, or the
        hand-coded expert ran out of steps)."""
        if self._state is None or self._state.won:
            return None
        if self.expert == "planner":
            plan = self.plan()
            return plan[0] if plan and plan[0] in self.valid_actions() else None
        if self.expert == "search":
            return self._search_action()
        return self._next_expert

    def plan(self) -> list[str]:
        """Fast Downward's shortest plan from the current state (every object's place known), as
        commands; empty where none is found. Cached per state."""
        if self._state is None:
            return []
        key = self.state_key()
        if self._plan is None or self._plan[0] != key:
            game = self._game.unwrapped
            self._plan = (key, list(game._pddl_state.replan(game._entity_infos) or []))
        return list(self._plan[1])

    def state_key(self) -> str:
        """The task and a digest of the world's PDDL facts."""
        facts = sorted(str(fact) for fact in (self._state["_facts"] if self._state is not None else []))
        return f"{self.task_name}:{stable_key(chr(10).join(facts), 32)}"

    def is_success(self) -> bool:
        """Whether the task is done (ALFWorld's ``won``)."""
        return bool(self._state is not None and self._state.won)

    def render_text(self) -> str:
        """The latest observation."""
        return "" if self._state is None else str(self._state.feedback)

    def close(self) -> None:
        """Close the game being played (its planner's library goes back to the pool)."""
        if self._game is not None:
            game, self._game = self._game, None
            game.close()

    # ------------------------------------------------------------------ the searching planner

    def _search_action(self) -> str | None:
        """The plan's first step, unless it goes to fetch something from a receptacle; then the
        next step of the search: open the receptacle here if it is closed, else go to the one
        after it in the admissible commands' order (the first one, from the room's middle)."""
        plan, valid = self.plan(), self.valid_actions()
        if not plan or plan[0] not in valid:
            return None
        if not _fetches(plan):
            return plan[0]
        if self._at is not None and f"open {self._at}" in valid:
            return f"open {self._at}"
        places = [a[len("go to "):] for a in valid if a.startswith("go to ")]
        if self._at is None or not places:
            return f"go to {places[0]}" if places else plan[0]
        after = [place for place in places if place > self._at]
        return f"go to {(after or places)[0]}"

    # ------------------------------------------------------------------ the hand-coded expert

    def _start_expert(self, traj_data: dict[str, Any]) -> None:
        """ALFWorld's ``HandCodedTWAgent.reset``, from the task's parameters rather than a file."""
        self._next_expert, self._plan = None, None
        if self.expert != "handcoded":
            return
        import alfworld.gen.constants as constants
        from alfworld.agents.expert import HandCodedTWAgent

        agent = HandCodedTWAgent(max_steps=200)
        params = {**traj_data["pddl_params"], "task_type": traj_data["task_type"]}
        agent.task_params = {k: v.lower() if v in constants.OBJECTS else v for k, v in params.items()}
        agent.policy = agent.get_task_policy(agent.task_params)(agent.task_params, max_steps=agent.max_steps)
        self._expert = agent
        with self._seeded_expert():
            agent.observe(self._state.feedback)
        self._next_expert = "look"  # what AlfredExpert plans before the expert has acted

    def _follow_expert(self, command: str) -> None:
        """Tell the hand-coded expert what was done (as AlfredExpert does after every step)."""
        if self.expert != "handcoded" or self._expert is None:
            return
        from alfworld.agents.expert import HandCodedAgentTimeout

        try:
            with self._seeded_expert():
                action = self._expert.act(self._state, 0, self._state.won, command)
        except (HandCodedAgentTimeout, IndexError, KeyError, ValueError):
            self._expert, self._next_expert = None, None
            return
        self._next_expert = action if action in (self._state.admissible_commands or []) else "look"

    def _seeded_expert(self) -> Any:
        """The expert draws on the ``random`` module; point it at this episode's stream for the
        call, so the expert's choices repeat with the seed."""
        return _ModuleRandom(self._expert_rng)


def _fetches(plan: list[str]) -> bool:
    """Whether the plan starts by going to a receptacle to take or use an object there: a step
    that only knowing where the object lies explains."""
    if not plan[0].startswith("go to "):
        return False
    place = plan[0][len("go to "):]
    for command in plan[1:]:
        if command.startswith("go to "):
            return False
        if command.startswith("use ") or (command.startswith("take ") and command.endswith(f" from {place}")):
            return True
    return False


class _LibraryPool:
    """Fast Downward's library, loaded once per env alive at a time and reused.

    Each ``PddlEnv`` loads its own copy of the 34 MB library (its state is global to the copy), from
    a temporary file deleted at once; the copy stays mapped, so its disk space is held until the
    process ends: ``dlclose`` does not unload it. A new ``PddlEnv`` per game filled 68 GB of /tmp in
    a 20-step RL run. A closed env's copy comes here, and the next env takes it, so a process holds
    as many copies as it ever had envs open at once.
    """

    def __init__(self) -> None:
        self._free: list[Any] = []
        self._lock = threading.Lock()

    def take(self) -> Any:
        with self._lock:
            return self._free.pop() if self._free else None

    def give_back(self, lib: Any) -> None:
        with self._lock:
            self._free.append(lib)


_planner_libraries = _LibraryPool()


@functools.lru_cache(maxsize=1)
def _pddl_env_class() -> type:
    """TextWorld's ``PddlEnv``, with a first ``reset`` after ``load`` that plays the state ``load``
    just built. ``PddlEnv`` translates the PDDL problem with Fast Downward in ``load`` (to name the
    entities) and again in every ``reset``; at about 0.6 s a translation on this machine, that was
    most of an episode's cost. Later resets translate as before. (TextWorld 1.7.0, pinned.)"""
    from textworld.core import GameState
    from textworld.envs import PddlEnv

    _speed_up_textworld_text()

    class OnceTranslatedPddlEnv(PddlEnv):
        _loaded_state: Any = None

        def __init__(self, infos: Any = None) -> None:
            lib = _planner_libraries.take()
            if lib is None:
                super().__init__(infos)  # loads a copy of the library
            else:
                super(PddlEnv, self).__init__(infos)
                self.downward_lib = lib

        def close(self) -> None:
            super().close()
            lib, self.downward_lib = getattr(self, "downward_lib", None), None
            if lib is not None:
                _planner_libraries.give_back(lib)

        def load(self, filename_or_data: Any) -> None:
            super().load(filename_or_data)
            self._loaded_state = self._pddl_state

        def reset(self) -> Any:
            if self._loaded_state is None:
                return super().reset()
            self._pddl_state, self._loaded_state = self._loaded_state, None
            # PddlEnv.reset from here on, without its PddlState(...).
            self.prev_state = None
            self.state = GameState()
            self._last_action = None
            self._moves = 0
            context = {"state": self._pddl_state, "facts": list(self._pddl_state.facts), "variables": {},
                       "mapping": {}, "entity_infos": self._entity_infos}
            self.state.feedback = self._logic.grammar.derive("#intro#", context)
            self.state.raw = self.state.feedback
            self._gather_infos()
            return self.state

    return OnceTranslatedPddlEnv


def _speed_up_textworld_text() -> None:
    """Three copies TextWorld's text grammar makes at every derivation, made cheaper with the same
    text out (TextWorld 1.7.0, pinned). They were about three quarters of a step's time.

    - Its templates (``#look.feedback#``, a rule's condition) are parsed with TatSu each time. The
      parses are pure functions of the text and the few hundred templates repeat: each is parsed once,
      and later calls get a deep copy (the grammar sets its symbols' contexts in place).
    - ``copy_context`` deep-copies a context's variables and mapping. Each derivation only adds keys
      to its own copies (``query``), and the grammar's ``{...}`` expressions only read attributes
      (``o.name``, ``r.indefinite``), so copies of the two dicts do.
    - ``Symbol.copy`` deep-copies the symbol with its old context, the world state included, then
      drops that context: the copy now leaves the old context out.
    """
    from textworld.envs.pddl import textgen

    with _PATCH_LOCK:  # once, whichever thread builds the first env
        if not hasattr(textgen, "envhub_originals"):
            _patch_textworld_text()


_PATCH_LOCK = threading.Lock()


def _patch_textworld_text() -> None:
    """``_speed_up_textworld_text``'s patch; TextWorld's originals stay in ``textgen.envhub_originals``."""
    import copy

    from textworld import logic
    from textworld.envs.pddl import textgen

    for module in (textgen, logic):
        parse = module._parse_and_convert
        cache: dict[Any, Any] = {}

        def memoized(*args: Any, _parse: Any = parse, _cache: dict[Any, Any] = cache, **kwargs: Any) -> Any:
            key = (args, tuple(sorted(kwargs.items())))
            try:
                hit = _cache.get(key)
            except TypeError:  # unhashable arguments: parsed as before
                return _parse(*args, **kwargs)
            if hit is None:
                hit = _parse(*args, **kwargs)
                if len(_cache) < 16384 and sum(len(a) for a in args if isinstance(a, str)) < 4096:  # templates, not files
                    _cache[key] = hit
            return copy.deepcopy(hit)

        memoized.parse, memoized.cache = parse, cache  # type: ignore[attr-defined]
        module._parse_and_convert = memoized

    def copy_context(context: dict[str, Any]) -> dict[str, Any]:
        return {"state": context["state"], "facts": context["facts"], "variables": dict(context["variables"]),
                "mapping": dict(context["mapping"]), "entity_infos": context["entity_infos"]}

    def symbol_copy(self: Any, context: dict[str, Any]) -> Any:
        copied = copy.deepcopy(self, {id(self.context): {}})
        copied.context = copy_context(context)
        return copied

    textgen.envhub_originals = {"copy_context": textgen.copy_context, "copy": textgen.Symbol.copy}
    textgen.copy_context, textgen.Symbol.copy = copy_context, symbol_copy


class _ModuleRandom:
    def __init__(self, rng: random.Random):
        self.rng = rng

    def __enter__(self) -> None:
        from alfworld.agents.expert import handcoded_expert

        self.saved = handcoded_expert.random
        handcoded_expert.random = self.rng

    def __exit__(self, *exc: Any) -> None:
        from alfworld.agents.expert import handcoded_expert

        handcoded_expert.random = self.saved
