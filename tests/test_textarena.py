"""The envhub-textarena plugin: TextArena's games behind the envhub contract."""

import json
import random
import re
from pathlib import Path

import pytest

import envhub
from envhub.error import MissingDependency
from envhub.generation import ExpertPolicy, RandomPolicy

textarena = pytest.importorskip("textarena")
from envhub_textarena.env import TextArenaEnv  # noqa: E402
from envhub_textarena.games import SINGLE_PLAYER, TWO_PLAYER, UNAVAILABLE, envhub_id  # noqa: E402


def _single_player_variants():
    """TextArena's default-version ids whose game is a single-player one, read from the source
    (importing some game modules downloads data)."""
    from textarena.envs.registration import ENV_REGISTRY

    root = Path(textarena.__file__).parent.parent
    found = []
    for ta_id, ta_spec in ENV_REGISTRY.items():
        if re.search(r"-(raw|train)(-|$)", ta_id):
            continue
        module = str(ta_spec.entry_point).partition(":")[0]
        path = root / (module.replace(".", "/") + ".py")
        if path.exists() and "SinglePlayerState" in path.read_text():
            found.append(ta_id)
    return found


def test_every_single_player_variant_is_registered_or_listed_unavailable():
    variants = _single_player_variants()
    registered = {game.ta_id for game in SINGLE_PLAYER}
    assert len(variants) > 60
    assert set(variants) == registered | set(UNAVAILABLE)
    assert not registered & set(UNAVAILABLE)
    ids = {spec.id for spec in envhub.registry.values()}
    assert {game.envhub_id for game in SINGLE_PLAYER} <= ids


def test_ids_follow_envhubs_form():
    assert envhub_id("Sudoku-v0-very-easy") == "textarena/Sudoku-very-easy-v0"
    assert envhub_id("TowerOfHanoi-v0") == "textarena/TowerOfHanoi-v0"
    assert "textarena/NimSelfPlay-medium-v0" in {spec.id for spec in envhub.registry.values()}


def test_an_unavailable_game_says_why_without_fetching_anything():
    with pytest.raises(MissingDependency, match="nltk"):
        TextArenaEnv("Wordle-v0")


def test_an_unavailable_id_is_listed_and_its_error_gives_the_reason():
    from click.testing import CliRunner

    from envhub.cli import cli
    from envhub.error import UnknownEnv

    with pytest.raises(UnknownEnv, match="envhub-textarena knows it but cannot offer it here: .*nltk"):
        envhub.make("textarena/Wordle-v0")
    result = CliRunner().invoke(cli, ["info", "textarena/Wordle-v0"])
    assert result.exit_code != 0 and "nltk" in result.output and "Traceback" not in result.output
    rows = json.loads(CliRunner().invoke(cli, ["list", "--unavailable", "--json"]).stdout)
    rows = [row for row in rows if row["id"].startswith("textarena/")]  # other plugins list theirs too
    assert {row["id"] for row in rows} == {envhub_id(ta_id) for ta_id in UNAVAILABLE}
    assert all(row["plugin"] == "envhub-textarena" and row["reason"] for row in rows)


def _play(env, policy, seed):
    observation, info = env.reset(seed=seed)
    while True:
        observation, reward, terminated, truncated, info = env.step(policy.act(env, observation))
        assert info["action_is_valid"], info.get("invalid_reason")
        if terminated or truncated:
            return reward, info


@pytest.mark.parametrize("env_id", [g.envhub_id for g in SINGLE_PLAYER if g.family in ("TowerOfHanoi", "GuessTheNumber")])
def test_the_expert_solves_every_game_that_has_one(env_id):
    env = envhub.make(env_id)
    for seed in range(3):
        reward, info = _play(env, ExpertPolicy(), seed)
        assert info["success"] and reward == 1.0


def test_hanoi_expert_is_optimal():
    env = envhub.make("textarena/TowerOfHanoi-medium-v0")
    env.reset(seed=0)
    moves = 0
    while not env.is_success():
        env.step(env.expert_action())
        moves += 1
    assert moves == 2**4 - 1


def test_the_expert_replans_after_a_detour():
    env = envhub.make("textarena/TowerOfHanoi-v0")
    env.reset(seed=0)
    env.step("[A B]")  # off the optimal path
    for _ in range(env.max_turns - 1):
        *_, terminated, truncated, info = env.step(env.expert_action())
        if terminated:
            break
    assert info["success"]


