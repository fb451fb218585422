"""Bad values are refused where they are given, with one line that names the value and its range:
``envhub.make``'s turn limit and the integrations built on it, every numeric field of
``EnvGRPOConfig``, ``envhub train``, ``envhub run --render`` and ``envhub export-sft --out``."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from click.testing import CliRunner

import envhub
from envhub.cli import cli

LAKE = "frozenlake/FrozenLake-v0"


def one_line_error(result) -> str:
    """The error line of a failed command; fails the test if the command passed or printed a traceback."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    return errors[0]


# ---------------------------------------------------------------------------------------- max_turns


@pytest.mark.parametrize("max_turns", [0, -1, "x", 2.5, True])
def test_make_refuses_a_turn_limit_that_is_not_a_positive_integer(max_turns):
    with pytest.raises(ValueError, match=f"max_turns for {LAKE} must be a positive integer.*got {max_turns!r}"):
        envhub.make(LAKE, max_turns=max_turns)


def test_make_checks_the_turn_limit_before_building_the_env():
    built = []

    def entry(**kwargs):
        built.append(kwargs)
        return envhub.make(LAKE)

    spec = envhub.registration.EnvSpec("test/Built-v0", entry)
    with pytest.raises(ValueError, match="max_turns"):
        spec.make(max_turns=0)
    assert built == []
    assert spec.make(max_turns=3).max_turns == 3


@pytest.mark.parametrize("max_turns", [0, -1, "x"])
def test_the_gem_wrapper_and_the_trl_factory_refuse_a_bad_turn_limit(max_turns):
    gem_module = pytest.importorskip("envhub.integrations.gem", exc_type=ImportError)
    trl_module = pytest.importorskip("envhub.integrations.trl", exc_type=ImportError)
    with pytest.raises(ValueError, match="max_turns"):
        gem_module.EnvhubGemEnv(LAKE, max_turns=max_turns)
    with pytest.raises(ValueError, match="max_turns"):
        trl_module.environment_factory(LAKE, max_turns=max_turns)


# ---------------------------------------------------------------------------------------- config


def _numeric(annotation: typing.Any) -> bool:
    args = typing.get_args(annotation) or (annotation,)
    return any(a in (int, float) for a in args) and str not in args


def test_every_numeric_field_of_the_config_has_bounds():
    config = pytest.importorskip("envhub_trl.config")
    hints = typing.get_type_hints(config.EnvGRPOConfig)
    own = [f.name for f in dataclasses.fields(config.EnvGRPOConfig) if f.name in config.EnvGRPOConfig.__annotations__]
    aliases = {"step_advantage_weight", "step_gamma", "async_generation_ratio"}  # copied onto their field before the check
    unbounded = [name for name in own if _numeric(hints[name]) and name not in config.FIELD_BOUNDS and name not in aliases]
    assert unbounded == []
    assert set(config.FIELD_BOUNDS) <= {f.name for f in dataclasses.fields(config.EnvGRPOConfig)}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("group_size", 0, "group_size must be >= 2, got 0"),
        ("temperature", -1.0, "temperature must be > 0, got -1.0"),
        ("temperature", 0.0, "temperature must be > 0, got 0.0"),
        ("max_steps", -3, "max_steps must be >= 1, or -1 (train for num_train_epochs instead), got -3"),
        ("max_steps", 0, "max_steps must be >= 1"),
        ("max_turns", 0, "max_turns must be >= 1, got 0"),
        ("max_turns", -1, "max_turns must be >= 1, got -1"),
        ("top_p", 1.5, "top_p must be in (0, 1], got 1.5"),
        ("learning_rate", float("nan"), "learning_rate must be >= 0, got nan"),
        ("beta", -0.1, "beta must be >= 0"),
        ("env_step_timeout", 0.0, "env_step_timeout must be > 0"),
        ("max_staleness", -1, "max_staleness must be >= 0, got -1"),
        ("gamma", 1.5, "gamma must be in [0, 1], got 1.5"),
        ("eval_episodes", 0, "eval_episodes must be >= 1, got 0"),
        ("max_prompt_tokens", 0, "max_prompt_tokens must be >= 1"),
        ("step_gamma", 2.0, "step_reward_gamma must be in [0, 1], got 2.0"),
        ("positive_advantage_weight", -0.1, "positive_advantage_weight must be >= 0, got -0.1"),
    ],
)
def test_the_config_refuses_a_value_out_of_range_naming_field_and_range(tmp_path, field, value, message):
    config = pytest.importorskip("envhub_trl.config")
    with pytest.raises(ValueError) as caught:
        config.EnvGRPOConfig(output_dir=str(tmp_path), report_to="none", **{field: value})
    assert message in str(caught.value)


@pytest.mark.parametrize(("field", "value"), [("max_steps", -1), ("top_k", 0), ("beta", 0.0), ("max_turns", None), ("history_turns", 0)])
def test_the_config_takes_the_edges_of_each_range(tmp_path, field, value):
    config = pytest.importorskip("envhub_trl.config")
    assert getattr(config.EnvGRPOConfig(output_dir=str(tmp_path), report_to="none", **{field: value}), field) == value


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("group_size: 0", "group_size must be >= 2, got 0"),
        ("temperature: -1", "temperature must be > 0, got -1"),
        ("max_steps: -3", "max_steps must be >= 1, or -1"),
        ("max_turns: 0", "max_turns must be >= 1, got 0"),
        ("env_kwargs: {view: bogus}", f"{LAKE} refuses its env_kwargs (view='bogus'): unknown view 'bogus'"),
        ("env_kwargs: {slope: 3}", f"{LAKE} refuses its env_kwargs (slope=3)"),
    ],
)
def test_train_refuses_a_bad_setting_in_one_line_before_anything_loads(tmp_path, setting, message):
    pytest.importorskip("envhub_trl")
    config = tmp_path / "run.yaml"
    config.write_text(f"max_steps: 2\n{setting}\n")
    result = CliRunner().invoke(cli, ["train", "--config", str(config), "--output-dir", str(tmp_path / "out")])
    assert message in one_line_error(result)
    assert "held-out" not in result.output  # no evaluation started
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------- output paths


def test_run_refuses_a_render_path_that_cannot_be_written_before_playing(tmp_path):
    pytest.importorskip("PIL")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for target in (blocker / "frames", blocker / "sub" / "last.png", blocker / "run.gif"):
        result = CliRunner().invoke(cli, ["run", "sokoban/Sokoban-v0", "--policy", "expert", "--render", str(target)])
        line = one_line_error(result)
        assert f"--render {target}: cannot create the folder" in line and "pick a path you can write" in line
        assert "===" not in result.output  # no episode was played


def test_export_sft_refuses_an_out_folder_that_cannot_be_created(tmp_path):
    pytest.importorskip("datasets")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(cli, ["export-sft", LAKE, "--episodes", "2", "--out", str(blocker / "data")])
    line = one_line_error(result)
    assert f"--out {blocker / 'data'}: cannot create the folder" in line and "pick a folder you can write" in line


@pytest.mark.parametrize("option", [["--seed", "-1"], ["--temperature", "-0.5"]])
def test_eval_refuses_a_negative_seed_or_temperature(tmp_path, option):
    pytest.importorskip("envhub_trl")
    result = CliRunner().invoke(cli, ["eval", LAKE, "--model", "tiny", *option])
    assert result.exit_code == 2 and f"Invalid value for '{option[0]}'" in result.output
