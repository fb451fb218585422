"""The Gymnasium and PettingZoo adapters: transitions, opponents, self-play, errors."""

from __future__ import annotations

import collections
import runpy
import subprocess
import sys
from typing import Any, ClassVar

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils import seeding

import envhub
from envhub.adapters import GymnasiumTextEnv, PettingZooTextEnv, blackjack, canonical_key, connect_four, tictactoe
from envhub.adapters.planning import TablePlanner
from envhub.adapters.references import load_reference
from envhub.error import AdapterError
from envhub.generation import ExpertPolicy, RandomPolicy

pettingzoo = pytest.importorskip("pettingzoo")

GYM_IDS = ["gym/Taxi-v3", "gym/CliffWalking-v1", "gym/Blackjack-v1"]
PZ_IDS = ["pettingzoo/TicTacToe-v0", "pettingzoo/TicTacToeSelfPlay-v0", "pettingzoo/ConnectFour-v0", "pettingzoo/ConnectFourSelfPlay-v0"]


def inner_seed(seed: int) -> int:
    """The seed the adapter passes to the wrapped env's reset: the first draw from its np_random."""
    rng, _ = seeding.np_random(seed)
    return int(rng.integers(2**31 - 1))


def raw_env(env_id: str) -> gymnasium.Env:
    """The Gymnasium env an adapter registration wraps, built independently of envhub."""
    if env_id == "gym/Taxi-v3":
        from gymnasium.envs.toy_text.taxi import TaxiEnv

        return TaxiEnv()
    return gymnasium.make(env_id.removeprefix("gym/")).unwrapped


def play(env: Any, policy: Any, seed: int) -> list[tuple[str, str, float, dict[str, Any]]]:
    """One episode: (observation before, action, reward, info) per step."""
    observation, _ = env.reset(seed=seed)
    steps = []
    done = False
    while not done:
        action = policy.act(env, observation)
        before = observation
        observation, reward, terminated, truncated, info = env.step(action)
        steps.append((before, action, float(reward), info))
        done = terminated or truncated
    return steps


# ---------------------------------------------------------------------- registry


def test_adapters_are_registered_by_the_builtin_plugin():
    for env_id in GYM_IDS + PZ_IDS:
        assert envhub.spec(env_id).plugin == "envhub-adapters"
    infos = {p.name: p for p in envhub.plugins.plugin_infos()}
    assert infos["envhub-adapters"].error is None
    assert "register_envs" in infos["envhub-adapters"].hooks


# ---------------------------------------------------------------------- Gymnasium


@pytest.mark.parametrize("env_id", GYM_IDS)
def test_gym_transitions_equal_the_wrapped_env(env_id):
    for seed in range(5):
        env = envhub.make(env_id, max_turns=None)
        raw = raw_env(env_id)
        env.reset(seed=seed)
        expected, _ = raw.reset(seed=inner_seed(seed))
        assert canonical_key(env.observation) == canonical_key(expected)
        rng = np.random.default_rng(seed)
        for _ in range(40):
            index = int(rng.integers(raw.action_space.n))
            _, reward, terminated, truncated, info = env.step(env.action_names[index])
            expected, raw_reward, raw_terminated, _, _ = raw.step(index)
            assert canonical_key(env.observation) == canonical_key(expected)
            assert (reward, terminated) == (float(raw_reward), raw_terminated)
            assert info["action_is_valid"] and not truncated
            if terminated:
                break


def test_gym_same_seed_same_episode_in_another_instance():
    for env_id in GYM_IDS:
        a = play(envhub.make(env_id), RandomPolicy(3), seed=11)
        b = play(envhub.make(env_id), RandomPolicy(3), seed=11)
        assert a == b


def test_gym_invalid_action_leaves_the_state_unchanged():
    env = envhub.make("gym/Taxi-v3")
    observation, info = env.reset(seed=0)
    state = env.observation
    for junk in ["Fly", "", "south east", "6", "<answer>North</answer>"]:
        text, reward, terminated, _, step_info = env.step(junk)
        assert step_info["action_is_valid"] is False
        assert step_info["state_key"] == info["state_key"]
        assert env.observation == state
        assert reward == 0.0 and not terminated
        assert text.endswith(observation)
    _, _, _, _, step_info = env.step("  nOrTh ")
    assert step_info["action_is_valid"] is True


