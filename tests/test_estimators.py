"""The advantage estimators of envhub_trl.estimators on hand-worked batches, and their registry."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("trl")

from envhub_trl.config import EnvGRPOConfig  # noqa: E402
from envhub_trl.estimators import ESTIMATORS, EstimatorSettings, TurnBatch, estimate, register, turn_advantages  # noqa: E402


def batch(rewards, traj_index, step_index, groups, keys=None) -> TurnBatch:
    n = len(rewards)
    return TurnBatch(
        rewards=np.asarray(rewards, dtype=float),
        traj_index=np.asarray(traj_index),
        step_index=np.asarray(step_index),
        state_keys=np.asarray(keys if keys is not None else [str(i) for i in range(n)], dtype=object),
        traj_groups=np.asarray(groups),
        env_ids=np.array(["lake"] * len(groups), dtype=object),
    )


# Episodes 0, 1, 2 in group 0 (returns 1, 0, 0.5); episode 3 alone in group 1 (return 2).
THREE_AND_ONE = batch([0.0, 1.0, 0.0, 0.5, 2.0], [0, 0, 1, 2, 3], [0, 1, 0, 0, 0], [0, 0, 0, 1])


def test_rloo_subtracts_the_mean_of_the_other_members():
    out = estimate("rloo", THREE_AND_ONE)["advantages"]
    # Episode 0: 1 - (0 + 0.5) / 2 = 0.75 on both its turns; episode 1: 0 - 0.75; episode 2: 0.5 - 0.5.
    np.testing.assert_allclose(out, [0.75, 0.75, -0.75, 0.0, 0.0])


def test_step_reinforce_normalises_discounted_returns_over_the_batch():
    out = estimate("step_reinforce", THREE_AND_ONE, EstimatorSettings(step_reward_gamma=0.5))["advantages"]
    returns = np.array([0.5, 1.0, 0.0, 0.5, 2.0])  # turn 0 of episode 0: 0 + 0.5 * 1
    np.testing.assert_allclose(out, (returns - returns.mean()) / (returns.std(ddof=1) + 1e-6))
    centred = estimate("step_reinforce", THREE_AND_ONE, EstimatorSettings(step_reward_gamma=0.5, norm="mean"))["advantages"]
    np.testing.assert_allclose(centred, returns - returns.mean())


def test_grpo_gives_every_turn_its_episodes_group_normalised_return():
    out = estimate("grpo", THREE_AND_ONE, EstimatorSettings(norm="mean"))["advantages"]
    np.testing.assert_allclose(out, [0.5, 0.5, -0.5, 0.0, 0.0])


def test_gigpo_weights_its_two_levels_with_rolls_names():
    # Two members of one group; both start in state "s" and move apart.
    two = batch([0.0, 1.0, 0.0, 0.0], [0, 0, 1, 1], [0, 1, 0, 1], [0, 0], keys=["s", "a", "s", "b"])
    settings = EstimatorSettings(episode_reward_weight=2.0, step_reward_weight=0.5, step_reward_gamma=1.0, norm="mean")
    out = estimate("gigpo", two, settings)
    # Episode level: +-0.5. Step level: state "s" holds returns 1 and 0 (+-0.5); "a" and "b" are met once (0).
    np.testing.assert_allclose(out["advantages"], [2 * 0.5 + 0.5 * 0.5, 2 * 0.5, -2 * 0.5 - 0.5 * 0.5, -2 * 0.5])
    np.testing.assert_array_equal(out["anchor_size"], [2, 1, 2, 1])


def test_a_registered_estimator_is_usable_by_name_and_names_are_unique():
    @register("test_constant")
    def constant(batch, settings):
        return {"advantages": np.ones_like(batch.rewards)}

    try:
        np.testing.assert_allclose(estimate("test_constant", THREE_AND_ONE)["advantages"], np.ones(5))
        assert EnvGRPOConfig(output_dir="x", advantage_estimator="test_constant", use_cpu=True).advantage_estimator == "test_constant"
        with pytest.raises(ValueError, match="already registered"):
            register("test_constant")(constant)
    finally:
        del ESTIMATORS["test_constant"]

    @register("test_wrong_shape")
    def wrong(batch, settings):
        return {"advantages": np.ones(1)}

    try:
        with pytest.raises(ValueError, match="returned"):
            estimate("test_wrong_shape", THREE_AND_ONE)
    finally:
        del ESTIMATORS["test_wrong_shape"]
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        estimate("nope", THREE_AND_ONE)


def test_config_takes_rolls_names_and_the_old_ones_as_aliases():
    config = EnvGRPOConfig(output_dir="x", use_cpu=True, step_advantage_weight=0.3, step_gamma=0.8)
    assert (config.step_reward_weight, config.step_reward_gamma) == (0.3, 0.8)
    settings = EnvGRPOConfig(output_dir="x", use_cpu=True, step_reward_weight=0.3, episode_reward_weight=0.5).estimator_settings()
    assert settings == EstimatorSettings(episode_reward_weight=0.5, step_reward_weight=0.3, step_reward_gamma=0.95, norm="mean_std")
    with pytest.raises(ValueError, match="alias of step_reward_gamma"):
        EnvGRPOConfig(output_dir="x", use_cpu=True, step_gamma=0.8, step_reward_gamma=0.7)
    with pytest.raises(ValueError, match="advantage_estimator must be one of"):
        EnvGRPOConfig(output_dir="x", use_cpu=True, advantage_estimator="a2c")


def test_reinforce_plus_plus_folds_a_token_kl_penalty_into_returns_whitened_over_the_batch():
    # Episode 0: turn 0 (2 tokens, reward 0), turn 1 (1 token, reward 1); episode 1: one turn of
    # 2 tokens, reward 0.5. log pi - log pi_ref per token: 0.1, 0.2 | 0.0 | 0.3, -0.1.
    turns = batch([0.0, 1.0, 0.5], [0, 0, 1], [0, 1, 0], [0, 1])
    logps = np.array([-1.0, -2.0, -0.5, -1.0, -3.0])
    tokens = turns.with_scores([0, 0, 1, 2, 2], logps=logps, ref_logps=logps - [0.1, 0.2, 0.0, 0.3, -0.1])
    out = estimate("reinforce++", tokens, EstimatorSettings(kl_coef=0.5))
    # Token rewards -0.5 * KL, each turn's reward on its last token: -0.05, -0.1 | 1.0 | -0.15, 0.55;
    # undiscounted rewards-to-go within each episode: 0.85, 0.9, 1.0 | 0.4, 0.55.
    returns = np.array([0.85, 0.9, 1.0, 0.4, 0.55])
    np.testing.assert_allclose(out["token_advantages"], (returns - returns.mean()) / (returns.std() + 1e-8))
    np.testing.assert_allclose(out["kl"], [0.1, 0.2, 0.0, 0.3, -0.1], atol=1e-12)
    assert "advantages" not in out


def test_positive_advantage_weight_scales_what_won_and_keeps_what_lost_per_turn_and_per_token():
    weighted = EstimatorSettings(positive_weight=0.1)
    # rloo on THREE_AND_ONE: 0.75, 0.75 | -0.75 | 0.0 | 0.0 (above); episode 2 dropped by the filter.
    keep = np.array([True, True, False, True])
    out = turn_advantages(THREE_AND_ONE, "rloo", weighted, keep=keep)
    np.testing.assert_allclose(out["advantages"], [0.075, 0.075, -0.75, 0.0, 0.0])
    np.testing.assert_array_equal(out["keep"], keep)
    # Weight 0 keeps the failures alone (NSR); weight 1 is the estimator's own output, bit for bit.
    np.testing.assert_allclose(turn_advantages(THREE_AND_ONE, "rloo", EstimatorSettings(positive_weight=0.0))["advantages"], [0, 0, -0.75, 0, 0])
    np.testing.assert_array_equal(turn_advantages(THREE_AND_ONE, "grpo")["advantages"], estimate("grpo", THREE_AND_ONE)["advantages"])
    # Per model token (reinforce++): each token's sign decides its weight.
    turns = batch([0.0, 1.0, 0.5], [0, 0, 1], [0, 1, 0], [0, 1])
    logps = np.array([-1.0, -2.0, -0.5, -1.0, -3.0])
    tokens = turns.with_scores([0, 0, 1, 2, 2], logps=logps, ref_logps=logps)
    plain = estimate("reinforce++", tokens)["token_advantages"]
    assert (plain > 0).any() and (plain < 0).any()
    np.testing.assert_allclose(turn_advantages(tokens, "reinforce++", weighted)["token_advantages"], np.where(plain > 0, 0.1 * plain, plain))
    config = EnvGRPOConfig(output_dir="/tmp/x", report_to="none", positive_advantage_weight=0.1)
    assert config.estimator_settings().positive_weight == 0.1


def test_an_estimator_that_needs_log_probs_refuses_a_batch_without_them():
    with pytest.raises(ValueError, match="needs the batch's logps, ref_logps"):
        estimate("reinforce++", THREE_AND_ONE)
    with pytest.raises(ValueError, match="unknown batch fields"):
        register("needs_q", needs=("q_values",))


def test_gae_matches_a_loop_by_loop_reference():
    rng = np.random.default_rng(0)
    lengths = [3, 1, 4]
    traj_index = np.repeat(np.arange(3), lengths)
    step_index = np.concatenate([np.arange(n) for n in lengths])
    rewards, values = rng.normal(size=8), rng.normal(size=8)
    from envhub_trl.estimators import gae

    got = gae(rewards, values, traj_index, step_index, gamma=0.9, lam=0.8)
    want, start = [], 0
    for n in lengths:
        r, v = rewards[start : start + n], values[start : start + n]
        advantage, out = 0.0, [0.0] * n
        for k in reversed(range(n)):
            next_value = v[k + 1] if k + 1 < n else 0.0
            advantage = r[k] + 0.9 * next_value - v[k] + 0.9 * 0.8 * advantage
            out[k] = advantage
        want += out
        start += n
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_ppo_whitens_gae_advantages_and_targets_the_critic_at_advantage_plus_value():
    turns = batch([0.0, 1.0, 0.5], [0, 0, 1], [0, 1, 0], [0, 1])
    out = estimate("ppo", turns.with_scores([], values=np.array([0.2, 0.6, 0.1])), EstimatorSettings(gamma=1.0, lam=1.0))
    # lam = gamma = 1: A = return-to-go - V = (1 - 0.2, 1 - 0.6, 0.5 - 0.1).
    raw = np.array([0.8, 0.4, 0.4])
    np.testing.assert_allclose(out["returns"], [1.0, 1.0, 0.5])
    np.testing.assert_allclose(out["advantages"], (raw - raw.mean()) / (raw.std() + 1e-8))


def test_gigpo_context_anchors_pool_the_same_policy_input_across_env_groups():
    # Episodes 0, 1 in group 0 and 2, 3 in group 1; every first turn was made from input "o".
    base = batch([1.0, 0.0, 0.0, 0.0], [0, 1, 2, 3], [0, 0, 0, 0], [0, 0, 1, 1], keys=["s0", "s0", "t0", "t0"])
    with_context = dataclasses.replace(base, context_keys=np.array(["o"] * 4, dtype=object))
    settings = EstimatorSettings(episode_reward_weight=0.0, norm="mean")
    state = estimate("gigpo", with_context, settings)
    context = estimate("gigpo", with_context, dataclasses.replace(settings, step_anchor="context"))
    np.testing.assert_allclose(state["advantages"], [0.5, -0.5, 0.0, 0.0])
    np.testing.assert_allclose(context["advantages"], [0.75, -0.25, -0.25, -0.25])
    with pytest.raises(ValueError, match="context_keys"):
        estimate("gigpo", base, dataclasses.replace(settings, step_anchor="context"))
    with pytest.raises(ValueError, match="step_anchor"):
        EnvGRPOConfig(output_dir="/tmp/x", step_anchor="view")


def test_a_turn_batch_keys_each_turn_by_what_the_policy_was_shown():
    from envhub.trajectory import Trajectory, Turn, context_keys

    def turn(k, user, ids=()):
        return Turn(index=k, user=user, observation=user, reply="r", action="a", reward=0.0, env_reward=0.0, action_is_valid=True,
                    format_valid=True, state_key=f"s{k}", next_state_key="", input_ids=ids)

    # Step layout: the windowed prompt's ids, so equal prompts in two episodes share a key.
    one = Trajectory(env_id="e", group_id=0, member=0, seed=0, index=0, layout="step", turns=[turn(0, "x", (1, 2)), turn(1, "y", (1, 3))])
    two = Trajectory(env_id="e", group_id=1, member=0, seed=1, index=1, layout="step", turns=[turn(0, "z", (1, 3))])
    assert context_keys(one)[1] == context_keys(two)[0] != context_keys(one)[0]
    # Trajectory layout: the whole conversation so far, so the same message after another history differs.
    three = Trajectory(env_id="e", group_id=0, member=0, seed=0, index=0, turns=[turn(0, "x"), turn(1, "y")])
    four = Trajectory(env_id="e", group_id=0, member=1, seed=0, index=1, turns=[turn(0, "w"), turn(1, "y")])
    assert context_keys(three)[1] != context_keys(four)[1] and context_keys(three)[0] != context_keys(four)[0]
    assert list(TurnBatch.from_trajectories([one, two]).context_keys) == context_keys(one) + context_keys(two)
