"""The trainer's stages (envhub_trl.pipeline) on generation batches built by hand, with no model."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from envhub.trajectory import Trajectory, Turn  # noqa: E402
from envhub_trl import loss_inputs, pipeline  # noqa: E402
from envhub_trl import metrics as step_metrics  # noqa: E402
from envhub_trl.estimators import EstimatorSettings  # noqa: E402
from envhub_trl.pipeline import RolloutError  # noqa: E402


def episode(rewards, *, layout="trajectory", reply=2, between=1, keys=None, seed=0, env_id="test/Env-v0"):
    """An episode with one turn per reward: each reply ``reply`` tokens, ``between`` environment
    tokens before every turn after the first (trajectory layout) or a 3-token prompt per turn (step)."""
    turns = []
    for k, reward in enumerate(rewards):
        prompt = [100 + k] * (3 if layout == "step" or k == 0 else between)
        turns.append(
            Turn(
                index=k, user=f"u{k}", observation=f"o{k}", reply=f"r{k}", action="a", reward=reward, env_reward=reward,
                action_is_valid=True, format_valid=True, state_key=(keys or [f"s{k}"] * len(rewards))[k], next_state_key="",
                input_ids=prompt, completion_ids=[10 + k] * reply, logprobs=[-0.5] * reply,
            )
        )
    return Trajectory(env_id=env_id, group_id=0, member=0, seed=seed, index=0, layout=layout, turns=turns, end_reason="terminated")


def rows_for(local):
    return [{"prompt": f"env seed {t.seed}", "env_seed": t.seed} for t in local]


def test_the_pipeline_module_loads_no_trl_and_no_trainer():
    code = (
        "import sys, envhub_trl.pipeline; "
        "assert not [m for m in sys.modules if m == 'trl' or m.startswith('trl.')], 'trl'; "
        "assert 'transformers.trainer' not in sys.modules, 'transformers.Trainer'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gather_gives_global_indices_and_groups_and_marks_dropped_groups():
    other = [dataclasses.replace(episode([1.0]), index=i, group_id=i // 2) for i in range(2)]  # process 0's, gathered already
    own = [episode([0.0, 1.0]), episode([1.0])]  # process 1's: group 1, whose returns tie
    batch = pipeline.gather(own, group_size=2, process_index=1, collect=lambda mine: other + mine, drop_tied=True)
    assert [t.index for t in batch.local] == [2, 3] and [t.group_id for t in batch.local] == [1, 1]
    assert [t.index for t in batch.episodes] == [0, 1, 2, 3]
    np.testing.assert_array_equal(batch.turns.traj_groups, [0, 0, 1, 1])
    np.testing.assert_array_equal(batch.turns.traj_index, [0, 1, 2, 2, 3])
    np.testing.assert_array_equal(batch.keep, [False, False, False, False])  # every group ties
    assert own[0].index == 0  # the played episodes are left as they were


def test_gather_keeps_the_groups_that_hold_the_top_share_of_return_variance():
    local = [episode([1.0]), episode([0.0]), episode([0.6]), episode([0.4]), episode([1.0]), episode([1.0])]  # variances 0.25, 0.01, 0
    batch = pipeline.gather(local, group_size=2, variance_share=0.9)
    np.testing.assert_array_equal(batch.keep, [True, True, False, False, False, False])
    batch = pipeline.gather(local, group_size=2, variance_share=0.99)
    np.testing.assert_array_equal(batch.keep, [True, True, True, True, False, False])


def won(success, reward=0.0, seed=0):
    return dataclasses.replace(episode([reward], seed=seed), success=success)


def test_refill_tied_puts_the_next_untied_groups_of_later_rounds_in_the_tied_groups_places():
    first = [episode([1.0], seed=1), episode([0.0], seed=1), episode([1.0], seed=2), episode([1.0], seed=2),
             episode([0.0], seed=3), episode([0.0], seed=3)]  # groups of 2: untied, tied, tied
    played = []

    def rounds():
        for n, pair in enumerate([(0.5, 0.7), (0.2, 0.4)], start=1):  # each round: a tied group, then an untied one
            more = [episode([pair[0]], seed=10 * n), episode([pair[0]], seed=10 * n), episode([pair[0]], seed=10 * n + 1),
                    episode([pair[1]], seed=10 * n + 1)]
            played.append(n)
            yield more

    filled, refill = pipeline.refill_tied(first, rounds(), group_size=2, rounds=5)
    assert [t.seed for t in filled] == [1, 1, 11, 11, 21, 21]  # round 1's untied group, then round 2's first untied
    assert refill == pipeline.Refill(rounds=3, tied_first=2, tied_left=0, success_first=0.0)
    assert played == [1, 2]  # no round past the one that untied the last


def test_refill_tied_stops_at_its_rounds_and_leaves_the_groups_still_tied_in_place():
    first = [episode([0.0], seed=1)] * 2 + [episode([1.0], seed=2), episode([0.0], seed=2)]
    always_tied = iter(lambda: [episode([0.0], seed=9)] * 4, None)
    filled, refill = pipeline.refill_tied(first, always_tied, group_size=2, rounds=3)
    assert [t.seed for t in filled] == [1, 1, 2, 2] and (refill.rounds, refill.tied_first, refill.tied_left) == (3, 1, 1)
    assert pipeline.refill_tied(first, iter(()), group_size=2, rounds=1)[1].rounds == 1  # one round: nothing replayed
    with pytest.raises(ValueError, match="whole groups"):
        pipeline.refill_tied(first[:3], iter(()), group_size=2, rounds=2)


def test_a_group_that_differs_by_format_penalties_alone_is_tied_by_success():
    penalties = [won(False, -0.1), won(False, -0.3)]  # both lost; one paid more format penalty
    assert not pipeline.group_is_tied(penalties, "return") and pipeline.group_is_tied(penalties, "success")
    assert not pipeline.group_is_tied([won(True, 1.0), won(False, 0.0)], "success")
    local = penalties + [won(True, 1.0), won(False, -0.1)]
    np.testing.assert_array_equal(pipeline.gather(local, group_size=2, drop_tied=True).keep, [True, True, True, True])
    np.testing.assert_array_equal(pipeline.gather(local, group_size=2, drop_tied=True, tied_by="success").keep, [False, False, True, True])
    with pytest.raises(ValueError, match="tied_by must be one of"):
        pipeline.gather(local, group_size=2, drop_tied=True, tied_by="score")
    filled, refill = pipeline.refill_tied(local, iter([[won(True, 1.0, seed=5), won(False, 0.0, seed=5)]]), group_size=2, rounds=2, tied_by="success")
    assert [t.seed for t in filled[:2]] == [5, 5] and refill.success_first == 0.25


def level(success, seed, env_id="test/Env-v0", reward=None):
    return dataclasses.replace(episode([float(success) if reward is None else reward], seed=seed, env_id=env_id), success=success)


def test_retry_unsolved_shares_a_batch_of_plays_over_the_unsolved_levels_and_puts_their_wins_in_failed_places():
    # Groups of 4 on levels 1 (solved once), 2 and 3 (never solved).
    first = [level(s, 1) for s in (True, False, False, False)] + [level(False, 2)] * 4 + [level(False, 3)] * 4
    first = [dataclasses.replace(t, member=i % 4, index=i, group_id=i // 4) for i, t in enumerate(first)]
    asked = []

    def play_round(slots):
        asked.append(slots)
        # The slots play the unsolved levels in turn: level 2 wins three plays of its 8 (all in its first slot).
        wins = [True, False, True, True] if len(asked) == 1 else [False] * 4
        return [level(w and k == 0, [1, 2, 3][g]) for k, g in enumerate(slots) for w in wins]

    filled, retry = pipeline.retry_unsolved(first, play_round, group_size=4, rounds=2)
    assert asked == [[1, 2, 1], [2, 2, 2]]  # round 1: levels 2, 3, 2 in the three slots; round 2: level 3 alone
    assert [t.success for t in filled[4:8]] == [True, True, False, False]  # two wins, up to half the group
    assert [(t.member, t.index, t.group_id) for t in filled[4:8]] == [(0, 4, 1), (1, 5, 1), (2, 6, 1), (3, 7, 1)]
    assert filled[:4] == first[:4] and [t.success for t in filled[8:]] == [False] * 4  # a solved group is left as it was
    assert retry == pipeline.Retry(rounds=2, unsolved_first=2, solved_later=1, episodes=24, wins_kept=2)
    assert len(filled) == len(first) and all(t.seed == first[i].seed for i, t in enumerate(filled))


def test_retry_unsolved_stops_once_every_group_is_solved_and_keeps_a_mixs_envs_in_their_slots():
    first = [level(True, 1, "a/A-v0"), level(False, 1, "a/A-v0"), level(False, 2, "b/B-v0"), level(False, 2, "b/B-v0")]
    asked = []

    def play_round(slots):
        asked.append(slots)
        return [level(g == 1, [1, 2][g], ["a/A-v0", "b/B-v0"][s]) for s, g in enumerate(slots) for _ in range(2)]

    filled, retry = pipeline.retry_unsolved(first, play_round, group_size=2, rounds=5)
    assert asked == [[0, 1]]  # env a has no unsolved group: its slot plays its own (solved) group, which is not used
    assert [t.success for t in filled] == [True, False, True, False] and retry.rounds == 1 and retry.solved_later == 1
    assert pipeline.retry_unsolved(first[:2], play_round, group_size=2, rounds=5)[1].rounds == 0  # nothing unsolved
    with pytest.raises(ValueError, match="whole groups"):
        pipeline.retry_unsolved(first[:3], play_round, group_size=2, rounds=1)


def test_play_then_gather_on_a_real_manager_without_a_model():
    from envhub.generation import ExpertGenerator, SamplingParams
    from envhub.manager import EnvGroupManager

    manager = EnvGroupManager("frozenlake/FrozenLakeNotSlippery-v0", 2, 2, max_turns=8)
    local, stats = pipeline.play(manager, ExpertGenerator(), SamplingParams(), seeds=[5, 6])
    assert [t.seed for t in local] == [5, 5, 6, 6] and stats.metrics()["rollout/turns_per_s"] > 0
    batch = pipeline.gather(local, group_size=2, drop_tied=True)
    assert all(t.success for t in batch.episodes)
    np.testing.assert_array_equal(batch.turns.traj_groups, [0, 0, 1, 1])
    assert not batch.keep.any()  # the expert succeeds in every member: every group ties


def test_gather_refuses_an_episode_without_a_turn():
    empty = Trajectory(env_id="test/Env-v0", group_id=0, member=0, seed=7, index=0, end_reason="context")
    with pytest.raises(RolloutError, match="seed 7.*max_prompt_tokens"):
        pipeline.gather([episode([1.0]), empty], group_size=2)


def failed(seed=0, error="ConnectionError: cannot reset: the env's server is down at env.py:12", rewards=()):
    """An episode whose env raised: at reset (no turn), or after ``rewards``' turns."""
    played = episode(list(rewards), seed=seed) if rewards else None
    return Trajectory(
        env_id="test/Env-v0", group_id=0, member=0, seed=seed, index=0, end_reason="error", error=error,
        turns=played.turns if played else [],
    )


