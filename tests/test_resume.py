"""Resumed training runs end where uninterrupted ones do (issue 32).

A run is interrupted right after it wrote ``checkpoint-k`` (a callback raises there, as a kill
would leave the folder), resumed from it to ``n`` steps, and compared with the uninterrupted
``n``-step run: the weights (and PPO's value head) within 1e-6 on the CPU, the same log.

Covered: GRPO with lockstep rollouts (the checkpoint inside a generation batch: TRL's buffered
batch and micro-step counter), PPO (the value head and its optimizer group), REINFORCE++ (its
frozen reference), a curriculum (stage and window) with continuous rollouts; and ``envhub train
--resume`` end to end, its ``results.json`` figures included. Not covered: async rollouts (their
producer's position is restored, but the batches it played ahead with older weights are lost:
see :mod:`envhub_trl.run_state`), vLLM generators, several processes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from click.testing import CliRunner  # noqa: E402
from transformers import AutoModelForCausalLM, TrainerCallback  # noqa: E402

from envhub.error import ResumeError  # noqa: E402
from envhub_trl import run_state  # noqa: E402
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
    return EnvGRPOTrainer(model, config, processing_class=tokenizer, callbacks=list(callbacks), generator=HalfExpert(model, tokenizer))


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
}


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
    assert not (tmp_path / "cut" / f"checkpoint-{k + 1}").exists()
    resumed = _trainer(tiny, _config(tmp_path / "cut", **MODES[mode]))
    resumed.train(resume_from_checkpoint=True)

    assert resumed.state.global_step == whole.state.global_step == n
    assert _max_difference(whole.model.state_dict(), start) > 1e-3  # the steps moved the weights: the comparison can fail
    assert _max_difference(_weights(resumed), _weights(whole)) <= 1e-6
    assert _trained_log(resumed) == _trained_log(whole)
    if mode == "reinforce++":
        assert _max_difference(
            {k_: v for k_, v in resumed._reference.state_dict().items()}, {k_: v for k_, v in whole._reference.state_dict().items()}
        ) == 0.0
    if mode.startswith("curriculum"):
        assert resumed.curriculum.stage == whole.curriculum.stage == 1
        assert [e["curriculum/stage"] for e in _trained_log(whole)] == [0.0, 0.0, 1.0]
