"""ALFWorld's games: the official split's task folders, and tasks generated offline.

An ALFWorld game is a PDDL problem over ALFRED's domain (``alfworld/data/alfred.pddl``), its text
grammar (``alfred.twl2``) with the task's sentence written in, and the task's parameters
(``traj_data.json``: type, target object, target receptacle, lamp). The official download holds one
folder per task with ``initial_state.pddl`` and ``traj_data.json`` (and ``game.tw-pddl``, the two
files joined, once ``alfworld-generate`` has run). :func:`official_tasks` finds them as ALFWorld's
own ``AlfredTWEnv`` does; :func:`generate_task` builds one from the wheel's floor plans instead.

Generated tasks follow the way ALFRED's PDDL problems are written (mangled ALFRED object ids such
as ``Apple_bar__minus_01_dot_25_bar_...``, one location per receptacle, ``canContain`` from
``VAL_RECEPTACLE_OBJECTS``), so the same engine, grammar and expert play both.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: ALFWorld's task types by their number in its configs (``env.task_types``).
TASK_TYPES = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}

#: The official splits and their folders under ``$ALFWORLD_DATA/json_2.1.1``.
SPLITS = {"train": "train", "eval_in_distribution": "valid_seen", "eval_out_of_distribution": "valid_unseen"}

DOWNLOAD = "pip install alfworld && alfworld-download   # then point ALFWORLD_DATA at its folder (default ~/.cache/alfworld)"

#: Floor plan numbers by room (ALFRED's scenes).
ROOMS = {
    "Kitchen": range(1, 31),
    "LivingRoom": range(201, 231),
    "Bedroom": range(301, 331),
    "Bathroom": range(401, 431),
}

#: Receptacles whose ALFRED id names a part: the sink's basin is what takes objects.
_BASINS = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}

#: How many of a receptacle type a scene has when its layout names the type but not its instances.
_UNPLACED_COUNTS = {"StoveBurner": (2, 4)}

_LAMPS = ("DeskLamp", "FloorLamp")
#: Where a lamp stands (the lamp is "in" it, as in ALFWorld's games, to be used from there).
_LAMP_STANDS = ("SideTable", "Desk", "Dresser", "DiningTable", "CoffeeTable", "Shelf", "TVStand", "CounterTop")


@functools.lru_cache(maxsize=1)
def _alfworld() -> Any:
    """ALFWorld's constants, goal library and data paths (imported on first use: importing
    ``alfworld`` creates its data folder)."""
    import alfworld.gen.constants as constants
    import alfworld.gen.goal_library as goals
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    return constants, goals, ALFRED_PDDL_PATH, ALFRED_TWL2_PATH


@functools.lru_cache(maxsize=1)
def game_logic() -> tuple[str, str]:
    """ALFWorld's PDDL domain and its text grammar (with ``UNKNOWN GOAL`` for the task)."""
    _, _, domain, grammar = _alfworld()
    return Path(domain).read_text(), Path(grammar).read_text()


def mangle(alfred_id: str) -> str:
    """An ALFRED object id as ALFWorld's PDDL writes it (``Apple|-01.25|...`` to ``Apple_bar__minus_01_dot_25_bar_...``)."""
    table = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
    return "".join(table.get(ch, ch) for ch in alfred_id)


def task_sentence(traj_data: dict[str, Any], rng: random.Random) -> str:
    """The task's sentence from ALFWorld's goal templates (what ``add_task_to_grammar`` writes,
    with the template drawn from ``rng`` instead of the global random stream)."""
    _, goals, _, _ = _alfworld()
    params = traj_data["pddl_params"]
    goal = traj_data["task_type"] + ("_slice" if params.get("object_sliced") else "")
    template = rng.choice(goals.gdict[goal]["templates"])
    return template.format(
        obj=params["object_target"].lower(),
        recep=params["parent_target"].lower(),
        toggle=params["toggle_target"].lower(),
        mrecep=params["mrecep_target"].lower(),
    )


