"""FrozenLake: Gymnasium's dynamics, the text grid, the expert and the optimal success probability."""

import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

import envhub
from envhub_frozenlake import optimal_success_probability
from envhub_frozenlake.env import FrozenLakeTextEnv
from view_checks import assert_views_change_the_text_only


@pytest.mark.parametrize("slippery", [True, False])
def test_transitions_equal_gymnasiums_for_the_same_map_and_seed(slippery):
    env = FrozenLakeTextEnv(size=8, is_slippery=slippery)
    rng = np.random.default_rng(0)
    for seed in range(20):
        env.reset(seed=seed)
        # The text env seeds its inner Gymnasium env with the second draw of its own generator.
        draws = np.random.default_rng(seed)  # gymnasium.utils.seeding uses default_rng(PCG64) too
        from gymnasium.utils import seeding

        gen, _ = seeding.np_random(seed)
        gen.integers(2**31 - 1)
        inner_seed = int(gen.integers(2**31 - 1))
        raw = FrozenLakeEnv(desc=list(env.desc), is_slippery=slippery)
        state, _ = raw.reset(seed=inner_seed)
        assert state == env.position
        for _ in range(40):
            a = int(rng.integers(4))
            state, reward, terminated, _, _ = raw.step(a)
            _, text_reward, text_terminated, truncated, info = env.step(env.action_names[a])
            assert (env.position, text_reward, text_terminated) == (state, reward, terminated)
            if terminated or truncated:
                break
        del draws


def test_grid_legend_and_distinct_player_on_hole_and_goal():
    env = FrozenLakeTextEnv(desc=["SH", "FG"], is_slippery=False)
    observation, _ = env.reset(seed=0)
    assert observation == "PO\n_G"
    observation, reward, terminated, _, info = env.step("Right")
    assert observation == "X\u200b"[0] + "\n_G" if False else observation == "_X\n_G"
    assert terminated and reward == 0.0 and not info["success"]
    env.reset(seed=0)
    env.step("Down")
    observation, reward, terminated, _, info = env.step("Right")
    assert observation == "_O\n_√" and terminated and reward == 1.0 and info["success"]


def test_random_maps_follow_p_and_the_seed():
    env = FrozenLakeTextEnv(size=8, p=0.8)
    maps = {env.reset(seed=s)[1]["map"] for s in range(10)}
    assert len(maps) == 10
    assert env.reset(seed=3)[1]["map"] == FrozenLakeTextEnv(size=8, p=0.8).reset(seed=3)[1]["map"]
    holes = np.mean([env.reset(seed=s)[1]["map"].count("H") / 64 for s in range(200)])
    assert 0.12 < holes < 0.2  # p=0.8 before Gymnasium rejects maps with no path


def test_expert_solves_non_slippery_maps_by_a_shortest_path():
    env = envhub.make("frozenlake/FrozenLake8x8NotSlippery-v0")
    for seed in range(30):
        env.reset(seed=seed)
        path = _shortest_path_length(env.desc)
        steps = 0
        while True:
            *_, terminated, truncated, info = env.step(env.expert_action())
            steps += 1
            if terminated or truncated:
                break
        assert info["success"] and steps == path


def _shortest_path_length(desc):
    from collections import deque

    n, m = len(desc), len(desc[0])
    start = "".join(desc).index("S")
    seen, queue = {start: 0}, deque([start])
    while queue:
        s = queue.popleft()
        r, c = divmod(s, m)
        if desc[r][c] == "G":
            return seen[s]
        if desc[r][c] == "H":
            continue
        for dr, dc in ((0, -1), (1, 0), (0, 1), (-1, 0)):
            rr, cc = r + dr, c + dc
            if 0 <= rr < n and 0 <= cc < m and rr * m + cc not in seen:
                seen[rr * m + cc] = seen[s] + 1
                queue.append(rr * m + cc)
    raise AssertionError("no path")


def test_value_iteration_matches_simulation_of_the_expert():
    env = envhub.make("frozenlake/FrozenLake-v0")
    env.reset(seed=21)
    desc = env.desc
    predicted = optimal_success_probability(desc, True, env.max_turns)
    fixed = FrozenLakeTextEnv(desc=list(desc), is_slippery=True)
    fixed.max_turns = env.max_turns
    episodes = 3000
    wins = 0
    for seed in range(episodes):
        fixed.reset(seed=seed)
        while True:
            *_, terminated, truncated, info = fixed.step(fixed.expert_action())
            if terminated or truncated:
                break
        wins += info["success"]
    sigma = np.sqrt(predicted * (1 - predicted) / episodes)
    assert abs(wins / episodes - predicted) < 4 * sigma + 1e-9, (wins / episodes, predicted)
    assert 0.0 < predicted < 1.0


def test_optimal_success_grows_with_the_turn_limit_and_is_one_without_slip():
    desc = ["SFFF", "FHFH", "FFFH", "HFFG"]
    values = [optimal_success_probability(desc, True, h) for h in (6, 10, 20, 100)]
    assert values == sorted(values) and values[0] < values[-1] <= 1.0
    assert optimal_success_probability(desc, False, 6) == 1.0
    assert optimal_success_probability(desc, False, 5) == 0.0
    assert envhub.make("frozenlake/FrozenLake-v0").reset(seed=0) and True


