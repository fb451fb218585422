"""The envhub-textworld plugin: generated TextWorld games behind the envhub contract.

Games are generated on first use and cached under the user cache dir, so only the first run pays
for generation (about 10 s for a pool's first game on 2 cores, a few seconds for each next one).
"""

import re

import pytest

import envhub

pytest.importorskip("textworld")
from envhub_textworld.env import clean_feedback  # noqa: E402
from envhub_textworld.generator import SERIAL, GenerationError, game_file, generate, stamp_serial, story_path  # noqa: E402
from envhub_textworld.plugin import VARIANTS  # noqa: E402

COOKING = next(v for v in VARIANTS if v[0] == "Cooking-level1-v0")


def without_install_paths(text: str) -> str:
    return re.sub(r'"text_grammars_path": "[^"]*"', '"text_grammars_path": ""', text)


@pytest.mark.slow
def test_one_seed_generates_the_same_game_in_another_process(tmp_path, monkeypatch):
    _, challenge, settings, _, _ = COOKING
    cached = game_file(challenge, settings, 0)
    monkeypatch.setenv("ENVHUB_TEXTWORLD_CACHE", str(tmp_path))
    timings = generate(challenge, settings, [0])
    again = story_path(challenge, settings, 0)
    assert again != cached and again.read_bytes() == cached.read_bytes()
    # The game's JSON records where TextWorld's grammar files are installed, which differs between
    # virtual environments; everything else must be the same.
    assert without_install_paths(again.with_suffix(".json").read_text()) == without_install_paths(cached.with_suffix(".json").read_text())
    assert timings[0]["generate_s"] > 0 and timings[0]["compile_s"] > 0


def test_a_compiled_game_carries_the_fixed_serial_not_its_compile_date():
    _, challenge, settings, _, _ = COOKING
    assert game_file(challenge, settings, 0).read_bytes()[0x12:0x18] == SERIAL


def test_stamp_serial_rewrites_only_the_serial_and_refuses_what_is_not_a_story(tmp_path):
    story = tmp_path / "game.z8"
    header = bytes(range(0x12)) + b"261124" + bytes(range(0x40))
    story.write_bytes(header)
    stamp_serial(story)
    assert story.read_bytes() == bytes(range(0x12)) + SERIAL + bytes(range(0x40))
    (tmp_path / "short.z8").write_bytes(b"abc")
    with pytest.raises(GenerationError, match="not a Z-machine story"):
        stamp_serial(tmp_path / "short.z8")


def _play_expert(env, seed, detour=None):
    observation, info = env.reset(seed=seed)
    total = 0.0
    if detour is not None:
        _, reward, *_ = env.step(detour(env))
        total += reward
    for _ in range(env.max_turns):
        observation, reward, terminated, truncated, info = env.step(env.expert_action())
        total += reward
        if terminated or truncated:
            break
    return total, info


@pytest.mark.parametrize("env_id", ["textworld/Cooking-level1-v0", "textworld/Simple-v0"])
def test_the_walkthrough_expert_wins_every_game_of_the_pool(env_id):
    env = envhub.make(env_id)
    for seed in range(4):
        total, info = _play_expert(env, seed)
        assert info["success"] and info["won"]
        assert total == info["max_score"] == info["score"]  # intermediate scores add up to the final one


def test_the_expert_replans_when_the_agent_leaves_the_walkthrough():
    env = envhub.make("textworld/Simple-v0")
    env.reset(seed=0)
    walkthrough_first = env.expert_action()

    def detour(env):
        return next(a for a in env.valid_actions() if a != walkthrough_first and a.startswith(("go", "open", "take")))

    total, info = _play_expert(env, 0, detour)
    assert info["success"]


def test_commands_outside_the_admissible_ones_are_invalid_and_change_nothing():
    env = envhub.make("textworld/Cooking-level1-v0")
    observation, info = env.reset(seed=0)
    bad, reward, terminated, _, bad_info = env.step("fly to the moon")
    assert not bad_info["action_is_valid"] and reward == 0.0 and not terminated
    assert bad_info["state_key"] == info["state_key"] and "fly to the moon" in bad


def test_feedback_loses_the_banner_and_the_interpreters_prompt():
    text = " $$$$ |  \\ \n  \\$$ \n\nYou are hungry!\n\n*** The End ***\n\nWould you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n> "
    assert clean_feedback(text) == "You are hungry!\n\n*** The End ***"