def game_data(pddl_problem: str, traj_data: dict[str, Any], sentence: str) -> dict[str, Any]:
    """The ``game.tw-pddl`` content TextWorld's ``PddlEnv`` loads."""
    domain, grammar = game_logic()
    return {
        "pddl_domain": domain,
        "grammar": grammar.replace("UNKNOWN GOAL", sentence),
        "pddl_problem": pddl_problem,
        "solvable": True,
    }


# ---------------------------------------------------------------------------- the official split


@dataclass(frozen=True)
class OfficialTask:
    """One task folder of the official download."""

    folder: Path

    @property
    def name(self) -> str:
        return f"{self.folder.parent.name}/{self.folder.name}"

    def load(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The game's ``tw-pddl`` data and its ``traj_data``. Where ``game.tw-pddl`` is missing
        (the PDDL download without ``alfworld-generate``), it is joined from ``initial_state.pddl``
        and ``traj_data.json`` here, the task's sentence drawn from a stream seeded by its name."""
        traj_data = json.loads((self.folder / "traj_data.json").read_text())
        game_file = self.folder / "game.tw-pddl"
        if game_file.is_file():
            return json.loads(game_file.read_text()), traj_data
        rng = random.Random(int(hashlib.sha256(self.name.encode()).hexdigest()[:16], 16))
        problem = (self.folder / "initial_state.pddl").read_text()
        return game_data(problem, traj_data, task_sentence(traj_data, rng)), traj_data


def data_root() -> Path | None:
    """Where the official games are: ``$ALFWORLD_DATA/json_2.1.1`` (``ALFWORLD_DATA`` defaulting to
    ``~/.cache/alfworld``, as for ``alfworld-download``), or None when absent."""
    root = os.environ.get("ALFWORLD_DATA") or "~/.cache/alfworld"  # alfworld-download's default
    folder = Path(os.path.expandvars(root)).expanduser() / "json_2.1.1"
    return folder if folder.is_dir() else None


@functools.lru_cache(maxsize=8)
def official_tasks(root: str, split: str, task_types: tuple[int, ...] = tuple(TASK_TYPES)) -> tuple[OfficialTask, ...]:
    """The split's playable tasks, in a fixed order, filtered as ``AlfredTWEnv.collect_game_files``
    does: folders with ``movable`` or ``Sliced`` in their path are dropped, as are other task
    types, folders without a game, and games marked unsolvable.

    Raises:
        ValueError: an unknown split.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; choose one of {', '.join(SPLITS)}")
    wanted = {TASK_TYPES[t] for t in task_types}
    found = []
    for traj in sorted(Path(root, SPLITS[split]).rglob("traj_data.json")):
        folder = traj.parent
        if "movable" in str(folder) or "Sliced" in str(folder):
            continue
        game_file = folder / "game.tw-pddl"
        if not game_file.is_file() and not (folder / "initial_state.pddl").is_file():
            continue
        try:
            task_type = json.loads(traj.read_text()).get("task_type")
            solvable = json.loads(game_file.read_text()).get("solvable", False) if game_file.is_file() else True
        except (OSError, ValueError):
            continue
        if task_type in wanted and solvable:
            found.append(OfficialTask(folder))
    return tuple(found)


# ---------------------------------------------------------------------------- generated tasks


@dataclass
class GeneratedTask:
    """A task built from a floor plan: its PDDL problem, ``traj_data`` and sentence."""

    floor_plan: int
    task_type: str
    traj_data: dict[str, Any]
    pddl_problem: str
    sentence: str
    objects: dict[str, list[str]] = field(default_factory=dict)

    @property
    def data(self) -> dict[str, Any]:
        return game_data(self.pddl_problem, self.traj_data, self.sentence)

    def write(self, folder: str | Path) -> Path:
        """Write the task in the official layout (``initial_state.pddl``, ``traj_data.json``,
        ``game.tw-pddl``); returns the folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "initial_state.pddl").write_text(self.pddl_problem)
        (folder / "traj_data.json").write_text(json.dumps(self.traj_data, indent=1))
        (folder / "game.tw-pddl").write_text(json.dumps(self.data))
        return folder