@pytest.mark.parametrize("layout", ["trajectory", "step"])
def test_a_failed_episode_is_set_aside_and_its_group_goes_on_with_the_members_left(layout):
    """Group 0 loses a member at reset, group 1 one mid-episode (its turns do not count either):
    each goes on as a group of one, whose GRPO advantage is 0; the failed rows are masked."""
    local = [episode([1.0], layout=layout), failed(), episode([2.0, 0.0], layout=layout), failed(rewards=[5.0])]
    if layout == "step":
        local[3] = dataclasses.replace(local[3], layout="step", turns=episode([5.0], layout="step").turns)
    batch = pipeline.gather(local, group_size=2)
    assert batch.aside.tolist() == [False, True, False, True] and batch.keep.tolist() == [True, False, True, False]
    assert [len(t.turns) for t in batch.episodes] == [1, 0, 2, 0] and [t.error is not None for t in batch.episodes] == [False, True, False, True]
    np.testing.assert_array_equal(batch.turns.traj_groups, [0, 5, 1, 7])  # the failed ones in groups of their own
    batch = pipeline.spread(pipeline.estimate(pipeline.to_rows(batch, rows_for(batch.local), layout=layout, decode=str), "grpo"), 8)
    assert not batch.estimate["advantages"].any()  # two groups of one
    assert not batch.advantages.any()
    played_rows = [s.trajectory_index for s in batch.samples if s.trajectory_index >= 0]
    assert sorted(set(played_rows)) == [0, 2]
    assert all(not any(mask) for mask, s in zip(batch.columns["env_mask"], batch.samples) if s.trajectory_index < 0)
    if layout == "trajectory":
        assert len(batch.rows) == 4 and batch.columns["episode_return"] == [1.0, None, 2.0, None]
    metrics = step_metrics.env_metrics(batch)
    assert metrics["env/error_rate"] == 0.5 and metrics["env/nonfinite_reward_episodes"] == 0.0
    assert metrics["env/success_rate"] == 0.0 and metrics["env/mean_turns"] == 1.5  # over the two played episodes


