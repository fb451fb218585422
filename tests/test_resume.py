"""Resumed training runs end where uninterrupted ones do (issue 32).

A run is interrupted right after it wrote ``checkpoint-k`` (a callback raises there, as a kill
would leave the folder), resumed from it to ``n`` steps, and compared with the uninterrupted
``n``-step run: the weights (and PPO's value head) within 1e-6 on the CPU, the same log.

Covered: GRPO with lockstep rollouts (the checkpoint inside a generation batch: TRL's buffered
batch and micro-step counter), PPO (the value head and its optimizer group), REINFORCE++ (its
frozen reference), a curriculum (stage and window) with continuous rollouts, async rollouts with
``max_staleness: 0`` (the producer's position: the same episodes, the weights within 1e-3, as
close as two uninterrupted async runs come, see ``NOT_BITWISE``); and ``envhub train --resume`` end to end, its
``results.json`` figures included. Not covered: async rollouts with ``max_staleness`` > 0 (not
exact: the batches the producer played ahead with older weights are lost, see
:mod:`envhub_trl.run_state`), vLLM generators, several processes, GiGPO/RLOO (the same path as GRPO).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from click.testing import CliRunner  # noqa: E402
from transformers import AutoModelForCausalLM, TrainerCallback  # noqa: E402

from envhub.error import ResumeError  # noqa: E402
from envhub_trl import run_files, run_state  # noqa: E402
from envhub_trl.config import EnvGRPOConfig  # noqa: E402
from trl_helpers import HalfExpert  # noqa: E402

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


class Killed(Exception):
    """What the interrupting callback raises: the process dies right after a checkpoint."""


class KillAfterCheckpoint(TrainerCallback):
    """Raise right after ``checkpoint-<step>`` is written, as a killed run leaves its folder."""

    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Killed(f"killed after checkpoint-{self.step}")


class SeededHalfExpert(HalfExpert):
    """:class:`HalfExpert` for continuous and async rollouts, which hand the generator requests in
    batches that the timing of env threads makes up: whether the expert answers a request depends
    on the request's own seed (its env and turn), not on its place in a batch, and the model
    samples each request from its own seed."""

    def generate_each(self, prompts, samplings):
        out = [None] * len(prompts)
        model = [i for i, sampling in enumerate(samplings) if sampling.seed is None or sampling.seed % 2 == 0]
        if model:
            for i, completion in zip(model, self.hf.generate_each([prompts[i] for i in model], [samplings[i] for i in model])):
                out[i] = completion
        for i in sorted(set(range(len(prompts))) - set(model)):
            out[i] = self.expert.generate([prompts[i]], samplings[i])[0]
        return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trl_helpers import save_tiny_lake_model

    return save_tiny_lake_model(tmp_path_factory.mktemp("tiny") / "model")


def _config(output_dir, **overrides) -> EnvGRPOConfig:
    values = dict(
        output_dir=str(output_dir), env_id=LAKE, max_turns=3, groups_per_step=2, group_size=2, per_device_train_batch_size=2,
        max_steps=3, max_turn_tokens=6, logging_steps=1, report_to="none", learning_rate=1e-2, use_cpu=True,
        save_strategy="steps", save_steps=1, disable_tqdm=True, seed=5, format_penalty=-0.1,
    )
    values.update(overrides)
    return EnvGRPOConfig(**values)


def _trainer(tiny, config, callbacks=()):
    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = tiny
    model = AutoModelForCausalLM.from_pretrained(path)
    # Half the episodes the expert's, so that returns differ within groups and every step moves the weights.
    return EnvGRPOTrainer(model, config, processing_class=tokenizer, callbacks=list(callbacks), generator=SeededHalfExpert(model, tokenizer))


def _weights(trainer) -> dict[str, torch.Tensor]:
    weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    if trainer.value_head is not None:
        weights.update({f"value_head.{k}": v.detach().clone() for k, v in trainer.value_head.state_dict().items()})
    return weights


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


#: Log keys that measure the wall clock, not the run.
CLOCK = ("time", "per_s", "idle_fraction")


def _trained_log(trainer) -> list[dict[str, float]]:
    """The per-step log lines, without the wall-clock figures."""
    return [{k: v for k, v in entry.items() if not any(c in k for c in CLOCK)} for entry in trainer.state.log_history if "loss" in entry]


MODES = {
    # k=1 falls inside a generation batch (2 optimizer steps per batch): TRL's buffered batch and step counter.
    "grpo-lockstep": dict(advantage_estimator="grpo"),
    "ppo": dict(advantage_estimator="ppo", per_device_train_batch_size=4),
    "reinforce++": dict(advantage_estimator="reinforce++", per_device_train_batch_size=4, kl_coef=0.05),
    # The next stage once a window of 2 batches is full: the checkpoint after batch 1 holds half a window.
    "curriculum-continuous": dict(
        advantage_estimator="grpo", rollout_mode="continuous", per_device_train_batch_size=4,
        curriculum={"stages": [{"max_turns": 2}, {"max_turns": 3}], "advance_at": 0.0, "window": 2},
    ),
    # The retries' rounds (seeded by the step) and self-imitation's memory (in the checkpoint) and its draws.
    "retries-self-imitation": dict(
        advantage_estimator="gigpo", retry_unsolved_rounds=1, self_imitation_coef=0.5, self_imitation_rows=8, self_imitation_memory=64,
        max_turns=8,  # the expert's half of the plays reaches the goal: wins to remember
    ),
    # With no staleness allowed every batch is played with the current weights: the producer's position alone matters.
    "async-staleness-0": dict(advantage_estimator="grpo", rollout_mode="async", max_staleness=0, per_device_train_batch_size=4),
}
#: Modes whose uninterrupted runs do not repeat themselves bit for bit: the producer hands the HF
#: generator requests in batches that thread timing makes up, so the log-probs the importance
#: weights read carry float noise of the batch's padding (two uninterrupted async runs measured
#: here differed by up to 1.4e-4 in a weight). Their episodes still match exactly.
NOT_BITWISE = {"async-staleness-0": 1e-3}


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights(tiny, tmp_path, mode):
    n, k = 3, 1
    whole = _trainer(tiny, _config(tmp_path / "whole", **MODES[mode]))
    whole.train()
    start = AutoModelForCausalLM.from_pretrained(tiny[0]).state_dict()

    interrupted = _trainer(tiny, _config(tmp_path / "cut", **MODES[mode]), callbacks=[KillAfterCheckpoint(k)])
    with pytest.raises(Killed):
        interrupted.train()
    if interrupted._async is not None:
        interrupted._async.close()  # a killed process's producer dies with it
    assert not (tmp_path / "cut" / f"checkpoint-{k + 1}").exists()
    if mode == "ppo":  # the config's resume_from_checkpoint, as a run script sets it, is not ignored
        resumed = _trainer(tiny, _config(tmp_path / "cut", resume_from_checkpoint=str(tmp_path / "cut" / f"checkpoint-{k}"), **MODES[mode]))
        resumed.train()
    else:
        resumed = _trainer(tiny, _config(tmp_path / "cut", **MODES[mode]))
        resumed.train(resume_from_checkpoint=True)

    assert resumed.state.global_step == whole.state.global_step == n
    assert _max_difference(whole.model.state_dict(), start) > 1e-3  # the steps moved the weights: the comparison can fail
    assert _max_difference(_weights(resumed), _weights(whole)) <= NOT_BITWISE.get(mode, 1e-6)
    if mode in NOT_BITWISE:  # the same episodes: the same seeds, the same samples
        episodes = lambda log: [{k: v for k, v in e.items() if k.startswith(("env/", "completions/", "num_tokens"))} for e in log]  # noqa: E731
        assert episodes(_trained_log(resumed)) == episodes(_trained_log(whole))
    else:
        assert _trained_log(resumed) == _trained_log(whole)
    if mode == "reinforce++":
        assert _max_difference(
            {k_: v for k_, v in resumed._reference.state_dict().items()}, {k_: v for k_, v in whole._reference.state_dict().items()}
        ) == 0.0
    if mode == "retries-self-imitation":
        assert len(whole.win_memory) > 0 and resumed.win_memory.rows == whole.win_memory.rows
        assert any(e.get("self_imitation/nll") for e in _trained_log(whole))  # the term was in the loss
    if mode.startswith("curriculum"):
        assert resumed.curriculum.stage == whole.curriculum.stage == 1
        assert [e["curriculum/stage"] for e in _trained_log(whole)] == [0.0, 0.0, 1.0]


# ---------------------------------------------------------------------------------------- the output folder


def _fake_checkpoint(folder: Path, step: int, complete: bool = True) -> Path:
    """A checkpoint folder of whole files (weights, optimizer, trainer state), as the Trainer leaves
    one; ``complete=False``: without the trainer state it writes last."""
    from safetensors.torch import save_file

    checkpoint = folder / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    save_file({"weight": torch.full((64, 64), float(step))}, str(checkpoint / "model.safetensors"))
    torch.save({"state": {0: {"exp_avg": torch.ones(64, 64)}}}, checkpoint / "optimizer.pt")
    if complete:
        (checkpoint / run_state.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step, "max_steps": 10}))
    return checkpoint


def test_resume_takes_the_last_complete_checkpoint_by_step(tmp_path):
    for step in (2, 9, 10):
        _fake_checkpoint(tmp_path, step)
    _fake_checkpoint(tmp_path, 11, complete=False)  # killed while the Trainer wrote it
    assert run_state.prepare_output_dir(tmp_path, resume=True) == tmp_path / "checkpoint-10"
    assert run_state.prepare_output_dir(tmp_path, resume="last") == tmp_path / "checkpoint-10"
    assert run_state.prepare_output_dir(tmp_path, resume=str(tmp_path / "checkpoint-2")) == tmp_path / "checkpoint-2"
    with pytest.raises(ResumeError, match="not a complete checkpoint"):
        run_state.prepare_output_dir(tmp_path, resume=str(tmp_path / "checkpoint-11"))
    with pytest.raises(ResumeError, match="no such folder"):
        run_state.prepare_output_dir(tmp_path, resume=str(tmp_path / "checkpoint-3"))
    with pytest.raises(ResumeError, match="holds no checkpoint-N"):
        run_state.prepare_output_dir(tmp_path / "empty", resume=True)


def test_a_new_run_into_an_earlier_runs_checkpoints_is_refused_unless_asked(tmp_path):
    assert run_state.prepare_output_dir(tmp_path) is None  # nothing there
    (tmp_path / "notes.txt").write_text("mine")
    _fake_checkpoint(tmp_path, 4)
    with pytest.raises(ResumeError, match=r"holds an unfinished run \(last checkpoint checkpoint-4.*--resume.*--overwrite"):
        run_state.prepare_output_dir(tmp_path)
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(ResumeError, match=r"holds a finished run \(results.json, final/, checkpoints up to checkpoint-4\): --resume .*--overwrite"):
        run_state.prepare_output_dir(tmp_path)
    with pytest.raises(ResumeError, match="give one of them"):
        run_state.prepare_output_dir(tmp_path, resume=True, overwrite=True)
    (tmp_path / "final").mkdir()
    assert run_state.prepare_output_dir(tmp_path, overwrite=True) is None
    assert (tmp_path / "checkpoint-4").is_dir()  # the caller clears once the new run has loaded
    run_state.clear_run(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # the run's outputs gone, nothing else


def test_a_finished_run_without_checkpoints_is_refused_naming_resume_and_overwrite(tmp_path):
    """The checkpoint of the last step goes once the run has finished, so results.json alone says
    that a run is there; the same command again does not replace it unasked."""
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "final").mkdir()
    with pytest.raises(ResumeError) as refused:
        run_state.prepare_output_dir(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path} holds a finished run (results.json, final/): --resume prints its results without training, --overwrite starts afresh"
    )
    assert run_state.prepare_output_dir(tmp_path, overwrite=True) is None


def test_a_resume_with_another_config_names_what_changed():
    record = {"model": "tiny", "config": {"max_steps": 3, "learning_rate": 0.01, "save_steps": 1}, "warm_start": {"steps": 0}}
    run_state.check_same_run(record, "tiny", {"max_steps": 3, "learning_rate": 0.01, "save_steps": 5}, {"steps": 0})
    with pytest.raises(ResumeError, match=r"max_steps: 3 then, 6 now; seed: None then, 1 now"):
        run_state.check_same_run(record, "tiny", {"max_steps": 6, "learning_rate": 0.01, "seed": 1}, {"steps": 0})
    with pytest.raises(ResumeError, match="model: 'tiny' then, 'smollm2-135m' now"):
        run_state.check_same_run(record, "smollm2-135m", record["config"], {"steps": 0})


def test_a_checkpoint_from_before_a_warm_start_field_existed_resumes_with_its_default():
    from envhub_trl.warm_start import WarmStart

    now = dataclasses.asdict(WarmStart(steps=2))
    before = {k: v for k, v in now.items() if k not in ("lr_schedule", "warmup_steps", "max_grad_norm")}
    record = {"model": "tiny", "config": {"max_steps": 3}, "warm_start": before}
    run_state.check_same_run(record, "tiny", {"max_steps": 3}, now)
    with pytest.raises(ResumeError, match="warm_start: .* then, .*'lr_schedule': 'cosine'.* now"):
        run_state.check_same_run(record, "tiny", {"max_steps": 3}, {**now, "lr_schedule": "cosine"})


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "holds an unfinished run (last checkpoint checkpoint-1, no results.json): add --resume to continue it, or --overwrite"),
        (["resume_from_checkpoint=/no/such/checkpoint"], "cannot resume from /no/such/checkpoint: no such folder"),
        (["--resume", "--overwrite"], "give one of them"),
        (["--resume", "/no/such/checkpoint"], "cannot resume from /no/such/checkpoint: no such folder"),
        (["--resume", "max_steps=3"], "holds no envhub_train.json"),  # an override after a bare --resume, not a path
    ],
)
def test_train_command_refuses_what_it_cannot_resume_in_one_line(tmp_path, args, message):
    from envhub.cli import cli

    _fake_checkpoint(tmp_path / "out", 1)
    result = CliRunner().invoke(cli, ["train", "--env", LAKE, "--output-dir", str(tmp_path / "out"), *args])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert message in result.output and result.output.count("\n") == 1, result.output


# ---------------------------------------------------------------------------------------- envhub train --resume

CLI_CONFIG = (
    "max_turns: 3\ngroups_per_step: 2\ngroup_size: 2\nper_device_train_batch_size: 2\nmax_steps: 3\nmax_turn_tokens: 6\n"
    "eval_episodes: 2\neval_sampled: true\neval_steps: 1\nsave_strategy: steps\nsave_steps: 1\nlogging_steps: 1\ndisable_tqdm: true\nseed: 5\n"
    "learning_rate: 0.01\nformat_penalty: -0.1\nwarm_start: {steps: 2, episodes: 4, learning_rate: 0.01}\n"
)


@pytest.fixture(scope="module")
def half_expert_runs():
    """``envhub train`` plays with the half-expert generator for the rest of the module (returns
    differ within groups, so every step trains, and the evaluations are not all 0)."""
    from envhub_trl.trainer import EnvGRPOTrainer

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EnvGRPOTrainer, "_build_generator", lambda self, model: HalfExpert(model, self.processing_class))
        yield


def _whole_and_cut(folder: Path, config_text: str) -> tuple[Path, list[str]]:
    """``envhub train`` uninterrupted into ``folder/whole``, and the same run killed right after
    ``checkpoint-1`` into ``folder/cut``."""
    from envhub.cli import cli
    from envhub_trl.trainer import EnvGRPOTrainer

    config = folder / "run.yaml"
    config.write_text(config_text)
    command = ["train", "--env", LAKE, "--algo", "grpo", "--config", str(config), "--output-dir"]
    whole = CliRunner().invoke(cli, [*command, str(folder / "whole")])
    assert whole.exit_code == 0, whole.output

    save = EnvGRPOTrainer._save_checkpoint

    def save_then_die(self, model, trial):
        save(self, model, trial)
        if self.state.global_step == 1:
            raise Killed("killed after checkpoint-1")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EnvGRPOTrainer, "_save_checkpoint", save_then_die)
        cut = CliRunner().invoke(cli, [*command, str(folder / "cut")])
    assert isinstance(cut.exception, Killed), cut.output
    return folder, command


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory, half_expert_runs):
    """``envhub train`` uninterrupted, and the same run killed right after ``checkpoint-1``."""
    return _whole_and_cut(tmp_path_factory.mktemp("cli"), CLI_CONFIG)


def _results(folder: Path) -> dict:
    results = json.loads((folder / "results.json").read_text())
    results.pop("seconds")  # the wall clock
    assert results.pop("phase_seconds")["rl"] > 0  # the RL phase's (this process's part of it)
    return results


def _final_weights(folder: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(folder / "final").state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("how", [["--resume"], ["resume_from_checkpoint={cut}/checkpoint-1"]])
def test_train_command_resumes_to_the_uninterrupted_runs_figures_and_weights(cli_runs, tmp_path, how):
    from envhub.cli import cli

    folder, command = cli_runs
    cut = tmp_path / "cut"
    shutil.copytree(folder / "cut", cut)
    assert not (cut / "results.json").exists() and (cut / "checkpoint-1").is_dir() and not (cut / "checkpoint-2").exists()
    resumed = CliRunner().invoke(cli, [*command, str(cut), *[arg.format(cut=cut) for arg in how]])
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming from {cut / 'checkpoint-1'}" in resumed.stderr
    assert "warm start:" not in resumed.stderr  # the checkpoint holds it

    whole = _results(folder / "whole")
    assert [p["step"] for p in whole["held_out_curve"]] == [1, 2] and whole["rl_steps"] == 3
    assert 0 < whole["evaluations"]["after RL"]["sampled"]["invalid_action_rate"] < 1  # figures that could differ
    assert _results(cut) == whole
    assert _max_difference(_final_weights(cut), _final_weights(folder / "whole")) <= 1e-6
    start = AutoModelForCausalLM.from_pretrained(cut / "checkpoint-1").state_dict()
    assert _max_difference(_final_weights(cut), start) > 1e-4  # the resumed steps trained: the comparison can fail


@pytest.mark.slow
def test_a_lora_run_resumes_to_the_uninterrupted_runs_figures_and_weights(tmp_path, half_expert_runs):
    """With LoRA the warm start's adapter is folded into the weights before RL, and a checkpoint
    must hold those weights, not only RL's adapter: the resumed run ends where the whole one does."""
    from envhub.cli import cli

    folder, command = _whole_and_cut(tmp_path, CLI_CONFIG + "lora: {r: 4, alpha: 8}\n")
    cut = folder / "cut"
    resumed = CliRunner().invoke(cli, [*command, str(cut), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "warm start:" not in resumed.stderr
    assert _results(cut) == _results(folder / "whole")
    assert _max_difference(_final_weights(cut), _final_weights(folder / "whole")) <= 1e-6


@pytest.mark.slow
def test_train_command_overwrite_starts_afresh(cli_runs, tmp_path):
    from envhub.cli import cli

    folder, command = cli_runs
    cut = tmp_path / "cut"
    shutil.copytree(folder / "cut", cut)
    fresh = CliRunner().invoke(cli, [*command, str(cut), "--overwrite", "max_steps=1", "eval_steps=null", "warm_start.steps=0"])
    assert fresh.exit_code == 0, fresh.output
    assert "resuming" not in fresh.stderr
    assert _results(cut)["rl_steps"] == 1 and _results(cut)["config"]["max_steps"] == 1
    assert run_state.checkpoints(cut) == []  # the earlier run's went; the new one's, at its last step, only duplicated final/


# ---------------------------------------------------------------------------------------- finished runs, kills and full disks (issue 43)


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_resume_of_a_finished_run_says_so_and_changes_nothing(cli_runs, tmp_path):
    from envhub.cli import cli

    folder, command = cli_runs
    done = tmp_path / "done"
    shutil.copytree(folder / "whole", done)
    before = _tree(done)
    resumed = CliRunner().invoke(cli, [*command, str(done), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert f"{done} holds a finished run (results.json): there is nothing to resume, and nothing was changed" in resumed.stderr
    assert "RL phase (3 steps" in resumed.stdout  # its table, from its results.json
    assert _tree(done) == before


@pytest.mark.slow
def test_a_run_killed_while_writing_its_final_model_resumes_to_no_step_past_max_steps(cli_runs, tmp_path):
    """Killed after its last checkpoint, while ``final/`` was written: the resume trains no step
    (the Trainer's loop trained a fourth of three) and ends with the uninterrupted run's weights."""
    from envhub.cli import cli

    from envhub_trl.run import TrainingRun

    folder, command = cli_runs
    cut = tmp_path / "cut"
    shutil.copytree(folder / "cut", cut)
    staging = run_files.partial_path(cut / "final")

    def killed_writing_final(self, card=None):
        staging.mkdir(parents=True)
        (staging / "model.safetensors").write_bytes(b"half a model")
        raise Killed("killed while writing final/")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TrainingRun, "save_final", killed_writing_final)
        killed = CliRunner().invoke(cli, [*command, str(cut), "--resume"])
    assert isinstance(killed.exception, Killed), killed.output
    assert (cut / "checkpoint-3").is_dir() and not (cut / "results.json").exists()  # the last step's checkpoint stays until the run ends
    resumed = CliRunner().invoke(cli, [*command, str(cut), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming from {cut / 'checkpoint-3'}" in resumed.stderr
    assert not (cut / "checkpoint-4").exists() and not staging.parent.exists()
    assert not (cut / "checkpoint-3").exists()  # finished: it only duplicated final/
    assert _results(cut) == _results(folder / "whole")
    assert _max_difference(_final_weights(cut), _final_weights(folder / "whole")) <= 1e-6


@pytest.mark.slow
def test_a_run_sigkilled_while_writing_a_checkpoint_resumes_from_the_last_whole_one(cli_runs, tmp_path):
    """A real SIGKILL halfway through checkpoint-2's trainer state: the half-written checkpoint is
    never taken for one (it was taken, and its state did not parse), and the resume from
    checkpoint-1 ends with the uninterrupted run's figures and weights."""
    import signal
    import subprocess
    import sys

    from envhub.cli import cli

    folder, command = cli_runs
    cut = tmp_path / "cut"
    script = Path(__file__).parent / "scripts" / "train_killed_mid_write.py"
    killed = subprocess.run([sys.executable, str(script), "2", *command, str(cut)], capture_output=True, text=True, timeout=1200)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert run_state.checkpoints(cut) == [cut / "checkpoint-1"] and not (cut / "results.json").exists()
    resumed = CliRunner().invoke(cli, [*command, str(cut), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming from {cut / 'checkpoint-1'}" in resumed.stderr
    assert not [p for p in cut.iterdir() if p.name.startswith(".envhub-partial")]  # the killed write's leftover is gone
    assert _results(cut) == _results(folder / "whole")
    assert _max_difference(_final_weights(cut), _final_weights(folder / "whole")) <= 1e-6


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs mounted at ``tmp_path/disk`` (root only, where mounting works); yields a function
    that sets its size in bytes (remount), and unmounts it at the end."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("needs root and tmpfs mounts")

    def resize(size: int) -> Path:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)
        return disk

    try:
        yield resize
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.slow
def test_a_full_disk_while_saving_is_one_line_and_the_last_checkpoint_stays_whole(cli_runs, small_disk):
    """On a tmpfs with room for one checkpoint and a half: checkpoint-2 does not fit. One line
    names it and the space; no results.json claims a finished run; checkpoint-1 is whole and, with
    room again, --resume takes it (the resumes above show where one goes from there)."""
    from envhub.cli import cli

    folder, command = cli_runs
    size = run_files.folder_bytes(folder / "whole" / "checkpoint-1")
    out = small_disk(int(size * 1.6) // 4096 * 4096) / "out"
    full = CliRunner().invoke(cli, [*command, str(out)])
    assert full.exit_code == 1 and isinstance(full.exception, SystemExit), full.output
    message = full.output.strip().splitlines()[-1]
    assert message.startswith(f"Error: cannot write {out / 'checkpoint-2'}: no space left on the device (it needs about "), message
    assert message.endswith("free); free some space; checkpoint-1 is whole and --resume continues from it"), message
    assert "Traceback" not in full.output
    assert not (out / "results.json").exists() and not (out / "final").exists()
    assert run_state.checkpoints(out) == [out / "checkpoint-1"] and run_state.checkpoint_damage(out / "checkpoint-1") is None
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no partial write, no lock left
    small_disk(256 << 20)
    assert run_state.prepare_output_dir(out, resume=True) == out / "checkpoint-1"
    saved = AutoModelForCausalLM.from_pretrained(out / "checkpoint-1").state_dict()
    assert _max_difference(saved, AutoModelForCausalLM.from_pretrained(folder / "whole" / "checkpoint-1").state_dict()) <= 1e-6