@functools.lru_cache(maxsize=None)
def _layout(floor_plan: int) -> tuple[tuple[str, ...], tuple[tuple[str, tuple[float, ...]], ...]]:
    """The floor plan's object types and its receptacles' poses, sorted by ALFRED id (read once a process)."""
    import alfworld.gen

    folder = Path(alfworld.gen.__file__).parent / "layouts"
    objects = json.loads((folder / f"FloorPlan{floor_plan}-objects.json").read_text())
    receptacles = json.loads((folder / f"FloorPlan{floor_plan}-openable.json").read_text())
    return tuple(objects), tuple((alfred_id, tuple(pose)) for alfred_id, pose in sorted(receptacles.items()))


def _room(floor_plan: int) -> str:
    return next(room for room, plans in ROOMS.items() if floor_plan in plans)


def _coords(rng: random.Random) -> str:
    return "|".join(f"{rng.uniform(-3, 3):+06.2f}" for _ in range(3))


class _Scene:
    """A floor plan's receptacles (ALFRED ids, types, locations) and the objects it can hold."""

    def __init__(self, floor_plan: int, rng: random.Random):
        constants, _, _, _ = _alfworld()
        self.constants = constants
        objects, placed = _layout(floor_plan)
        self.receptacles: dict[str, str] = {}  # ALFRED id -> type
        self.location: dict[str, str] = {}  # ALFRED id -> location name
        for alfred_id, pose in placed:
            kind = alfred_id.split("|", 1)[0]
            basin = _BASINS.get(kind)
            rid = f"{alfred_id}|{basin}" if basin else alfred_id
            self.receptacles[rid] = basin or kind
            self.location[rid] = "loc|%d|%d|%d|%d" % tuple(int(round(v * 4)) if i < 2 else int(v) for i, v in enumerate(pose))
        static = set(constants.RECEPTACLES) - set(constants.MOVABLE_RECEPTACLES)
        present = set(self.receptacles.values())
        for kind in sorted(set(objects) & static - present - set(_BASINS.values())):
            low, high = _UNPLACED_COUNTS.get(kind, (1, 1))
            for _ in range(rng.randint(low, high)):
                rid = f"{kind}|{_coords(rng)}"
                self.receptacles[rid] = kind
                self.location[rid] = f"loc|{len(self.location)}|{rng.randint(-20, 20)}|{rng.choice((0, 90, 180, 270))}|{rng.choice((0, 30, 60))}"
        # Objects: anything ALFRED lets a receptacle hold, present in the scene and not itself fixed.
        holdable = set().union(*constants.VAL_RECEPTACLE_OBJECTS.values())
        self.object_types = sorted((set(objects) & holdable) - static - set(_LAMPS))
        self.lamps = sorted(set(objects) & set(_LAMPS))
        self.types = sorted(set(self.receptacles.values()))

    def trim(self, keep: set[str], cap: int, rng: random.Random) -> None:
        """Keep the receptacles in ``keep`` and others drawn at random, ``cap`` in all."""
        rest = sorted(set(self.receptacles) - keep)
        rng.shuffle(rest)
        chosen = keep | set(rest[: max(0, cap - len(keep))])
        self.receptacles = {r: t for r, t in self.receptacles.items() if r in chosen}
        self.location = {r: loc for r, loc in self.location.items() if r in chosen}
        self.types = sorted(set(self.receptacles.values()))

    def holders(self, obj_type: str, exclude: str | None = None) -> list[str]:
        """The scene's receptacles that can hold ``obj_type`` (not of type ``exclude``)."""
        valid = self.constants.VAL_RECEPTACLE_OBJECTS
        return [r for r, t in self.receptacles.items() if obj_type in valid.get(t, ()) and t != exclude]

    def parent_types(self, obj_type: str) -> list[str]:
        valid = self.constants.VAL_RECEPTACLE_OBJECTS
        return [t for t in self.types if obj_type in valid.get(t, ())]


