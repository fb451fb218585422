"""Extracting actions from LLM replies."""

import pytest

from envhub.actions import FORMATS, TagFormat, apply_reply, get_format, match_action, parse_reply

LEGAL = ["Left", "Down", "Right", "Up"]


def test_answer_tag_is_extracted_and_matched_to_the_legal_spelling():
    parsed = parse_reply("I will go <answer>  rIGHT </answer>", LEGAL)
    assert parsed.valid and parsed.actions == ("Right",)


def test_think_then_answer():
    parsed = parse_reply("<think>the goal is below</think>\n<answer>Down</answer>", LEGAL, get_format("think-answer"))
    assert parsed.valid and parsed.think == "the goal is below" and parsed.action == "Down"


@pytest.mark.parametrize(
    "reply, reason",
    [
        ("Down", "no <answer>"),
        ("<answer>Down", "never closed"),
        ("Down</answer>", "no opening"),
        ("<answer><answer>Down</answer></answer>", "exactly one block"),
        ("<answer>Down</answer><answer>Up</answer>", "exactly one block"),
        ("</answer>Down<answer>", "before"),
        ("<answer>  </answer>", "empty action"),
        ("<answer>Down</answer><think>late</think>", "must come before"),
        ("<think>x<answer>Down</answer>", "never closed"),
    ],
)
def test_malformed_replies_say_why(reply, reason):
    parsed = parse_reply(reply, LEGAL)
    assert not parsed.format_valid and not parsed.valid
    assert reason in parsed.error


def test_think_is_mandatory_only_when_required():
    assert parse_reply("<answer>Up</answer>", LEGAL).valid
    parsed = parse_reply("<answer>Up</answer>", LEGAL, get_format("think-answer"))
    assert not parsed.valid and "<think>" in parsed.error


def test_illegal_action_is_well_formed_but_not_legal():
    parsed = parse_reply("<answer>Jump</answer>", LEGAL)
    assert parsed.format_valid and not parsed.legal
    assert "Jump" in parsed.error and "Left" in parsed.error


def test_several_actions_are_capped():
    fmt = TagFormat(max_actions=2)
    parsed = fmt.parse("<answer>up || LEFT || down</answer>", LEGAL)
    assert parsed.valid and parsed.actions == ("Up", "Left") and parsed.dropped == 1
    assert not fmt.parse("<answer>up || </answer>", LEGAL).valid
    assert parse_reply("<answer>Up || Left</answer>", LEGAL).legal is False


def test_open_action_spaces_keep_the_text():
    assert parse_reply("<answer> search[red shoes] </answer>").actions == ("search[red shoes]",)


def test_strict_format_refuses_text_outside_tags():
    fmt = TagFormat(strict=True)
    assert fmt.parse("<think>a</think> <answer>Up</answer>\n", LEGAL).valid
    assert not fmt.parse("so: <answer>Up</answer>", LEGAL).valid


def test_a_megabyte_of_open_tags_parses_quickly_and_invalidly():
    parsed = parse_reply("<answer>" * 200_000, LEGAL)
    assert not parsed.valid


def test_non_text_replies_are_invalid_not_errors():
    assert not parse_reply(None, LEGAL).valid


def test_match_action_and_format_registry():
    assert match_action("  up\n", LEGAL) == "Up" and match_action("upp", LEGAL) is None
    assert set(FORMATS) >= {"answer", "think-answer"}
    with pytest.raises(ValueError, match="choose one of"):
        get_format("xml")
    with pytest.raises(ValueError):
        TagFormat(max_actions=0)


def test_apply_reply_spends_a_turn_on_bad_format_and_leaves_the_state():
    import envhub

    env = envhub.make("frozenlake/FrozenLakeNotSlippery-v0")
    _, info = env.reset(seed=0)
    outcome = apply_reply(env, "Right")
    assert not outcome.info["action_is_valid"] and outcome.info["state_key"] == info["state_key"]
    assert "no <answer>" in outcome.observation and env.turn == 1
    outcome = apply_reply(env, "<answer>Right || Down</answer>", TagFormat(max_actions=2))
    assert outcome.info["action_is_valid"] and env.turn == 3