def test_gym_texts_are_free_of_colour_codes_and_say_where_things_are():
    env = envhub.make("gym/Taxi-v3")
    observation, _ = env.reset(seed=4)
    assert "\x1b" not in observation
    assert "Passenger: waiting at" in observation and "Destination:" in observation
    assert "Taxi: row" in observation
    ansi = GymnasiumTextEnv(entry_point="gymnasium.envs.toy_text.taxi:TaxiEnv", action_names=list("SNEWPD"))
    text, _ = ansi.reset(seed=4)
    assert "\x1b" not in text and "+---------+" in text
    blackjack_env = envhub.make("gym/Blackjack-v1")
    text, _ = blackjack_env.reset(seed=1)
    assert text.startswith("Your cards:") and "Dealer shows:" in text
    text, *_ = blackjack_env.step("Stick")
    assert "Dealer's cards:" in text and "The episode is over." in text


def test_gym_env_without_text_rendering_says_what_to_pass():
    with pytest.raises(AdapterError, match="observation_to_text"):
        GymnasiumTextEnv("Blackjack-v1", action_names=["Stick", "Hit"])


def test_gym_env_without_action_names_says_what_to_pass():
    with pytest.raises(AdapterError, match=r"action_names=\[\.\.\.\] with 4 names"):
        GymnasiumTextEnv("CliffWalking-v1")
    with pytest.raises(AdapterError, match="has 4 actions but action_names has 2"):
        GymnasiumTextEnv("CliffWalking-v1", action_names=["a", "b"])
    with pytest.raises(AdapterError, match="distinct"):
        GymnasiumTextEnv("CliffWalking-v1", action_names=["Up", "up", "Down", "Left"])


class _Meanings(gymnasium.Env):
    """A two-action env with an action-meaning table and an ansi rendering."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}

    def __init__(self, render_mode: str | None = None, continuous: bool = False):
        self.render_mode = render_mode
        self.observation_space = spaces.Discrete(3)
        self.action_space = spaces.Box(-1, 1, (1,)) if continuous else spaces.Discrete(2, start=5)
        self.position = 1

    def get_action_meanings(self) -> list[str]:
        return ["LEFT", "RIGHT"]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 1
        return self.position, {}

    def step(self, action):
        self.position += 1 if action == 6 else -1
        done = self.position in (0, 2)
        return self.position, float(self.position == 2), done, False, {}

    def render(self):
        return "\x1b[31m" + "".join("A" if i == self.position else "." for i in range(3)) + "\x1b[0m"


def test_gym_action_names_from_the_meaning_table_and_success_on_positive_reward():
    env = GymnasiumTextEnv(entry_point=_Meanings)
    assert env.valid_actions() == ["LEFT", "RIGHT"]
    observation, _ = env.reset(seed=0)
    assert observation == ".A."
    observation, reward, terminated, _, info = env.step("right")
    assert observation.startswith("..A") and reward == 1.0 and terminated and info["success"]
    env.reset(seed=0)
    *_, info = env.step("LEFT")
    assert not info["success"]


def test_gym_continuous_actions_are_refused():
    with pytest.raises(AdapterError, match="Discrete action space"):
        GymnasiumTextEnv(entry_point=_Meanings, gym_kwargs={"continuous": True}, action_names=["a"])


def test_gym_needs_exactly_one_source():
    with pytest.raises(AdapterError, match="exactly one"):
        GymnasiumTextEnv()
    with pytest.raises(AdapterError, match="Gymnasium cannot find"):
        GymnasiumTextEnv("NoSuchEnv-v9", action_names=["a"])


def test_table_planner_needs_a_transition_table():
    with pytest.raises(AdapterError, match="transition table"):
        TablePlanner(_Meanings())


def test_cliffwalking_expert_takes_the_shortest_safe_path():
    env = envhub.make("gym/CliffWalking-v1")
    steps = play(env, ExpertPolicy(), seed=0)
    assert steps[-1][3]["success"]
    assert [action for _, action, _, _ in steps] == ["Up"] + ["Right"] * 11 + ["Down"]
    assert all(reward == -1.0 for _, _, reward, _ in steps)


def shortest_delivery(taxi: gymnasium.Env, start: int) -> int:
    """Breadth-first search on Taxi's transition table: the fewest moves to a delivery."""
    depth, frontier = {start: 0}, collections.deque([start])
    while frontier:
        state = frontier.popleft()
        for action in range(taxi.action_space.n):
            (_, nxt, _, done), = taxi.P[state][action]
            if done:
                return depth[state] + 1
            if nxt not in depth:
                depth[nxt] = depth[state] + 1
                frontier.append(nxt)
    raise AssertionError("no delivery is reachable")


