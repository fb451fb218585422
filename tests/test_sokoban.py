"""Sokoban: gym-sokoban's dynamics and rewards, generated levels, the optimal solver, pictures."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import envhub
from envhub.checker import check_env
from envhub_sokoban import (
    ALT_LEGEND,
    Board,
    GenerationError,
    InvalidLevel,
    Oracle,
    SokobanEnv,
    board_from_rooms,
    board_to_rooms,
    generate_level,
    solve,
)
from envhub_sokoban.render import TILE, board_to_rgb
from envhub_sokoban.solver import DistanceTable, dead_squares
from view_checks import assert_views_change_the_text_only

VARIANTS = {
    "sokoban/Sokoban-v0": (6, 6, 1),
    "sokoban/SokobanAltSymbols-v0": (6, 6, 1),
    "sokoban/Sokoban8x8-v0": (8, 8, 2),
    "sokoban/Sokoban10x10-v0": (10, 10, 3),
}


def play(level: str, *actions: str, max_turns: int | None = None):
    """Reset a SokobanEnv on a hand-written level and take ``actions``; return every step's result."""
    env = SokobanEnv(level=level)
    env.max_turns = max_turns
    env.reset(seed=0)
    return env, [env.step(a) for a in actions]


# ---------------------------------------------------------------------- dynamics and rewards


def test_walking_costs_a_step_and_a_push_onto_the_last_target_wins():
    env, [(obs1, r1, term1, trunc1, info1), (obs2, r2, term2, _, info2)] = play(
        "######\n#P_XO#\n######", "Right", "Right"
    )
    assert obs1 == "######\n#_PXO#\n######"
    assert r1 == pytest.approx(-0.1) and not term1 and not trunc1
    assert info1["moved_player"] and not info1["moved_box"] and not info1["success"]
    assert obs2 == "######\n#__P√#\n######"
    assert r2 == pytest.approx(-0.1 + 1 + 10) and term2
    assert info2["success"] and info2["moved_box"] and info2["boxes_on_target"] == 1
    assert env.is_success()


def test_a_box_against_a_wall_does_not_move_but_the_step_is_paid():
    _, [(obs, reward, terminated, _, info)] = play("######\n#O_PX#\n######", "Right")
    assert obs == "######\n#O_PX#\n######"
    assert reward == pytest.approx(-0.1) and not terminated
    assert info["action_is_valid"] and not info["moved_player"] and not info["moved_box"]


def test_a_box_cannot_push_another_box():
    _, [(obs, reward, _, _, info)] = play("########\n#PXX_OO#\n########", "Right")
    assert obs == "########\n#PXX_OO#\n########" and reward == pytest.approx(-0.1)
    assert not info["moved_player"]


def test_walking_into_a_wall_changes_nothing():
    _, [(obs, reward, _, _, _)] = play("#####\n#P_X#\n#_O_#\n#####", "Up")
    assert obs == "#####\n#P_X#\n#_O_#\n#####" and reward == pytest.approx(-0.1)


def test_pushing_a_box_off_a_target_costs_one():
    _, [(obs, reward, _, _, info)] = play("#######\n#P√_XO#\n#######", "Right")
    assert obs == "#######\n#_SXXO#\n#######"  # the player now stands on the emptied target
    assert reward == pytest.approx(-0.1 - 1) and info["boxes_on_target"] == 0


def test_moving_a_box_from_one_target_to_another_is_neutral():
    _, [(obs, reward, _, _, info)] = play("######\n#P√OX#\n######", "Right")
    assert obs == "######\n#_S√X#\n######"
    assert reward == pytest.approx(-0.1) and info["boxes_on_target"] == 1


def test_the_player_on_a_target_is_drawn_as_S():
    _, [(obs, *_)] = play("######\n#PO_X#\n#__O_#\n#___X#\n######", "Right")
    assert obs.splitlines()[1] == "#_S_X#"


def test_an_unknown_action_changes_nothing_and_says_why():
    env, [(obs, reward, _, _, info)] = play("######\n#P_XO#\n######", "Jump")
    assert not info["action_is_valid"] and reward == 0.0
    assert "Up, Down, Left, Right" in obs and env.state_key() == "######\n#P_XO#\n######"


def test_the_turn_limit_truncates():
    _, steps = play("######\n#O_PX#\n######", "Right", "Right", max_turns=2)
    assert [s[3] for s in steps] == [False, True]
    assert not steps[-1][2]


