"""Trackers (issue 42, item 4): ``report_to: tensorboard`` writes event files that hold the per-step
metrics and every held-out evaluation, read back here with TensorBoard's own reader; a tracker
that is not installed is one line naming the extra that installs it, before any model loads."""

from __future__ import annotations

import importlib.util
import types

import pytest

pytest.importorskip("trl")

from click.testing import CliRunner  # noqa: E402

from envhub.cli import cli  # noqa: E402
from envhub_trl import trackers  # noqa: E402

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the TensorBoard event files under ``folder``, as ``tag: [(step, value)]``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, list[tuple[int, float]]] = {}
    for run in sorted({p.parent for p in folder.rglob("events.out.tfevents.*")}):
        events = EventAccumulator(str(run))
        events.Reload()
        for tag in events.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.step, round(e.value, 6)) for e in events.Scalars(tag))
    return found


def uninstalled(monkeypatch, module: str) -> None:
    """Make ``module`` look uninstalled to the checks (and to transformers' own), as on a machine without it."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name.split(".")[0] == module else find_spec(name, *a, **k))


@pytest.mark.parametrize("name", ["tensorboard", "wandb", "trackio"])
def test_a_tracker_that_is_not_installed_is_one_line_naming_its_extra_before_any_model_loads(tmp_path, monkeypatch, name):
    from envhub_trl import models

    uninstalled(monkeypatch, name)
    monkeypatch.setattr(models, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("a model loaded"))
    result = CliRunner().invoke(cli, ["train", "--env", LAKE, "--output-dir", str(tmp_path / "out"), f"report_to={name}"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output == (
        f"Error: bad configuration: report_to={name} needs {name}, which is not installed: install the extra envhub-trl[{name}] "
        f"(pip install './trainers[{name}]' in a checkout)\n"
    )
    assert not (tmp_path / "out").exists()


def test_an_unknown_tracker_gets_a_suggestion_and_each_of_a_list_is_checked(monkeypatch):
    from envhub_trl.config import EnvGRPOConfig

    with pytest.raises(ValueError, match=r"report_to: no tracker 'tensorbord' \(did you mean tensorboard\?\)"):
        EnvGRPOConfig(output_dir="x", report_to="tensorbord")
    uninstalled(monkeypatch, "wandb")
    with pytest.raises(ValueError, match=r"report_to=wandb needs wandb, which is not installed: install the extra envhub-trl\[wandb\]"):
        trackers.check_trackers(["none", "wandb"])
    for nothing in ("none", None, []):
        trackers.check_trackers(nothing)


def test_held_out_figures_reach_tensorboard_each_at_its_step(tmp_path):
    """On a hand-built trainer: figures before training wait for the tracker to start, the periodic
    curve's points go at their own steps, and the last figures after training close the writer."""
    pytest.importorskip("tensorboard")
    from transformers.integrations.integration_utils import TensorBoardCallback

    tensorboard = TensorBoardCallback()
    args = types.SimpleNamespace(report_to=["tensorboard"], run_name=None, output_dir=str(tmp_path), to_json_string=lambda: "{}")
    state = types.SimpleNamespace(global_step=0, is_world_process_zero=True, is_hyper_param_search=False)
    trainer = types.SimpleNamespace(args=args, state=state, control=None, model=None,
                                    callback_handler=types.SimpleNamespace(callbacks=[object(), tensorboard]))
    periodic = types.SimpleNamespace(points=[])
    sender = trackers.HeldOutToTrackers(trainer, {"held_out": periodic})
    initial = {"env": {"greedy": {"success_rate": 0.25, "invalid_action_rate": 0.5}}}
    sender.send(trackers.stage_scalars("initial model", initial), 0)
    sender.send(trackers.curve_scalars(trackers.greedy_point(initial, 0)), 0)
    assert not list(tmp_path.rglob("events.out.tfevents.*"))  # held until the tracker has started
    tensorboard.on_train_begin(args, state, None)
    sender.on_train_begin(args, state, None)
    state.global_step = 3
    periodic.points.append({"step": 2, "greedy": 0.5})  # measured at step 2, seen at the end of step 3
    sender.on_step_end(args, state, None)
    state.global_step = 4
    tensorboard.on_train_end(args, state, None)  # the Trainer closes its writer before the last evaluation
    after = {"env": {"greedy": {"success_rate": 0.75, "invalid_action_rate": 0.0}, "sampled": {"success_rate": 0.5}}}
    sender.after_training({**trackers.stage_scalars("after RL", after), **trackers.curve_scalars(trackers.greedy_point(after, 4))})
    assert tensorboard.tb_writer is None  # closed again
    assert scalars(tmp_path) == {
        "eval/initial_model/greedy/success_rate": [(0, 0.25)],
        "eval/initial_model/greedy/invalid_action_rate": [(0, 0.5)],
        "eval/held_out/success_rate": [(0, 0.25), (2, 0.5), (4, 0.75)],
        "eval/after_rl/greedy/success_rate": [(4, 0.75)],
        "eval/after_rl/greedy/invalid_action_rate": [(4, 0.0)],
        "eval/after_rl/sampled/success_rate": [(4, 0.5)],
    }


