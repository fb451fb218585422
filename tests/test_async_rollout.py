"""Off-policy rollouts with bounded staleness (rollout_mode: async) and continuous rollouts in the trainer."""

from __future__ import annotations

import math
import os
import random
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from envhub.rollout import RolloutStats  # noqa: E402
from envhub_trl.async_rollout import AsyncRollouts, staleness_metrics, truncated_importance_weights  # noqa: E402
from envhub_trl.config import EnvGRPOConfig  # noqa: E402

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_truncated_importance_weights_match_a_hand_worked_example():
    # current / sampled probabilities: 0.5/0.25 = 2, 0.2/0.8 = 0.25, 0.9/0.3 = 3 (capped at 2), an env token, padding
    current = torch.log(torch.tensor([[0.5, 0.2, 0.9, 0.7, 0.1]]))
    sampled = torch.log(torch.tensor([[0.25, 0.8, 0.3, 0.1, 0.5]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]])
    weights, stats = truncated_importance_weights(current, sampled, mask, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.25, 2.0, 1.0, 1.0]]))
    assert stats["mean"] == pytest.approx((2 + 0.25 + 3) / 3) and stats["max"] == pytest.approx(3.0)
    assert stats["truncated_fraction"] == pytest.approx(1 / 3)


def test_staleness_histogram():
    metrics = staleness_metrics([0, 1, 1, 2], bound=2)
    assert metrics["rollout/staleness_mean"] == 1.0 and metrics["rollout/staleness_max"] == 2.0
    assert [metrics[f"rollout/staleness/{s}"] for s in range(3)] == [0.25, 0.5, 0.25]


@pytest.mark.parametrize("bound", [0, 1, 2])
def test_async_rollouts_never_exceed_their_staleness_bound(bound):
    """Batches of random length (a slow batch delays the producer, it is never dropped) against a
    trainer of random speed: every batch arrives whole, in order, at most ``bound`` versions old,
    and a fast producer runs exactly ``bound`` ahead."""
    rng = random.Random(bound)
    loads = []

    def play(batch):
        time.sleep(rng.choice([0.0, 0.001, 0.02]))
        return [f"episode {batch}.{i}" for i in range(4)], RolloutStats(turns=4)

    producer = AsyncRollouts(play, loads.append, bound)
    seen = []
    try:
        for batch in range(12):
            producer.post_weights(batch, f"weights v{batch}")
            time.sleep(rng.choice([0.0, 0.005, 0.03]))
            trajectories, stats, version = producer.take(batch)
            assert trajectories == [f"episode {batch}.{i}" for i in range(4)] and stats.turns == 4
            seen.append(batch - version)
    finally:
        producer.close()
    assert all(0 <= s <= bound for s in seen)
    assert all(load.startswith("weights v") for load in loads)

    fast = AsyncRollouts(lambda batch: ([batch], RolloutStats()), lambda snapshot: None, bound)
    try:
        stale = []
        for batch in range(6):
            time.sleep(0.05)  # the producer is always ahead when the trainer asks
            fast.post_weights(batch, batch)
            stale.append(batch - fast.take(batch)[2])
    finally:
        fast.close()
    assert stale[bound:] == [bound] * (6 - bound)


@pytest.mark.parametrize("bound", [0, 2])
def test_a_resumed_producer_goes_on_from_its_position_within_its_bound(bound):
    """A producer started at batch 5 (a run resumed there) plays 5, 6, ... (never 0 again: their
    seeds were trained on), runs at most ``bound`` ahead of the posted weights, and counts the
    weights it starts with as version 5."""
    played = []

    def play(batch):
        played.append(batch)
        return [batch], RolloutStats()

    producer = AsyncRollouts(play, lambda snapshot: None, bound, first_batch=5)
    try:
        time.sleep(0.1)  # time to run ahead, if it would
        assert played == list(range(5, 5 + bound + 1))
        stale = []
        for batch in range(5, 9):
            producer.post_weights(batch, batch)
            trajectories, _, version = producer.take(batch)
            assert trajectories == [batch]
            stale.append(batch - version)
    finally:
        producer.close()
    assert played[:4] == [5, 6, 7, 8] and all(0 <= s <= bound for s in stale)
    with pytest.raises(ValueError, match="first_batch"):
        AsyncRollouts(play, lambda snapshot: None, bound, first_batch=-1)


