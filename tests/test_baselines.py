"""The reference policies (envhub.baselines): random, best open-loop sequence, expert, optimal."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import envhub
from envhub.baselines import best_open_loop, optimal_success_rate, reference_policies
from envhub.core import DiscreteTextEnv
from envhub.error import PolicyError
from envhub.generation import Completion
from envhub.manager import EnvGroupManager, group_seeds
from envhub.registration import registry
from envhub.rollout import batch_metrics, rollout
from envhub.settings import EnvSettings


class Corridor(DiscreteTextEnv):
    """Walk from cell 0 to the goal at cell 2 or 3 (drawn from the seed); reaching it ends the episode.

    With 3 turns, Right, Right, Right is the only sequence that wins every seed.
    """

    action_names = ("Wait", "Right", "Left")
    instructions = "Walk right to the goal."

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.goal, self.pos = int(self.np_random.integers(2, 4)), 0
        return self.render_text(), {}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.pos = max(0, self.pos + {"Wait": 0, "Right": 1, "Left": -1}[action])
        return self.render_text(), float(self.is_success()), self.is_success(), {}

    def state_key(self) -> str:
        return f"{self.pos}/{self.goal}"

    def is_success(self) -> bool:
        return self.pos == self.goal

    def render_text(self) -> str:
        return f"cell {self.pos}, goal {self.goal}"


class Signpost(DiscreteTextEnv):
    """A sign shows which door opens; one turn to walk through it. Reading the sign wins every
    seed; a fixed choice wins only the seeds whose door it is."""

    action_names = ("Left", "Right")
    instructions = "Take the door the sign points to."

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.door, self.taken = self.action_names[int(self.np_random.integers(2))], None
        return f"The sign points {self.door}.", {}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.taken = action
        return "The door opens." if self.is_success() else "Locked.", float(self.is_success()), True, {}

    def state_key(self) -> str:
        return f"{self.door}:{self.taken}"

    def is_success(self) -> bool:
        return self.taken == self.door

    def render_text(self) -> str:
        return f"sign: {self.door}"

    def expert_action(self) -> str:
        return self.door


SEEDS = list(range(16))


@pytest.fixture
def toy_envs():
    envhub.register("test/Corridor-v0", Corridor, max_turns=3)
    envhub.register("test/Signpost-v0", Signpost, max_turns=1)
    yield
    registry.remove("test/Corridor-v0")
    registry.remove("test/Signpost-v0")


def goals(seeds: list[int]) -> list[int]:
    """The corridor's goal cell on each seed."""
    env, out = Corridor(), []
    for seed in seeds:
        env.reset(seed=seed)
        out.append(env.goal)
    return out


def play(env_id: str, seeds: list[int], actions: tuple[str, ...], **make_kwargs: Any) -> int:
    """How many of ``seeds`` the fixed ``actions`` win, each episode on a fresh env."""
    wins = 0
    for seed in seeds:
        env = envhub.make(env_id, **make_kwargs)
        env.reset(seed=seed)
        for action in actions:
            _, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        wins += info["success"]
    return wins


class FixedSequence:
    """A generator that replies the t-th action of a sequence at turn t (episodes run in lockstep)."""

    def __init__(self, actions: tuple[str, ...]):
        self.actions, self.turn = actions, 0

    def generate(self, prompts, sampling):
        action = self.actions[self.turn]
        self.turn += 1
        return [Completion([], [], f"<answer>{action}</answer>") for _ in prompts]


def test_the_unique_winning_sequence_of_a_corridor_is_found_exhaustively(toy_envs):
    assert set(goals(SEEDS)) == {2, 3}
    result = best_open_loop("test/Corridor-v0", SEEDS)
    assert result.actions == ("Right", "Right", "Right") and result.success_rate == 1.0
    assert result.exhaustive and result.max_turns == 3
    # Wait and Left lead to the same joint state at cell 0, as do Right-Wait and Wait-Right at
    # cell 1: merged, 1 + 2 + 3 joint states are expanded instead of 1 + 3 + 9.
    assert result.joint_states == 6


def test_a_narrow_beam_is_marked_non_exhaustive(toy_envs):
    narrow = best_open_loop("test/Corridor-v0", SEEDS, beam_width=1)
    assert not narrow.exhaustive
    # Width 1 keeps Wait (the first of the tied prefixes) and cannot reach a goal 3 cells away afterwards.
    assert narrow.actions[0] == "Wait" and narrow.success_rate < 1.0
    # Width 2 drops a joint state at depth 2 but keeps Right-Right (most successes): still the best, not proven.
    wider = best_open_loop("test/Corridor-v0", SEEDS, beam_width=2)
    assert not wider.exhaustive and wider.actions == ("Right", "Right", "Right")


def test_the_turn_limit_is_the_managers(toy_envs):
    shorter = best_open_loop("test/Corridor-v0", SEEDS, max_turns=2)
    assert shorter.max_turns == 2 and shorter.actions == ("Right", "Right")
    assert shorter.successes == goals(SEEDS).count(2)


def test_reading_observations_beats_every_fixed_sequence(toy_envs):
    doors = []
    for seed in SEEDS:
        env = Signpost()
        env.reset(seed=seed)
        doors.append(env.door)
    assert 0 < doors.count("Left") < len(SEEDS)
    references = reference_policies(EnvSettings("test/Signpost-v0"), SEEDS)
    assert list(references) == ["random policy", "open-loop", "expert"]  # no known limit: no "optimal"
    assert references["open-loop"] == max(doors.count("Left"), doors.count("Right")) / len(SEEDS)
    assert references["open-loop"] < references["expert"] == 1.0


