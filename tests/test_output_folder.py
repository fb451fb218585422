"""What ``envhub train`` leaves in its output folder (issue 42, item 6): periodic checkpoints as
``save_strategy``/``save_steps`` ask, but not the one of the last step once ``final/`` holds the
same model; a model card written from results.json instead of TRL's; and the same command on a
finished run refused in one line that names ``--resume`` and ``--overwrite``."""

from __future__ import annotations

import json
import types

import pytest

pytest.importorskip("trl")

from click.testing import CliRunner  # noqa: E402

from envhub.cli import cli  # noqa: E402
from envhub_trl import run_state  # noqa: E402
from envhub_trl.model_card import model_card  # noqa: E402
from envhub_trl.run import TrainingRun  # noqa: E402

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


def _results(**changes):
    figures = {
        "evaluations": {
            "initial model": {"greedy": {"success_rate": 0.0}},
            "after warm start (SFT)": {"greedy": {"success_rate": 0.5}, "sampled": {"success_rate": 0.25}},
            "after RL": {"greedy": {"success_rate": 0.75}, "sampled": {"success_rate": 0.625}},
        },
        "references": {"random policy": 0.0625, "open-loop": 0.5, "expert": 1.0, "optimal": 1.0},
    }
    results = {
        "env_ids": [LAKE], "model": "tiny", "advantage_estimator": "gigpo", "rl_steps": 20, "held_out_episodes": 16,
        "held_out_seed_offset": 1000, "sampling": "T=1", "per_env": {LAKE: figures}, "validation": None,
        "warm_start": {"steps": 30, "episodes": 64},
    }
    return {**results, **changes}


def test_the_model_card_says_what_made_the_model_and_how_well_it_does():
    card = model_card(_results(), f"envhub train --env {LAKE} --output-dir 'my run'")
    assert card.startswith("---\nlibrary_name: transformers\ntags:\n- envhub\n- reinforcement-learning\n- gigpo\n- frozenlake\n---\n")
    assert "None" not in card
    for line in (
        f"# {LAKE}: tiny trained with gigpo",
        f"- Environments: `{LAKE}`",
        "- Algorithm: gigpo, 20 RL steps",
        "- Warm start: 30 supervised steps on 64 expert episodes",
        "| initial model | 0.0% | - |",
        "| after warm start (SFT) | 50.0% | 25.0% |",
        "| after RL | 75.0% | 62.5% |",
        "| random policy (reference) | 6.2% | 6.2% |",
        "| open-loop (reference) | 50.0% | 50.0% |",
        "| expert (reference) | 100.0% | 100.0% |",
        "| optimal (reference) | 100.0% | 100.0% |",
        "envhub train --env frozenlake/FrozenLakeNotSlippery-v0 --output-dir 'my run'",
    ):
        assert line in card.splitlines(), line
    assert "Success on 16 held-out seeds (from seed 1000" in card


def test_the_card_of_a_mix_has_a_table_per_env_and_names_the_kept_step():
    results = _results(env_ids=[LAKE, "sokoban/Sokoban-v0"], validation={"step": 4, "last_step": 20, "greedy": 0.5},
                       warm_start={"steps": 0})
    results["per_env"]["sokoban/Sokoban-v0"] = results["per_env"][LAKE]
    card = model_card(results)
    assert f"### {LAKE}" in card and "### sokoban/Sokoban-v0" in card
    assert "- Kept the policy of step 4 of 20, the best on the validation seeds" in card
    assert "- Warm start: none (RL from the model as loaded)" in card
    assert "envhub train  # from Python" in card  # no command line to show


def _checkpoint(folder, step):
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / run_state.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step}))


def _finished(folder, last_step, kept=None):
    run = types.SimpleNamespace(spec=types.SimpleNamespace(args=types.SimpleNamespace(output_dir=str(folder))),
                                trainer=types.SimpleNamespace(state=types.SimpleNamespace(global_step=last_step)), kept=kept)
    TrainingRun.drop_last_checkpoint(run)
    return [p.name for p in run_state.checkpoints(folder)]


def test_the_last_steps_checkpoint_goes_and_periodic_ones_stay(tmp_path):
    for step in (2, 4, 5):
        _checkpoint(tmp_path, step)
    assert _finished(tmp_path, 5) == ["checkpoint-2", "checkpoint-4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-4"]  # nothing set aside is left
    assert _finished(tmp_path, 5) == ["checkpoint-2", "checkpoint-4"]  # none at the last step: nothing goes


def test_the_last_steps_checkpoint_stays_when_final_holds_another_steps_policy(tmp_path):
    _checkpoint(tmp_path, 6)
    assert _finished(tmp_path, 6, kept={"step": 2, "last_step": 6}) == ["checkpoint-6"]
    assert _finished(tmp_path, 6, kept={"step": 6, "last_step": 6}) == []


@pytest.mark.slow
def test_a_short_run_leaves_its_model_card_no_duplicate_checkpoint_and_refuses_to_run_again(tmp_path):
    out = tmp_path / "out"
    command = [
        "train", "--env", LAKE, "--model", "tiny", "--output-dir", str(out), "--eval-episodes", "2", "--max-steps", "3",
        "save_steps=2", "groups_per_step=2", "group_size=2", "per_device_train_batch_size=4", "max_turns=4", "max_turn_tokens=6",
    ]
    first = CliRunner().invoke(cli, command)
    assert first.exit_code == 0, first.output
    assert [p.name for p in run_state.checkpoints(out)] == ["checkpoint-2"]  # periodic; checkpoint-3 was final/ again
    assert not (out / "README.md").exists()  # TRL's card, which named the base model "None"
    results = json.loads((out / "results.json").read_text())
    line = (
        f"envhub train --env {LAKE} --model tiny --output-dir {out} --eval-episodes 2 max_steps=3 save_steps=2 groups_per_step=2 "
        "group_size=2 per_device_train_batch_size=4 max_turns=4 max_turn_tokens=6"
    )
    card = (out / "final" / "README.md").read_text()
    assert card == model_card(results, line)  # TRL's --max-steps 3 shown as the override it is
    assert "| expert (reference) |" in card and "command" not in results

    again = CliRunner().invoke(cli, command)
    assert again.exit_code == 1 and isinstance(again.exception, SystemExit), again.output
    assert again.output == (
        f"Error: {out} holds a finished run (results.json, final/, checkpoints up to checkpoint-2): --resume prints its results "
        "without training, --overwrite starts afresh\n"
    )
    shown = CliRunner().invoke(cli, [*command, "--resume"])
    assert shown.exit_code == 0 and "RL phase (3 steps" in shown.output, shown.output