def test_alternative_symbols_read_and_draw_the_same_board():
    board = Board.from_text("######\n#P_XO#\n#_√X_#\n#__O_#\n######")
    alt = board.to_text(ALT_LEGEND)
    assert alt == "WWWWWW\nWA.BGW\nW.CB.W\nW..G.W\nWWWWWW"
    assert Board.from_text(alt, ALT_LEGEND) == board
    env = envhub.make("sokoban/SokobanAltSymbols-v0")
    observation, _ = env.reset(seed=0)
    assert set(observation) <= set("WGBCA@.\n")
    assert all(symbol in env.instructions for symbol in "W.GBCA@")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("######\n#P_XO#\n#####", "same length"),
        ("######\n#P_XZ#\n######", "unknown symbol"),
        ("######\n#PPXO#\n######", "exactly one player"),
        ("######\n#P_XX#\n#_O__#\n######", "as many boxes as targets"),
        ("######\n#P_XO_\n######", "surround the level with walls"),
        ("######\n#P_√_#\n######", "already solved"),
        ("", "empty"),
    ],
)
def test_unplayable_levels_are_refused_with_a_reason(text, fragment):
    env = SokobanEnv()
    with pytest.raises(InvalidLevel, match=fragment):
        env.reset(seed=0, options={"level": text})


def test_gym_sokoban_room_arrays_convert_both_ways():
    board = Board.from_text("######\n#S_X_#\n#_√__#\n######")
    fixed, state = board_to_rooms(board)
    assert fixed.tolist() == [[0] * 6, [0, 2, 1, 1, 1, 0], [0, 1, 2, 1, 1, 0], [0] * 6]
    assert state.tolist() == [[0] * 6, [0, 5, 1, 4, 1, 0], [0, 1, 3, 1, 1, 0], [0] * 6]
    assert board_from_rooms(fixed, state) == board


# ---------------------------------------------------------------------- solver


def test_solver_finds_the_fewest_steps_including_walking():
    board = Board.from_text("#######\n#P____#\n#_X_O_#\n#_____#\n#######")
    path = solve(board)
    # Walk left of the box (Down), push it right twice.
    assert path == ["Down", "Right", "Right"]


def test_solver_reports_unsolvable_levels():
    assert solve(Board.from_text("######\n#X__O#\n#__P_#\n######")) is None


def test_dead_squares_are_the_cells_a_box_can_never_leave_for_a_target():
    board = Board.from_text("######\n#____#\n#_XO_#\n#P___#\n######")
    dead = dead_squares(board)
    corners = [1 * 6 + 1, 1 * 6 + 4, 3 * 6 + 1, 3 * 6 + 4]
    assert all(dead >> c & 1 for c in corners)
    assert not dead >> (2 * 6 + 2) & 1 and not dead >> (2 * 6 + 3) & 1


def test_distance_table_layers_are_exact_optimal_lengths():
    board = Board.from_text("########\n#P_____#\n#__X__O#\n#______#\n########")
    table = DistanceTable(board.width, board.floor, board.targets)
    table.grow(50)
    assert table.exhausted
    assert table.distance(board.boxes, board.player) == len(solve(board))


def test_expert_recovers_optimally_after_a_detour():
    env = envhub.make("sokoban/Sokoban10x10-v0")
    env.reset(seed=4)
    first = env.expert_action()
    detour = next(a for a in env.action_names if a != first and env.board.move(a)[1] and not env.board.move(a)[2])
    env.step(detour)
    remaining = solve(env.board)
    steps = 0
    while not env.is_success():
        env.step(env.expert_action())
        steps += 1
    assert steps == len(remaining)


def test_expert_stays_legal_when_the_level_is_lost():
    lost = SokobanEnv(level="######\n#X__O#\n#__P_#\n######")
    _, info = lost.reset(seed=0)
    assert info["optimal_length"] is None
    assert lost.expert_action() in lost.action_names


def test_oracle_gives_up_past_its_search_limit():
    board = generate_level(np.random.default_rng(0), height=10, width=10, num_boxes=3).board
    assert Oracle(board, max_states=10).action(board) is None


# ---------------------------------------------------------------------- generation