def test_a_failing_producer_fails_the_trainer_with_its_error():
    def play(batch):
        raise OSError("env server gone")

    producer = AsyncRollouts(play, lambda snapshot: None, 1)
    producer.post_weights(0, None)
    with pytest.raises(RuntimeError, match="env server gone"):
        producer.take(0)
    producer.close()


def test_config_takes_rolls_name_and_checks_the_mode(tmp_path):
    config = EnvGRPOConfig(output_dir=str(tmp_path), rollout_mode="async", async_generation_ratio=2, use_cpu=True, report_to="none")
    assert config.max_staleness == 2
    with pytest.raises(ValueError, match="rollout_mode must be one of"):
        EnvGRPOConfig(output_dir=str(tmp_path), rollout_mode="sideways", use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        EnvGRPOConfig(output_dir=str(tmp_path), rollout_mode="async", max_staleness=-1, use_cpu=True, report_to="none")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trl_helpers import save_tiny_lake_model

    return save_tiny_lake_model(tmp_path_factory.mktemp("tiny") / "model")


def train(tiny, tmp_path, half_expert=False, **overrides):
    from transformers import AutoModelForCausalLM

    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = tiny
    values = dict(
        output_dir=str(tmp_path), env_id=LAKE, max_turns=4, groups_per_step=2, group_size=4, per_device_train_batch_size=8,
        max_steps=3, max_turn_tokens=8, logging_steps=1, report_to="none", learning_rate=1e-3, use_cpu=True,
        save_strategy="no", disable_tqdm=True, seed=3, format_penalty=-0.1, advantage_estimator="grpo",
    )
    values.update(overrides)
    model = AutoModelForCausalLM.from_pretrained(path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    generator = None
    if half_expert:  # the model on half the prompts, the expert on the rest: returns differ, so the weights move
        from trl_helpers import HalfExpert

        generator = HalfExpert(model, tokenizer)
    trainer = EnvGRPOTrainer(model, EnvGRPOConfig(**values), processing_class=tokenizer, generator=generator)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    changed = any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    return trainer, logs, changed


@pytest.mark.slow
def test_async_training_keeps_its_staleness_bound_and_corrects_for_the_lag(tiny, tmp_path):
    trainer, logs, _ = train(tiny, tmp_path, rollout_mode="async", max_staleness=1)
    assert trainer.state.global_step == 3 and len(logs) == 3
    assert trainer._async is None  # stopped when training ended
    for entry in logs:
        assert entry["rollout/staleness_max"] <= 1 and entry["rollout/staleness/0"] + entry["rollout/staleness/1"] == 1.0
        assert math.isfinite(entry["rollout/importance_weight_mean"]) and entry["rollout/importance_weight_mean"] > 0
        assert entry["rollout/turns_per_s"] > 0 and 0.0 <= entry["rollout/generator_idle_fraction"] <= 1.0
    assert logs[0]["rollout/staleness_max"] == 0  # the first batch plays with the initial weights
    # batch 0 was sampled by the weights it trains: the importance weights are 1 up to numerics
    assert logs[0]["rollout/importance_weight_max"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow
def test_continuous_training_runs_and_reports_where_the_time_went(tiny, tmp_path):
    trainer, logs, changed = train(tiny, tmp_path, half_expert=True, rollout_mode="continuous", max_steps=2)
    assert trainer.state.global_step == 2 and changed
    assert all(entry["rollout/turns_per_s"] > 0 and "rollout/staleness_max" not in entry for entry in logs)
