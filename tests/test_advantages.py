"""GRPO and GiGPO advantages on hand-worked examples."""

import numpy as np
import pytest

from envhub_trl.advantages import discounted_returns, gigpo_advantages, group_normalize, grpo_advantages


def test_grpo_normalises_within_each_group():
    returns = np.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0])
    groups = np.array([0, 0, 0, 0, 1, 1, 2])
    # group 0: mean 0.5, unbiased std sqrt(1/3); group 1 ties; group 2 has one member
    expected = np.array([0.5, -0.5, -0.5, 0.5, 0, 0, 0]) / np.sqrt(1 / 3)
    np.testing.assert_allclose(grpo_advantages(returns, groups), expected, rtol=1e-5)
    np.testing.assert_allclose(grpo_advantages(returns, groups, norm="mean"), [0.5, -0.5, -0.5, 0.5, 0, 0, 0])


def test_group_labels_need_not_be_contiguous_or_sorted():
    a = group_normalize(np.array([3.0, 1.0, 10.0, 20.0]), np.array([7, 7, -2, -2]), norm="mean")
    np.testing.assert_allclose(a, [1, -1, -5, 5])
    with pytest.raises(ValueError, match="norm"):
        group_normalize(np.ones(2), np.zeros(2), norm="std")


def test_discounted_returns_per_trajectory_in_any_order():
    rewards = np.array([0.0, 1.0, 0.0, 0.0, 1.0])
    traj = np.array([0, 0, 1, 1, 1])
    step = np.array([0, 1, 0, 1, 2])
    expected = np.array([0.5, 1.0, 0.25, 0.5, 1.0])
    np.testing.assert_allclose(discounted_returns(rewards, traj, step, 0.5), expected)
    order = np.array([4, 2, 0, 3, 1])
    np.testing.assert_allclose(discounted_returns(rewards[order], traj[order], step[order], 0.5), expected[order])
    np.testing.assert_allclose(discounted_returns(rewards, traj, step, 1.0), [1, 1, 1, 1, 1])


def _batch():
    """Env group 0: traj 0 visits A,B; traj 1 visits A,C,B; traj 3 visits A,B,A.
    Env group 1: traj 2 visits A once (same key as group 0's A, but another group)."""
    steps = [
        # traj, t, state, reward
        (0, 0, "A", 0.0), (0, 1, "B", 1.0),
        (1, 0, "A", 0.0), (1, 1, "C", 0.0), (1, 2, "B", 1.0),
        (2, 0, "A", 0.0),
        (3, 0, "A", 0.0), (3, 1, "B", 0.0), (3, 2, "A", 1.0),
    ]
    traj, t, keys, rewards = map(np.array, zip(*steps))
    return dict(rewards=rewards, traj_index=traj, step_index=t, traj_groups=np.array([0, 0, 1, 0]), state_keys=keys)


def test_gigpo_by_hand_mean_norm():
    out = gigpo_advantages(**_batch(), gamma=0.5, norm="mean")
    # step returns: traj0 [0.5, 1]; traj1 [0.25, 0.5, 1]; traj2 [0]; traj3 [0.25, 0.5, 1]
    np.testing.assert_allclose(out["step_returns"], [0.5, 1, 0.25, 0.5, 1, 0, 0.25, 0.5, 1])
    # anchor (g0, A) = {0.5, 0.25, 0.25, 1} mean 0.5 -> {0, -.25, -.25, .5}
    # anchor (g0, B) = {1, 1, 0.5} mean 5/6; anchor (g0, C) singleton; anchor (g1, A) singleton
    expected_step = [0, 1 / 6, -0.25, 0, 1 / 6, 0, -0.25, 0.5 - 5 / 6, 0.5]
    np.testing.assert_allclose(out["step"], expected_step, atol=1e-12)
    np.testing.assert_array_equal(out["anchor_size"], [4, 3, 4, 1, 3, 1, 4, 3, 4])
    # episode returns: group 0 = {1, 1, 1} -> 0; group 1 = {0} -> 0
    np.testing.assert_allclose(out["episode"], [0, 0, 0, 0])
    np.testing.assert_allclose(out["advantages"], expected_step, atol=1e-12)


def test_gigpo_identical_states_in_two_groups_stay_apart():
    batch = _batch()
    out = gigpo_advantages(**batch, gamma=0.5, norm="mean")
    assert out["anchor_size"][5] == 1 and out["step"][5] == 0.0
    merged = dict(batch, traj_groups=np.array([0, 0, 0, 0]))
    pooled = gigpo_advantages(**merged, gamma=0.5, norm="mean")
    assert pooled["anchor_size"][5] == 5 and pooled["step"][5] != 0.0