def _choose(scene: _Scene, task_type: str, rng: random.Random) -> dict[str, str] | None:
    """The task's targets in this scene, or None when the scene cannot host the task type."""
    c = scene.constants
    need = {
        "pick_clean_then_place_in_recep": ("Cleanable", "SinkBasin"),
        "pick_heat_then_place_in_recep": ("Heatable", "Microwave"),
        "pick_cool_then_place_in_recep": ("Coolable", "Fridge"),
    }.get(task_type)
    candidates = []
    for obj in scene.object_types:
        if need and (obj not in c.VAL_ACTION_OBJECTS[need[0]] or need[1] not in scene.types):
            continue
        for parent in scene.parent_types(obj):
            if need and parent == need[1]:
                continue  # "put a hot apple in the microwave" would be won by heating it there
            if scene.holders(obj, exclude=parent):
                candidates.append((obj, parent))
    if task_type == "look_at_obj_in_light":
        stands = [r for r, t in scene.receptacles.items() if t in _LAMP_STANDS]
        if not scene.lamps or not stands:
            return None
        objs = sorted({obj for obj, _ in candidates})
        if not objs:
            return None
        return {"object_target": rng.choice(objs), "parent_target": "", "toggle_target": rng.choice(scene.lamps),
                "lamp_stand": rng.choice(stands)}
    if not candidates:
        return None
    obj, parent = rng.choice(candidates)
    return {"object_target": obj, "parent_target": parent, "toggle_target": ""}