def test_a_mix_sends_each_envs_figures_and_their_mean():
    by_env = {"a/A-v0": {"greedy": {"success_rate": 1.0}}, "b/B-v0": {"greedy": {"success_rate": 0.5}}}
    assert trackers.stage_scalars("after warm start (SFT)", by_env) == {
        "eval_after_warm_start/a/A-v0/greedy/success_rate": 1.0, "eval_after_warm_start/b/B-v0/greedy/success_rate": 0.5,
    }
    assert trackers.curve_scalars(trackers.greedy_point(by_env, 7)) == {
        "eval_held_out/success_rate": 0.75, "eval_held_out/a/A-v0/success_rate": 1.0, "eval_held_out/b/B-v0/success_rate": 0.5,
    }


def test_after_rl_the_kept_policys_figures_and_the_last_ones_are_both_sent():
    from envhub_trl.run import TrainingRun

    after = {LAKE: {"greedy": {"success_rate": 0.75}}}
    last = {LAKE: {"greedy": {"success_rate": 0.25}}}
    run = types.SimpleNamespace(evaluations={"after RL": after}, kept={"held_out_last_step": last},
                                trainer=types.SimpleNamespace(state=types.SimpleNamespace(global_step=9)))
    assert TrainingRun._after_rl_scalars(run) == {
        "eval_after_rl_last_step/greedy/success_rate": 0.25, "eval_after_rl/greedy/success_rate": 0.75, "eval_held_out/success_rate": 0.75,
    }
    run.kept = None
    assert TrainingRun._after_rl_scalars(run) == {"eval_after_rl/greedy/success_rate": 0.75, "eval_held_out/success_rate": 0.75}


@pytest.mark.slow
def test_a_tensorboard_run_writes_the_per_step_metrics_and_every_held_out_evaluation(tmp_path):
    """``envhub train ... report_to=tensorboard``: the event files under ``runs/`` hold training
    success at each RL step, and the held-out evaluations (initial model, after the warm start,
    every ``eval_steps``, after RL) at their steps, with the figures results.json holds."""
    import json

    pytest.importorskip("tensorboard")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [
        "train", "--env", LAKE, "--model", "tiny", "--output-dir", str(out), "--eval-episodes", "2",
        "--warm-start-steps", "1", "--warm-start-episodes", "4", "max_steps=3", "eval_steps=2", "groups_per_step=2", "group_size=2",
        "per_device_train_batch_size=4", "max_turns=4", "max_turn_tokens=6", "logging_steps=1", "report_to=tensorboard",
    ])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    found = scalars(out / "runs")
    assert [step for step, _ in found["train/env/success_rate"]] == [1, 2, 3]
    assert [value for _, value in found["train/env/success_rate"]] == [round(p["success_rate"], 6) for p in results["training_curve"]]
    for stage, tag in (("initial model", "initial_model"), ("after warm start (SFT)", "after_warm_start"), ("after RL", "after_rl")):
        figures = results["evaluations"][stage]["greedy"]
        step = 3 if stage == "after RL" else 0
        assert found[f"eval/{tag}/greedy/success_rate"] == [(step, round(figures["success_rate"], 6))]
        assert found[f"eval/{tag}/greedy/invalid_action_rate"] == [(step, round(figures["invalid_action_rate"], 6))]
    start, after = (results["evaluations"][s]["greedy"]["success_rate"] for s in ("after warm start (SFT)", "after RL"))
    periodic = [(p["step"], round(p["greedy"], 6)) for p in results["held_out_curve"]]
    assert [step for step, _ in periodic] == [2]
    assert found["eval/held_out/success_rate"] == [(0, round(start, 6)), *periodic, (3, round(after, 6))]