def test_references_leave_out_what_the_env_cannot_provide(toy_envs):
    references = reference_policies(EnvSettings("test/Corridor-v0"), SEEDS)
    assert set(references) == {"random policy", "open-loop"}  # no expert, no known limit
    assert references["open-loop"] == 1.0 and references["random policy"] < 1.0


def test_a_factory_works_and_an_open_action_space_is_refused():
    assert best_open_loop(Corridor, SEEDS, max_turns=3).actions == ("Right", "Right", "Right")
    with pytest.raises(PolicyError, match="turn limit"):
        best_open_loop(Corridor, SEEDS)

    class Open(Corridor):
        def valid_actions(self):
            return None

    with pytest.raises(PolicyError, match="finite action list"):
        best_open_loop(Open, SEEDS, max_turns=3)

    class Unsearchable(Corridor):
        searchable = False

        def reset(self, **kwargs):
            raise AssertionError("an unsearchable env is not played by the search")

    with pytest.raises(PolicyError, match="searchable = False"):
        best_open_loop(Unsearchable, SEEDS, max_turns=3)


@pytest.mark.parametrize("slippery", [False, True], ids=["not-slippery", "slippery"])
def test_exhaustive_search_matches_brute_force_on_small_lakes(slippery):
    kwargs = {"size": 3, "is_slippery": slippery}
    seeds = list(range(8))
    result = best_open_loop("frozenlake/FrozenLake-v0", seeds, max_turns=4, env_kwargs=kwargs)
    assert result.exhaustive
    best = max(
        play("frozenlake/FrozenLake-v0", seeds, sequence, max_turns=4, **kwargs)
        for sequence in itertools.product(("Left", "Down", "Right", "Up"), repeat=4)
    )
    assert best > 0 and result.successes == best
    assert play("frozenlake/FrozenLake-v0", seeds, result.actions, max_turns=4, **kwargs) == best


@pytest.mark.parametrize(
    ("env_id", "max_turns", "beam_width"),
    [("frozenlake/FrozenLake-v0", 8, 4096), ("sokoban/Sokoban-v0", None, 64)],
)
def test_the_sequence_wins_as_many_seeds_through_the_manager(env_id, max_turns, beam_width):
    seeds = list(range(12))
    result = best_open_loop(env_id, seeds, max_turns, beam_width=beam_width)
    assert result.successes > 0
    with EnvGroupManager(env_id, len(seeds), 1, max_turns=max_turns) as manager:
        trajectories = rollout(manager, FixedSequence(result.actions), seeds=seeds)
    assert batch_metrics(trajectories)["success_rate"] == result.success_rate


def test_the_same_seeds_give_the_same_sequence_in_another_process():
    seeds = list(range(100, 124))
    result = best_open_loop("frozenlake/FrozenLake-v0", seeds, max_turns=6)
    code = (
        "import json; from envhub.baselines import best_open_loop; "
        f"r = best_open_loop('frozenlake/FrozenLake-v0', {seeds}, max_turns=6); "
        "print(json.dumps([r.actions, r.successes, r.exhaustive]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [list(result.actions), result.successes, result.exhaustive]


def test_frozenlakes_optimal_is_the_mean_of_its_planned_limit():
    from envhub_frozenlake.planning import optimal_success_probability

    seeds = list(range(20))
    expected = []
    for seed in seeds:
        env = envhub.make("frozenlake/FrozenLake-v0")
        env.reset(seed=seed)
        expected.append(optimal_success_probability(env.desc, True, 20))
    assert 0.0 < np.mean(expected) < 1.0
    assert optimal_success_rate("frozenlake/FrozenLake-v0", seeds) == pytest.approx(np.mean(expected))


def test_sokobans_optimal_is_whether_the_level_fits_the_turn_limit():
    seeds = list(range(12))
    assert optimal_success_rate("sokoban/Sokoban-v0", seeds) == 1.0  # generated levels always fit 10 turns
    env = envhub.make("sokoban/Sokoban-v0")
    lengths = [env.reset(seed=s)[1]["optimal_length"] for s in seeds]
    assert 0 < sum(n <= 4 for n in lengths) < len(seeds)
    assert optimal_success_rate("sokoban/Sokoban-v0", seeds, max_turns=4) == sum(n <= 4 for n in lengths) / len(seeds)


def test_eval_json_carries_the_references(tmp_path):
    pytest.importorskip("torch")
    from envhub.cli import cli
    from envhub_trl.tiny import build_tiny

    lake = "frozenlake/FrozenLakeNotSlippery-v0"
    model = build_tiny(tmp_path / "tiny", env_ids=[lake])
    command = ["eval", lake, "--model", str(model), "--episodes", "6", "--max-turns", "6", "--max-turn-tokens", "4", "--seed", "3"]
    result = CliRunner().invoke(cli, [*command, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    expected = reference_policies(EnvSettings(lake, max_turns=6), group_seeds(3, 0, 6), seed=3)
    assert report["references"] == expected
    assert list(expected) == ["random policy", "open-loop", "expert", "optimal"] and expected["expert"] == 1.0
    assert report["open_loop_exhaustive"] is True
    assert play(lake, group_seeds(3, 0, 6), tuple(report["open_loop_actions"]), max_turns=6) / 6 == expected["open-loop"]
    skipped = CliRunner().invoke(cli, [*command, "--json", "--no-references"])
    assert skipped.exit_code == 0, skipped.output
    assert "references" not in json.loads(skipped.stdout.strip().splitlines()[-1])
