"""A config a user can discover: ``envhub train --help-config`` lists every field, ``--print-config``
prints the config a run would use, a typo gets the field it meant, and TRL's flags work; none of
it loads a model."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from click.testing import CliRunner

pytest.importorskip("trl")

from envhub.cli import cli  # noqa: E402
from envhub_trl.config import EnvGRPOConfig  # noqa: E402


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """A model load would be a defect here: it fails the test."""
    import envhub_trl.models

    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(envhub_trl.models, "load_model_and_tokenizer", refuse)


def invoke(*args: str):
    return CliRunner().invoke(cli, ["train", *args])


def test_help_config_lists_every_field_of_envhub_trl_and_transformers_with_type_default_bounds_and_help():
    result = invoke("--help-config")
    assert result.exit_code == 0, result.output
    names = {line.split(":")[0] for line in result.output.splitlines() if line and not line.startswith((" ", "#"))}
    assert names == {f.name for f in dataclasses.fields(EnvGRPOConfig) if f.init}
    assert [line for line in result.output.splitlines() if line.startswith("#")] == [
        "# envhub fields", "# TRL fields", "# transformers fields",
    ]
    lines = result.output.splitlines()
    steps = lines.index("max_steps: int = -1  (>= 1, or -1 (train for num_train_epochs instead))")
    assert "training steps" in lines[steps + 1]
    assert "group_size: int | None = null  (>= 2)" in lines


def test_help_config_takes_a_glob_or_a_word_and_suggests_for_a_miss():
    glob = invoke("--help-config", "*_seed_offset")
    assert glob.exit_code == 0
    assert [line.split(":")[0] for line in glob.output.splitlines() if line[:1].isalpha()] == ["eval_seed_offset", "validation_seed_offset"]
    word = invoke("--help-config", "learning rate")
    assert "learning_rate: float" in word.output and "env_id" not in word.output
    miss = invoke("--help-config", "max_stepz")
    assert miss.exit_code == 1
    assert miss.output.strip() == (
        "Error: no config field matches 'max_stepz' (did you mean max_steps?); `envhub train --help-config` lists them all"
    )


def test_print_config_resolves_file_overrides_flags_and_defaults_and_reads_back(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("max_steps: 3\nlearning_rate: 1e-4\nwarm_start: {steps: 5}\n")
    result = invoke("--config", str(config), "--env", "frozenlake/FrozenLakeNotSlippery-v0", "--print-config", "max_steps=7",
                    "--per-device-train-batch-size", "16", "--learning-rate=2e-5", "--bf16")
    assert result.exit_code == 0, result.output
    values = yaml.safe_load(result.output)
    assert values["max_steps"] == 7 and values["learning_rate"] == 2e-5 and values["per_device_train_batch_size"] == 16
    assert values["bf16"] is True and values["env_id"] == "frozenlake/FrozenLakeNotSlippery-v0"
    assert values["warm_start"]["steps"] == 5 and values["max_turns"] == EnvGRPOConfig.max_turns  # a default
    assert len(values) == len([f for f in dataclasses.fields(EnvGRPOConfig) if f.init and f.name != "output_dir"]) + 1
    assert not list(tmp_path.glob("trainer_output*")) and not (tmp_path / "out").exists()
    again = tmp_path / "again.yaml"
    again.write_text(result.output)  # what it prints is a config file that gives the same run
    second = invoke("--config", str(again), "--print-config")
    assert second.exit_code == 0, second.output
    assert yaml.safe_load(second.output) == values


def test_print_config_refuses_a_bad_value_as_a_run_would():
    result = invoke("--print-config", "group_size=1")
    assert result.exit_code == 1 and "group_size must be >= 2, got 1" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["max_step=2"], "unknown config field 'max_step' (did you mean max_steps?)"),
        (["--max-step", "2"], "no such option: --max-step (did you mean --max-steps?)"),
        (["--warm-start-step", "2"], "no such option: --warm-start-step (did you mean --warm-start-steps?)"),
        (["--max-steps"], "--max-steps needs a value (--max-steps VALUE, or max_steps=VALUE)"),
    ],
)
def test_a_typo_on_the_command_line_gets_the_name_it_meant_in_one_line(tmp_path, args, message):
    result = invoke("--output-dir", str(tmp_path / "out"), *args)
    assert result.exit_code != 0
    assert result.output.strip().splitlines()[-1].startswith("Error: ") and message in result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_a_typo_in_the_config_file_gets_the_field_it_meant(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("max_step: 2\n")
    result = invoke("--config", str(config), "--output-dir", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"Error: {config}: unknown config field 'max_step' (did you mean max_steps?); `envhub train --help-config` lists the fields"
    )


def test_trl_flags_are_the_key_value_overrides():
    from envhub_trl.config_file import ConfigError, flags_as_overrides
    from envhub_trl.run import RUN_KEYS

    args = ["--max-steps", "5", "--learning_rate=1e-5", "--bf16", "--warm-start.steps", "3", "seed=1", "--instructions", "a=b"]
    assert flags_as_overrides(args, EnvGRPOConfig, extra=RUN_KEYS) == [
        "max_steps=5", "learning_rate=1e-5", "bf16=true", "warm_start.steps=3", "seed=1", "instructions=a=b",
    ]
    with pytest.raises(ConfigError, match="--temperature needs a value"):
        flags_as_overrides(["--temperature", "max_steps=2"], EnvGRPOConfig)


def test_train_without_an_output_dir_says_so():
    result = invoke()
    assert result.exit_code == 2 and "Missing option '--output-dir'" in result.output