@pytest.mark.slow
def test_a_wandb_offline_run_logs_the_per_step_metrics_and_the_held_out_evaluations(tmp_path, monkeypatch):
    """``report_to=wandb`` with ``WANDB_MODE=offline`` (no account, no network): the run's history
    gets training success at each step and the held-out curve at its steps (read where W&B's run
    takes them: its offline files are a binary log)."""
    wandb = pytest.importorskip("wandb")
    from wandb.sdk.wandb_run import Run

    logged: list[dict] = []
    log = Run.log
    monkeypatch.setattr(Run, "log", lambda self, data, *a, **k: (logged.append(dict(data)), log(self, data, *a, **k))[1])
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [
        "train", "--env", LAKE, "--model", "tiny", "--output-dir", str(out), "--eval-episodes", "2", "max_steps=3", "eval_steps=2",
        "groups_per_step=2", "group_size=2", "per_device_train_batch_size=4", "max_turns=4", "max_turn_tokens=6",
        "logging_steps=1", "report_to=wandb",
    ])
    wandb.finish()
    assert result.exit_code == 0, result.output
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    steps = lambda key: [entry["train/global_step"] for entry in logged if key in entry]  # noqa: E731
    assert steps("train/env/success_rate") == [1, 2, 3]
    assert steps("eval/held_out/success_rate") == [0, 2, 3]
    assert steps("eval/initial_model/greedy/success_rate") == [0] and steps("eval/after_rl/greedy/success_rate") == [3]


@pytest.mark.slow
def test_a_trackio_run_logs_the_held_out_evaluations_into_one_run(tmp_path, monkeypatch):
    """``report_to=trackio``, to a local database: the held-out curve at its steps, and the figures
    after training in the same run (named after the output folder), not a second one."""
    trackio = pytest.importorskip("trackio")

    logged: list[tuple[str, dict]] = []
    init, log = trackio.init, trackio.log
    names: list[str] = []
    monkeypatch.setattr(trackio, "init", lambda *a, **k: (names.append(k.get("name")), init(*a, **k))[1])
    monkeypatch.setattr(trackio, "log", lambda metrics, *a, **k: (logged.append(dict(metrics)), log(metrics, *a, **k))[1])
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    out = tmp_path / "my-run"
    result = CliRunner().invoke(cli, [
        "train", "--env", LAKE, "--model", "tiny", "--output-dir", str(out), "--eval-episodes", "2", "max_steps=3", "eval_steps=2",
        "groups_per_step=2", "group_size=2", "per_device_train_batch_size=4", "max_turns=4", "max_turn_tokens=6",
        "logging_steps=1", "report_to=trackio",
    ])
    assert result.exit_code == 0, result.output
    assert names == ["my-run", "my-run"]  # the run again after training, not a new one with a random name
    steps = lambda key: [entry["train/global_step"] for entry in logged if key in entry]  # noqa: E731
    assert steps("train/env/success_rate") == [1, 2, 3]
    assert steps("eval/held_out/success_rate") == [0, 2, 3] and steps("eval/after_rl/greedy/success_rate") == [3]