def test_gigpo_mean_std_weight_and_episode_level():
    batch = _batch()
    batch["rewards"] = np.array([0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])  # traj 1 fails
    out = gigpo_advantages(**batch, gamma=0.5, norm="mean_std", step_weight=0.5, eps=0.0)
    returns = np.array([1.0, 0.0, 0.0, 1.0])
    group0 = returns[[0, 1, 3]]
    ep = (group0 - group0.mean()) / group0.std(ddof=1)
    np.testing.assert_allclose(out["episode"][[0, 1, 3]], ep)
    assert out["episode"][2] == 0.0
    a_vals = out["step_returns"][[0, 2, 6, 8]]  # anchor (g0, A): traj0 t0, traj1 t0, traj3 t0 and t2
    a_norm = (a_vals - a_vals.mean()) / a_vals.std(ddof=1)
    np.testing.assert_allclose(out["step"][[0, 2, 6, 8]], a_norm)
    expected = out["episode"][batch["traj_index"]] + 0.5 * out["step"]
    np.testing.assert_allclose(out["advantages"], expected)
    assert out["advantages"][1] > 0 > out["advantages"][4]  # the success step beats the failed one


def test_tied_groups_get_zero_even_without_eps():
    np.testing.assert_array_equal(group_normalize(np.array([2.0, 2.0, 1.0]), np.array([0, 0, 1]), eps=0.0), [0, 0, 0])


def test_gigpo_with_no_repeated_states_reduces_to_grpo():
    traj = np.array([0, 0, 1, 1])
    out = gigpo_advantages(np.array([0.0, 1.0, 0.0, 0.0]), traj, np.array([0, 1, 0, 1]), np.array([0, 0]),
                           np.array(["a", "b", "c", "d"]))
    np.testing.assert_allclose(out["advantages"], grpo_advantages(np.array([1.0, 0.0]), np.array([0, 0]))[traj])