def test_a_failed_episode_is_in_no_statistic_of_the_batch():
    """With batch-wide normalisation too, the advantages are those of the batch without the failed episode."""
    settings = EstimatorSettings(norm_scope="batch")
    without = pipeline.estimate(pipeline.gather([episode([1.0]), episode([0.0]), episode([3.0]), episode([1.0])], group_size=2), "grpo", settings)
    local = [episode([1.0]), episode([0.0]), episode([3.0]), episode([1.0]), failed(), failed()]
    with_failures = pipeline.estimate(pipeline.gather(local, group_size=2, max_error_rate=0.5), "grpo", settings)
    np.testing.assert_allclose(with_failures.estimate["advantages"], without.estimate["advantages"])


def test_more_failed_episodes_than_the_run_allows_stop_it_naming_the_envs_exception():
    local = [episode([1.0]), failed(seed=4), failed(seed=4), failed(seed=5, rewards=[1.0])]
    with pytest.raises(RolloutError) as caught:
        pipeline.gather(local, group_size=2)
    message = str(caught.value)
    assert message == (
        "3 of 4 episodes of the batch failed, more than max_env_error_rate=0.5 allows; e.g. test/Env-v0 (seed 4): "
        "ConnectionError: cannot reset: the env's server is down at env.py:12"
    )
    assert "max_prompt_tokens" not in message
    assert pipeline.gather(local, group_size=2, max_error_rate=0.75).aside.sum() == 3
    with pytest.raises(RolloutError, match="1 of 4 episodes"):
        pipeline.gather([episode([1.0]), failed(), episode([1.0]), episode([0.0])], group_size=2, max_error_rate=0.0)


