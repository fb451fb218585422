"""PromptSettings is the one source of the prompt settings: each default declared once, each rule
checked once, received by the manager, the player and the trainer's config (flat keys still work)."""

from __future__ import annotations

import dataclasses

import pytest

from envhub.generation import RandomGenerator
from envhub.manager import EnvGroupManager
from envhub.play import Player
from envhub.prompts import BARE_PROMPT, PROMPT_BOUNDS, PromptSettings
from envhub.settings import EnvSettings

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"
FIELDS = [f.name for f in dataclasses.fields(PromptSettings)]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"history_turns": -1}, "history_turns must be >= 0, got -1"),
        ({"max_prompt_tokens": 0}, "max_prompt_tokens must be >= 1, got 0"),
        ({"format_penalty": float("nan")}, "format_penalty must be a finite number, got nan"),
        ({"unfinished_replies": "drop"}, "unfinished_replies must be one of ('parse', 'invalid'), got 'drop'"),
    ],
)
def test_each_rule_is_prompt_settings_own_and_the_manager_applies_it(changes, message):
    with pytest.raises(ValueError) as settings_error:
        PromptSettings(**changes)
    with pytest.raises(ValueError) as manager_error:
        EnvGroupManager(LAKE, 1, 1, **changes)
    assert str(settings_error.value) == str(manager_error.value) == message


def test_the_manager_receives_prompt_settings_and_takes_single_fields_over_them():
    settings = PromptSettings(history_turns=1, format_penalty=-0.5, show_turns=False, max_prompt_tokens=None)  # no tokenizer here
    manager = EnvGroupManager(LAKE, 1, 1, prompt=settings)
    assert manager.prompt == settings
    assert manager.history_turns == 1 and manager.format_penalty == -0.5
    manager = EnvGroupManager(LAKE, 1, 1, prompt=settings, history_turns=0)
    assert manager.prompt.history_turns == 0 and manager.prompt.format_penalty == -0.5
    with pytest.raises(TypeError, match="history_turn"):
        EnvGroupManager(LAKE, 1, 1, history_turn=1)


def test_a_budget_without_a_tokenizer_is_refused():
    with pytest.raises(ValueError, match="max_prompt_tokens counts tokens"):
        EnvGroupManager(LAKE, 1, 1, prompt=PromptSettings())


def test_a_bare_manager_and_player_play_without_a_budget_training_with_2048():
    """Which max_prompt_tokens default wins: PromptSettings' 2048 for training, evaluation and
    checkpoints; none for a manager or player given no settings (BARE_PROMPT), as they always played."""
    assert PromptSettings().max_prompt_tokens == 2048
    assert BARE_PROMPT == dataclasses.replace(PromptSettings(), max_prompt_tokens=None)
    assert EnvGroupManager(LAKE, 1, 1).prompt == BARE_PROMPT
    assert Player(RandomGenerator()).manager(LAKE).prompt == BARE_PROMPT
    # A player given a budget but no tokenizer plays without it (a budget counts tokens).
    manager = Player(RandomGenerator(), settings=EnvSettings(LAKE, prompt=PromptSettings(history_turns=1))).manager(LAKE)
    assert manager.prompt == PromptSettings(history_turns=1, max_prompt_tokens=None)


def test_the_configs_prompt_fields_take_prompt_settings_defaults_and_bounds(tmp_path):
    config = pytest.importorskip("envhub_trl.config")
    defaults = PromptSettings()
    fields = config.EnvGRPOConfig.__dataclass_fields__
    flat_defaults = {name: fields[name].default for name in FIELDS}
    assert flat_defaults.pop("stop_strings") is None and defaults.stop_strings == ()  # a list field's default: None, read as none
    assert flat_defaults == {k: v for k, v in dataclasses.asdict(defaults).items() if k != "stop_strings"}
    assert all(config.FIELD_BOUNDS[name] is bound for name, bound in PROMPT_BOUNDS.items())
    run = config.EnvGRPOConfig(output_dir=str(tmp_path), report_to="none")
    assert run.prompt_settings() == defaults
    assert run.env_settings().prompt.max_prompt_tokens == 2048