@pytest.mark.parametrize("height, width, boxes, depth, seeds", [(6, 6, 1, 10, 40), (8, 8, 2, 20, 15), (10, 10, 3, 30, 8)])
def test_generated_levels_are_solvable_unsolved_and_report_the_optimal_length(height, width, boxes, depth, seeds):
    for seed in range(seeds):
        level = generate_level(np.random.default_rng(seed), height=height, width=width, num_boxes=boxes, search_depth=depth)
        board = level.board
        assert board.num_boxes == boxes and board.targets.bit_count() == boxes
        assert board.boxes & board.targets == 0  # every box starts off its target, as in gym-sokoban
        assert 1 <= level.optimal_length <= depth
        path = solve(board)  # an independent forward search, not the generator's table
        assert path is not None and len(path) == level.optimal_length
        for action in path:
            board = board.move(action)[0]
        assert board.solved


@pytest.mark.parametrize("env_id", sorted(VARIANTS))
def test_the_expert_solves_every_variant_in_exactly_the_optimal_length(env_id):
    env = envhub.make(env_id)
    for seed in range(5):
        _, info = env.reset(seed=seed)
        steps, terminated, truncated = 0, False, False
        while not (terminated or truncated):
            _, _, terminated, truncated, step_info = env.step(env.expert_action())
            steps += 1
        assert terminated and step_info["success"] and steps == info["optimal_length"] <= env.max_turns


def test_generation_settings_that_cannot_make_a_level_are_refused():
    with pytest.raises(ValueError, match="3x3"):
        generate_level(np.random.default_rng(0), height=2, width=6, num_boxes=1)
    with pytest.raises(ValueError, match="boxes"):
        generate_level(np.random.default_rng(0), height=4, width=4, num_boxes=3)
    with pytest.raises(ValueError, match="search_depth"):
        generate_level(np.random.default_rng(0), search_depth=0)
    with pytest.raises(GenerationError, match="attempts"):
        generate_level(np.random.default_rng(0), height=5, width=5, num_boxes=2, num_steps=0, max_attempts=3)


def test_bad_settings_fail_when_the_env_is_made():
    with pytest.raises(ValueError, match="boxes"):
        envhub.make("sokoban/Sokoban-v0", num_boxes=40)
    with pytest.raises(ValueError, match="symbols"):
        envhub.make("sokoban/Sokoban-v0", symbols="emoji")


def test_same_seed_same_level_and_other_seeds_other_levels():
    env = envhub.make("sokoban/Sokoban8x8-v0")
    first = [env.reset(seed=s)[0] for s in range(10)]
    again = [envhub.make("sokoban/Sokoban8x8-v0").reset(seed=s)[0] for s in range(10)]
    assert first == again
    assert len(set(first)) == 10


def test_same_seed_same_level_in_other_processes():
    script = (
        "import json, envhub\n"
        "out = {}\n"
        f"for env_id in {sorted(VARIANTS)!r}:\n"
        "    env = envhub.make(env_id)\n"
        "    out[env_id] = [list(env.reset(seed=s)) for s in range(4)]\n"
        "print(json.dumps(out))\n"
    )
    local = {
        env_id: [json.loads(json.dumps(list(envhub.make(env_id).reset(seed=s)))) for s in range(4)]
        for env_id in sorted(VARIANTS)
    }
    for hash_seed in ("0", "123"):
        environ = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environ, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == local


# ---------------------------------------------------------------------- registration and the checker


@pytest.mark.parametrize("env_id", sorted(VARIANTS))
def test_every_variant_is_registered_with_its_room(env_id):
    env_spec = envhub.spec(env_id)
    assert env_spec.plugin == "envhub-sokoban"
    height, width, boxes = VARIANTS[env_id]
    observation, info = envhub.make(env_id).reset(seed=2)
    rows = observation.splitlines()
    assert len(rows) == height and all(len(r) == width for r in rows)
    assert info["num_boxes"] == boxes
    assert env_spec.kwargs["search_depth"] <= env_spec.max_turns


@pytest.mark.parametrize("env_id", sorted(VARIANTS))
def test_every_variant_passes_envhub_check(env_id):
    report = check_env(env_id)
    assert report.ok, report.format()


# ---------------------------------------------------------------------- views