def test_a_nonfinite_reward_is_refused_naming_env_and_episode_or_dropped_and_counted():
    from envhub.error import NonFiniteReward

    local = [episode([1.0], env_id="test/Nan-v0"), episode([0.0, float("nan")], seed=9, env_id="test/Nan-v0")]
    with pytest.raises(NonFiniteReward) as caught:
        pipeline.gather(local, group_size=2)
    assert str(caught.value) == (
        "test/Nan-v0 gave a non-finite reward (nan) at turn 1 of episode 1 (seed 9); fix the env's reward, "
        "or set nonfinite_rewards: drop to leave such episodes out of training"
    )
    local.append(episode([float("inf")], env_id="test/Nan-v0"))
    local.append(episode([0.5], env_id="test/Nan-v0"))
    batch = pipeline.gather(local, group_size=2, nonfinite_rewards="drop")
    assert batch.aside.tolist() == [False, True, True, False]
    batch = pipeline.estimate(pipeline.to_rows(batch, rows_for(batch.local), layout="trajectory"), "grpo")
    assert np.isfinite(batch.estimate["advantages"]).all()
    assert batch.columns["episode_return"] == [1.0, None, None, 0.5]
    metrics = step_metrics.env_metrics(batch)
    assert metrics["env/nonfinite_reward_episodes"] == 2.0 and metrics["env/error_rate"] == 0.0
    assert np.isfinite(list(metrics.values())).all()


