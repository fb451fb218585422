"""keep_best_on_validation: the run ends with the policy that did best on the validation seeds."""

from __future__ import annotations

import json
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from click.testing import CliRunner  # noqa: E402

from envhub_trl.config import EnvGRPOConfig  # noqa: E402
from envhub_trl.selection import BEST_FILE, ValidationSelection  # noqa: E402

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


class ScriptedTrainer:
    """What ValidationSelection uses of EnvGRPOTrainer: a model whose weight is the step it was
    validated at, and validation figures read from a script."""

    def __init__(self, tmp_path, rates):
        self.args = types.SimpleNamespace(
            validation_steps=2, validation_seed_offset=500_000_000, validation_episodes=3, output_dir=str(tmp_path),
            env_entries=lambda: [types.SimpleNamespace(env_id=LAKE)],
        )
        self.model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(self.model.weight)  # step 0's
        self.accelerator = types.SimpleNamespace(unwrap_model=lambda m: m, is_main_process=True, wait_for_everyone=lambda: None)
        self.state = types.SimpleNamespace(global_step=0)
        self.rates = dict(rates)
        self.seeds_seen = []
        self.changed = 0

    def evaluate_env(self, seeds, env, label):
        self.seeds_seen.append(list(seeds))
        return {"success_rate": self.rates[self.state.global_step]}

    def weights_changed(self):
        self.changed += 1

    def step_to(self, step, selection):
        self.state.global_step = step
        with torch.no_grad():
            self.model.weight.fill_(float(step))
        selection.on_step_end(self.args, self.state, None)


def test_the_best_policy_is_kept_the_earliest_of_equals(tmp_path):
    trainer = ScriptedTrainer(tmp_path, {0: 0.5, 2: 0.75, 4: 0.75, 5: 0.25})
    selection = ValidationSelection(trainer)
    selection.on_train_begin(trainer.args, trainer.state, None)
    for step in range(1, 6):
        trainer.step_to(step, selection)
    kept = selection.finish()
    assert [p["step"] for p in selection.points] == [0, 2, 4, 5]  # the start, every 2 steps and the end
    assert trainer.seeds_seen[0] == [500_000_000, 500_000_001, 500_000_002]
    assert kept == {"step": 2, "greedy": 0.75, "last_step": 5, "last_greedy": 0.25}
    assert trainer.model.weight.item() == 5.0
    selection.restore()
    assert trainer.model.weight.item() == 2.0 and trainer.changed == 1  # step 2's weights, and the generator is told
    assert (tmp_path / BEST_FILE).is_file()


def test_a_run_that_only_loses_ends_with_its_start(tmp_path):
    trainer = ScriptedTrainer(tmp_path, {0: 0.5, 2: 0.25, 3: 0.0})
    selection = ValidationSelection(trainer)
    selection.on_train_begin(trainer.args, trainer.state, None)
    for step in range(1, 4):
        trainer.step_to(step, selection)
    assert selection.finish()["step"] == 0
    selection.restore()
    assert trainer.model.weight.item() == 0.0


def test_a_resumed_run_does_not_validate_its_start_again(tmp_path):
    trainer = ScriptedTrainer(tmp_path, {4: 0.5})
    trainer.state.global_step = 3
    selection = ValidationSelection(trainer, [{"step": 0, "greedy": 0.6}, {"step": 2, "greedy": 0.4}])
    selection.on_train_begin(trainer.args, trainer.state, None)
    assert len(selection.points) == 2
    trainer.step_to(4, selection)
    assert selection.finish() == {"step": 0, "greedy": 0.6, "last_step": 4, "last_greedy": 0.5}


def test_validation_seeds_must_not_overlap_training_or_held_out_seeds():
    with pytest.raises(ValueError, match="validation seeds 1000000000..1000000255 overlap"):
        EnvGRPOConfig(output_dir="/tmp/x", keep_best_on_validation=True, validation_seed_offset=1_000_000_000)
    with pytest.raises(ValueError, match="overlap the training seeds"):
        EnvGRPOConfig(output_dir="/tmp/x", keep_best_on_validation=True, validation_seed_offset=10)
    EnvGRPOConfig(output_dir="/tmp/x", validation_seed_offset=10)  # only checked when the seeds are used


@pytest.mark.slow
def test_train_command_ends_with_the_kept_policy(tmp_path):
    from envhub.cli import cli
    from transformers import AutoModelForCausalLM

    config = tmp_path / "run.yaml"
    config.write_text(
        "max_turns: 4\ngroups_per_step: 2\ngroup_size: 2\nper_device_train_batch_size: 4\nmax_steps: 3\n"
        "max_turn_tokens: 6\neval_episodes: 2\nsave_strategy: 'no'\nlogging_steps: 1\ndisable_tqdm: true\n"
        "learning_rate: 0.01\nkeep_best_on_validation: true\nvalidation_steps: 2\nvalidation_episodes: 3\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["train", "--env", LAKE, "--config", str(config), "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    validation = json.loads((out / "results.json").read_text())["validation"]
    assert [p["step"] for p in validation["curve"]] == [0, 2, 3]
    best = max(validation["curve"], key=lambda p: p["greedy"])
    assert validation["step"] == best["step"] and validation["last_step"] == 3
    assert (validation["held_out_last_step"] is None) == (best["step"] == 3)
    kept = torch.load(out / BEST_FILE, weights_only=True)
    final = AutoModelForCausalLM.from_pretrained(out / "final").state_dict()
    assert all(torch.equal(final[name], kept[name]) for name in final)
    assert "validation success at step 2:" in result.stderr
