"""A first training run does not sit silent: held-out episodes of a model that cannot yet reply end
after a few invalid replies in a row (reported as such), and progress shows as lines where
stderr is a file or a pipe."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import types

import pytest
from helper_envs import flaky_env  # noqa: F401  (fixture)

from envhub.manager import EnvGroupManager
from envhub.rollout import batch_metrics

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


def play(manager: EnvGroupManager, replies_per_turn: list[list[str]]) -> None:
    manager.reset()
    for replies in replies_per_turn:
        if not manager.prompts():
            break
        active = [t for t in manager.trajectories() if t.end_reason is None]
        manager.step([replies[t.member] for t in active])


def test_an_episode_ends_after_the_set_number_of_invalid_replies_in_a_row(flaky_env):
    manager = EnvGroupManager(flaky_env, 1, 2, max_turns=20, max_invalid_streak=2)
    bad, ok = "<answer>Jump</answer>", "<answer>Ok</answer>"
    # Member 0: invalid, valid, invalid, invalid -> ends on its 4th turn. Member 1: always valid.
    play(manager, [[bad, ok], [ok, ok], [bad, ok], [bad, ok], [ok, ok]])
    stuck, fine = manager.trajectories()
    assert stuck.end_reason == "invalid" and stuck.truncated and not stuck.success and stuck.num_turns == 4
    assert fine.end_reason is None and fine.num_turns == 5
    assert batch_metrics([stuck, fine])["invalid_end_rate"] == 0.5


def test_a_cut_episode_returns_what_playing_on_invalid_would_have(flaky_env):
    """The cut saves turns, not penalties: quitting by a streak must not pay better than playing on."""
    bad, ok = "<answer>Jump</answer>", "<answer>Ok</answer>"
    cut = EnvGroupManager(flaky_env, 1, 1, max_turns=6, max_invalid_streak=2, format_penalty=-0.1)
    play(cut, [[ok], [bad], [bad]])
    full = EnvGroupManager(flaky_env, 1, 1, max_turns=6, format_penalty=-0.1)
    play(full, [[ok], [bad], [bad], [bad], [bad], [bad]])
    (stopped,), (played,) = cut.trajectories(), full.trajectories()
    assert stopped.end_reason == "invalid" and stopped.num_turns == 3 and played.num_turns == 6
    assert [t.reward for t in stopped.turns[:2]] == [t.reward for t in played.turns[:2]]
    assert stopped.turns[-1].reward == pytest.approx(played.turns[2].reward - 0.3)  # three turns left
    assert sum(t.reward for t in stopped.turns) == pytest.approx(sum(t.reward for t in played.turns))


def test_without_a_streak_limit_invalid_replies_play_to_the_turn_limit(flaky_env):
    manager = EnvGroupManager(flaky_env, 1, 1, max_turns=5)
    play(manager, [["nonsense"]] * 6)
    (trajectory,) = manager.trajectories()
    assert trajectory.end_reason == "truncated" and trajectory.num_turns == 5
    assert batch_metrics([trajectory])["invalid_end_rate"] == 0.0


def test_the_streak_limit_must_be_positive():
    with pytest.raises(ValueError, match="max_invalid_streak must be at least 1"):
        EnvGroupManager(LAKE, 1, 1, max_invalid_streak=0)


def test_evaluation_cuts_the_models_episodes_but_not_the_reference_policies(tmp_path, monkeypatch):
    config = pytest.importorskip("envhub_trl.config")
    trainer_module = pytest.importorskip("envhub_trl.trainer")
    args = config.EnvGRPOConfig(output_dir=str(tmp_path), report_to="none", env_id=LAKE)
    entry = args.env_entries()[0]
    assert args.eval_max_invalid_streak == 3
    assert args.env_settings(entry).max_invalid_streak is None  # training, and the reference policies, play every turn
    cut = config.EnvGRPOConfig(output_dir=str(tmp_path), report_to="none", env_id=LAKE, max_invalid_streak=2)
    assert cut.env_settings(entry).max_invalid_streak == 2  # training's own streak ...
    assert cut.held_out_settings(entry).max_invalid_streak is None  # ... which evaluation does not inherit
    played = []
    trainer = types.SimpleNamespace(args=args, processing_class=None, generator=None, generator_lock=contextlib.nullcontext())
    monkeypatch.setattr(trainer_module, "evaluate_generator", lambda generator, tokenizer, settings, *a, **k: played.append(settings) or {})
    trainer_module.EnvGRPOTrainer.evaluate_env(trainer, [1])
    trainer_module.EnvGRPOTrainer.evaluate_env(trainer, [1], generator=object())
    assert [s.max_invalid_streak for s in played] == [3, None]
    off = config.EnvGRPOConfig(output_dir=str(tmp_path), report_to="none", env_id=LAKE, eval_max_invalid_streak=None)
    trainer.args = off
    trainer_module.EnvGRPOTrainer.evaluate_env(trainer, [1])
    assert played[-1].max_invalid_streak is None


def test_progress_is_written_as_lines_where_stderr_is_not_a_terminal(monkeypatch):
    evaluation = pytest.importorskip("envhub_trl.evaluation")
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    bar = evaluation.progress_bar("held-out, greedy", 4)
    assert isinstance(bar, evaluation.LineProgress)
    bar.every_s = 0.0
    with bar:
        for _ in range(4):
            bar.update(1)
    lines = stream.getvalue().splitlines()
    assert [line.split(",")[1].strip() for line in lines] == ["greedy: 0/4 episodes", "greedy: 1/4 episodes", "greedy: 2/4 episodes",
                                                              "greedy: 3/4 episodes", "greedy: 4/4 episodes"]
    assert all(line.endswith(" s") for line in lines)


def test_progress_lines_are_spaced_out(monkeypatch):
    evaluation = pytest.importorskip("envhub_trl.evaluation")
    stream = io.StringIO()
    with evaluation.LineProgress("eval", 100, stream, every_s=3600.0) as bar:
        for _ in range(100):
            bar.update(1)
    assert stream.getvalue().splitlines() == ["eval: 0/100 episodes, 0 s", "eval: 100/100 episodes, 0 s"]


def test_a_first_run_reports_its_cut_episodes_and_its_progress(tmp_path):
    """``envhub train`` from the untrained tiny model, cut short: the held-out lines say how many
    episodes ended for invalid replies, progress lines appear on a non-terminal stderr, and
    results.json holds every figure. Its training episodes end after 2 invalid replies in a row
    (``max_invalid_streak``), held-out ones after 3 (``eval_max_invalid_streak``)."""
    pytest.importorskip("envhub_trl")
    from click.testing import CliRunner

    from envhub.cli import cli

    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [
        "train", "--env", LAKE, "--model", "tiny", "--output-dir", str(out), "--eval-episodes", "8",
        "max_steps=1", "groups_per_step=2", "group_size=2", "per_device_train_batch_size=4", "max_turns=6",
        "max_invalid_streak=2", "--verbose",
    ])
    assert result.exit_code == 0, result.output
    logged = re.search(r"\{[^{}]*'env/mean_turns'[^{}]*\}", result.output)
    assert logged, result.output
    logged = ast.literal_eval(logged.group(0))  # the step's metrics: every training episode cut after 2 turns
    assert float(logged["env/invalid_end_rate"]) == 1.0 and float(logged["env/mean_turns"]) == 2.0
    assert "held-out, initial model, greedy: 8/8 episodes" in result.output
    assert "held-out, initial model, sampled" not in result.output  # sampled only with eval_sampled: true
    # The untrained model replies nothing in format: every episode is cut, and the line says so.
    assert "held-out success, initial model: 0.0% greedy (100% greedy episodes ended after 3 invalid replies in a row)" in result.output
    results = json.loads((out / "results.json").read_text())
    for stage in ("initial model", "after RL"):
        figures = results["evaluations"][stage]
        assert set(figures) == {"greedy"}
        assert 0.0 <= figures["greedy"]["invalid_end_rate"] <= 1.0 and 0.0 <= figures["greedy"]["success_rate"] <= 1.0
    assert set(results["rl_success_gain"]) == {"greedy"}
    assert {"random policy", "expert"} <= set(results["references"])
    assert [line.split()[:4] for line in result.output.splitlines() if line.startswith("initial model")] == [["initial", "model", "0.0%", "-"]]


def test_each_rl_step_is_one_line_with_success_return_invalid_replies_time_and_eta(monkeypatch):
    callbacks = pytest.importorskip("envhub_trl.callbacks")
    clock = iter([100.0, 104.0, 110.0])
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: next(clock))
    metrics = {"env/success_rate": [0.25], "env/mean_return": [0.5], "env/invalid_action_rate": [0.125]}
    trainer = types.SimpleNamespace(_metrics={"train": metrics})
    lines: list[str] = []
    progress = callbacks.StepProgress(trainer, lines.append)
    state = types.SimpleNamespace(global_step=0, max_steps=4, is_world_process_zero=True)
    progress.on_train_begin(None, state, None)
    state.global_step = 1
    progress.on_step_end(None, state, None)
    metrics.clear()  # TRL's log line took them; the next step trains on the same batch
    state.global_step = 2
    progress.on_step_end(None, state, None)
    assert lines == [
        "RL step 1/4: training success 25.0%, return 0.5, invalid replies 12.5%, 4.0 s/step, ETA 0:12",
        "RL step 2/4: training success 25.0%, return 0.5, invalid replies 12.5%, 6.0 s/step, ETA 0:10",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("generator", ["hf", "vllm"])
def test_a_run_prints_a_line_per_rl_step_to_a_pipe_and_names_its_files_without_third_party_noise(tmp_path, generator):
    """``envhub train`` with stderr and stdout pipes: one progress line per RL step (whatever
    logging_steps), the held-out table and the paths of results.json, the curve and the model; no
    Triton warning, progress bars, vLLM's deprecation warnings or raw metrics dicts, with either
    generator."""
    import os
    import re
    import subprocess
    import sys

    pytest.importorskip("envhub_trl")
    if generator == "vllm":
        pytest.importorskip("vllm")
    config = tmp_path / "run.yaml"
    config.write_text(
        "max_turns: 4\ngroups_per_step: 2\ngroup_size: 2\nper_device_train_batch_size: 4\nmax_steps: 3\n"
        f"max_turn_tokens: 6\neval_episodes: 2\nsave_strategy: 'no'\nlogging_steps: 2\ngenerator: {generator}\n"
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "envhub", "train", "--env", LAKE, "--config", str(config), "--output-dir", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    step = re.compile(r"RL step (\d)/3: training success \d+\.\d%, return \S+, invalid replies \d+\.\d%, \d+\.\d s/step, ETA \d+:\d\d")
    assert [m.group(1) for m in map(step.fullmatch, done.stderr.splitlines()) if m] == ["1", "2", "3"]
    for noise in ("Triton", "Loading weights", "Loading safetensors", "FutureWarning", "Writing model shards", "it/s]", "{'loss'", "train_runtime"):
        assert noise not in done.stderr + done.stdout
    lines = done.stdout.splitlines()
    assert any(line.startswith("after RL ") for line in lines)
    assert lines[-4:-1] == [f"results: {out / 'results.json'}", f"learning curve: {out / 'learning_curve.png'}", f"model: {out / 'final'}"]
    assert (out / "results.json").is_file()