def test_a_process_whose_episodes_all_failed_still_gives_masked_rows():
    for layout in ("trajectory", "step"):
        batch = pipeline.gather([failed(), failed()], group_size=2, collect=lambda mine: mine + [episode([1.0], layout=layout)] * 2, max_error_rate=0.5)
        batch = pipeline.to_rows(batch, rows_for(batch.local), layout=layout, decode=str, row_multiple=2)
        assert len(batch.samples) == 2 and all(s.trajectory_index == -1 and not any(s.env_mask) for s in batch.samples)


def test_the_batch_is_a_frozen_value_each_stage_returns_a_new_one():
    batch = pipeline.gather([episode([1.0]), episode([0.0])], group_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.keep = None
    rows = pipeline.to_rows(batch, rows_for(batch.local), layout="trajectory")
    assert rows is not batch and batch.columns is None and rows.columns is not None


def test_to_rows_trajectory_layout_masks_the_rows_of_dropped_groups():
    local = [episode([1.0, 0.0]), episode([0.0]), episode([0.5]), episode([0.5])]
    batch = pipeline.gather(local, group_size=2, drop_tied=True)
    batch = pipeline.to_rows(batch, rows_for(batch.local), layout="trajectory")
    assert list(batch.rows) == rows_for(batch.local)
    columns = batch.columns
    assert columns["env_mask"][0] == [1, 1, 0, 1, 1]  # reply, environment token, reply
    assert columns["turn_ids"][0] == [0, 0, 0, 1, 1]
    assert columns["env_mask"][2] == [0, 0] and columns["env_mask"][3] == [0, 0]  # group 1 tied: dropped
    assert columns["episode_return"] == [1.0, 0.0, 0.5, 0.5]
    assert batch.row_keep == [True, True, False, False]


def test_to_rows_step_layout_gives_a_row_per_turn_padded_to_what_trl_splits_evenly():
    local = [episode([0.0, 1.0], layout="step", seed=4), episode([0.0], layout="step", seed=4)]
    batch = pipeline.gather(local, group_size=2)
    batch = pipeline.to_rows(
        batch, rows_for(batch.local), layout="step", decode=lambda ids: " ".join(map(str, ids)), row_multiple=4,
        most_rows=lambda count: count + 2,  # another process holds 5 rows
    )
    assert len(batch.rows) == len(batch.samples) == 8
    assert [row["prompt"] for row in batch.rows[:3]] == ["100 100 100", "101 101 101", "100 100 100"]
    assert all(row["env_seed"] == 4 for row in batch.rows)
    assert [s.trajectory_index for s in batch.samples] == [0, 0, 1, -1, -1, -1, -1, -1]
    assert [s.turn_index for s in batch.samples[:3]] == [0, 1, 0]
    assert batch.columns["env_mask"][3:] == [[0, 0]] * 5
    assert batch.columns["episode_return"] == [1.0, 1.0, 0.0] + [None] * 5
    with pytest.raises(ValueError, match="layout"):
        pipeline.to_rows(batch, [], layout="turn")


def grpo_batch(layout="trajectory"):
    local = [episode([1.0, 1.0], layout=layout), episode([0.0], layout=layout), episode([3.0], layout=layout), episode([1.0], layout=layout)]
    batch = pipeline.gather(local, group_size=2)
    return pipeline.to_rows(batch, rows_for(batch.local), layout=layout, decode=str)


#: A toy vocabulary: the closing tag is four tokens, as the tiny model's tokenizer spells it.
PIECES = {1: "Right", 2: "<", 3: "/", 4: "answer", 5: ">", 6: "Ri", 7: "ght<", 8: "Up"}


def spell(ids):
    return "".join(PIECES.get(i, f"[{i}]") for i in ids)


def test_stop_string_start_is_the_first_token_wholly_in_the_closing_tag():
    from envhub_trl.pipeline import stop_string_start

    assert stop_string_start([1, 2, 3, 4, 5], ["</answer>"], spell) == 1
    assert stop_string_start([6, 7, 3, 4, 5], ["</answer>"], spell) == 2  # "ght<" holds the action's end: trained
    assert stop_string_start([1, 2, 3], ["</answer>"], spell) == 3  # never closed: trained whole
    assert stop_string_start([1, 2, 3, 4, 5], [], spell) == 5


@pytest.mark.parametrize("layout", ["trajectory", "step"])
def test_to_rows_leaves_each_replys_closing_tag_out_of_the_loss_mask_and_nothing_else(layout):
    replies = ([1, 2, 3, 4, 5], [8, 2, 3])  # "Right</answer>", then "Up</" (never closed)
    local = [
        dataclasses.replace(t, turns=[dataclasses.replace(turn, completion_ids=ids, logprobs=[-0.5] * len(ids)) for turn, ids in zip(t.turns, replies)])
        for t in (episode([0.0, 1.0], layout=layout), episode([0.0], layout=layout))
    ]
    batch = pipeline.gather(local, group_size=2)
    whole = pipeline.to_rows(batch, rows_for(batch.local), layout=layout, decode=spell)
    cut = pipeline.to_rows(batch, rows_for(batch.local), layout=layout, decode=spell, untrained_stops=("</answer>",))
    assert whole.samples == cut.samples  # the estimators and the token order see every reply token
    if layout == "step":
        assert cut.columns["env_mask"][:3] == [[1, 0, 0, 0, 0], [1, 1, 1], [1, 0, 0, 0, 0]]
    else:  # the environment token between the turns stays 0 as well
        assert cut.columns["env_mask"][:2] == [[1, 0, 0, 0, 0, 0, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert whole.columns["env_mask"] == [s.env_mask for s in whole.samples]


def test_an_invalid_replys_closing_tag_stays_in_the_loss_with_train_invalid_stops():
    """``<answer></answer>`` (an empty answer) is invalid, and its closing tag is what the model wrote
    instead of a move: with ``train_invalid_stops`` it keeps its tokens in the loss; a valid reply's
    tag stays out either way."""
    replies = ([1, 2, 3, 4, 5], [2, 3, 4, 5])  # "Right</answer>" (valid), then "</answer>" (invalid: no move)
    local = [
        dataclasses.replace(t, turns=[
            dataclasses.replace(turn, completion_ids=ids, logprobs=[-0.5] * len(ids), action_is_valid=k == 0)
            for k, (turn, ids) in enumerate(zip(t.turns, replies))
        ])
        for t in (episode([0.0, 1.0], layout="step"), episode([0.0, 0.0], layout="step"))
    ]
    batch = pipeline.gather(local, group_size=2)
    rows = rows_for(batch.local)
    left_out = pipeline.to_rows(batch, rows, layout="step", decode=spell, untrained_stops=("</answer>",))
    kept = pipeline.to_rows(batch, rows, layout="step", decode=spell, untrained_stops=("</answer>",), train_invalid_stops=True)
    assert left_out.columns["env_mask"][:2] == [[1, 0, 0, 0, 0], [0, 0, 0, 0]]  # the empty answer: nothing trained
    assert kept.columns["env_mask"][:2] == [[1, 0, 0, 0, 0], [1, 1, 1, 1]]


@pytest.mark.parametrize("layout", ["trajectory", "step"])
def test_estimate_and_spread_put_each_episodes_grpo_advantage_on_its_model_tokens(layout):
    batch = pipeline.spread(pipeline.estimate(grpo_batch(layout), "grpo"), width=6)
    # Returns (2, 0) and (3, 1) in the two groups: each member 1 from its group's mean, over the unbiased std sqrt(2).
    high = 1.0 / (np.sqrt(2.0) + 1e-6)
    expected = {0: high, 1: -high, 2: high, 3: -high}
    assert batch.advantages.shape == (len(batch.samples), 6)
    for row, sample in enumerate(batch.samples):
        mask = np.asarray(sample.env_mask, dtype=bool)
        np.testing.assert_allclose(batch.advantages[row, : len(mask)][mask], expected[sample.trajectory_index], rtol=1e-6)
        assert not batch.advantages[row, len(mask) :].any()  # past the row's end
    means = step_metrics.row_advantage_means(batch)
    np.testing.assert_allclose(means, [expected[s.trajectory_index] for s in batch.samples], rtol=1e-6)


def test_estimate_zeroes_the_turns_of_dropped_groups():
    local = [episode([1.0]), episode([0.0]), episode([1.0]), episode([1.0])]
    batch = pipeline.gather(local, group_size=2, drop_tied=True)
    batch = pipeline.estimate(pipeline.to_rows(batch, rows_for(batch.local), layout="trajectory"), "gigpo")
    assert batch.estimate["keep"].tolist() == [True, True, False, False]
    assert batch.estimate["advantages"][2:].tolist() == [0.0, 0.0]
    assert step_metrics.env_metrics(batch)["env/kept_fraction"] == 0.5
    assert "env/anchor_size" in step_metrics.env_metrics(batch)


@pytest.mark.parametrize("layout", ["trajectory", "step"])
def test_score_puts_per_token_quantities_in_the_batchs_token_order_and_spread_puts_them_back(layout):
    """Whatever the layout, ``score`` orders model tokens episode by episode and turn by turn
    (``token_turn``), and ``spread`` of per-token advantages is its inverse."""
    batch = grpo_batch(layout)
    width = max(len(s.completion_ids) for s in batch.samples)
    logps = np.zeros((len(batch.samples), width), dtype=np.float32)
    for row, sample in enumerate(batch.samples):
        for j, (turn, model) in enumerate(zip(sample.turn_ids, sample.env_mask)):
            logps[row, j] = -(10 * sample.trajectory_index + turn + 0.01 * j) if model else 99.0
    scored = pipeline.score(batch, logps=logps, ref_logps=logps - 1.0)
    turns = scored.turns
    np.testing.assert_array_equal(turns.token_turn, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])  # 5 turns, 2 tokens each
    assert not (turns.logps == 99.0).any()  # environment tokens are not model tokens
    order = -turns.logps
    assert np.all(np.diff(np.floor(order)) >= 0)  # episode by episode, turn by turn
    np.testing.assert_allclose(turns.ref_logps, turns.logps - 1.0)
    assert scored.turns.values is None and batch.turns.logps is None
    back = dataclasses.replace(scored, estimate={"token_advantages": turns.logps.astype(np.float64), "keep": scored.keep})
    spread = pipeline.spread(back, width).advantages
    mask = np.zeros_like(logps, dtype=bool)
    for row, sample in enumerate(batch.samples):
        mask[row, : len(sample.env_mask)] = np.asarray(sample.env_mask, dtype=bool)
    np.testing.assert_allclose(spread[mask], logps[mask], rtol=1e-6)
    assert not spread[~mask].any()


def test_reinforce_plus_plus_runs_through_the_stages_with_its_kl_logged():
    batch = grpo_batch("trajectory")
    width = max(len(s.completion_ids) for s in batch.samples)
    logps = np.full((len(batch.samples), width), -1.0, dtype=np.float32)
    settings = EstimatorSettings(kl_coef=0.5)
    with pytest.raises(ValueError, match="needs the batch's logps, ref_logps"):
        pipeline.estimate(batch, "reinforce++", settings)
    batch = pipeline.estimate(pipeline.score(batch, logps=logps, ref_logps=logps - 0.2), "reinforce++", settings)
    batch = pipeline.spread(batch, width)
    assert step_metrics.estimate_metrics(batch) == {"env/kl": pytest.approx(0.2)}
    advantages = batch.estimate["token_advantages"]
    assert advantages.shape == (10,) and abs(advantages.mean()) < 1e-9  # whitened over the batch's tokens


def test_ppos_values_reach_the_turns_and_the_critic_targets():
    local = [episode([0.0, 1.0], layout="step"), episode([0.0], layout="step")]
    batch = pipeline.gather(local, group_size=2)
    batch = pipeline.to_rows(batch, rows_for(batch.local), layout="step", decode=str, row_multiple=4)  # one padding row
    assert batch.turn_starts == [{0: 0}, {1: 0}, {0: 0}, {}]
    values = np.array([[0.5], [0.25], [0.125], [9.0]], dtype=np.float32)  # per row, its turns in order
    scored = pipeline.score(batch, values=values)
    np.testing.assert_allclose(scored.turns.values, [0.5, 0.25, 0.125])  # episode 0's two turns, then episode 1's
    estimated = pipeline.estimate(scored, "ppo", EstimatorSettings(gamma=1.0, lam=1.0))
    np.testing.assert_allclose(estimated.estimate["returns"], [1.0, 1.0, 0.0])  # GAE(1, 1) + V: the reward to go
    targets = loss_inputs.critic_targets(estimated, prompt_width=5)
    assert targets["value_positions"][:, 0].tolist() == [4, 4, 4, 0]  # the turn's last prompt token
    assert targets["value_mask"][:, 0].tolist() == [1.0, 1.0, 1.0, 0.0]  # the padding row reads nothing
    np.testing.assert_allclose(targets["old_values"][:, 0].numpy(), [0.5, 0.25, 0.125, 0.0])
    np.testing.assert_allclose(targets["value_returns"][:, 0].numpy(), [1.0, 1.0, 0.0, 0.0])
    metrics = step_metrics.estimate_metrics(estimated)
    assert metrics["critic/values_mean"] == pytest.approx(0.875 / 3) and metrics["critic/returns_mean"] == pytest.approx(2 / 3)


def test_turn_id_matrix_is_each_completion_tokens_turn():
    batch = grpo_batch("trajectory")
    matrix = loss_inputs.turn_id_matrix(batch, width=7)
    assert matrix[0].tolist() == [0, 0, 0, 1, 1, 0, 0]
    assert matrix[1].tolist() == [0] * 7


@pytest.mark.parametrize("layout", ["step", "trajectory"])
def test_choice_points_sit_before_the_first_token_of_each_valid_turns_action(layout):
    # Replies "<answer", ">", then the action's tokens, then "</answer>"; legal actions' first tokens 3..6.
    vocab = {1: "<answer", 2: ">", 3: "Do", 4: "wn", 5: "Up", 6: "Le", 7: "ft", 8: "</answer>", 9: "Ri", 10: "ght", 11: ">Up"}
    decode = lambda ids: "".join(vocab.get(i, "~") for i in ids)  # noqa: E731  (prompt tokens decode to "~")
    first = {"Down": 3, "Up": 5, "Left": 6, "Right": 9, "Upper": 5}.get
    legal = ("Left", "Down", "Right", "Up")
    assert loss_inputs.action_offset([1, 2, 3, 4, 8], "Down", decode) == 2
    assert loss_inputs.action_offset([1, 11, 8], "Up", decode) == 1  # the token ">Up" begins it
    assert loss_inputs.action_offset([1, 2, 5, 8], "Down", decode) is None
    ep = episode([0.0, 0.0, 0.0, 0.0, 1.0], layout=layout, reply=5)
    replies = [
        ([1, 2, 3, 4, 8], "Down", True, legal),  # a choice at its "Do"
        ([1, 2, 5, 8, 8], "Up", False, legal),  # an invalid reply: none
        ([1, 2, 6, 7, 8], "Left", True, None),  # an env that lists no legal actions: none
        ([1, 11, 8, 8, 8], "Up", True, legal),  # spelled with another first token in context: none
        ([1, 2, 5, 8, 8], "Up", True, ("Up", "Upper", "Down")),  # "Up" and "Upper" are one choice
    ]
    for k, (ids, action, valid, offered) in enumerate(replies):
        ep.turns[k] = dataclasses.replace(ep.turns[k], completion_ids=ids, action=action, action_is_valid=valid, valid_actions=offered)
    batch = pipeline.to_rows(pipeline.gather([ep], group_size=1), rows_for([ep]), layout=layout, decode=decode)
    width = 3  # every prompt: 3 tokens
    points = loss_inputs.choice_points(batch, width, first, decode)
    mask = points["choice_mask"].bool()
    found = [
        (row, int(points["choice_positions"][row, k]), sorted(points["choice_tokens"][row, k][mask[row, k]].tolist()))
        for row in range(mask.shape[0]) for k in range(mask.shape[1]) if mask[row, k].any()
    ]
    starts = batch.turn_starts
    if layout == "step":  # one row a turn: turns 0 and 4
        assert found == [(0, width + 2 - 1, [3, 5, 6, 9]), (4, width + 2 - 1, [3, 5])]
    else:  # one row: each turn's reply starts where turn_starts says
        assert found == [(0, width + starts[0][0] + 1, [3, 5, 6, 9]), (0, width + starts[0][4] + 1, [3, 5])]
