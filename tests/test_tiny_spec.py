"""``tiny:``: how ``--model tiny`` is built (size, vocabulary, phrase tokens), and FrozenLake's phrases."""

import click
import pytest

from envhub_frozenlake.env import FrozenLakeTextEnv
from envhub_trl.tiny import TinySpec, environment_phrases

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


def test_local_view_declares_each_direction_with_each_tile_and_each_row_and_column():
    phrases = FrozenLakeTextEnv(view="local").phrases
    assert "Down: hole." in phrases and "Left: edge." in phrases and "Row 4," in phrases and "column 1." in phrases
    assert len(phrases) == 4 * 4 + 4 + 4
    assert FrozenLakeTextEnv(view="grid").phrases == ()
    assert environment_phrases([LAKE], {"view": "local"}) == list(phrases)


def test_phrase_tokens_make_each_clause_of_the_view_one_token_and_leave_the_rest_alone():
    kwargs = {LAKE: {"view": "local"}}
    model, tokenizer = TinySpec(phrase_tokens=True).build([LAKE], 0, kwargs_by_env=kwargs)
    plain_model, plain = TinySpec().build([LAKE], 0, kwargs_by_env=kwargs)
    text = "Row 2, column 1.\nLeft: edge. Down: ice. Right: hole. Up: ice."
    pieces = [tokenizer.decode([i]) for i in tokenizer(text).input_ids]
    assert pieces == ["Row 2,", " ", "column 1.", "\n", "Left: edge.", " ", "Down: ice.", " ", "Right: hole.", " ", "Up: ice."]
    assert len(plain(text).input_ids) > 2 * len(pieces)
    assert len(tokenizer) == len(plain) + 24
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)
    assert tokenizer("Reach the goal.").input_ids == plain("Reach the goal.").input_ids


def test_tool_call_tokens_make_the_call_scaffolding_one_token_each():
    from envhub.tools import ToolCall

    from envhub_trl.tiny import TOOL_CALL_PHRASES

    _, tokenizer = TinySpec(tool_call_tokens=True).build([LAKE], 0)
    _, plain = TinySpec().build([LAKE], 0)
    call = ToolCall("move", {"direction": "down"}).render()
    pieces = [tokenizer.decode([i]) for i in tokenizer(call).input_ids]
    assert all(phrase in pieces for phrase in ('<tool_call>', '</tool_call>', '{"name": ', ', "arguments": '))
    assert "".join(pieces) == call and len(pieces) < len(plain(call).input_ids) / 2
    assert len(tokenizer) == len(plain) + len(TOOL_CALL_PHRASES)
    assert tokenizer("Reach the goal.").input_ids == plain("Reach the goal.").input_ids


def test_system_per_episode_merges_the_system_message_into_fewer_tokens():
    kwargs = {LAKE: {"view": "local"}}
    _, once = TinySpec().build([LAKE], 0, kwargs_by_env=kwargs)
    _, often = TinySpec(system_per_episode=True).build([LAKE], 0, kwargs_by_env=kwargs)
    system = "Reply with optionally <think>your reasoning</think>, then <answer>action</answer>. Give exactly one action."
    assert len(often(system).input_ids) < len(once(system).input_ids)


def test_size_fields_reach_the_model():
    model, _ = TinySpec(hidden_size=256, num_heads=4, num_layers=3).build([LAKE], 0)
    config = model.config
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (256, 4, 3)


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"hidden_size": 100, "num_heads": 3}, "multiple of tiny.num_heads"),
        ({"num_layers": 0}, "tiny.num_layers must be a positive integer"),
        ({"phrase_tokens": "yes"}, "tiny.phrase_tokens must be true or false"),
        ({"layers": 2}, "unknown tiny key 'layers' \\(did you mean num_layers\\?\\)"),
        ([1, 2], "tiny must be a mapping"),
    ],
)
def test_bad_tiny_settings_are_one_line_errors(mapping, message):
    with pytest.raises(ValueError, match=message):
        TinySpec.from_mapping(mapping)


def test_tiny_settings_for_another_model_are_refused_before_anything_loads(tmp_path):
    from envhub_trl.run import run_training

    values = dict(output_dir=str(tmp_path), env_id=LAKE, max_steps=1, tiny={"phrase_tokens": True})
    with pytest.raises(click.ClickException, match="tiny settings are for --model tiny"):
        run_training(values, "some-org/some-model")
    assert not any(tmp_path.iterdir())
