"""envhub environments through GEM's registry and API (the real gem-llm package), as ROLL drives them."""

from __future__ import annotations

import json

import pytest

gem = pytest.importorskip("gem")

from click.testing import CliRunner  # noqa: E402

import envhub  # noqa: E402
from envhub.cli import cli  # noqa: E402
from envhub.core import INFO_KEYS  # noqa: E402
from envhub.integrations.gem import PREFIX, register_envs  # noqa: E402

ALL_IDS = list(envhub.registry)
SEED = 3


#: What a person types into an env with neither an expert nor a list of legal moves (open text
#: games): some moves the game takes, some it refuses; the input then ends, and so does the episode.
TYPED = ["1", "[1]", "up", "[a b]", "hello"]


def player_for(env_id: str) -> str:
    """The expert where the env has one, else random legal moves, else a person typing :data:`TYPED`."""
    env = envhub.make(env_id)
    env.reset(seed=SEED)
    if env.expert_action() is not None:
        return "expert"
    return "random" if env.valid_actions() else "human"


def envhub_run(env_id: str, policy: str) -> dict:
    """The ``envhub run --json`` record of one episode from ``SEED``."""
    typed = "\n".join(TYPED) + "\n" if policy == "human" else None
    result = CliRunner().invoke(cli, ["run", env_id, "--policy", policy, "--seed", str(SEED), "--json"], input=typed)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def envhub_info(info: dict) -> dict:
    """GEM's info less the keys it adds, as ``envhub run --json`` writes info."""
    return json.loads(json.dumps({k: v for k, v in info.items() if k not in ("env_instruction", "suffix")}, default=str))


#: Ids slow to play on 2 cores (big generated levels, compiled games): `make check` leaves them out.
SLOW_IDS = {"textarena/Sokoban-medium-v0", "textarena/Sudoku-hard-v0", "textworld/Cooking-level3-v0", "alfworld/ALFWorldGenerated-v0"}


@pytest.mark.parametrize("env_id", [pytest.param(i, marks=pytest.mark.slow if i in SLOW_IDS else ()) for i in ALL_IDS])
def test_gem_make_plays_the_transcript_of_envhub_run(env_id):
    """``gem.make("envhub:ID")``, driven through GEM's reset/step with the expert's replies in the
    answer format, plays the transcript ``envhub run --policy expert --json`` prints. An env with no
    expert (Connect Four) replays the random policy's actions instead, and one with no list of
    moves either (TextArena's open text games) the moves a person typed."""
    player = player_for(env_id)
    expert = player == "expert"
    record = envhub_run(env_id, player)
    env = gem.make(PREFIX + env_id)
    assert isinstance(env, gem.Env) and env.env_id == PREFIX + env_id
    observation, info = env.reset(seed=SEED)
    assert all(isinstance(info[k], t) for k, t in INFO_KEYS.items())
    assert env.env.instructions.strip() in info["env_instruction"] and "<answer>" in info["suffix"]
    transcript = [{"observation": observation, "action": None, "reward": 0.0, "info": envhub_info(info)}]
    done = False
    while not done and len(transcript) < len(record["transcript"]):  # a person's input may end first
        action = env.env.expert_action() if expert else record["transcript"][len(transcript)]["action"]
        observation, reward, terminated, truncated, info = env.step(f"<answer>{action}</answer>")
        transcript.append({"observation": observation, "action": action, "reward": float(reward), "info": envhub_info(info)})
        done = terminated or truncated
    assert transcript == record["transcript"]
    if expert and env_id.startswith(("sokoban/", "frozenlake/FrozenLakeNotSlippery", "gym/Taxi")):
        assert info["success"] is True


def test_a_reply_that_breaks_the_format_spends_a_turn_and_changes_nothing():
    env = gem.make(PREFIX + "sokoban/Sokoban-v0")
    observation, info = env.reset(seed=0)
    after, reward, terminated, truncated, bad = env.step("Up")  # no <answer> tags
    assert bad["action_is_valid"] is False and bad["state_key"] == info["state_key"]
    assert after.endswith(observation) and "<answer>" in after and reward == 0.0 and not (terminated or truncated)
    assert env.env.turn == 1


def test_gem_env_options_and_gem_conventions():
    env = gem.make(PREFIX + "frozenlake/FrozenLakeNotSlippery-v0", action_format=None, max_turns=3, seed=5)
    first, _ = env.reset()  # the seed given to make (as gem.make_vec passes one) seeds the first reset
    assert first == envhub.make("frozenlake/FrozenLakeNotSlippery-v0").reset(seed=5)[0]
    legal = env.env.valid_actions()
    assert env.step(legal[0])[4]["action_is_valid"] is True  # action_format=None: the text is the action
    reply = env.sample_random_action()
    assert reply in legal
    twin = env.spawn(same_state=True)
    assert twin.env.state_key() == env.env.state_key() and twin.env is not env.env
    fresh = env.spawn()
    assert fresh.env.max_turns == 3 and fresh.fmt is None
    answer = gem.make(PREFIX + "frozenlake/FrozenLakeNotSlippery-v0")
    answer.reset(seed=0)
    assert answer.sample_random_action().startswith("<answer>")


def test_registration_is_idempotent_and_unknown_ids_fail_in_one_line():
    assert register_envs() == []  # importing the module registered every id already
    with pytest.raises(ValueError, match="not found in registry"):
        gem.make(PREFIX + "sokoban/Sokoban-v99")
    with pytest.raises(ValueError, match="unknown action format"):
        gem.make(PREFIX + "sokoban/Sokoban-v0", action_format="xml")


def test_integrations_page_gem_example_plays_an_expert_episode(capsys):
    from docs_pages import DOCS, code_block

    source = code_block(DOCS / "integrations.md", "python", lambda b: 'gem.make("envhub:' in b)
    namespace: dict = {}
    exec(compile(source, "docs/integrations.md", "exec"), namespace)  # noqa: S102
    assert capsys.readouterr().out.split() == ["True", "10.9"]  # solved; gym-sokoban's rewards
    assert namespace["system_prompt"].startswith(envhub.make("sokoban/Sokoban-v0").instructions.strip()[:40])