def test_taxi_expert_delivers_every_passenger_by_a_shortest_route():
    env = envhub.make("gym/Taxi-v3")
    for seed in range(10):
        env.reset(seed=seed)
        shortest = shortest_delivery(env.inner, env.observation)
        steps = play(env, ExpertPolicy(), seed=seed)
        assert steps[-1][3]["success"], seed
        assert len(steps) == shortest
        assert steps[-1][2] == 20.0
        assert all(reward == -1.0 for _, _, reward, _ in steps[:-1])  # no illegal pickup or dropoff


def test_blackjack_expert_matches_sutton_and_barto():
    # Figure 5.2 of Sutton & Barto: the optimal policy's thresholds.
    assert sum(blackjack.dealer_outcomes(10).values()) == pytest.approx(1.0)
    assert blackjack.best_action(12, 2, False) == blackjack.HIT
    assert blackjack.best_action(13, 2, False) == blackjack.STICK
    assert blackjack.best_action(12, 4, False) == blackjack.STICK
    assert blackjack.best_action(16, 10, False) == blackjack.HIT
    assert blackjack.best_action(17, 10, False) == blackjack.STICK
    assert blackjack.best_action(18, 9, True) == blackjack.HIT
    assert blackjack.best_action(18, 8, True) == blackjack.STICK
    assert blackjack.best_action(21, 1, True) == blackjack.STICK


# ---------------------------------------------------------------------- PettingZoo


def make_tictactoe(**kwargs: Any) -> PettingZooTextEnv:
    return envhub.make("pettingzoo/TicTacToe-v0", **kwargs)


def cells(env: PettingZooTextEnv) -> tuple[int, ...]:
    return tictactoe.cells_of(env.aec)


def test_tictactoe_cells_are_numbered_in_reading_order():
    env = make_tictactoe(opponent="self")
    env.reset(seed=0)
    env.step("3")
    assert cells(env) == (0, 0, tictactoe.X, 0, 0, 0, 0, 0, 0)
    assert tictactoe.board_text(env.aec).splitlines()[0] == " 1 | 2 | X"
    assert env.valid_actions() == ["1", "2", "4", "5", "6", "7", "8", "9"]


@pytest.mark.parametrize("env_id", ["pettingzoo/TicTacToeSelfPlay-v0", "pettingzoo/ConnectFourSelfPlay-v0"])
def test_pettingzoo_transitions_equal_the_wrapped_env(env_id):
    kwargs = envhub.spec(env_id).kwargs
    env_fn, board = load_reference(kwargs["env_fn"], "env_fn"), load_reference(kwargs["board"], "board")
    for seed in range(3):
        env = envhub.make(env_id)
        steps = play(env, RandomPolicy(seed), seed=seed)
        replay = env_fn()
        replay.reset(seed=0)
        for _, action, _, info in steps:
            assert replay.agent_selection == info["seat"]
            replay.step(env.action_names.index(action))
            assert {seat: float(r) for seat, r in replay.rewards.items()} == info["seat_rewards"]
            assert board(replay) == info["state_key"].split("\n", 1)[1]
        assert all(replay.terminations.values())