def test_the_config_takes_prompt_settings_as_one_mapping_or_as_flat_keys(tmp_path):
    config = pytest.importorskip("envhub_trl.config")

    def make(**values):
        return config.EnvGRPOConfig(output_dir=str(tmp_path), report_to="none", **values)

    nested = make(prompt={"history_turns": 1, "max_prompt_tokens": 512, "show_turns": False})
    flat = make(history_turns=1, max_prompt_tokens=512, show_turns=False)
    assert nested.prompt_settings() == flat.prompt_settings() == PromptSettings(history_turns=1, max_prompt_tokens=512, show_turns=False)
    assert nested.history_turns == 1  # the flat field is its alias
    assert make(prompt={"history_turns": 1}, history_turns=1).history_turns == 1  # the same value both ways
    with pytest.raises(ValueError, match="history_turns is set twice, 3 as a field and 1 under prompt"):
        make(prompt={"history_turns": 1}, history_turns=3)
    with pytest.raises(ValueError, match=r"prompt: unknown prompt settings \['history'\]"):
        make(prompt={"history": 1})
    with pytest.raises(ValueError, match="history_turns must be >= 0, got -1"):
        make(prompt={"history_turns": -1})
    with pytest.raises(ValueError, match="unfinished_replies must be one of"):
        make(prompt={"unfinished_replies": "drop"})


def test_a_yaml_config_takes_a_prompt_mapping_and_flat_keys(tmp_path):
    pytest.importorskip("envhub_trl")
    from envhub_trl.run import load_config_file

    nested = tmp_path / "nested.yaml"
    nested.write_text("prompt:\n  history_turns: 1\n  format_penalty: -0.1\n")
    flat = tmp_path / "flat.yaml"
    flat.write_text("history_turns: 1\nformat_penalty: -0.1\n")
    from envhub_trl.config import EnvGRPOConfig

    runs = [EnvGRPOConfig(output_dir=str(tmp_path), report_to="none", **load_config_file(str(path))) for path in (nested, flat)]
    assert runs[0].prompt_settings() == runs[1].prompt_settings() == PromptSettings(history_turns=1, format_penalty=-0.1)


def test_reply_prefix_and_stop_strings_are_checked_and_kept_hashable():
    settings = PromptSettings(reply_prefix="<answer>", stop_strings=["</answer>"])
    assert settings.stop_strings == ("</answer>",) and hash(settings)
    assert PromptSettings(stop_strings="</answer>").stop_strings == ("</answer>",)
    with pytest.raises(ValueError, match="stop_strings must be non-empty strings"):
        PromptSettings(stop_strings=["</answer>", ""])
    with pytest.raises(ValueError, match="reply_prefix must be text"):
        PromptSettings(reply_prefix=3)


def test_a_run_carries_its_reply_prefix_and_stop_strings_to_its_envs_and_its_checkpoints(tmp_path):
    """The config's flat fields or its prompt mapping reach every env's settings, and a checkpoint's
    envhub.json gives them back, so evaluation replies as training did."""
    config = pytest.importorskip("envhub_trl.config")
    from envhub.settings import TrainedOn

    flat = config.EnvGRPOConfig(output_dir=str(tmp_path), report_to="none", env_id=LAKE, reply_prefix="<answer>", stop_strings=["</answer>"])
    nested = config.EnvGRPOConfig(output_dir=str(tmp_path), report_to="none", env_id=LAKE, prompt={"reply_prefix": "<answer>", "stop_strings": ["</answer>"]})
    assert flat.env_settings().prompt == nested.env_settings().prompt
    assert flat.env_settings().prompt.stop_strings == ("</answer>",)
    with pytest.raises(ValueError, match="stop_strings is set twice"):
        config.EnvGRPOConfig(output_dir=str(tmp_path), report_to="none", env_id=LAKE, stop_strings=["</a>"], prompt={"stop_strings": ["</answer>"]})
    TrainedOn({LAKE: flat.env_settings()}).save(tmp_path)
    assert TrainedOn.load(tmp_path).for_env(LAKE).prompt == flat.env_settings().prompt