def test_gigpo_scales_to_a_16k_step_batch_without_python_loops():
    rng = np.random.default_rng(0)
    n_traj, length = 1024, 16
    traj = np.repeat(np.arange(n_traj), length)
    out = gigpo_advantages(rng.random(n_traj * length), traj, np.tile(np.arange(length), n_traj),
                           np.arange(n_traj) // 8, rng.integers(0, 20, n_traj * length).astype(str))
    assert out["advantages"].shape == (n_traj * length,) and np.isfinite(out["advantages"]).all()


def test_select_groups_drops_tied_groups_and_keeps_the_top_fraction_by_std():
    from envhub_trl.advantages import select_groups

    returns = np.array([1.0, 0.0, 0.5, 0.5, 3.0, 0.0, 0.2, 0.1])
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 3])  # stds 0.5, 0, 1.5, 0.05
    np.testing.assert_array_equal(select_groups(returns, groups), [True] * 8)
    np.testing.assert_array_equal(select_groups(returns, groups, drop_tied=True), [1, 1, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(select_groups(returns, groups, keep_fraction=0.5), [1, 1, 0, 0, 1, 1, 0, 0])
    # ceil(0.3 * 4) = 2 groups; after dropping ties the quota still counts every group
    np.testing.assert_array_equal(select_groups(returns, groups, drop_tied=True, keep_fraction=0.3), [1, 1, 0, 0, 1, 1, 0, 0])
    with pytest.raises(ValueError, match="keep_fraction"):
        select_groups(returns, groups, keep_fraction=1.5)


def test_select_groups_keeps_the_top_share_of_return_variance():
    from envhub_trl.advantages import select_groups

    returns = np.array([1.0, 0.0, 0.5, 0.5, 3.0, 0.0, 0.2, 0.1])
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 3])  # variances 0.25, 0, 2.25, 0.0025: 2.5025 in all
    # group 2 alone (2.25) holds half of the sum (1.25)
    np.testing.assert_array_equal(select_groups(returns, groups, variance_share=0.5), [0, 0, 0, 0, 1, 1, 0, 0])
    # 2.25 < 0.9 * 2.5025 = 2.252, so group 0 is taken too, and then the share is held
    np.testing.assert_array_equal(select_groups(returns, groups, variance_share=0.9), [1, 1, 0, 0, 1, 1, 0, 0])
    # just under 1: every group with variance, never the tied one
    np.testing.assert_array_equal(select_groups(returns, groups, variance_share=0.9999), [1, 1, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(select_groups(returns, groups, variance_share=1.0), [True] * 8)
    # beside the std quota: each filter drops what it drops
    np.testing.assert_array_equal(
        select_groups(returns, groups, keep_fraction=0.25, variance_share=0.9), [0, 0, 0, 0, 1, 1, 0, 0]
    )
    # a batch with no variance keeps every group (nothing to rank), as VAGEN's filter does
    np.testing.assert_array_equal(select_groups(np.ones(4), np.array([0, 0, 1, 1]), variance_share=0.5), [True] * 4)
    with pytest.raises(ValueError, match="variance_share"):
        select_groups(returns, groups, variance_share=0.0)


def test_gigpo_anchor_groups_span_members_and_turns_of_one_group():
    # one group of two members; member 0 returns to state A on its 3rd turn, member 1 starts in A
    out = gigpo_advantages(
        np.array([0.0, 0.0, 1.0, 0.0]), np.array([0, 0, 0, 1]), np.array([0, 1, 2, 0]), np.array([5, 5]),
        np.array(["A", "B", "A", "A"], dtype=object), gamma=1.0, norm="mean",
    )
    # anchor A: step returns {1, 1, 0} (member 0 turns 0 and 2, member 1 turn 0), mean 2/3; B alone
    np.testing.assert_allclose(out["step"], [1 / 3, 0, 1 / 3, -2 / 3])
    np.testing.assert_array_equal(out["anchor_size"], [3, 1, 3, 3])
    np.testing.assert_allclose(out["episode"], [0.5, -0.5])


def test_relative_norm_divides_by_the_groups_mean_floored():
    # Group 0: success rate 1/4: the success gets (1 - 1/4) / (1/4) = 3, each failure -1; the
    # same ranks and spacing as mean_std, another scale. Group 1 never succeeds (mean 0): /floor.
    # Group 2 all succeed: tied, 0.
    values = np.array([1.0, 0.0, 0.0, 0.0, 0.0, -0.1, 1.0, 1.0])
    groups = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    out = group_normalize(values, groups, norm="relative", floor=0.1)
    np.testing.assert_allclose(out, [3.0, -1.0, -1.0, -1.0, 0.5, -0.5, 0.0, 0.0])
    std = group_normalize(values[:4], groups[:4])
    np.testing.assert_allclose(out[:4] / out[0], std / std[0])


def test_relative_norm_makes_the_expected_policy_gradient_that_of_log_success():
    """A bandit with success iff the action is ``a*``: sum_a pi(a) A(a) grad log pi(a) is grad log pi(a*)
    with (r - p) / p (p = pi(a*)), and p / sqrt(p (1 - p)) times it with mean_std."""
    pi = np.array([0.7, 0.2, 0.1])  # a* = 2, a rare right move
    logits_grad = np.eye(3) - pi  # d log pi(a) / d logits, row a
    p = pi[2]
    for norm, factor in (("relative", 1.0), ("mean_std", p / np.sqrt(p * (1 - p)))):
        # The population normalisation of a large group sampled from pi.
        rewards = np.array([0.0, 0.0, 1.0])
        mean = p
        advantage = (rewards - mean) / (mean if norm == "relative" else np.sqrt(p * (1 - p)))
        expected = (pi[:, None] * advantage[:, None] * logits_grad).sum(axis=0)
        np.testing.assert_allclose(expected, factor * logits_grad[2], atol=1e-12)


def test_gigpo_anchor_groups_override_the_env_groups():
    # Two env groups visit state "v" (as a memoryless policy's input, equal across maps): with
    # one anchor set over the batch they anchor together.
    rewards = np.array([1.0, 0.0, 0.0, 0.0])
    traj, step = np.array([0, 1, 2, 3]), np.zeros(4, dtype=int)
    groups = np.array([0, 0, 1, 1])
    keys = np.array(["v", "v", "v", "v"], dtype=object)
    apart = gigpo_advantages(rewards, traj, step, groups, keys, norm="mean")
    together = gigpo_advantages(rewards, traj, step, groups, keys, norm="mean", anchor_groups=np.zeros(4, dtype=int))
    np.testing.assert_allclose(apart["step"], [0.5, -0.5, 0.0, 0.0])
    np.testing.assert_allclose(together["step"], [0.75, -0.25, -0.25, -0.25])
    assert list(together["anchor_size"]) == [4, 4, 4, 4]