def test_opponent_moves_between_the_models_turns():
    for seat, model_mark, opponent_mark in [("player_1", tictactoe.X, tictactoe.O), ("player_2", tictactoe.O, tictactoe.X)]:
        env = make_tictactoe(seat=seat, opponent="random")
        observation, info = env.reset(seed=1)
        assert info["seat"] == seat
        opponent_moves_first = seat == "player_2"
        assert cells(env).count(opponent_mark) == int(opponent_moves_first)
        assert ("X played" in observation) == opponent_moves_first
        policy, done = RandomPolicy(1), False
        while not done:
            before = cells(env)
            action = policy.act(env, observation)
            observation, _, terminated, truncated, info = env.step(action)
            after = cells(env)
            assert after.count(model_mark) == before.count(model_mark) + 1
            if not terminated:  # the opponent replied before the model's next turn
                assert after.count(opponent_mark) == before.count(opponent_mark) + 1
                assert f"{'XO'[opponent_mark - 1]} played" in observation
            assert info["seat"] == seat and info["to_move"] in (seat, None)
            done = terminated or truncated
        moves = env.seat_trajectories()
        assert [t.played_by for t in moves.values()] == (["model", "opponent"] if seat == "player_1" else ["opponent", "model"])


def test_self_play_gives_trajectories_for_both_seats():
    policy = RandomPolicy(5)
    outcomes = set()
    for seed in range(8):
        env = envhub.make("pettingzoo/TicTacToeSelfPlay-v0")
        steps = play(env, policy, seed=seed)
        assert [info["seat"] for *_, info in steps] == [("player_1", "player_2")[i % 2] for i in range(len(steps))]
        seats = env.seat_trajectories()
        x, o = seats["player_1"], seats["player_2"]
        assert len(x.turns) + len(o.turns) == len(steps) and len(x.turns) - len(o.turns) in (0, 1)
        assert {x.played_by, o.played_by} == {"model"}
        assert x.total_reward == -o.total_reward
        assert all(t.observation.startswith("You play X.") for t in x.turns)
        assert all(t.observation.startswith("You play O.") for t in o.turns)
        assert [t.action for t in x.turns] == [a for _, a, _, info in steps if info["seat"] == "player_1"]
        if x.outcome == "draw":
            assert o.outcome == "draw" and x.total_reward == 0
        else:
            winner, loser = (x, o) if x.outcome == "win" else (o, x)
            assert loser.outcome == "loss"
            assert winner.turns[-1].reward == 1.0 and loser.turns[-1].reward == -1.0  # the loser's last move is credited
            assert steps[-1][3]["success"] and steps[-1][3]["seat"] == winner.seat
        outcomes.add(x.outcome)
    assert len(outcomes) > 1


def test_opponent_turns_are_recorded_as_a_trajectory_too():
    env = make_tictactoe(seat="player_1", opponent="random")
    steps = play(env, RandomPolicy(0), seed=2)
    seats = env.seat_trajectories()
    assert [t.action for t in seats["player_1"].turns] == [a for _, a, _, _ in steps]
    assert seats["player_2"].played_by == "opponent" and seats["player_2"].turns
    assert seats["player_1"].total_reward == sum(r for _, _, r, _ in steps)


@pytest.mark.parametrize("env_id", PZ_IDS)
def test_pettingzoo_invalid_moves_leave_the_state_unchanged(env_id):
    board = load_reference(envhub.spec(env_id).kwargs["board"], "board")
    env = envhub.make(env_id)
    env.reset(seed=3)
    observation, _, _, _, info = env.step(env.valid_actions()[0])
    taken = [name for name in env.action_names if name not in env.valid_actions()]
    before_board, before_moves = board(env.aec), len(env.seat_trajectories()[info["to_move"]].turns)
    for junk in ["0", "10", "", "X", "<answer>1</answer>", "1 2", *taken[:1]]:
        text, reward, terminated, _, step_info = env.step(junk)
        assert step_info["action_is_valid"] is False, junk
        assert step_info["state_key"] == info["state_key"]
        assert step_info["seat"] == info["to_move"]
        assert board(env.aec) == before_board
        assert len(env.seat_trajectories()[info["to_move"]].turns) == before_moves
        assert reward == 0.0 and not terminated
        assert text.endswith(observation)
    if "TicTacToe" in env_id:
        assert taken