def test_a_refused_move_leaves_the_game_as_it_was_and_gives_the_games_reason():
    env = envhub.make("textarena/Minesweeper-small-v0")
    observation, info = env.reset(seed=2)
    for _ in range(5):  # past TextArena's error allowance: the game would otherwise be lost
        bad, reward, terminated, truncated, bad_info = env.step("dig everywhere")
        assert not bad_info["action_is_valid"] and not terminated and reward == 0.0
        assert bad_info["state_key"] == info["state_key"]
        assert "the game refused" in bad and observation in bad
    assert not env.game.state.done and env.game.state.error_count == 0


def test_interleaved_instances_keep_their_own_random_streams():
    def trace(env, seed, other=None):
        env.reset(seed=seed)
        keys = []
        for move in ["[up]", "[left]", "[down]", "[right]"] * 3:
            if other is not None:
                other.step("[up]")  # draws from TextArena's random in between
            keys.append(env.step(move)[4]["state_key"])
        return keys

    alone = trace(envhub.make("textarena/2048-v0"), 5)
    other = envhub.make("textarena/2048-v0")
    other.reset(seed=99)
    assert trace(envhub.make("textarena/2048-v0"), 5, other) == alone


def test_games_leave_the_callers_global_random_stream_alone():
    random.seed(7)
    expected = [random.random() for _ in range(3)]
    env = envhub.make("textarena/2048-v0")
    random.seed(7)
    drawn = [random.random()]
    env.reset(seed=1)
    env.step("[up]")  # 2048 draws a new tile from TextArena's random after every move
    drawn.append(random.random())
    env.step("[left]")
    drawn.append(random.random())
    assert drawn == expected


def test_a_game_that_keeps_a_random_function_draws_from_its_own_stream():
    # TextArena's Secretary keeps ``random.random`` from its constructor and samples with it at reset.
    def first_observation(global_seed):
        random.seed(global_seed)
        return envhub.make("textarena/Secretary-v0").reset(seed=3)[0]

    assert first_observation(1) == first_observation(2)


def test_an_opponent_answers_between_the_models_moves():
    env = envhub.make("textarena/TicTacToe-v0", seat=0, opponent="random")
    observation, info = env.reset(seed=0)
    assert info["to_move"] == 0
    observation, _, _, _, info = env.step(env.valid_actions()[0])
    assert info["to_move"] == 0 and "[Player 1]" in observation
    trajectories = env.seat_trajectories()
    assert trajectories["Player 1"].played_by == "opponent" and len(trajectories["Player 1"].turns) == 1


class AnswerFirstCell:
    """A model-like opponent: replies in envhub's answer format."""

    def __init__(self, seed=None):
        self.replies = 0

    def act(self, env, observation):
        self.replies += 1
        return f"<think>take a corner</think><answer>{env.valid_actions()[-1]}</answer>"


def test_any_envhub_policy_can_be_the_opponent():
    policy = AnswerFirstCell()
    env = envhub.make("textarena/TicTacToe-v0", seat=0, opponent=policy)
    env.reset(seed=0)
    env.step("[0]")
    assert policy.replies == 1 and env.opponent_fallbacks == 0
    assert env.game.state.game_state["board"][2][2] != ""


def test_the_expert_never_loses_tictactoe_and_wins_nim_from_a_winning_seat():
    for seed in range(4):
        reward, info = _play(envhub.make("textarena/TicTacToe-v0", seat=seed % 2), ExpertPolicy(), seed)
        assert info["outcome"][info["seat"]] >= 0
    # Nim 3-4-5 has a non-zero nim-sum: the first player wins with perfect play, even against it.
    reward, info = _play(envhub.make("textarena/Nim-v0", seat=0), ExpertPolicy(), 0)
    assert info["success"] and reward == 1.0


def test_self_play_hands_every_turn_to_the_caller():
    env = envhub.make("textarena/NimSelfPlay-v0")
    _, info = env.reset(seed=1)
    movers = []
    policy = RandomPolicy(seed=0)
    terminated = False
    while not terminated:
        movers.append(info["to_move"])
        _, _, terminated, truncated, info = env.step(policy.act(env, ""))
        assert not truncated
    assert set(movers) == {0, 1} and all(a != b for a, b in zip(movers, movers[1:]))
    trajectories = env.seat_trajectories()
    assert {t.played_by for t in trajectories.values()} == {"model"}
    assert sorted(t.outcome for t in trajectories.values()) == ["loss", "win"]
    assert info["success"]  # judged for the seat that moved last, which took the last object


def test_two_player_games_are_registered_against_an_opponent_and_in_self_play():
    ids = {spec.id for spec in envhub.registry.values()}
    for duel in TWO_PLAYER:
        family = duel.ta_id.split("-v")[0]
        assert envhub_id(duel.ta_id) in ids
        assert envhub_id(duel.ta_id.replace(family, family + "SelfPlay", 1)) in ids