def test_local_view_puts_the_box_its_target_and_the_neighbours_into_words():
    env = SokobanEnv(level="#######\n#P_X__#\n#___O_#\n#######", view="local")
    observation, _ = env.reset(seed=0)
    assert observation == (
        "Row 2, column 2.\nBox: 2 right. Target: 1 down, 1 right of the box.\n"
        "Up: wall. Down: floor. Left: wall. Right: floor."
    )
    observation, *_ = env.step("Right")
    assert observation.splitlines()[1:] == ["Box: 1 right. Target: 1 down, 1 right of the box.",
                                             "Up: wall. Down: floor. Left: floor. Right: box (can push)."]
    observation, *_ = env.step("Right")  # a push: the box now stands above its target
    assert observation.splitlines()[1] == "Box: 1 right. Target: 1 down of the box."
    env.step("Right")
    observation, _, _, _, info = env.step("Right")  # the box is against the wall
    assert not info["moved_box"]
    assert observation.splitlines()[1:] == ["Box: 1 right. Target: 1 down, 1 left of the box.",
                                             "Up: wall. Down: target. Left: floor. Right: box (blocked)."]
    assert "Legend" not in env.instructions and "one step Up, Down, Left and Right" in env.instructions


def test_local_view_says_when_a_box_is_on_its_target_and_lists_every_box():
    env = SokobanEnv(level="######\n#P√X_#\n#__O_#\n######", view="local")
    observation, _ = env.reset(seed=0)
    assert observation.splitlines()[1:3] == ["Box: 1 right. It is on a target.", "Box: 2 right. Target: 1 down of the box."]


@pytest.mark.parametrize("view", ["local", "grid+local"])
def test_views_change_the_text_only(view):
    """Same seed, same actions: the same levels, rewards and state keys in every view."""
    shows = (lambda grid, shown: shown.startswith(grid + "\n")) if view == "grid+local" else (lambda grid, shown: shown.startswith("Row "))
    assert_views_change_the_text_only("sokoban/Sokoban8x8-v0", view, seeds=5, steps=15, shows=shows)


def test_local_view_passes_the_checker():
    report = check_env("sokoban/Sokoban-v0", fuzz=200, view="local")
    assert report.ok, report.format()


def test_unknown_view_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="grid\\+local"):
        SokobanEnv(view="map")


# ---------------------------------------------------------------------- pictures


def tile(picture: np.ndarray, r: int, c: int) -> np.ndarray:
    """The pixels of cell ``(r, c)``."""
    return picture[r * TILE : (r + 1) * TILE, c * TILE : (c + 1) * TILE]


def test_render_rgb_draws_one_tile_per_cell_and_follows_the_state():
    env = SokobanEnv(level="######\n#P_XO#\n######", render_mode="rgb_array")
    env.reset(seed=0)
    before = env.render()
    assert before.shape == (3 * TILE, 6 * TILE, 3) and before.dtype == np.uint8
    assert not np.array_equal(tile(before, 1, 1), tile(before, 1, 2))  # player vs floor
    assert not np.array_equal(tile(before, 1, 3), tile(before, 1, 4))  # box vs target
    assert np.array_equal(tile(before, 0, 0), tile(before, 2, 5))  # walls look alike
    env.step("Right")
    env.step("Right")
    after = env.render()
    assert np.array_equal(tile(after, 1, 3), tile(before, 1, 1))  # the player moved on
    assert np.array_equal(tile(after, 1, 1), tile(before, 1, 2))
    assert not np.array_equal(tile(after, 1, 4), tile(before, 1, 3))  # a box on target looks done
    assert np.array_equal(board_to_rgb(env.board), after)
    text_env = SokobanEnv(level="######\n#P_XO#\n######")
    observation, _ = text_env.reset(seed=0)
    assert text_env.render() == observation


def test_bench_sokoban_failures_replays_an_episode_with_the_solver_after_each_turn():
    """bench/sokoban_failures.py's replay: an optimal win has no wasted move; an invalid reply is a
    wasted turn; a box pushed against a wall away from its target is stuck from that turn on."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("sokoban_failures", Path(__file__).parents[1] / "bench" / "sokoban_failures.py")
    failures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(failures)
    corridor = SokobanEnv(level="######\n#P_XO#\n######")
    win = failures.replay(corridor, 0, ["Right", "Right"])
    assert win["won"] and win["optimal_length"] == 2 and win["wasted"] == 0 and win["optimal_moves"] == [True, True]
    slow = failures.replay(corridor, 0, ["Right", None, "Left", "Right", "Right"])
    assert slow["won"] and slow["invalid"] == 1 and slow["first_wasted"] == 1 and slow["wasted"] == 2 and slow["stuck_at"] is None
    room = SokobanEnv(level="######\n#__P_#\n#_X__#\n#___O#\n######")
    stuck = failures.replay(room, 0, ["Down", "Left", "Up"])
    assert not stuck["won"] and stuck["stuck_at"] == 1 and stuck["turns"] == 3
