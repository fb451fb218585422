"""TRL's own GRPOConfig fields on EnvGRPOTrainer: each one that touches sampling, scoring or
advantages is honoured (it reaches TRL's loss with envhub's per-token advantages) or refused with
a one-line error naming what envhub does instead (envhub_trl.inherited)."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from envhub_trl.config import EnvGRPOConfig  # noqa: E402
from envhub_trl.estimators import TurnBatch, estimate  # noqa: E402
from envhub_trl.inherited import HONOURED, REFUSED  # noqa: E402
from trl_helpers import HalfExpert, lake_config, save_tiny_lake_model  # noqa: E402

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


def _config(tmp_path, **overrides) -> EnvGRPOConfig:
    return lake_config(tmp_path, **{"max_steps": 1, **overrides})


#: A value other than TRL's default for every refused field.
SET_REFUSED = {
    "reward_weights": [1.0],
    "multi_objective_aggregation": "normalize_then_sum",
    "mask_truncated_completions": True,
    "use_liger_kernel": True,
    "min_p": 0.1,
    "repetition_penalty": 1.2,
    "generation_kwargs": {"min_new_tokens": 2},
}


def test_every_refused_field_has_a_case():
    assert set(SET_REFUSED) == set(REFUSED)


@pytest.mark.parametrize("name", sorted(SET_REFUSED))
def test_a_field_envhub_would_ignore_is_refused_naming_what_it_does_instead(tmp_path, name):
    instead = REFUSED[name][1]
    with pytest.raises(ValueError, match=rf"^{name}=.* is TRL's and would be ignored here: ") as caught:
        _config(tmp_path, **{name: SET_REFUSED[name]})
    assert str(caught.value).endswith(instead) and "\n" not in str(caught.value)


def test_scale_rewards_batch_is_refused_naming_envhubs_normalisation(tmp_path):
    with pytest.raises(ValueError, match="scale_rewards='batch'.*advantage_norm.*advantage_norm_scope"):
        _config(tmp_path, scale_rewards="batch")


@pytest.mark.parametrize("estimator", ["rloo", "reinforce++", "ppo"])
def test_scale_rewards_none_is_refused_where_the_estimator_scales_on_its_own(tmp_path, estimator):
    with pytest.raises(ValueError, match=re.escape(f"scale_rewards='none' does not apply to advantage_estimator='{estimator}'")):
        _config(tmp_path, advantage_estimator=estimator, scale_rewards="none")


@pytest.mark.parametrize("value", ["none", False])
def test_scale_rewards_none_is_advantage_norm_mean(tmp_path, value):
    config = _config(tmp_path, advantage_estimator="grpo", scale_rewards=value)
    assert config.advantage_norm == "mean" and config.scale_rewards == "none"
    batch = TurnBatch(
        rewards=np.array([1.0, 0.0, 0.0, 3.0, 1.0, 1.0]), traj_index=np.arange(6), step_index=np.zeros(6, dtype=np.int64),
        state_keys=np.array(["s"] * 6, dtype=object), traj_groups=np.array([0, 0, 0, 1, 1, 1]), env_ids=np.array([LAKE] * 6, dtype=object),
    )
    advantages = estimate("grpo", batch, config.estimator_settings())["advantages"]
    # TRL's scale_rewards='none': the return less its group's mean, not divided by a std
    assert advantages.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 4 / 3, -2 / 3, -2 / 3])


def test_advantage_norm_mean_keeps_trls_scale_rewards_in_step(tmp_path):
    assert _config(tmp_path, advantage_norm="mean").scale_rewards == "none"
    assert _config(tmp_path).scale_rewards == "group" and _config(tmp_path).advantage_norm == "mean_std"


# -------------------------------------------------------------------- honoured fields reach the loss


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_lake_model(tmp_path_factory.mktemp("tiny") / "model")


def _trainer(tiny, tmp_path, **overrides):
    from transformers import AutoModelForCausalLM

    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = tiny
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path).train()
    return EnvGRPOTrainer(model, _config(tmp_path, **overrides), processing_class=tokenizer, generator=HalfExpert(model, tokenizer))


@pytest.fixture(scope="module")
def batch(tiny, tmp_path_factory):
    """One generation batch with envhub's per-token advantages, made off-policy by hand (old and
    reference log-probs away from the current ones) so that clipping and KL terms bite."""
    trainer = _trainer(tiny, tmp_path_factory.mktemp("batch"), advantage_estimator="gigpo", max_turns=7, format_penalty=-0.1)
    inputs = next(iter(trainer.get_train_dataloader()))
    output = trainer._generate_and_score_completions(inputs)
    generator = torch.Generator().manual_seed(0)
    shape = output["completion_ids"].shape
    with torch.no_grad():
        current = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([output["prompt_ids"], output["completion_ids"]], 1),
            torch.cat([output["prompt_mask"], output["completion_mask"]], 1), shape[1],
        )[0]
    output["old_per_token_logps"] = current + 0.4 * torch.randn(shape, generator=generator)
    output["ref_per_token_logps"] = current + 0.4 * torch.randn(shape, generator=generator)
    output["num_items_in_batch"] = (output["completion_mask"] * output["tool_mask"]).sum()
    assert output["advantages"].dim() == 2 and output["advantages"].abs().max() > 0
    return output


def _loss(trainer, batch) -> float:
    trainer.current_gradient_accumulation_steps = 1  # set by train() around each optimizer step
    return float(trainer.compute_loss(trainer.model, dict(batch)).detach())


#: A setting other than TRL's default for every honoured field of the loss.
SET_IN_LOSS = {
    "beta": {"beta": 0.5},
    "epsilon": {"epsilon": 0.05},
    "epsilon_high": {"epsilon_high": 0.05},
    "delta": {"delta": 1.05},
    "loss_type": {"loss_type": "grpo"},  # TRL's default is dapo
    "importance_sampling_level": {"importance_sampling_level": "sequence"},
    "top_entropy_quantile": {"top_entropy_quantile": 0.2},
    "entropy_coef": {"entropy_coef": 0.5},
    "off_policy_mask_threshold": {"off_policy_mask_threshold": 0.01},
    "use_bias_correction_kl": {"beta": 0.5, "use_bias_correction_kl": False},  # TRL's default is True
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SET_IN_LOSS))
def test_an_honoured_field_changes_trls_loss_over_envhubs_advantages(tiny, tmp_path, batch, name):
    overrides = SET_IN_LOSS[name]
    baseline = {"beta": 0.5} if name == "use_bias_correction_kl" else {}
    assert _loss(_trainer(tiny, tmp_path, **overrides), batch) != pytest.approx(_loss(_trainer(tiny, tmp_path, **baseline), batch), rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "luspo", "sapo", "vespo"])
def test_every_trl_loss_type_takes_per_token_advantages(tiny, tmp_path, batch, loss_type):
    overrides = {"loss_type": loss_type}
    if loss_type == "luspo":
        overrides["importance_sampling_level"] = "sequence"
    loss = _loss(_trainer(tiny, tmp_path, **overrides), batch)
    assert torch.isfinite(torch.tensor(loss))


@pytest.mark.slow
def test_num_iterations_reuses_the_batch_with_envhubs_advantages(tiny, tmp_path):
    """With num_iterations > 1 TRL keeps the batch's old log-probs, for the passes that reuse it."""
    trainer = _trainer(tiny, tmp_path, advantage_estimator="gigpo", num_iterations=2)
    output = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    assert output["old_per_token_logps"] is not None and output["advantages"].dim() == 2