def test_bad_arguments_say_what_to_pass():
    with pytest.raises(ValueError, match="map_name"):
        FrozenLakeTextEnv(map_name="3x3")
    with pytest.raises(ValueError, match="0 < p"):
        FrozenLakeTextEnv(p=0.0)


def test_local_view_names_the_four_neighbours_and_the_position():
    env = FrozenLakeTextEnv(desc=["SH", "FG"], is_slippery=False, view="local")
    observation, _ = env.reset(seed=0)
    assert observation == "Row 1, column 1.\nLeft: edge. Down: ice. Right: hole. Up: edge."
    observation, *_ = env.step("Down")
    assert observation == "Row 2, column 1.\nLeft: edge. Down: edge. Right: goal. Up: ice."
    observation, reward, terminated, _, info = env.step("Right")
    assert (observation, reward, terminated, info["success"]) == ("Row 2, column 2. You reached the goal.", 1.0, True, True)
    assert "one step Left, Down, Right and Up" in env.instructions and "Legend" not in env.instructions


@pytest.mark.parametrize("view", ["local", "grid+local"])
def test_views_change_the_text_only(view):
    """Same seed, same actions: the same states, rewards and state keys in every view."""
    shows = (lambda grid, shown: shown.startswith(grid)) if view == "grid+local" else (lambda grid, shown: "Row 1, column 1." in shown)
    assert_views_change_the_text_only("frozenlake/FrozenLake-v0", view, seeds=10, steps=20, shows=shows)


def test_local_view_passes_the_checker():
    from envhub.checker import check_env

    report = check_env("frozenlake/FrozenLakeNotSlippery-v0", fuzz=200, view="local")
    assert report.ok, report.format()


def test_unknown_view_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="grid\\+local"):
        FrozenLakeTextEnv(view="map")


def _play_expert(env: FrozenLakeTextEnv, seed: int, desc: list[str] | None = None) -> tuple[list[str], bool]:
    env.reset(seed=seed, options={"desc": desc} if desc else None)
    actions, done, info = [], False, {}
    while not done:
        actions.append(env.expert_action())
        *_, terminated, truncated, info = env.step(actions[-1])
        done = terminated or truncated
    return actions, bool(info["success"])


def test_view_expert_moves_depend_only_on_tiles_the_player_has_seen():
    """Change a tile the player never saw: the view expert plays the same moves; the map expert may not."""
    env = FrozenLakeTextEnv(is_slippery=False, view="local", expert="view")
    env.max_turns = 8
    changed = 0
    for seed in range(40):
        actions, _ = _play_expert(env, seed)
        seen = {cell for cell, _ in env._seen}
        desc = [list(row) for row in env.desc]
        for r, c in [(r, c) for r in range(4) for c in range(4) if (r, c) not in seen and desc[r][c] in "FH"]:
            desc[r][c] = "H" if desc[r][c] == "F" else "F"
            other = ["".join(row) for row in desc]
            if planner_has_path(other):
                assert _play_expert(env, seed, other)[0] == actions, (seed, other)
                changed += 1
            desc[r][c] = "H" if desc[r][c] == "F" else "F"
    assert changed > 20


def planner_has_path(desc: list[str]) -> bool:
    from envhub_frozenlake.view_planning import _has_path

    return _has_path(np.array([[ch == "H" for ch in row] for row in desc]))


def test_view_expert_wins_what_its_belief_mdp_promises():
    """On 3x3 random maps (128 boards), the view expert's exact prior-weighted success equals the
    planner's optimum, which lies between the memoryless level and the full-map expert's 1."""
    from envhub_frozenlake.view_planning import ViewPlanner

    planner = ViewPlanner(3, 0.8)
    env = FrozenLakeTextEnv(size=3, is_slippery=False, view="local", expert="view")
    env.max_turns = 5
    won = 0.0
    for hole, weight in zip(planner.hole, planner.weight):
        desc = ["".join("G" if (r, c) == (2, 2) else "S" if (r, c) == (0, 0) else "H" if hole[r, c] else "F" for c in range(3)) for r in range(3)]
        won += weight * _play_expert(env, 0, desc)[1]
    assert won == pytest.approx(planner.success_probability(5), abs=1e-9)
    assert 0.8 < won < 1.0


def test_view_expert_is_refused_where_it_cannot_plan():
    with pytest.raises(ValueError, match="unknown expert"):
        FrozenLakeTextEnv(expert="oracle")
    for kwargs in ({"is_slippery": True}, {"map_name": "4x4", "is_slippery": False}, {"size": 5, "is_slippery": False}):
        with pytest.raises(ValueError, match="expert='view'"):
            FrozenLakeTextEnv(expert="view", **kwargs)


def test_local_view_with_the_view_expert_passes_the_checker():
    from envhub.checker import check_env

    report = check_env("frozenlake/FrozenLakeNotSlippery-v0", fuzz=100, view="local", expert="view")
    assert report.ok, report.format()