def test_perfect_tictactoe_opponent_never_loses_and_the_expert_always_draws():
    for seed in range(12):
        env = make_tictactoe()
        steps = play(env, RandomPolicy(seed), seed=seed)
        assert env.seat_trajectories()[env.seat].outcome in ("loss", "draw")
        assert steps[-1][3]["success"] == (env.seat_trajectories()[env.seat].outcome == "draw")
        steps = play(env, ExpertPolicy(), seed=seed)
        assert env.seat_trajectories()[env.seat].outcome == "draw" and steps[-1][3]["success"]


def test_tictactoe_expert_wins_against_a_random_opponent_at_least_as_often_as_it_loses():
    results = []
    for seed in range(12):
        env = make_tictactoe(opponent="random", success="win")
        play(env, ExpertPolicy(), seed=seed)
        results.append(env.seat_trajectories()[env.seat].outcome)
    assert "loss" not in results and "win" in results


def test_minimax_takes_a_win_and_blocks_one():
    x, o, e = tictactoe.X, tictactoe.O, tictactoe.EMPTY
    assert tictactoe.best_cells((x, x, e, o, o, e, e, e, e)) == [2]  # X completes the top row
    assert tictactoe.best_cells((x, x, e, o, e, e, e, e, e)) == [2]  # O must block
    assert set(tictactoe.move_scores((e,) * 9).values()) == {0}  # every first move draws


def test_connect_four_heuristic_wins_blocks_and_avoids_handing_over_a_win():
    x, o = connect_four.X, connect_four.O
    grid = np.zeros((6, 7), dtype=np.int8)
    grid[5, 0:3] = x
    grid[4, 0:3] = o
    assert connect_four.to_move(grid) == x
    assert connect_four.heuristic_columns(grid) == [3]  # X completes the bottom row
    grid = np.zeros((6, 7), dtype=np.int8)
    grid[5, 0:3] = x
    grid[4, 0] = o
    grid[5, 6] = o
    assert connect_four.to_move(grid) == o
    assert connect_four.heuristic_columns(grid) == [3]  # O blocks it
    grid = np.zeros((6, 7), dtype=np.int8)
    grid[5] = [x, o, x, 0, 0, x, x]
    grid[4, 0:3] = o  # O wins at grid[4, 3] as soon as column index 3 holds a disc
    assert connect_four.to_move(grid) == x
    assert connect_four.heuristic_columns(grid) == [0, 1, 2, 4, 5, 6]  # X keeps out of column index 3


def test_same_state_by_another_move_order_has_the_same_key():
    a, b = make_tictactoe(opponent="self"), make_tictactoe(opponent="self")
    a.reset(seed=0)
    b.reset(seed=1)
    for move in ["1", "5", "9"]:
        *_, info_a = a.step(move)
    for move in ["9", "5", "1"]:
        *_, info_b = b.step(move)
    assert info_a["state_key"] == info_b["state_key"]
    assert info_a["state_key"].startswith("player_2\n")


def test_pettingzoo_same_seed_same_game_with_seeded_opponents():
    for env_id in ["pettingzoo/TicTacToe-v0", "pettingzoo/ConnectFour-v0"]:
        a = play(envhub.make(env_id), RandomPolicy(7), seed=21)
        b = play(envhub.make(env_id), RandomPolicy(7), seed=21)
        assert a == b
    seats = {make_tictactoe().reset(seed=s)[1]["seat"] for s in range(10)}
    assert seats == {"player_1", "player_2"}


class _Babbler:
    """A model-like opponent: tagged replies, and nonsense every other turn."""

    def __init__(self):
        self.calls = 0

    def act(self, env, observation):
        self.calls += 1
        assert observation.startswith("You play")
        legal = env.valid_actions()
        return f"<think>hmm</think><answer>{legal[-1]}</answer>" if self.calls % 2 else "I resign?"


def test_a_policy_object_plays_the_opponent_and_bad_replies_fall_back_to_a_legal_move():
    babbler = _Babbler()
    env = make_tictactoe(seat="player_2", opponent=babbler)
    play(env, RandomPolicy(0), seed=0)
    opponent = env.seat_trajectories()["player_1"]
    assert babbler.calls == len(opponent.turns) >= 3
    assert opponent.turns[0].action == "9"  # the tagged reply was understood
    assert env.opponent_fallbacks == babbler.calls // 2


