"""The learning-signal diagnostics (envhub_trl.diagnostics) on batches built by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("torch")

from envhub.trajectory import Trajectory, Turn  # noqa: E402
from envhub_trl.diagnostics import entropy, learning_signal  # noqa: E402


def episode(group, moves, *, success=False, member=0):
    """An episode of ``moves``: (observation, action, state_key) triples; reward 1 on the last turn if ``success``."""
    turns = [
        Turn(
            index=k, user=obs, observation=obs, reply=f"<answer>{act}</answer>", action=act,
            reward=float(success and k == len(moves) - 1), env_reward=0.0, action_is_valid=act is not None,
            format_valid=act is not None, state_key=key, next_state_key="", finish_reason="stop",
        )
        for k, (obs, act, key) in enumerate(moves)
    ]
    return Trajectory(env_id="t/T-v0", group_id=group, member=member, seed=group, index=0, turns=turns, success=success)


def test_entropy_plug_in_and_miller_madow():
    assert entropy([5]) == 0.0 and entropy([]) == 0.0
    assert entropy([1, 1, 1, 1]) == pytest.approx(math.log(4))
    assert entropy([2, 2], corrected=True) == pytest.approx(math.log(2) + 1 / 8)


def test_a_policy_that_reads_its_observation_has_information_one_that_ignores_it_none():
    # Reads: in view "A" it always goes Right, in "B" always Down; as often as each other.
    reads = [episode(0, [("A", "Right", "s0"), ("B", "Down", "s1")], member=m) for m in range(40)]
    out = learning_signal(reads)
    assert out["diag/action_entropy_given_observation"] == pytest.approx(0.0)
    assert out["diag/observation_action_information"] == pytest.approx(out["diag/action_entropy"]) and out["diag/action_entropy"] > 0.6
    # Ignores: the same two moves, half and half in each view.
    ignores = [episode(0, [("A", "Right" if m % 2 else "Down", "s0"), ("B", "Down" if m % 2 else "Right", "s1")], member=m) for m in range(40)]
    assert learning_signal(ignores)["diag/observation_action_information"] == pytest.approx(0.0, abs=1e-9)


def test_first_moves_and_anchor_spread():
    # Group 0: one success, so not tied; its members' first moves differ (two of each).
    group0 = [
        episode(0, [("o", "Right", "start"), ("p", "Down", "mid")], success=True),
        episode(0, [("o", "Right", "start"), ("p", "Left", "mid")], member=1),
        episode(0, [("o", "Down", "start")], member=2),
        episode(0, [("o", "Down", "start")], member=3),
    ]
    # Group 1: every member fails with the same move: tied, first-move entropy 0, anchor tied.
    group1 = [episode(1, [("o", "Up", "start")], member=m) for m in range(4)]
    out = learning_signal(group0 + group1, advantages=np.array([1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]), gamma=0.5)
    assert out["diag/first_move_entropy"] == pytest.approx((math.log(2) + 0.0) / 2)
    # Every turn's anchor repeats: (0, start) x4, (0, mid) x2, (1, start) x4.
    assert out["diag/repeated_anchor_rate"] == 1.0
    # Returns from (0, start): 0.5, 0, 0, 0 (gamma 0.5); from (0, mid): 1, 0; group 1's all 0.
    start_std, mid_std = np.std([0.5, 0, 0, 0]), np.std([1.0, 0.0])
    assert out["diag/anchor_return_std"] == pytest.approx((4 * start_std + 2 * mid_std) / 10)
    assert out["diag/informative_anchor_rate"] == pytest.approx(6 / 10)
    assert out["diag/advantage_abs_mean"] == pytest.approx(0.4)
    assert out["diag/reply_cut_rate"] == 0.0


def test_invalid_replies_count_as_one_action_of_their_own():
    batch = [episode(0, [("o", None, "s")], member=m) for m in range(3)] + [episode(0, [("o", "Left", "s")], member=3)]
    out = learning_signal(batch)
    assert out["diag/first_move_entropy"] == pytest.approx(entropy([3, 1]))


def test_observations_seen_less_than_four_times_do_not_count_towards_the_information():
    # A blind policy over many rarely seen observations: each seen once has conditional entropy 0,
    # which would read as information; they are left out.
    rng = np.random.default_rng(0)
    moves = ["Left", "Down", "Right", "Up"]
    rare = [episode(0, [(f"o{k}", moves[rng.integers(4)], f"s{k}")], member=k) for k in range(300)]
    assert learning_signal(rare)["diag/observation_action_information"] == 0.0
    common = [episode(0, [(f"o{k % 10}", moves[rng.integers(4)], "s")], member=k) for k in range(400)]
    assert learning_signal(common)["diag/observation_action_information"] < 0.05