def generate_task(seed: int, task_type: str | None = None, max_distractors: int = 12, max_receptacles: int = 16) -> GeneratedTask:
    """Build a solvable ALFWorld task from ``seed`` (same seed, same task, in any process).

    The task type (uniform over the six unless given) picks a floor plan of a room ALFRED allows it
    in (``GOALS_VALID``); the target object and receptacle are drawn among what that scene holds;
    The scene keeps ``max_receptacles`` of its receptacles (those the task needs, and others drawn
    at random): ALFRED's largest kitchens have 50, whose PDDL problems Fast Downward's planner could
    not solve within minutes and gigabytes on this machine. Then
    1-3 instances of the target (2-3 for ``pick_two_obj_and_place``) and up to ``max_distractors``
    other objects go into receptacles ALFRED lets hold them (``VAL_RECEPTACLE_OBJECTS``), never
    into one of the target receptacle's type, so no task is won at the start. Every needed
    receptacle exists and every placed object can be reached, so the task is solvable by
    construction (the tests check it with the expert).
    """
    rng = random.Random(seed)
    constants, _, _, _ = _alfworld()
    task_type = task_type or rng.choice(list(TASK_TYPES.values()))
    if task_type not in TASK_TYPES.values():
        raise ValueError(f"unknown ALFWorld task type {task_type!r}; choose one of {', '.join(TASK_TYPES.values())}")
    rooms = sorted(constants.GOALS_VALID[task_type])
    for _ in range(1000):
        floor_plan = rng.choice([n for room in rooms for n in ROOMS[room]])
        try:
            scene = _Scene(floor_plan, rng)
        except FileNotFoundError:
            continue
        targets = _choose(scene, task_type, rng)
        if targets is not None:
            break
    else:  # pragma: no cover - every task type has scenes that host it
        raise RuntimeError(f"no floor plan hosts {task_type}")

    obj, parent, toggle = targets["object_target"], targets["parent_target"], targets["toggle_target"]
    keep = {rng.choice(scene.holders(obj, exclude=parent or None))}
    for kind in (parent, {"pick_clean_then_place_in_recep": "SinkBasin", "pick_heat_then_place_in_recep": "Microwave",
                          "pick_cool_then_place_in_recep": "Fridge"}.get(task_type)):
        if kind:
            keep.add(rng.choice(sorted(r for r, t in scene.receptacles.items() if t == kind)))
    if toggle:
        keep.add(targets["lamp_stand"])
    scene.trim(keep, max_receptacles, rng)
    placements: list[tuple[str, str, str]] = []  # (ALFRED id, type, receptacle id)
    low = 2 if task_type == "pick_two_obj_and_place" else 1
    for _ in range(rng.randint(low, 3)):
        placements.append((f"{obj}|{_coords(rng)}", obj, rng.choice(scene.holders(obj, exclude=parent or None))))
    others = [t for t in scene.object_types if t != obj and scene.holders(t, exclude=parent or None)]
    for kind in rng.sample(others, min(len(others), rng.randint(max_distractors // 2, max_distractors))):
        placements.append((f"{kind}|{_coords(rng)}", kind, rng.choice(scene.holders(kind, exclude=parent or None))))
    if toggle:
        placements.append((f"{toggle}|{_coords(rng)}", toggle, targets["lamp_stand"]))

    start = f"loc|{rng.randint(-20, 20)}|{rng.randint(-20, 20)}|{rng.choice((0, 90, 180, 270))}|30"
    problem = _problem(f"generated_{seed}", scene, placements, start, task_type, obj, parent, toggle)
    traj_data = {
        "task_type": task_type,
        "scene": {"floor_plan": f"FloorPlan{floor_plan}", "scene_num": floor_plan},
        "pddl_params": {"object_target": obj, "parent_target": parent, "toggle_target": toggle,
                        "mrecep_target": "", "object_sliced": False},
        "task_id": f"generated_{seed}",
        "generator": "envhub_alfworld",
    }
    objects: dict[str, list[str]] = {}
    for alfred_id, kind, recep in placements:
        objects.setdefault(recep, []).append(alfred_id)
    return GeneratedTask(floor_plan, task_type, traj_data, problem, task_sentence(traj_data, rng), objects)


def _problem(name: str, scene: _Scene, placements: list[tuple[str, str, str]], start: str,
             task_type: str, obj: str, parent: str, toggle: str) -> str:
    """The PDDL problem, written as ALFRED writes ``initial_state.pddl``."""
    c = scene.constants
    _, goals, _, _ = _alfworld()
    m = mangle
    receptacles = sorted(scene.receptacles)
    locations = sorted(set(scene.location.values()) | {start})
    object_types = sorted({kind for _, kind, _ in placements})
    lines = [f"(define (problem {name})", "(:domain alfred)", "(:objects", "agent1 - agent"]
    lines += [f"{m(loc)} - location" for loc in locations]
    lines += [f"{m(r)} - receptacle" for r in receptacles]
    lines += [f"{m(o)} - object" for o, _, _ in placements]
    lines += [f"{t}Type - rtype" for t in scene.types]
    lines += [f"{t}Type - otype" for t in object_types]
    lines += [")", "(:init", f"(atLocation agent1 {m(start)})"]
    for r in receptacles:
        kind = scene.receptacles[r]
        lines.append(f"(receptacleType {m(r)} {kind}Type)")
        lines.append(f"(receptacleAtLocation {m(r)} {m(scene.location[r])})")
        if kind in c.OPENABLE_CLASS_SET:
            lines.append(f"(openable {m(r)})")
    for rtype in scene.types:
        for otype in object_types:
            if otype in c.VAL_RECEPTACLE_OBJECTS.get(rtype, ()):
                lines.append(f"(canContain {rtype}Type {otype}Type)")
    for alfred_id, kind, recep in placements:
        o = m(alfred_id)
        lines.append(f"(objectType {o} {kind}Type)")
        lines.append(f"(inReceptacle {o} {m(recep)})")
        lines.append(f"(objectAtLocation {o} {m(scene.location[recep])})")
        if kind in _LAMPS:
            lines.append(f"(toggleable {o})")
            continue
        lines.append(f"(pickupable {o})")
        for flag, group in (("cleanable", "Cleanable"), ("heatable", "Heatable"), ("coolable", "Coolable")):
            if kind in c.VAL_ACTION_OBJECTS[group]:
                lines.append(f"({flag} {o})")
    lines.append(")")
    goal = goals.gdict[task_type]["pddl"].format(obj=obj, recep=parent, toggle=toggle, mrecep="")
    goal = goal.replace(" # ", " - ")
    return "\n".join(lines) + "\n" + goal.strip() + "\n"