def test_expert_opponent_needs_an_expert():
    with pytest.raises(AdapterError, match="needs an expert"):
        envhub.make("pettingzoo/ConnectFour-v0", opponent="expert")
    env = make_tictactoe(opponent="expert", seat="player_2")
    env.reset(seed=0)
    assert cells(env) == (tictactoe.X,) + (0,) * 8


def test_pettingzoo_env_without_text_rendering_says_what_to_pass():
    with pytest.raises(AdapterError, match="board="):
        PettingZooTextEnv("pettingzoo.classic.tictactoe.tictactoe:env", action_names=list(tictactoe.ACTION_NAMES))
    with pytest.raises(AdapterError, match="action_names"):
        PettingZooTextEnv("pettingzoo.classic.tictactoe.tictactoe:env", board="envhub.adapters.tictactoe:board_text")
    with pytest.raises(AdapterError, match="not a seat"):
        make_tictactoe(seat="player_3")
    with pytest.raises(AdapterError, match="success="):
        make_tictactoe(success="draw")


def test_without_pettingzoo_the_ids_are_listed_and_making_one_says_what_to_install():
    script = (
        "import sys; sys.modules['pettingzoo'] = None\n"
        "import envhub\n"
        "from envhub.error import MissingDependency\n"
        "assert 'pettingzoo/TicTacToe-v0' in envhub.registry\n"
        "try:\n"
        "    envhub.make('pettingzoo/TicTacToe-v0')\n"
        "except MissingDependency as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'envhub[pettingzoo]'" in proc.stdout


def test_opponents_can_be_given_as_classes_objects_or_references():
    for opponent in [RandomPolicy, RandomPolicy(0), "envhub.generation:RandomPolicy", "random"]:
        env = make_tictactoe(seat="player_2", opponent=opponent)
        env.reset(seed=0)
        assert cells(env).count(tictactoe.X) == 1
    with pytest.raises(AdapterError, match="opponent="):
        make_tictactoe(opponent=42)
    with pytest.raises(AdapterError, match="no module"):
        make_tictactoe(opponent="no_such_module:Policy")


def test_a_broken_expert_is_reported_when_the_env_is_made():
    with pytest.raises(AdapterError, match="transition table"):
        GymnasiumTextEnv(entry_point=_Meanings, expert="envhub.adapters.planning:TablePlanner")


@pytest.mark.parametrize("env_id", ["gym/CliffWalking-v1", "pettingzoo/TicTacToe-v0"])
def test_rgb_array_pictures_come_from_the_wrapped_env(env_id):
    pytest.importorskip("pygame")
    env = envhub.make(env_id, render_mode="rgb_array")
    env.reset(seed=0)
    first = env.render()
    assert first.ndim == 3 and first.shape[2] == 3 and first.dtype == np.uint8
    env.step(env.expert_action())
    assert not np.array_equal(env.render(), first)
    assert env.render_text().strip()


def test_rgb_array_needs_a_text_function_and_a_picture():
    with pytest.raises(AdapterError, match="rgb_array"):
        GymnasiumTextEnv("CliffWalking-v1", action_names=["U", "R", "D", "L"], render_mode="rgb_array")
    with pytest.raises(AdapterError, match="rgb_array"):
        GymnasiumTextEnv(entry_point=_Meanings, observation_to_text=lambda env, obs, done: str(obs), render_mode="rgb_array")


def test_a_game_without_action_masks_is_refused_with_the_reason():
    env = PettingZooTextEnv("pettingzoo.classic.rps.rps:env", board=lambda aec: "", action_names=["Rock", "Paper", "Scissors"])
    with pytest.raises(AdapterError, match="no action mask"):
        env.reset(seed=0)


def test_environments_page_adapter_example_runs_as_written(tmp_path):
    from docs_pages import DOCS, code_block

    source = code_block(DOCS / "environments.md", "python", lambda block: block.startswith("# wrap a game"))
    (tmp_path / "example.py").write_text(source)
    namespace = runpy.run_path(str(tmp_path / "example.py"))
    seats = namespace["seats"]
    assert set(seats) == {"player_1", "player_2"} and all(t.turns for t in seats.values())
    assert namespace["game"].action_names == tictactoe.ACTION_NAMES
