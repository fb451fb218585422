"""The warm start's learning-rate schedule, warm-up and gradient clipping (WarmStart.lr_schedule,
warmup_steps, max_grad_norm): the schedule's shape, its checks, and that supervised_steps applies it."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from envhub.trajectory import Sample  # noqa: E402
from envhub_trl.warm_start import LR_SCHEDULES, WarmStart, lr_factor, supervised_steps  # noqa: E402


def test_each_schedule_warms_up_linearly_then_keeps_or_decays_to_zero():
    assert [lr_factor(i, 10, "constant", 3) for i in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert [lr_factor(i, 10, "linear") for i in (0, 5, 9)] == [1.0, 0.5, pytest.approx(0.1)]
    cosine = [lr_factor(i, 10, "cosine", 2) for i in range(10)]
    assert cosine[2] == 1.0 and all(a > b for a, b in zip(cosine[2:], cosine[3:])) and cosine[-1] < 0.04
    assert lr_factor(5, 10, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


def test_bad_schedule_settings_are_one_line_errors():
    with pytest.raises(ValueError, match=r"lr_schedule must be one of \['constant', 'linear', 'cosine'\], got 'step'"):
        WarmStart(lr_schedule="step")
    with pytest.raises(ValueError, match="warmup_steps >= 0 and max_grad_norm >= 0"):
        WarmStart(warmup_steps=-1)
    with pytest.raises(ValueError, match="warm_start.max_grad_norm must be a number"):
        WarmStart.from_mapping({"max_grad_norm": "a lot"})
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        lr_factor(0, 1, "exponential")
    assert set(LR_SCHEDULES) == {"constant", "linear", "cosine"}


def test_a_config_mapping_reads_the_schedule_and_describes_it():
    warm = WarmStart.from_mapping({"steps": 1000, "lr_schedule": "cosine", "warmup_steps": "50", "max_grad_norm": 1})
    assert (warm.lr_schedule, warm.warmup_steps, warm.max_grad_norm) == ("cosine", 50, 1.0)
    assert "cosine learning rate, 50 warm-up steps" in warm.describe()
    assert "learning rate" not in WarmStart(steps=10).describe()
    assert WarmStart(steps=1, episodes=1).describe() == "1 supervised step on 1 expert episode"


class _Recorder(torch.nn.Module):
    """A model with one weight, whose loss is the weight's square times 1000 (a large gradient)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([1.0]))

    def forward(self, input_ids, attention_mask, labels):
        return type("Output", (), {"loss": (self.weight**2).sum() * 1000})()


def test_supervised_steps_follow_the_schedule_and_clip_the_gradient():
    model = _Recorder()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    rates, step = [], optimizer.step

    def recording_step(*args, **kwargs):
        rates.append(optimizer.param_groups[0]["lr"])
        assert model.weight.grad.norm() <= 0.5 + 1e-6  # clipped from 2000
        return step(*args, **kwargs)

    optimizer.step = recording_step
    sample = Sample(prompt_ids=[1, 2], completion_ids=[3], env_mask=[1], logprobs=[0.0], turn_ids=[0], group_id=0, trajectory_index=0)
    supervised_steps(model, [sample], 4, learning_rate=0.1, optimizer=optimizer, lr_schedule="linear", warmup_steps=1, max_grad_norm=0.5)
    assert rates == pytest.approx([0.05, 0.1, 0.1 * 2 / 3, 0.1 / 3])


def test_the_cli_flag_overrides_the_configs_schedule_and_refuses_unknown_ones():
    from click.testing import CliRunner

    from envhub_trl.commands import train_command
    from envhub_trl.run import split_warm_start

    values = {"warm_start": {"steps": 5, "lr_schedule": "linear"}}
    assert split_warm_start(values, None, {"lr_schedule": "cosine"}).lr_schedule == "cosine" and "warm_start" not in values
    result = CliRunner().invoke(train_command, ["--output-dir", "unused", "--warm-start-schedule", "step"])
    assert result.exit_code == 2 and "'step' is not one of 'constant', 'linear', 'cosine'" in result.output


class _Linear(torch.nn.Module):
    """One linear layer; the loss is its output's mean square, and each forward records the dtype
    its matrix product ran in."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)
        self.dtypes: list[torch.dtype] = []

    def forward(self, input_ids, attention_mask, labels):
        out = self.layer(torch.ones(2, 4))
        self.dtypes.append(out.dtype)
        return type("Output", (), {"loss": out.float().pow(2).mean()})()


def test_a_bf16_run_warms_up_in_mixed_precision_and_keeps_fp32_weights():
    """bf16 (the run's precision, as envhub train passes it) autocasts the forward pass; the weights
    the optimizer updates stay fp32, and without it the warm start computes in fp32."""
    sample = Sample(prompt_ids=[1, 2], completion_ids=[3], env_mask=[1], logprobs=[0.0], turn_ids=[0], group_id=0, trajectory_index=0)
    mixed, plain = _Linear(), _Linear()
    before = mixed.layer.weight.detach().clone()
    losses = supervised_steps(mixed, [sample], 3, learning_rate=0.1, bf16=True)
    supervised_steps(plain, [sample], 1, learning_rate=0.1)
    assert mixed.dtypes == [torch.bfloat16] * 3 and plain.dtypes == [torch.float32]
    assert mixed.layer.weight.dtype == torch.float32 and not torch.equal(mixed.layer.weight, before)
    assert losses[-1] < losses[0]