def test_every_honoured_field_has_a_test():
    covered = set(SET_IN_LOSS) | {"num_iterations", "scale_rewards"}
    # sampling fields are covered by the trainer's seeded-sampling tests; sync_ref_model by TRL's callback
    assert set(HONOURED) - covered == {"temperature", "top_p", "top_k", "sync_ref_model"}


@pytest.mark.slow
def test_after_a_warm_start_the_kl_reference_is_the_warm_started_policy(tiny, tmp_path):
    """TRL copies ``ref_model`` from the model when the trainer is built; envhub train's warm start
    changes the weights afterwards, and ``reference_from_policy`` hands them to the reference, so
    that ``beta`` holds RL near the warm start rather than near the initial weights."""
    trainer = _trainer(tiny, tmp_path, beta=0.5)
    with torch.no_grad():
        for parameter in trainer.model.parameters():
            parameter.add_(0.01)  # what a warm start does, in short
    first = next(iter(trainer.model.state_dict()))
    assert not torch.equal(trainer.ref_model.state_dict()[first], trainer.model.state_dict()[first])
    trainer.reference_from_policy()
    policy, reference = trainer.model.state_dict(), trainer.ref_model.state_dict()
    assert all(torch.equal(policy[name], reference[name]) for name in policy)
    assert next(trainer.ref_model.parameters()).data_ptr() != next(trainer.model.parameters()).data_ptr()


def test_trls_none_reward_warning_is_dropped_for_padding_rows_only(caplog):
    """The step layout pads each process's rows with rows whose reward is None on purpose; TRL
    warned about them once per batch. A None reward on a real row still warns."""
    import logging

    from accelerate import PartialState
    from accelerate.logging import get_logger

    import envhub_trl.trl_bridge  # noqa: F401  (installs the filter)

    PartialState()
    logger = get_logger("trl.trainer.grpo_trainer")  # as TRL's module makes it: it prefixes "[RANK 0] "
    message = "All reward functions returned None for the following kwargs:\n{{'trajectory_index': {}, 'turn_index': 0}}\nPlease ensure..."
    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_trainer"):
        logger.warning(message.format(-1))
        logger.warning(message.format(3))
    kept = [r.getMessage() for r in caplog.records if r.name == "trl.trainer.grpo_trainer"]
    assert len(kept) == 1 and kept[0].endswith(message.format(3))


@pytest.mark.slow
def test_beta_works_for_a_model_built_in_memory(tiny, tmp_path):
    """A model built here (``--model tiny``) has no path for TRL to load the reference from; TRL
    failed with a hub error about an empty repo id. The trainer saves it for TRL to load."""
    from transformers import AutoModelForCausalLM

    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = tiny
    model = AutoModelForCausalLM.from_config(AutoModelForCausalLM.from_pretrained(path).config)
    model.config._name_or_path = ""  # as a model built in memory has
    trainer = EnvGRPOTrainer(model, _config(tmp_path, beta=0.5), processing_class=tokenizer, generator=HalfExpert(model, tokenizer))
    policy, reference = trainer.model.state_dict(), trainer.ref_model.state_dict()
    assert all(torch.equal(policy[name], reference[name]) for name in policy)
    assert model.config._name_or_path == str(tmp_path / "reference-initial-weights")
    assert (tmp_path / "reference-initial-weights" / "config.json").is_file()
