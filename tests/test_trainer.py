"""EnvGRPOTrainer, its config, the rollout glue and the ``envhub train`` command, on the tiny model.

One 2-step GiGPO training run on multi-turn FrozenLake is shared by the tests that inspect a
batch; its generator answers half the episodes with the tiny model (real sampling, real logprobs)
and half with the expert, so returns differ within groups and the advantages are not all zero.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

import click  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from envhub.generation import ExpertGenerator, Prompt, SamplingParams  # noqa: E402
from envhub.manager import EnvGroupManager  # noqa: E402
from envhub.rollout import rollout, step_arrays  # noqa: E402
from envhub_trl.advantages import gigpo_advantages, grpo_advantages, select_groups  # noqa: E402
from envhub_trl.config import EnvGRPOConfig  # noqa: E402
from envhub_trl.estimators import EstimatorSettings, TurnBatch  # noqa: E402
from envhub.rollout import batch_columns  # noqa: E402
from trl_helpers import HalfExpert, lake_config, spied_run  # noqa: E402
from envhub_trl.estimators import turn_advantages  # noqa: E402
from envhub_trl.pipeline import RolloutError, check_has_turns, token_advantages  # noqa: E402

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _config(tmp_path, **overrides) -> EnvGRPOConfig:
    return lake_config(tmp_path, **overrides)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trl_helpers import save_tiny_lake_model

    return save_tiny_lake_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def run(tiny, tmp_path_factory):
    """A 2-step GiGPO run in the trajectory layout."""
    return spied_run(tiny, _config(tmp_path_factory.mktemp("run"), format_penalty=-0.1, step_gamma=0.9, max_turns=7))


# ---------------------------------------------------------------------------------------- config


def test_config_names_the_fix_for_a_batch_that_does_not_divide(tmp_path):
    with pytest.raises(ValueError, match="per_device_train_batch_size"):
        _config(tmp_path, groups_per_step=3, group_size=2, per_device_train_batch_size=4)
    with pytest.raises(ValueError, match="advantage_estimator"):
        _config(tmp_path, advantage_estimator="a2c")
    with pytest.raises(ValueError, match="eval_seed_offset"):
        _config(tmp_path, eval_seed_offset=10, num_train_seeds=100)
    with pytest.raises(ValueError, match="keep_group_fraction"):
        _config(tmp_path, keep_group_fraction=0.0)
    with pytest.raises(ValueError, match="keep_group_variance_share"):
        _config(tmp_path, keep_group_variance_share=1.5)


def test_config_group_size_is_num_generations_and_sets_the_generation_batch(tmp_path):
    config = _config(tmp_path, groups_per_step=4, group_size=3, per_device_train_batch_size=6)
    assert config.num_generations == config.group_size == 3
    assert config.generation_batch_size == 12
    assert config.steps_per_generation == 2
    assert config.env_settings().max_turns == 4


# ---------------------------------------------------------------------------------------- glue


def test_config_bounds_dynamic_sampling_and_names_what_ties(tmp_path):
    with pytest.raises(ValueError, match="dynamic_sampling_rounds"):
        _config(tmp_path, dynamic_sampling_rounds=0)
    with pytest.raises(ValueError, match="tied_by must be one of"):
        _config(tmp_path, tied_by="score")
    with pytest.raises(ValueError, match="rollout_mode='async' plays ahead"):
        _config(tmp_path, dynamic_sampling_rounds=2, rollout_mode="async")


def test_config_refuses_dynamic_sampling_where_a_process_would_hold_part_of_a_group(tmp_path, monkeypatch):
    """Three groups of 4 over two processes: 6 episodes each, so a group straddles them."""
    monkeypatch.setattr(EnvGRPOConfig, "world_size", property(lambda self: 2))
    straddling = dict(groups_per_step=3, group_size=4, per_device_train_batch_size=6)
    _config(tmp_path, **straddling)  # without dynamic sampling a straddling group is normalised across processes
    with pytest.raises(ValueError, match="each of the 2 processes holds 6 episodes .* multiple of the number of processes"):
        _config(tmp_path, dynamic_sampling_rounds=2, **straddling)
    _config(tmp_path, dynamic_sampling_rounds=2, groups_per_step=4, group_size=4, per_device_train_batch_size=8)


def test_dynamic_sampling_trains_on_untied_groups_replayed_in_the_tied_ones_places(tiny, tmp_path, monkeypatch):
    """DAPO's dynamic sampling in the trainer: a first round in which every group ties (the untrained
    model alone plays it, and loses) is replaced group by group by a second round on new training
    seeds (half of each group played by the expert), and the rounds and shares are logged."""
    from transformers import AutoModelForCausalLM

    from envhub_trl import pipeline
    from envhub_trl.trainer import EnvGRPOTrainer

    class FirstRoundLoses(HalfExpert):
        model_only = True

        def generate(self, prompts, sampling):
            return self.hf.generate(prompts, sampling) if self.model_only else super().generate(prompts, sampling)

    play_round, gathered, real = EnvGRPOTrainer._play_round, [], pipeline.gather

    def played(self, seeds, group_size, mode, round=0):
        self.generator.model_only = round == 0
        episodes = play_round(self, seeds, group_size, mode, round=round)
        assert round > 0 or all(pipeline.group_is_tied(episodes[i : i + 4], "success") for i in range(0, len(episodes), 4))
        return episodes

    monkeypatch.setattr(EnvGRPOTrainer, "_play_round", played)
    monkeypatch.setattr(pipeline, "gather", lambda local, **kw: gathered.append((list(local), kw)) or real(local, **kw))
    path, tokenizer = tiny
    model = AutoModelForCausalLM.from_pretrained(path)
    config = _config(tmp_path, dynamic_sampling_rounds=3, tied_by="success", max_turns=8, groups_per_step=4, per_device_train_batch_size=16)
    trainer = EnvGRPOTrainer(model, config, processing_class=tokenizer, generator=FirstRoundLoses(model, tokenizer))
    first_seeds = []
    monkeypatch.setattr(trainer, "_refill_tied", lambda local, inputs, size: first_seeds.append([t.seed for t in local]) or
                        EnvGRPOTrainer._refill_tied(trainer, local, inputs, size))
    trainer.train()
    log = {key: [entry[key] for entry in trainer.state.log_history if key in entry]
           for key in ("dynamic/rounds", "dynamic/tied_first", "dynamic/tied_left", "dynamic/success_first", "env/kept_fraction")}
    assert log == {"dynamic/rounds": [2.0, 2.0], "dynamic/tied_first": [1.0, 1.0], "dynamic/tied_left": [0.0, 0.0],
                   "dynamic/success_first": [0.0, 0.0], "env/kept_fraction": [1.0, 1.0]}
    for (local, kw), seeds in zip(gathered, first_seeds):
        assert kw["drop_tied"] and kw["tied_by"] == "success"
        groups = [local[i : i + 4] for i in range(0, 16, 4)]
        assert not any(pipeline.group_is_tied(group, "success") for group in groups)
        assert all(len({t.seed for t in group}) == 1 for group in groups) and [t.seed for t in local] != seeds


def test_config_bounds_the_retries_of_unsolved_groups_and_refuses_what_they_cannot_join(tmp_path):
    with pytest.raises(ValueError, match="retry_unsolved_rounds"):
        _config(tmp_path, retry_unsolved_rounds=-1)
    with pytest.raises(ValueError, match="rollout_mode='async' plays ahead"):
        _config(tmp_path, retry_unsolved_rounds=2, rollout_mode="async")
    with pytest.raises(ValueError, match="retry_unsolved_rounds and dynamic_sampling_rounds"):
        _config(tmp_path, retry_unsolved_rounds=2, dynamic_sampling_rounds=2)


def test_retries_train_on_the_unsolved_levels_own_wins_in_the_places_of_failed_members(tiny, tmp_path, monkeypatch):
    """The trainer's retries of unsolved groups: a first round that every group loses (the untrained
    model alone plays it) is followed by a round on the same levels, half of it played by the expert;
    the batch trained on holds each level's wins in the places of its failed members, on the same
    seeds and with as many episodes, and the rounds and shares are logged."""
    from transformers import AutoModelForCausalLM

    from envhub_trl import pipeline
    from envhub_trl.trainer import EnvGRPOTrainer

    class FirstRoundLoses(HalfExpert):
        model_only = True

        def generate(self, prompts, sampling):
            return self.hf.generate(prompts, sampling) if self.model_only else super().generate(prompts, sampling)

    play_round, gathered, real, rounds = EnvGRPOTrainer._play_round, [], pipeline.gather, []

    def played(self, seeds, group_size, mode, round=0):
        self.generator.model_only = round == 0
        episodes = play_round(self, seeds, group_size, mode, round=round)
        rounds.append((round, [t.seed for t in episodes]))
        assert round > 0 or not any(t.success for t in episodes)
        return episodes

    monkeypatch.setattr(EnvGRPOTrainer, "_play_round", played)
    monkeypatch.setattr(pipeline, "gather", lambda local, **kw: gathered.append(list(local)) or real(local, **kw))
    path, tokenizer = tiny
    model = AutoModelForCausalLM.from_pretrained(path)
    config = _config(tmp_path, retry_unsolved_rounds=3, max_turns=8, groups_per_step=4, per_device_train_batch_size=16)
    trainer = EnvGRPOTrainer(model, config, processing_class=tokenizer, generator=FirstRoundLoses(model, tokenizer))
    trainer.train()
    log = {key: [entry[key] for entry in trainer.state.log_history if key in entry]
           for key in ("retry/rounds", "retry/unsolved_first", "retry/solved_later", "retry/success_first")}
    assert log == {"retry/rounds": [1.0, 1.0], "retry/unsolved_first": [1.0, 1.0], "retry/solved_later": [1.0, 1.0],
                   "retry/success_first": [0.0, 0.0]}
    training = [seeds for n, seeds in rounds if n == 0 and len(seeds) == 16]
    assert [n for n, _ in rounds if n] == [1, 1]  # one further round a step: every level won in it
    for local, seeds in zip(gathered, training):
        assert [t.seed for t in local] == seeds  # the same levels, in the same places
        groups = [local[i : i + 4] for i in range(0, 16, 4)]
        assert all(1 <= sum(t.success for t in group) <= 2 for group in groups)  # wins kept, up to half a group
        assert [t.member for t in local] == [0, 1, 2, 3] * 4


def test_a_zero_gradient_step_leaves_adams_weights_alone_and_the_schedule_goes_on():
    """Adam moves the weights on a zero gradient by its moments; the skip holds them, logs each
    step, still steps on a NaN gradient, and stays a bound method under torch's LR scheduler."""
    from envhub_trl.trainer import skip_zero_gradient_steps

    def steps(skip: bool):
        torch.manual_seed(0)
        layer = torch.nn.Linear(3, 2)
        optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1)
        seen: list[bool] = []
        if skip:
            skip_zero_gradient_steps(optimizer, seen.append)
            skip_zero_gradient_steps(optimizer, seen.append)  # twice: once in place
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        weights = []
        for scale in (1.0, 0.0, 0.0):
            layer(torch.ones(1, 3)).sum().mul(scale).backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=False)
            weights.append(layer.weight.detach().clone())
        return weights, seen, schedule.get_last_lr()[0]

    plain, _, _ = steps(skip=False)
    held, seen, lr = steps(skip=True)
    assert torch.equal(plain[0], held[0]) and not torch.equal(plain[0], plain[2])  # Adam drifts on zero gradients
    assert torch.equal(held[0], held[1]) and torch.equal(held[0], held[2])
    assert seen == [False, True, True] and lr == pytest.approx(0.1 / 4)

    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    skip_zero_gradient_steps(optimizer, seen.append)
    layer(torch.ones(1, 3)).sum().mul(float("nan")).backward()
    optimizer.step()
    assert seen[-1] is False and torch.isnan(layer.weight).all()


def test_a_step_that_keeps_no_group_takes_no_optimizer_step(tiny, tmp_path):
    """filter_tied_groups with skip_zero_gradient_steps: the first step trains on the half-expert's
    untied groups, the second's groups all tie (the model alone plays, and loses) and are dropped,
    so its gradient is zero and the weights stay as the first step left them."""
    from transformers import AutoModelForCausalLM, TrainerCallback

    from envhub_trl.trainer import EnvGRPOTrainer

    class SecondStepLoses(HalfExpert):
        def generate(self, prompts, sampling):
            return self.hf.generate(prompts, sampling) if trainer.state.global_step == 1 else super().generate(prompts, sampling)

    class Weights(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            after.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    path, tokenizer = tiny
    runs = {}
    for skip in (True, False):
        after = []
        model = AutoModelForCausalLM.from_pretrained(path)
        config = _config(tmp_path / str(skip), filter_tied_groups=True, skip_zero_gradient_steps=skip, max_turns=8)
        trainer = EnvGRPOTrainer(model, config, processing_class=tokenizer, generator=SecondStepLoses(model, tokenizer), callbacks=[Weights()])
        trainer.train()
        log = {key: [entry[key] for entry in trainer.state.log_history if key in entry] for key in ("env/kept_fraction", "optimizer/skipped", "grad_norm")}
        runs[skip] = after, log
    (held, log), (drifted, plain) = runs[True], runs[False]
    assert log["env/kept_fraction"] == plain["env/kept_fraction"] == [1.0, 0.0] and log["grad_norm"][1] == 0.0
    assert log["optimizer/skipped"] == [0.0, 1.0] and plain["optimizer/skipped"] == []
    assert all(torch.equal(held[0][k], held[1][k]) for k in held[0])
    assert any(not torch.equal(drifted[0][k], drifted[1][k]) for k in drifted[0])


def test_token_advantages_give_each_turn_its_own_value(tokenizer_free_trajectories):
    trajectories, samples = tokenizer_free_trajectories
    per_turn = [np.arange(t.num_turns, dtype=float) + 10 * i for i, t in enumerate(trajectories)]
    width = max(len(s.completion_ids) for s in samples) + 3
    out = token_advantages(samples, per_turn, width)
    assert out.shape == (len(samples), width)
    for row, sample in enumerate(samples):
        expected = per_turn[row][sample.turn_ids]
        np.testing.assert_array_equal(out[row, : len(sample.turn_ids)], expected)
        assert not out[row, len(sample.turn_ids) :].any()


@pytest.fixture
def tokenizer_free_trajectories(tiny):
    _, tokenizer = tiny
    manager = EnvGroupManager(LAKE, 2, 2, tokenizer=tokenizer, max_turns=3)
    trajectories = rollout(manager, ExpertGenerator(tokenizer=tokenizer), SamplingParams())
    samples = [t.sample() for t in trajectories]
    assert batch_columns(samples)["env_mask"] == [s.env_mask for s in samples]
    return trajectories, samples


def test_an_episode_without_turns_is_a_clear_error(tiny):
    _, tokenizer = tiny
    manager = EnvGroupManager(LAKE, 1, 1, tokenizer=tokenizer, max_prompt_tokens=5)
    trajectories = rollout(manager, ExpertGenerator(tokenizer=tokenizer), SamplingParams())
    with pytest.raises(RolloutError, match="max_prompt_tokens"):
        check_has_turns(trajectories[0])


def test_turn_advantages_zero_dropped_groups():
    batch = TurnBatch(
        rewards=np.array([1.0, 0.0, 0.5, 0.5]),
        traj_index=np.array([0, 1, 2, 3]),
        step_index=np.zeros(4, dtype=int),
        state_keys=np.array(["a", "a", "b", "b"], dtype=object),
        traj_groups=np.array([0, 0, 1, 1]),
        env_ids=np.array([LAKE] * 4, dtype=object),
    )
    tied = select_groups(batch.returns, batch.traj_groups, drop_tied=True)
    out = turn_advantages(batch, "grpo", EstimatorSettings(norm="mean"), keep=tied)
    np.testing.assert_allclose(out["advantages"], [0.5, -0.5, 0, 0])
    np.testing.assert_array_equal(out["keep"], [True, True, False, False])
    half = select_groups(batch.returns, batch.traj_groups, keep_fraction=0.5)
    gigpo = turn_advantages(batch, "gigpo", EstimatorSettings(norm="mean", step_reward_weight=0.5), keep=half)
    np.testing.assert_allclose(gigpo["advantages"], [0.75, -0.75, 0, 0])
    with pytest.raises(ValueError, match="unknown advantage estimator 'a2c'"):
        turn_advantages(batch, "a2c")
    with pytest.raises(ValueError, match="'ppo' needs the batch's values"):
        turn_advantages(batch, "ppo")


# ---------------------------------------------------------------------------------------- training run


@pytest.mark.slow
def test_training_changes_the_weights(run):
    trainer, before, batches = run
    assert trainer.state.global_step == 2 and len(batches) == 2
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_environment_tokens_are_masked_out_of_the_loss(run):
    _, _, batches = run
    for batch in batches:
        output, trajectories = batch["output"], batch["trajectories"]
        mask = output["tool_mask"] * output["completion_mask"]
        for row, trajectory in enumerate(trajectories):
            sample = trajectory.sample()
            n = len(sample.completion_ids)
            assert output["completion_ids"][row, :n].tolist() == sample.completion_ids
            assert mask[row, :n].tolist() == sample.env_mask
            assert not mask[row, n:].any()
            assert 0 in sample.env_mask or trajectory.num_turns == 1


@pytest.mark.slow
def test_rows_of_a_group_share_a_seed_and_an_initial_state(run):
    trainer, _, batches = run
    size = trainer.args.num_generations
    for batch in batches:
        seeds = np.array(batch["seeds"]).reshape(-1, size)
        assert (seeds == seeds[:, :1]).all()
        first = np.array([t.turns[0].state_key for t in batch["trajectories"]], dtype=object).reshape(-1, size)
        assert (first == first[:, :1]).all()


def expected_gigpo(trajectories, args) -> np.ndarray:
    """GiGPO's per-turn advantages of one process's batch, groups of ``num_generations`` rows in order."""
    for i, t in enumerate(trajectories):
        t.group_id = i // args.num_generations
    steps = step_arrays(trajectories)
    return gigpo_advantages(
        steps["rewards"], steps["traj_index"], steps["step_index"], steps["traj_groups"], steps["state_keys"],
        step_weight=args.step_advantage_weight, gamma=args.step_gamma, norm=args.advantage_norm,
    )["advantages"]


@pytest.mark.slow
def test_the_loss_sees_per_token_gigpo_advantages(run):
    trainer, _, batches = run
    for batch in batches:
        output, trajectories = batch["output"], batch["trajectories"]
        expected = expected_gigpo(trajectories, trainer.args)
        assert output["advantages"].dim() == 2
        bounds = np.cumsum([0] + [t.num_turns for t in trajectories])
        for row, trajectory in enumerate(trajectories):
            sample = trajectory.sample()
            per_turn = expected[bounds[row] : bounds[row + 1]]
            got = output["advantages"][row, : len(sample.turn_ids)].numpy()
            model_tokens = np.array(sample.env_mask, dtype=bool)
            np.testing.assert_allclose(got[model_tokens], per_turn[np.array(sample.turn_ids)[model_tokens]], rtol=1e-5, atol=1e-6)
        assert np.abs(expected).max() > 0  # the run had signal


@pytest.mark.slow
def test_env_metrics_reach_trls_log(run):
    trainer, _, _ = run
    logged = [entry for entry in trainer.state.log_history if "env/success_rate" in entry]
    assert len(logged) == 2
    for key in ("env/invalid_action_rate", "env/mean_turns", "env/tokens_per_turn", "env/reward_std_per_group", "entropy", "grad_norm"):
        assert key in logged[0]
    assert 0.0 < logged[0]["env/success_rate"] < 1.0  # expert members win, model members do not


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["run", "step_run"])
def test_clipped_ratio_counts_the_rows_with_a_reply_cut_at_the_token_limit(fixture, request):
    """TRL calls a row clipped when its last token is not end-of-sequence; an envhub row can end at
    a stop string or an env's text, so the trainer re-measures it by the replies' finish reasons."""
    trainer, _, batches = request.getfixturevalue(fixture)
    logged = [entry["completions/clipped_ratio"] for entry in trainer.state.log_history if "completions/clipped_ratio" in entry]
    for batch, figure in zip(batches, logged):
        episodes = [traj.turns for traj in batch["trajectories"]]
        rows = [[turn] for turns in episodes for turn in turns] if fixture == "step_run" else episodes
        cut = np.mean([any(turn.finish_reason == "length" for turn in row) for row in rows])
        assert 0.0 < cut < 1.0  # both kinds of row are in the batch
        assert figure == pytest.approx(cut)


def test_grpo_matches_trls_own_advantages(tiny, tmp_path, monkeypatch):
    """GRPO's per-token advantage is, on every model token, the sequence advantage TRL computes itself."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = tiny
    model = AutoModelForCausalLM.from_pretrained(path).train()
    seen = []
    original = GRPOTrainer._generate_and_score_completions

    def spy(self, inputs):
        output = original(self, inputs)
        seen.append(output["advantages"].clone())  # TRL's (B,) advantages, before ours replace them
        return output

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", spy)
    config = _config(tmp_path, advantage_estimator="grpo", max_steps=1, max_turns=7, format_penalty=-0.1)
    trainer = EnvGRPOTrainer(model, config, processing_class=tokenizer, generator=HalfExpert(model, tokenizer))
    inputs = next(iter(trainer.get_train_dataloader()))
    ours = trainer._generate_and_score_completions(inputs)
    trls = seen[0]
    assert trls.abs().max() > 0
    model_tokens = (ours["tool_mask"] * ours["completion_mask"]).bool()
    expected = trls[:, None].expand_as(ours["advantages"])
    # TRL divides by std + 1e-4, the estimator by std + 1e-6
    torch.testing.assert_close(ours["advantages"][model_tokens], expected[model_tokens], rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_completions_log_shows_the_advantages_the_loss_used(run):
    trainer, _, batches = run
    output = batches[-1]["output"]
    mask = (output["tool_mask"] * output["completion_mask"]).bool()
    means = [float(output["advantages"][row][mask[row]].mean()) if mask[row].any() else 0.0 for row in range(len(mask))]
    assert list(trainer._logs["advantages"])[-len(means) :] == pytest.approx(means, abs=1e-5)


@pytest.fixture(scope="module")
def step_run(tiny, tmp_path_factory):
    """One generation batch in the step layout, trained as two micro-batches (two optimizer steps)."""
    config = _config(
        tmp_path_factory.mktemp("step-run"), sample_layout="step", history_turns=1, max_turns=6, per_device_train_batch_size=4,
        format_penalty=-0.1, step_gamma=0.9,
    )
    assert config.steps_per_generation == 2
    return spied_run(tiny, config)


@pytest.mark.slow
def test_step_layout_trains_one_row_per_turn(step_run, tiny):
    trainer, before, batches = step_run
    _, tokenizer = tiny
    assert trainer.state.global_step == 2 and len(batches) == 1  # two micro-batches of one generation batch
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    output, trajectories = batches[0]["output"], batches[0]["trajectories"]
    turns = [turn for t in trajectories for turn in t.turns]
    rows = output["completion_ids"].shape[0]
    assert rows >= len(turns) and rows % 4 == 0 and rows - len(turns) < 4  # padded to num_generations x micro-batches
    mask = output["tool_mask"] * output["completion_mask"]
    assert not mask[len(turns) :].any()  # padding rows stay out of the loss
    for row, turn in enumerate(turns):
        n = len(turn.completion_ids)
        assert output["completion_ids"][row, :n].tolist() == list(turn.completion_ids)
        assert mask[row, :n].all() and not mask[row, n:].any()
        prompt = output["prompt_ids"][row][output["prompt_mask"][row].bool()].tolist()
        assert prompt == list(turn.input_ids)  # the windowed prompt the reply was sampled from
        assert tokenizer.decode(prompt).count("<|im_start|>user") <= 1 + trainer.args.history_turns


@pytest.mark.slow
def test_step_layout_rows_carry_their_turns_gigpo_advantage(step_run):
    trainer, _, batches = step_run
    output, trajectories = batches[0]["output"], batches[0]["trajectories"]
    expected = expected_gigpo(trajectories, trainer.args)
    assert np.abs(expected).max() > 0
    mask = (output["tool_mask"] * output["completion_mask"]).bool()
    for row, value in enumerate(expected):
        np.testing.assert_allclose(output["advantages"][row][mask[row]].numpy(), value, rtol=1e-5, atol=1e-6)
    assert not output["advantages"][len(expected) :].any()


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["trajectory", "step"])
@pytest.mark.parametrize("estimator", ["grpo", "rloo", "step_reinforce"])
def test_every_estimator_trains_in_both_layouts_with_its_own_advantages(tiny, tmp_path, estimator, layout):
    """2 optimizer steps of each estimator (GiGPO has its own runs above): the loss sees, on every
    reply token, the estimator's advantage of that turn."""
    from envhub_trl.estimators import TurnBatch, estimate

    config = _config(tmp_path, advantage_estimator=estimator, sample_layout=layout, max_turns=5, format_penalty=-0.1, step_reward_gamma=0.9)
    trainer, before, batches = spied_run(tiny, config)
    assert trainer.state.global_step == 2
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    for spied in batches:
        trajectories = spied["trajectories"]
        for i, t in enumerate(trajectories):
            t.group_id = i // config.num_generations
        expected = estimate(estimator, TurnBatch.from_trajectories(trajectories), config.estimator_settings())["advantages"]
        output = spied["output"]
        mask = (output["tool_mask"] * output["completion_mask"]).bool()
        turns = [(i, turn) for i, t in enumerate(trajectories) for turn in t.turns]
        seen = []
        if layout == "step":
            for row, _ in enumerate(turns):
                seen.append(float(output["advantages"][row][mask[row]].mean()))
        else:
            for row, t in enumerate(trajectories):
                spans = np.asarray(t.sample().turn_ids)[np.asarray(t.sample().env_mask, dtype=bool)]
                values = output["advantages"][row][mask[row]].numpy()
                seen += [float(values[spans == k].mean()) for k in range(t.num_turns)]
        np.testing.assert_allclose(seen, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["trajectory", "step"])
def test_reinforce_plus_plus_trains_on_kl_shaped_token_returns_against_a_frozen_reference(tiny, tmp_path, layout):
    """REINFORCE++ runs after the score stage: its reference is the policy as RL started, frozen;
    on the first batch policy and reference agree (KL 0), so each model token's advantage is its
    episode's reward-to-go whitened over every model token of the batch; later the KL is not 0."""
    config = _config(tmp_path, advantage_estimator="reinforce++", sample_layout=layout, max_turns=5, format_penalty=-0.1, kl_coef=0.05)
    trainer, before, batches = spied_run(tiny, config)
    assert trainer.state.global_step == 2
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    assert all(torch.equal(before[k], v) for k, v in trainer._reference.state_dict().items())

    output, trajectories = batches[0]["output"], batches[0]["trajectories"]
    expected = []
    for t in trajectories:
        samples = [t.sample()] if layout == "trajectory" else t.step_samples()
        model_turns = np.concatenate([np.asarray(s.turn_ids)[np.asarray(s.env_mask, dtype=bool)] for s in samples])
        rewards = [turn.reward for turn in t.turns]
        expected += [sum(rewards[k:]) for k in model_turns]
    expected = np.asarray(expected)
    expected = (expected - expected.mean()) / (expected.std() + 1e-8)
    mask = (output["tool_mask"] * output["completion_mask"]).bool()
    seen = np.concatenate([output["advantages"][row][mask[row]].numpy() for row in range(len(mask))])
    np.testing.assert_allclose(seen, expected, rtol=1e-4, atol=1e-5)
    kls = [entry["env/kl"] for entry in trainer.state.log_history if "env/kl" in entry]
    assert len(kls) == 2 and kls[0] == pytest.approx(0.0, abs=1e-6) and kls[1] != 0.0


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["trajectory", "step"])
def test_segment_ratio_is_each_turns_geometric_mean_of_its_token_ratios(tiny, tmp_path, layout):
    """ratio_type='segment' on a real forward pass: with old log-probs that differ from the
    policy's, the ratio the loss sees on each model token, exp(lp' - old), is the geometric mean of
    the token ratios exp(lp - old) of its turn; training runs 2 steps."""
    config = _config(tmp_path, ratio_type="segment", sample_layout=layout, max_turns=4)
    trainer, _, batches = spied_run(tiny, config)
    assert trainer.state.global_step == 2
    inputs = dict(batches[-1]["output"])
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, width)[0]
        inputs["old_per_token_logps"] = logps + 0.3 * torch.randn(logps.shape, generator=torch.Generator().manual_seed(0))
        trainer._loss_inputs = inputs
        try:
            segment = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, width)[0]
        finally:
            trainer._loss_inputs = None
    mask = (inputs["tool_mask"] * inputs["completion_mask"]).bool()
    token_ratio = torch.exp(logps - inputs["old_per_token_logps"])
    ratio = torch.exp(segment - inputs["old_per_token_logps"])
    checked = 0
    for row in range(mask.shape[0]):
        for turn in inputs["turn_ids"][row][mask[row]].unique():
            where = mask[row] & (inputs["turn_ids"][row] == turn)
            geometric = torch.exp(torch.log(token_ratio[row][where]).mean())
            torch.testing.assert_close(ratio[row][where], geometric.expand(int(where.sum())), rtol=1e-5, atol=1e-6)
            checked += 1
    assert checked >= 2
    assert not torch.allclose(ratio[mask], token_ratio[mask])
    with pytest.raises(ValueError, match="ratio_type"):
        _config(tmp_path, ratio_type="turn")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        _config(tmp_path, ratio_type="segment", importance_sampling_level="sequence")


@pytest.mark.slow
def test_share_prompt_forward_trains_on_the_log_probs_of_one_forward_per_row(tiny, tmp_path):
    """share_prompt_forward in a real run (step layout, no history, so prompts repeat): the loss's
    log-probs are those of TRL's one forward per row, and the log says how many rows each prompt
    pass served."""
    config = _config(tmp_path, share_prompt_forward=True, gradient_checkpointing=False, sample_layout="step", history_turns=0, max_turns=5, format_penalty=-0.1)
    trainer, before, batches = spied_run(tiny, config)
    assert trainer.state.global_step == 2
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    shared = [entry["perf/rows_per_prompt_forward"] for entry in trainer.state.log_history if "perf/rows_per_prompt_forward" in entry]
    assert shared and all(value > 1.0 for value in shared)
    inputs = batches[-1]["output"]
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        once = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, width, compute_entropy=True)
        trainer.args.share_prompt_forward = False
        whole = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, width, compute_entropy=True)
    mask = inputs["completion_mask"].bool()
    torch.testing.assert_close(once[0][mask], whole[0][mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(once[1][mask], whole[1][mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "settings",
    [
        {"advantage_estimator": "gigpo"},
        pytest.param({"advantage_estimator": "ppo", "action_entropy_coef": 0.1, "share_prompt_forward": True}, marks=pytest.mark.slow),
    ],
    ids=["gigpo", "ppo-choices-shared"],
)
def test_max_forward_tokens_trains_on_the_gradient_of_one_pass(tiny, tmp_path, settings):
    """max_forward_tokens in a real run (step layout): the loss runs its micro-batch in chunks, logged,
    and on the last batch its gradient is that of one forward and backward over the whole batch
    (PPO's critic and the choices' entropies read hidden states: those chunks keep them too)."""
    config = _config(
        tmp_path, max_forward_tokens=256, gradient_checkpointing=False, sample_layout="step", history_turns=1, max_turns=5,
        format_penalty=-0.1, **settings,
    )
    trainer, before, batches = spied_run(tiny, config)
    assert trainer.state.global_step == 2
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    chunks = [entry["perf/loss_forward_chunks"] for entry in trainer.state.log_history if "perf/loss_forward_chunks" in entry]
    assert chunks and all(value > 1.0 for value in chunks)
    inputs = batches[-1]["output"]
    trainer.model.train()
    grads = {}
    for chunked in (False, True):
        trainer.model.zero_grad()
        if trainer.value_head is not None:
            trainer.value_head.zero_grad()
        with trainer.loss_in_chunks(trainer.model) if chunked else contextlib.nullcontext():
            trainer.compute_loss(trainer.model, inputs).backward()
        params = [*trainer.model.named_parameters(), *(trainer.value_head.named_parameters() if trainer.value_head is not None else [])]
        grads[chunked] = {name: p.grad.clone() for name, p in params if p.grad is not None}
    assert grads[True].keys() == grads[False].keys() and len(grads[True]) > 0
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_share_prompt_forward_gives_ppos_values_and_the_choice_entropies_of_one_forward_per_row(tiny, tmp_path):
    """PPO with action_entropy_coef and share_prompt_forward trains; on its last batch the hidden
    states read off the second pass (the last prompt token on) give the critic's values and the
    choices' entropies that one forward pass per row gives."""
    from envhub_trl.critic import captured_hidden_states, read_values
    from envhub_trl.loss_inputs import choice_entropies

    config = _config(
        tmp_path, share_prompt_forward=True, gradient_checkpointing=False, sample_layout="step", history_turns=0, max_turns=5,
        format_penalty=-0.1, advantage_estimator="ppo", action_entropy_coef=0.1,
    )
    trainer, _, batches = spied_run(tiny, config)
    assert trainer.state.global_step == 2
    logged = [entry for entry in trainer.state.log_history if "policy/action_entropy" in entry]
    assert logged and all("critic/value_loss" in entry for entry in logged)
    inputs = batches[-1]["output"]
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    head = trainer.model.get_output_embeddings()
    read = {}
    for shared in (True, False):
        trainer.args.share_prompt_forward = shared
        with torch.no_grad(), captured_hidden_states(trainer.model) as hidden:
            trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, inputs["completion_ids"].shape[1])
        states = trainer.sequence_states(hidden)
        entropy, points = choice_entropies(head, states, inputs, trainer.temperature)
        read[shared] = (entropy[points], read_values(trainer.value_head, states, inputs["value_positions"])[inputs["value_mask"].bool()])
    assert len(read[True][0]) > 0 and len(read[True][1]) > 0
    torch.testing.assert_close(read[True][0], read[False][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(read[True][1], read[False][1], rtol=1e-5, atol=1e-5)


def test_eval_env_id_plays_the_held_out_evaluation_on_another_env(tiny, tmp_path):
    """eval_env_id: training plays its env, every held-out evaluation (model or reference policy)
    the named one, with the run's prompt settings; the checkpoint record says so; a mix, kwargs
    without an id and an unknown id are refused."""
    from envhub.generation import RandomGenerator
    from transformers import AutoModelForCausalLM

    from envhub_trl.trainer import EnvGRPOTrainer

    class Seen(RandomGenerator):
        def generate(self, prompts, sampling):
            self.texts = getattr(self, "texts", []) + [self.tokenizer.decode(p.token_ids) for p in prompts]
            return super().generate(prompts, sampling)

    config = _config(tmp_path, eval_env_id="sokoban/Sokoban-v0", eval_env_kwargs={"view": "local"}, eval_episodes=3)
    assert config.env_settings().env_id == "frozenlake/FrozenLakeNotSlippery-v0"
    held_out = config.held_out_settings()
    assert (held_out.env_id, held_out.env_kwargs, held_out.max_turns) == ("sokoban/Sokoban-v0", {"view": "local"}, config.max_turns)
    assert held_out.prompt == config.env_settings().prompt
    assert config.trained_on().held_out["env_id"] == "sokoban/Sokoban-v0"
    assert "env_id" not in _config(tmp_path).trained_on().held_out  # an older record still matches
    path, tokenizer = tiny
    trainer = EnvGRPOTrainer(AutoModelForCausalLM.from_pretrained(path), config, processing_class=tokenizer)
    seen = Seen(seed=0, tokenizer=tokenizer)
    metrics = trainer.evaluate_env(generator=seen)
    assert 0.0 <= metrics["success_rate"] <= 1.0
    firsts = [text for text in seen.texts if "box" in text.lower()]
    assert seen.texts and len(firsts) == len(seen.texts)  # every prompt is Sokoban's
    with pytest.raises(ValueError, match="eval_env_id"):
        _config(tmp_path, eval_env_kwargs={"view": "local"})
    with pytest.raises(ValueError, match="eval_env_id"):
        _config(tmp_path, eval_env_id="sokoban/Sokoban-v0", env_id=None, envs={"frozenlake/FrozenLakeNotSlippery-v0": {"groups_per_step": 1}, "sokoban/Sokoban-v0": {"groups_per_step": 1}})
    with pytest.raises(Exception, match="Sokobann"):
        EnvGRPOTrainer(AutoModelForCausalLM.from_pretrained(path), _config(tmp_path, eval_env_id="sokoban/Sokobann-v0"), processing_class=tokenizer)


@pytest.fixture(scope="module")
def ppo_runs(tiny, tmp_path_factory):
    """2-step PPO runs in both layouts (a checkpoint after each step)."""
    runs = {}
    for layout in ("trajectory", "step"):
        folder = tmp_path_factory.mktemp(f"ppo-{layout}")
        config = _config(folder, advantage_estimator="ppo", sample_layout=layout, max_turns=5, format_penalty=-0.1, save_strategy="steps", save_steps=1)
        runs[layout] = spied_run(tiny, config)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["trajectory", "step"])
def test_ppo_trains_a_value_head_and_gives_each_turn_its_whitened_gae(ppo_runs, layout):
    from envhub_trl.advantages import discounted_returns

    trainer, before, batches = ppo_runs[layout]
    assert trainer.state.global_step == 2
    assert trainer.value_head.linear.weight.abs().sum() > 0  # it starts at 0 and learned
    # First batch: every value is 0, so GAE is the (gamma lam)-discounted reward-to-go.
    output, trajectories = batches[0]["output"], batches[0]["trajectories"]
    assert not output["old_values"].any()
    turns = TurnBatch.from_trajectories(trajectories)
    raw = discounted_returns(turns.rewards, turns.traj_index, turns.step_index, 1.0 * 0.95)
    expected = (raw - raw.mean()) / (raw.std() + 1e-8)
    np.testing.assert_allclose(output["value_returns"][output["value_mask"].bool()].numpy(), raw, rtol=1e-5, atol=1e-6)
    mask = (output["tool_mask"] * output["completion_mask"]).bool()
    flat = np.concatenate([output["advantages"][row][mask[row]].numpy() for row in range(mask.shape[0])])
    per_token = []
    for t, first in zip(trajectories, np.cumsum([0] + [t.num_turns for t in trajectories])):
        samples = [t.sample()] if layout == "trajectory" else t.step_samples()
        for sample in samples:
            per_token += [expected[first + k] for k in np.asarray(sample.turn_ids)[np.asarray(sample.env_mask, dtype=bool)]]
    np.testing.assert_allclose(flat, per_token, rtol=1e-4, atol=1e-5)
    # Second batch: the values come from the trained head.
    assert batches[1]["output"]["old_values"][batches[1]["output"]["value_mask"].bool()].abs().sum() > 0
    assert any("critic/value_loss" in entry for entry in trainer.state.log_history)


@pytest.mark.slow
def test_ppo_value_loss_falls_on_a_fixed_batch(ppo_runs):
    """Gradient steps on the critic alone, through the trainer's own loss, lower the value loss."""
    trainer, _, batches = ppo_runs["trajectory"]
    inputs = batches[-1]["output"]
    trainer.model.train()
    optimizer = torch.optim.SGD(trainer.value_head.parameters(), lr=0.03)  # the critic alone; the run's schedule ended at lr 0
    clip, trainer.args.cliprange_value = trainer.args.cliprange_value, 100.0  # unclipped: old values are fixed here
    losses = []
    for _ in range(20):
        trainer.compute_loss(trainer.model, inputs).backward()
        losses.append(trainer._metrics["train"]["critic/value_loss"][-1])
        optimizer.step()
        optimizer.zero_grad()
    trainer.args.cliprange_value = clip
    # The trunk is fixed here, so the head's loss is a least-squares fit: it falls at every step,
    # down to what a linear head on these features can reach.
    assert all(later <= earlier + 1e-9 for earlier, later in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.slow
def test_ppo_critic_is_saved_with_each_checkpoint_and_resumed(ppo_runs, tiny, tmp_path):
    from safetensors.torch import load_file

    from envhub_trl.critic import VALUE_HEAD_FILE
    from envhub_trl.trainer import EnvGRPOTrainer

    trainer, _, _ = ppo_runs["trajectory"]
    checkpoint = os.path.join(trainer.args.output_dir, "checkpoint-1")
    saved = load_file(os.path.join(checkpoint, VALUE_HEAD_FILE))
    assert saved["linear.weight"].abs().sum() > 0
    path, tokenizer = tiny
    config = _config(tmp_path, advantage_estimator="ppo", max_turns=5, max_steps=1)
    resumed = EnvGRPOTrainer(str(path), config, processing_class=tokenizer)
    resumed._load_from_checkpoint(checkpoint)
    torch.testing.assert_close(resumed.value_head.linear.weight.detach().cpu(), saved["linear.weight"])


@pytest.mark.slow
def test_training_envs_can_run_in_worker_processes_with_a_deadline(tiny, tmp_path):
    config = _config(tmp_path, env_executor="process", env_workers=1, env_step_timeout=60.0)
    trainer, before, batches = spied_run(tiny, config)
    assert trainer.state.global_step == 2 and type(trainer._managers["main"][0].executor).__name__ == "ProcessPoolExecutor"
    assert trainer._managers["main"][0].executor.step_timeout == 60.0
    assert all(t.error is None for spied in batches for t in spied["trajectories"])
    trainer._managers["main"][0].close()
    with pytest.raises(ValueError, match="env_executor"):
        _config(tmp_path, env_executor="threads")


def test_config_checks_the_layout_and_the_server(tmp_path):
    with pytest.raises(ValueError, match="sample_layout"):
        _config(tmp_path, sample_layout="episode")
    with pytest.raises(ValueError, match="vllm_server_url"):
        _config(tmp_path, generator="vllm-server")
    with pytest.raises(ValueError, match="vllm-server"):
        _config(tmp_path, vllm_server_url="http://127.0.0.1:8000")
    assert _config(tmp_path, sample_layout="step", history_turns=3).env_settings().prompt.history_turns == 3


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["trajectory", "step"])
def test_two_processes_normalise_a_group_that_straddles_them(tiny, tmp_path, layout):
    """Under torchrun with two CPU processes, the loss gets the advantages of the whole batch: a group
    split between the processes is normalised as one."""
    import subprocess
    import sys
    from pathlib import Path

    path, _ = tiny
    script = Path(__file__).parent / "scripts" / "two_process_step.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), str(path), str(tmp_path), layout]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["world_size"] == 2
    episodes = ranks[0]["episodes"] + ranks[1]["episodes"]
    seeds = [e["seed"] for e in episodes]
    assert len(episodes) == 12 and seeds[4:8] == [seeds[4]] * 4 and ranks[0]["episodes"][-1]["seed"] == ranks[1]["episodes"][0]["seed"]
    turns = [(i, k) for i, e in enumerate(episodes) for k in range(len(e["rewards"]))]
    expected = gigpo_advantages(
        np.array([episodes[i]["rewards"][k] for i, k in turns]),
        np.array([i for i, _ in turns]),
        np.array([k for _, k in turns]),
        np.array([i // 4 for i in range(len(episodes))]),
        np.array([episodes[i]["state_keys"][k] for i, k in turns], dtype=object),
        gamma=0.9,
    )["advantages"]
    assert np.abs(expected).max() > 0
    per_turn = dict(zip(turns, expected))
    got = ranks[0]["advantages"] + ranks[1]["advantages"]
    if layout == "trajectory":
        want = [[per_turn[i, k] for k, n in enumerate(e["lengths"]) for _ in range(n)] for i, e in enumerate(episodes)]
        assert len(got) == len(want)
    else:
        want = [[per_turn[i, k]] * episodes[i]["lengths"][k] for i, k in turns]
        local = [sum(len(e["rewards"]) for e in rank["episodes"]) for rank in ranks]
        rows = [len(rank["advantages"]) for rank in ranks]
        assert rows[0] == rows[1] >= max(local)  # both processes padded to the same number of rows
        got = ranks[0]["advantages"][: local[0]] + ranks[1]["advantages"][: local[1]]
        assert not any(row for rank, n in zip(ranks, local) for row in rank["advantages"][n:])
    for row_got, row_want in zip(got, want):
        np.testing.assert_allclose(row_got, row_want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_two_processes_train_ppo_with_one_critic_and_batch_wide_gae(tiny, tmp_path):
    """PPO under torchrun with two CPU processes: the advantages are GAE whitened over the whole
    batch (both processes' turns), and the value heads of the two processes stay identical (their
    gradients are averaged, as DDP does for the model)."""
    import subprocess
    import sys
    from pathlib import Path

    from envhub_trl.advantages import discounted_returns

    path, _ = tiny
    script = Path(__file__).parent / "scripts" / "two_process_step.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), str(path), str(tmp_path), "trajectory", "ppo"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["value_head"] == ranks[1]["value_head"]
    assert any(abs(x) > 0 for p in ranks[0]["value_head"] for x in p)
    episodes = ranks[0]["episodes"] + ranks[1]["episodes"]
    rewards = np.concatenate([e["rewards"] for e in episodes])
    traj_index = np.concatenate([[i] * len(e["rewards"]) for i, e in enumerate(episodes)])
    step_index = np.concatenate([np.arange(len(e["rewards"])) for e in episodes])
    raw = discounted_returns(rewards, traj_index, step_index, 0.95)  # the first batch's values are all 0
    expected = (raw - raw.mean()) / (raw.std() + 1e-8)
    first = np.cumsum([0] + [len(e["rewards"]) for e in episodes])
    want = [[expected[first[i] + k] for k, n in enumerate(e["lengths"]) for _ in range(n)] for i, e in enumerate(episodes)]
    got = ranks[0]["advantages"] + ranks[1]["advantages"]
    for row_got, row_want in zip(got, want, strict=True):
        np.testing.assert_allclose(row_got, row_want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------- vLLM


@pytest.fixture(scope="module")
def vllm_available():
    pytest.importorskip("vllm")


@pytest.mark.slow
def test_vllm_generator_holds_the_trained_weights_after_a_step(tiny, tmp_path, vllm_available):
    """After an optimizer step the in-process engine samples with the new weights, not the initial ones.

    Weight decay (halving the decayed weights) makes the step move the weights even when every reply
    of the random tiny model is invalid (all advantages 0).
    """
    from transformers import AutoModelForCausalLM

    from envhub_trl.generators import VLLMGenerator
    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = tiny
    model = AutoModelForCausalLM.from_pretrained(path)
    initial = AutoModelForCausalLM.from_pretrained(path)
    config = _config(
        tmp_path, generator="vllm", max_steps=1, max_turns=2, learning_rate=0.5, weight_decay=1.0,
        generator_kwargs={"gpu_memory_utilization": 0.1, "max_model_len": 2048, "dtype": "float32", "enforce_eager": True},
    )
    trainer = EnvGRPOTrainer(model, config, processing_class=tokenizer)
    trainer.train()
    engine = trainer.generator
    assert isinstance(engine, VLLMGenerator)
    prompt = EnvGroupManager(LAKE, 1, 1, tokenizer=tokenizer).__enter__()
    prompt.reset(seeds=[0])
    ids = prompt.prompts()[0].token_ids
    completion = engine.generate([Prompt(ids, [])], SamplingParams(max_new_tokens=6, temperature=0.0))[0]

    def logprobs(m):
        with torch.no_grad():
            logits = m(torch.tensor([ids + completion.token_ids])).logits[0, len(ids) - 1 : -1]
        return logits.log_softmax(-1).gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1).numpy()

    trained, old = logprobs(trainer.model.eval()), logprobs(initial.eval())
    sampled = np.array(completion.logprobs)
    np.testing.assert_allclose(sampled, trained, atol=1e-2)
    assert np.abs(sampled - old).max() > 10 * np.abs(sampled - trained).max()


def test_a_generator_with_its_own_weights_gets_them_after_a_warm_start(tiny, tmp_path):
    """A vLLM-like generator keeps its own copy of the weights; weights changed outside train()
    (the warm start) must reach it before it samples again (they did not: held-out success after
    the warm start was measured with the initial weights)."""
    from transformers import AutoModelForCausalLM

    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = tiny

    class OwnWeights(HalfExpert):
        loads = 0

        def load_weights(self, model):
            OwnWeights.loads += 1

    model = AutoModelForCausalLM.from_pretrained(path)
    trainer = EnvGRPOTrainer(model, _config(tmp_path), processing_class=tokenizer, generator=OwnWeights(model, tokenizer))
    _ = trainer.generator
    _ = trainer.generator
    assert OwnWeights.loads == 1  # once per optimizer step, not per use
    trainer.weights_changed()
    _ = trainer.generator
    assert OwnWeights.loads == 2


# ---------------------------------------------------------------------------------------- CLI


@pytest.mark.slow
def test_train_command_reports_before_and_after_and_draws_the_curve(tmp_path):
    from envhub.cli import cli

    config = tmp_path / "run.yaml"
    config.write_text(
        "max_turns: 8\ngroups_per_step: 2\ngroup_size: 2\nper_device_train_batch_size: 4\nmax_steps: 1\n"
        "max_turn_tokens: 6\neval_episodes: 64\neval_sampled: true\nuse_cpu: true\nsave_strategy: 'no'\nlogging_steps: 1\ndisable_tqdm: true\n"
        "instructions: Move P to G.\nwarm_start: {steps: 500, episodes: 4, epsilon: 0.5, learning_rate: '1e-3'}\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["train", "--env", LAKE, "--algo", "grpo", "--config", str(config), "--output-dir", str(out), "--warm-start-steps", "2",
              "--eval-episodes", "4"],
    )
    assert result.exit_code == 0, result.output
    # The config file's warm start, with the flag's step count over its own.
    assert "warm start: 2 supervised steps on 4 expert episodes, the expert taking a random move with probability 0.5" in result.output
    assert "held-out, after RL, greedy" in result.stderr  # each evaluation's progress bar, on stderr
    for stage in ("initial model", "after warm start (SFT)", "after RL"):
        assert stage in result.output
    assert (out / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "final" / "config.json").is_file()
    results = json.loads((out / "results.json").read_text())
    assert results["advantage_estimator"] == "grpo" and results["held_out_episodes"] == 4
    assert results["warm_start"] == {
        "demonstrator": "expert", "mapping_share": 1.0, "world_model": False,  # which demonstrator ran (a format-only start says random)
        "steps": 2, "episodes": 4, "learning_rate": 1e-3, "batch_size": 16, "epsilon": 0.5,
        "dagger_rounds": 0, "dagger_episodes": 64, "dagger_steps": 100, "dagger_temperature": 1.0,
        "lr_schedule": "constant", "warmup_steps": 0, "max_grad_norm": 0.0,
    }
    assert set(results["evaluations"]) == {"initial model", "after warm start (SFT)", "after RL"}
    references = results["references"]
    assert list(references) == ["random policy", "open-loop", "expert", "optimal"]
    assert references["expert"] == 1.0 and 0.0 <= references["random policy"] < 1.0  # the expert wins every map in 8 turns
    assert results["open_loop_exhaustive"] is True and 1 <= len(results["open_loop_actions"]) <= 8
    rows = [line.split() for line in result.output.splitlines()]
    assert ["random", "policy", f"{references['random policy']:.1%}", f"{references['random policy']:.1%}", "-", "-", "-"] in rows
    assert ["open-loop", f"{references['open-loop']:.1%}", f"{references['open-loop']:.1%}", "-", "-", "-"] in rows
    after_rl = results["evaluations"]["after RL"]
    gain = {mode: after_rl[mode]["success_rate"] - references["open-loop"] for mode in ("greedy", "sampled")}
    assert results["gain_over_open_loop"] == pytest.approx(gain)
    assert (
        f"learned policy over the best open-loop policy ({references['open-loop']:.1%}): "
        f"{gain['greedy'] * 100:+.1f} points greedy, {gain['sampled'] * 100:+.1f} points sampled"
    ) in result.output


@pytest.mark.slow
def test_train_command_evaluates_every_eval_steps(tmp_path):
    from envhub.cli import cli

    config = tmp_path / "run.yaml"
    config.write_text(
        "max_turns: 4\ngroups_per_step: 2\ngroup_size: 2\nper_device_train_batch_size: 4\nmax_steps: 3\neval_steps: 1\n"
        "max_turn_tokens: 6\neval_episodes: 2\nsave_strategy: 'no'\nlogging_steps: 1\ndisable_tqdm: true\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["train", "--env", LAKE, "--config", str(config), "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    curve = json.loads((out / "results.json").read_text())["held_out_curve"]
    assert [p["step"] for p in curve] == [1, 2] and all(0.0 <= p["greedy"] <= 1.0 for p in curve)
    assert "held-out success at step 2:" in result.stderr


def test_train_command_rejects_unknown_config_fields(tmp_path):
    from envhub.cli import cli

    config = tmp_path / "bad.yaml"
    config.write_text("groups_per_stepp: 2\n")
    result = CliRunner().invoke(cli, ["train", "--config", str(config), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code != 0
    assert "groups_per_stepp" in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_steps: 'two'", "max_steps must be an integer, got 'two'"),
        ("group_size: 4.5", "group_size must be an integer or null, got 4.5"),
        ("use_cpu: maybe", "use_cpu must be true or false, got 'maybe'"),
        ("max_steps: [1\n", "not valid YAML at line 2"),
        ("- 1\n- 2", "must hold a mapping of config fields, got list"),
    ],
)
def test_a_bad_config_file_is_named_by_field_and_type_before_anything_loads(tmp_path, text, message):
    from envhub.cli import cli

    config = tmp_path / "bad.yaml"
    config.write_text(text)
    result = CliRunner().invoke(cli, ["train", "--config", str(config), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_config_values_are_converted_and_overridden_hydra_style(tmp_path):
    from envhub.cli import cli
    from envhub_trl.run import load_config_file

    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 1e-4\ngroup_size: '4'\nwarm_start: {steps: 5}\n")
    values = load_config_file(str(config), ["max_steps=200", "warm_start.epsilon=0.1", "instructions=Go east"])
    assert values == {
        "learning_rate": 1e-4, "group_size": 4, "max_steps": 200, "warm_start": {"steps": 5, "epsilon": 0.1}, "instructions": "Go east",
    }
    assert isinstance(values["learning_rate"], float)
    result = CliRunner().invoke(cli, ["train", "--config", str(config), "--output-dir", str(tmp_path / "out"), "learning_rate=fast"])
    assert result.exit_code == 1 and "learning_rate must be a number, got 'fast'" in result.output


def test_an_override_of_a_string_field_keeps_its_word_where_yaml_would_read_a_boolean(tmp_path):
    from envhub_trl.run import load_config_file

    values = load_config_file(None, ["save_strategy=no", "eval_strategy=no", "use_cpu=true", "bf16=no"])
    assert values == {"save_strategy": "no", "eval_strategy": "no", "use_cpu": True, "bf16": False}
    config = tmp_path / "run.yaml"
    config.write_text("save_strategy: no\n")  # a file is YAML: unquoted, the word is a boolean; the error says so
    with pytest.raises(click.ClickException, match="save_strategy must be .* got False .*quote the word"):
        load_config_file(str(config))


@pytest.mark.parametrize(
    ("warm_start", "message"),
    [
        ("{stepz: 3}", "unknown warm_start key 'stepz' (did you mean steps?)"),
        ("{steps: two}", "warm_start.steps must be a number, got 'two'"),
        ("{steps: 2.5}", "warm_start.steps must be an integer, got 2.5"),
        ("{epsilon: 2}", "warm_start.epsilon is a probability"),
        ("200", "warm_start must be a mapping"),
    ],
)
def test_train_command_names_a_bad_warm_start_before_loading_anything(tmp_path, warm_start, message):
    from envhub.cli import cli

    config = tmp_path / "bad.yaml"
    config.write_text(f"warm_start: {warm_start}\n")
    result = CliRunner().invoke(cli, ["train", "--config", str(config), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert f"Error: {config}: {message}" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_noisy_demonstrations_are_played_but_only_the_experts_moves_imitated(tmp_path):
    from envhub_trl.tiny import build_model, build_tokenizer, environment_corpus
    from envhub_trl.warm_start import WarmStart, expert_samples

    tokenizer = build_tokenizer(environment_corpus([LAKE]))
    settings = _config(tmp_path, max_turns=8).env_settings()
    samples = expert_samples(tokenizer, settings, range(24), epsilon=0.5, seed=3)
    # The same episodes, played again: the noise is seeded.
    manager = EnvGroupManager.from_settings(settings, 24, 1, tokenizer=tokenizer)
    trajectories = rollout(manager, ExpertGenerator(tokenizer, epsilon=0.5, seed=3), SamplingParams(), seeds=list(range(24)))
    noisy_turns = [turn for t in trajectories for turn in t.turns if turn.action != turn.expert_action]
    assert noisy_turns and all(turn.expert_action is not None for t in trajectories for turn in t.turns)
    kept = {(s.trajectory_index, turn) for s in samples for m, turn in zip(s.env_mask, s.turn_ids) if m}
    for t in trajectories:
        for turn in t.turns:
            assert ((t.index, turn.index) in kept) == (turn.action == turn.expert_action)
    assert all(len(s.env_mask) == len(s.turn_ids) for s in samples)
    # Clean demonstrations keep every reply.
    clean = expert_samples(tokenizer, settings, range(4))
    played = rollout(EnvGroupManager.from_settings(settings, 4, 1, tokenizer=tokenizer), ExpertGenerator(tokenizer), seeds=list(range(4)))
    assert [sum(s.env_mask) for s in clean] == [sum(len(turn.completion_ids) for turn in t.turns) for t in played]
    model = build_model(tokenizer, seed=0)
    losses = WarmStart(steps=30, episodes=24, epsilon=0.5).run(model, tokenizer, settings, seed=3)
    assert len(losses) == 30 and losses[-1] < losses[0]


def test_a_random_demonstrator_is_imitated_in_full_and_teaches_the_format_only(tmp_path):
    """warm_start.demonstrator: random: a uniformly random legal mover, seeded, every move imitated
    (no expert is consulted), so a warm start on it learns the reply format and nothing of the task."""
    from envhub.generation import RandomGenerator
    from envhub_trl.tiny import build_tokenizer, environment_corpus
    from envhub_trl.warm_start import WarmStart, expert_samples

    tokenizer = build_tokenizer(environment_corpus([LAKE]))
    settings = _config(tmp_path, max_turns=8).env_settings()
    samples = expert_samples(tokenizer, settings, range(16), seed=5, demonstrator="random")
    played = rollout(EnvGroupManager.from_settings(settings, 16, 1, tokenizer=tokenizer), RandomGenerator(5, tokenizer), seeds=list(range(16)))
    # Every reply of the random mover's episodes is imitated, and they are its moves, not the expert's.
    assert [sum(s.env_mask) for s in samples] == [sum(len(turn.completion_ids) for turn in t.turns) for t in played]
    moves = [turn.action for t in played for turn in t.turns]
    assert len(set(moves)) == 4
    assert samples == expert_samples(tokenizer, settings, range(16), seed=5, demonstrator="random")  # seeded
    warm = WarmStart.from_mapping({"demonstrator": "random", "steps": 2, "episodes": 16})
    assert warm.demonstrator == "random" and "random-mover (format-only) episodes" in warm.describe()
    # random-mapping: the same moves whenever the same prompt comes back, every move imitated.
    from envhub.generation import RandomMappingGenerator

    mapped = expert_samples(tokenizer, settings, range(16), seed=5, demonstrator="random-mapping")
    played = rollout(EnvGroupManager.from_settings(settings, 16, 1, tokenizer=tokenizer), RandomMappingGenerator(5, tokenizer), seeds=list(range(16)))
    assert [sum(s.env_mask) for s in mapped] == [sum(len(turn.completion_ids) for turn in t.turns) for t in played]
    assert len({turn.action for t in played for turn in t.turns}) > 1
    with pytest.raises(ValueError, match="demonstrator must be one of"):
        WarmStart.from_mapping({"demonstrator": "oracle"})


@pytest.mark.parametrize("layout", ["step", "trajectory"])
def test_a_world_model_warm_start_learns_the_observation_each_move_led_to(tmp_path, layout):
    """warm_start.world_model: besides the imitated replies, samples whose loss is on what the env
    answered each move (the next observation), the move itself out of that loss."""
    from envhub.generation import RandomGenerator
    from envhub_trl.tiny import build_model, build_tokenizer, environment_corpus
    from envhub_trl.warm_start import WarmStart, expert_samples

    tokenizer = build_tokenizer(environment_corpus([LAKE]))
    settings = _config(tmp_path, max_turns=8, sample_layout=layout).env_settings()
    plain = expert_samples(tokenizer, settings, range(8), seed=5, demonstrator="random")
    both = expert_samples(tokenizer, settings, range(8), seed=5, demonstrator="random", world_model=True)
    assert both[: len(plain)] == plain
    world = both[len(plain) :]
    played = rollout(EnvGroupManager.from_settings(settings, 8, 1, tokenizer=tokenizer), RandomGenerator(5, tokenizer), seeds=list(range(8)))
    if layout == "step":
        pairs = [(turn, after) for t in played for turn, after in zip(t.turns, t.turns[1:])]
        assert len(world) == len(pairs) > 8
        for sample, (turn, after) in zip(world, pairs):
            following = tokenizer.encode(after.observation, add_special_tokens=False)
            assert sample.prompt_ids == list(turn.input_ids)
            assert sample.completion_ids == list(turn.completion_ids) + following
            assert sample.env_mask == [0] * len(turn.completion_ids) + [1] * len(following)
    else:
        for sample, t in zip(world, [t for t in played if t.num_turns > 1]):
            whole = t.sample()
            assert sample.completion_ids == whole.completion_ids
            trained = [token for token, m in zip(sample.completion_ids, sample.env_mask) if m]
            between = [token for k, (token, m) in enumerate(zip(whole.completion_ids, whole.env_mask)) if not m and k > whole.env_mask.index(1)]
            assert trained == between and trained  # the env's tokens after the first reply, no reply token
    warm = WarmStart.from_mapping({"demonstrator": "random", "world_model": True, "steps": 3, "episodes": 8})
    assert "the observation each move led to" in warm.describe()
    assert len(warm.run(build_model(tokenizer, seed=0), tokenizer, settings, seed=5)) == 3
    with pytest.raises(ValueError, match="world_model must be true or false"):
        WarmStart.from_mapping({"world_model": "yes"})


def test_dagger_labels_every_state_the_student_visits_with_the_experts_reply(tmp_path):
    """On-policy relabelling: the student (here a random player) plays, and each prompt it answered
    becomes a sample of that exact context with the expert's reply, token for token as a
    demonstration's; a DAgger round then trains on the demonstrations and those labels."""
    from envhub.generation import RandomGenerator
    from envhub_trl.tiny import build_model, build_tokenizer, environment_corpus
    from envhub_trl.warm_start import WarmStart, expert_samples, relabelled_samples

    tokenizer = build_tokenizer(environment_corpus([LAKE]))
    settings = _config(tmp_path, max_turns=8).env_settings()
    samples, trajectories = relabelled_samples(RandomGenerator(seed=1, tokenizer=tokenizer), tokenizer, settings, range(12))
    # Lockstep play asks for every running episode's reply once a turn, in episode order.
    turns = sorted((turn for t in trajectories for turn in t.turns), key=lambda turn: turn.index)
    assert len(samples) == len(turns) > 12  # one label per reply the student made
    assert any(turn.action != turn.expert_action for turn in turns)  # the random student strays from the expert
    expert_reply = {}
    for demo in expert_samples(tokenizer, settings, range(12)):
        first = demo.completion_ids[: demo.turn_ids.count(0)]
        expert_reply[tuple(demo.prompt_ids)] = [t for t, m in zip(first, demo.env_mask) if m]
    for sample, turn in zip(samples, turns):
        assert sample.env_mask == [1] * len(sample.completion_ids)
        assert tokenizer.decode(sample.completion_ids).startswith(f"<answer>{turn.expert_action}</answer>")
        # The context is exactly what the student was shown: the whole conversation so far.
        assert tokenizer.decode(sample.prompt_ids).endswith(turn.user + "<|im_end|>\n<|im_start|>assistant\n")
        if turn.index == 0:  # the first turn's context and label are the demonstration's
            assert sample.completion_ids == expert_reply[tuple(sample.prompt_ids)]
    rounds = []
    model = build_model(tokenizer, seed=0)
    warm = WarmStart(steps=3, episodes=4, dagger_rounds=2, dagger_episodes=4, dagger_steps=2)
    losses = warm.run_on(model, tokenizer, [settings.replace(max_turn_tokens=8)], seed=3, on_round=lambda r, played: rounds.append((r, len(played))))
    assert len(losses) == 3 + 2 * 2 and rounds == [(0, 4), (1, 4)]
    assert "then 2 DAgger rounds of 4 episodes played by the model and labelled by the expert, 2 steps each" in warm.describe()
    with pytest.raises(ValueError, match="dagger_episodes >= 1"):
        WarmStart(dagger_episodes=0)



# ---------------------------------------------------------------------------------------- prompt settings


def test_show_turns_reaches_the_manager_and_the_checkpoints_settings(tmp_path):
    from envhub.prompts import PromptSettings
    from envhub.settings import TrainedOn

    config = _config(tmp_path, show_turns=False)
    assert config.prompt_settings().show_turns is False and config.env_settings().prompt.show_turns is False
    TrainedOn({LAKE: config.env_settings()}).save(tmp_path)
    assert TrainedOn.load(tmp_path).for_env(LAKE).prompt.show_turns is False
    # A checkpoint saved before the setting existed shows the count, as it was trained.
    (tmp_path / "envhub.json").write_text(json.dumps({"prompt_settings": {"history_turns": 2}, "env": {"id": LAKE}}))
    assert TrainedOn.load(tmp_path).for_env(LAKE).prompt.show_turns is True and PromptSettings().show_turns is True


def test_config_picks_the_cpu_and_fp32_when_it_says_nothing_of_the_device(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the defaults then pick it")
    config = EnvGRPOConfig(output_dir=str(tmp_path), report_to="none")
    assert config.use_cpu and not config.bf16


def test_eval_renders_exactly_the_first_prompt_training_rendered(tiny, tmp_path, monkeypatch):
    """A checkpoint carries its prompt settings and env settings (envhub.json); envhub eval loads
    them, so the model meets the prompts it trained on, and a flag that overrides one says so."""
    from transformers import AutoModelForCausalLM

    import click

    from envhub.manager import group_seeds
    from envhub.prompts import PromptSettings
    from envhub.settings import TrainedOn
    from envhub_trl import evaluation, plugin
    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = tiny
    config = _config(
        tmp_path / "run", instructions="Reach the goal.", show_legal_actions=False, max_prompt_tokens=900,
        env_kwargs={"view": "local"}, max_turns=5, format_penalty=-0.2, system_prompt="Be brief.",
    )
    trainer = EnvGRPOTrainer(AutoModelForCausalLM.from_pretrained(path), config, processing_class=tokenizer)
    trainer.save_model(str(tmp_path / "final"))
    trained = TrainedOn.load(tmp_path / "final").first
    assert trained.prompt == PromptSettings("Reach the goal.", "Be brief.", None, False, 900, 2, -0.2)  # None: each env its own format
    assert (trained.env_id, trained.env_kwargs, trained.max_turns) == (LAKE, {"view": "local"}, 5)
    assert trained.max_turn_tokens == config.max_turn_tokens == 8
    assert trained == config.env_settings()

    seed = group_seeds(0, 0, 1)[0]
    training = EnvGroupManager.from_settings(config.env_settings(), 1, 1, tokenizer=tokenizer)
    training.reset(seeds=[seed])
    expected = training.prompts()[0]

    seen = []

    class Recording(EnvGroupManager):
        def prompts(self):
            prompts = super().prompts()
            seen.append(prompts)
            return prompts

    monkeypatch.setattr(evaluation, "EnvGroupManager", Recording)
    cli = click.Group("envhub")
    plugin.register_commands(cli=cli)
    args = ["eval", LAKE, "--model", str(tmp_path / "final"), "--episodes", "1", "--no-references"]
    sampled = []
    monkeypatch.setattr(evaluation, "rollout", lambda manager, generator, sampling, **kw: sampled.append(sampling) or rollout(manager, generator, sampling, **kw))
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert seen[0][0].token_ids == expected.token_ids
    assert sampled[0].max_new_tokens == 8  # the reply budget it trained with
    from envhub_trl.policy import load_model_player

    assert load_model_player(str(tmp_path / "final"), LAKE).sampling.max_new_tokens == 8  # envhub run --policy PATH too
    assert load_model_player(str(tmp_path / "final"), LAKE).manager(LAKE).layout == trained.layout == "trajectory"
    from envhub.settings import SETTINGS_FILE

    body = json.loads((tmp_path / "final" / SETTINGS_FILE).read_text())
    (tmp_path / "final" / SETTINGS_FILE).write_text(json.dumps({**body, "layout": "step"}))
    assert load_model_player(str(tmp_path / "final"), LAKE).manager(LAKE).layout == "step"  # a step-layout run plays one turn a prompt
    text = tokenizer.decode(seen[0][0].token_ids)
    assert "Row 1, column 1." in text and "system\nBe brief.\n\nReach the goal." in text and "Legal actions" not in text
    assert "instead of the trained" not in result.output

    result = CliRunner().invoke(cli, [*args, "--max-prompt-tokens", "700", "--max-turns", "3", "--max-new-tokens", "4"])  # the old flag still works
    assert result.exit_code == 0, result.output
    assert "max_turn_tokens: 4 instead of the trained 8" in result.output and sampled[-1].max_new_tokens == 4
    assert "max_prompt_tokens: 700 instead of the trained 900" in result.output
    assert "max_turns: 3 instead of the trained 5" in result.output


@pytest.mark.slow
def test_eval_repeats_the_runs_final_held_out_figure(tmp_path, monkeypatch):
    """`envhub eval --model OUT/final` plays the run's held-out evaluation again: its seeds, its end
    after invalid replies in a row, its generator and prompts, so the figures are the run's."""
    from envhub.cli import cli
    from envhub.settings import TrainedOn

    config = tmp_path / "run.yaml"
    config.write_text(
        "max_turns: 6\ngroups_per_step: 2\ngroup_size: 2\nper_device_train_batch_size: 4\nmax_steps: 1\n"
        "max_turn_tokens: 6\neval_episodes: 6\neval_seed_offset: 2000000000\neval_max_invalid_streak: 2\n"
        "save_strategy: 'no'\nlogging_steps: 1\ndisable_tqdm: true\nsample_layout: step\n"
    )
    out = tmp_path / "out"
    trained = CliRunner().invoke(cli, ["train", "--env", LAKE, "--config", str(config), "--output-dir", str(out), "--warm-start-steps", "3"])
    assert trained.exit_code == 0, trained.output
    held_out = TrainedOn.load(out / "final").held_out
    assert held_out == {"seed_offset": 2_000_000_000, "episodes": 6, "max_invalid_streak": 2, "generator": "hf"}
    final = json.loads((out / "results.json").read_text())["evaluations"]["after RL"]["greedy"]

    from envhub_trl import evaluation

    played = []
    monkeypatch.setattr(evaluation, "rollout", lambda manager, *a, seeds, **kw: played.append((seeds, manager.layout)) or rollout(manager, *a, seeds=seeds, **kw))
    result = CliRunner().invoke(cli, ["eval", LAKE, "--model", str(out / "final"), "--json", "--no-references"])
    assert result.exit_code == 0, result.output
    assert "the run's held-out seeds: 6 from 2000000000" in result.stderr
    # the run's prompts: one turn a sample (a step-layout policy shown the whole episode lost 23 points)
    assert TrainedOn.load(out / "final").first.layout == "step"
    assert played == [(list(range(2_000_000_000, 2_000_000_006)), "step")]
    again = json.loads(result.stdout.strip().splitlines()[-1])
    assert again["episodes"] == 6
    assert {k: again[k] for k in ("success_rate", "invalid_action_rate", "mean_turns")} == {
        k: final[k] for k in ("success_rate", "invalid_action_rate", "mean_turns")
    }
    assert final["mean_turns"] == 2.0  # the untrained model's invalid replies: each episode ended after 2 in a row, as here


def test_trained_on_keeps_the_held_out_evaluation_and_refuses_a_bad_one(tmp_path):
    from envhub.prompts import SettingsError
    from envhub.settings import SETTINGS_FILE, EnvSettings, TrainedOn

    held_out = {"seed_offset": 7, "episodes": 3, "max_invalid_streak": None, "generator": "vllm"}
    TrainedOn({LAKE: EnvSettings(LAKE, layout="step")}, held_out=held_out).save(tmp_path)
    assert TrainedOn.load(tmp_path).held_out == held_out
    assert TrainedOn.load(tmp_path).first.layout == "step"
    body = json.loads((tmp_path / SETTINGS_FILE).read_text())
    (tmp_path / SETTINGS_FILE).write_text(json.dumps({**body, "held_out": {"seed_offset": 7}}))
    with pytest.raises(SettingsError, match="held_out must map exactly"):
        TrainedOn.load(tmp_path)
    del body["held_out"]  # a folder from before the record: eval falls back to its own seeds
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(body))
    assert TrainedOn.load(tmp_path).held_out is None


def test_pass_at_k_counts_a_seed_solved_when_any_of_its_k_episodes_is():
    """evaluate_generator(members=k): k episodes per seed, all reset with it; pass_at_k is the share
    of seeds one of them solved, and the episode metrics cover every episode."""
    from envhub.generation import ExpertGenerator, RandomGenerator
    from envhub.settings import EnvSettings
    from envhub_trl.evaluation import evaluate_generator

    seeds = list(range(40))
    lake = EnvSettings(LAKE, max_turns=8)
    expert = evaluate_generator(ExpertGenerator(), None, lake, seeds, members=3)
    assert expert["pass_at_k"] == expert["success_rate"] == 1.0  # the map expert wins every map
    one = evaluate_generator(RandomGenerator(seed=0), None, lake, seeds)
    assert "pass_at_k" not in one
    several = evaluate_generator(RandomGenerator(seed=0), None, lake, seeds, members=8)
    # pass@8 is at least the mean success, and a seed counts once however many members solve it.
    assert several["success_rate"] <= several["pass_at_k"] <= min(1.0, 8 * several["success_rate"])
    assert several["pass_at_k"] * len(seeds) == int(round(several["pass_at_k"] * len(seeds)))


def test_choice_entropies_are_the_legal_first_tokens_renormalised_entropy():
    from envhub_trl.loss_inputs import choice_entropies

    torch.manual_seed(0)
    head = torch.nn.Linear(4, 6, bias=False)
    hidden = torch.randn(2, 5, 4, requires_grad=True)
    inputs = {
        "choice_positions": torch.tensor([[1, 3], [2, 0]]),
        "choice_tokens": torch.tensor([[[0, 2, 5], [1, 4, 0]], [[3, 5, 0], [0, 0, 0]]]),
        "choice_mask": torch.tensor([[[1.0, 1, 1], [1, 1, 0]], [[1, 1, 0], [0, 0, 0]]]),
    }
    entropy, points = choice_entropies(head, hidden, inputs, temperature=0.5)
    assert points.tolist() == [[True, True], [True, False]]
    logits = head(hidden) / 0.5
    for (row, k), ids in {(0, 0): [0, 2, 5], (0, 1): [1, 4], (1, 0): [3, 5]}.items():
        p = torch.softmax(logits[row, inputs["choice_positions"][row, k], ids], -1)
        assert float(entropy[row, k].detach()) == pytest.approx(float(-(p * p.log()).sum()), rel=1e-5)
    assert float(entropy[1, 1]) == 0.0
    entropy[points].sum().backward()
    assert torch.isfinite(hidden.grad).all()
    assert hidden.grad[0, 1].abs().sum() > 0 and hidden.grad[0, 0].abs().sum() == 0  # only the choice positions
    assert head.weight.grad[[0, 1, 2, 3, 4, 5]].abs().sum(-1).gt(0).tolist() == [True, True, True, True, True, True]



def test_an_entropy_floor_pulls_only_the_choices_below_it_up_to_it():
    """``action_entropy_floor``: a choice point under the floor gets the bonus's gradient, towards
    the floor; one above it gets none; without a floor every point gets the plain entropy."""
    from envhub_trl.config import EnvGRPOConfig
    from envhub_trl.loss_inputs import entropy_bonus

    entropy = torch.tensor([0.05, 0.2, 0.9], requires_grad=True)
    bonus = entropy_bonus(entropy, 0.3)
    assert bonus.tolist() == pytest.approx([-0.25, -0.1, 0.0])
    bonus.sum().backward()
    assert entropy.grad.tolist() == [1.0, 1.0, 0.0]
    assert entropy_bonus(entropy, None) is entropy
    with pytest.raises(ValueError, match="set action_entropy_coef > 0 too"):
        EnvGRPOConfig(output_dir="unused", env_id="frozenlake/FrozenLake-v0", action_entropy_floor=0.3)
    with pytest.raises(ValueError, match="action_entropy_floor"):
        EnvGRPOConfig(output_dir="unused", env_id="frozenlake/FrozenLake-v0", action_entropy_coef=0.1, action_entropy_floor=0.0)

@pytest.mark.slow
@pytest.mark.parametrize("layout", ["trajectory", "step"])
def test_action_entropy_bonus_reads_each_turns_choice_where_its_action_begins(tiny, tmp_path, layout):
    """2 steps with ``action_entropy_coef``: every choice point sits just before the first token of
    a valid turn's action, its tokens are the four moves' first tokens, and the loss logs the
    choice's entropy (at most log 4)."""
    config = _config(tmp_path, sample_layout=layout, max_turns=5, format_penalty=-0.1, action_entropy_coef=0.1)
    trainer, _, batches = spied_run(tiny, config)
    moves = sorted({trainer.first_token(m) for m in ("Left", "Down", "Right", "Up")})
    assert len(moves) == 4
    seen = 0
    for spied in batches:
        output = spied["output"]
        sequence = torch.cat([output["prompt_ids"], output["completion_ids"]], 1)
        valid = sum(turn.action_is_valid for t in spied["trajectories"] for turn in t.turns)
        for row in range(len(sequence)):
            for k in range(output["choice_positions"].shape[1]):
                mask = output["choice_mask"][row, k].bool()
                if not mask.any():
                    continue
                seen += 1
                assert sorted(output["choice_tokens"][row, k][mask].tolist()) == moves
                assert int(sequence[row, int(output["choice_positions"][row, k]) + 1]) in moves
        assert valid > 0
    assert seen > 0
    logged = [entry["policy/action_entropy"] for entry in trainer.state.log_history if "policy/action_entropy" in entry]
    assert logged and all(0.0 < value <= np.log(4) + 1e-6 for value in logged)


# ---------------------------------------------------------------------------------------- failing envs and rewards (issue 43)

SMALL_RUN = (
    "max_turns: 3\ngroups_per_step: 4\ngroup_size: 2\nper_device_train_batch_size: 8\nmax_steps: 2\nmax_turn_tokens: 6\n"
    "num_train_seeds: 8\neval_episodes: 1\nsave_strategy: steps\nsave_steps: 2\nlogging_steps: 1\ndisable_tqdm: true\nseed: 1\n"
)


def _train(tmp_path, env_id, *overrides):
    from envhub.cli import cli
    from envhub_trl.run import TrainingRun

    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "run.yaml"
    config.write_text(SMALL_RUN)
    out = tmp_path / "out"
    command = ["train", "--env", env_id, "--model", "tiny", "--algo", "grpo", "--config", str(config), "--output-dir", str(out), *overrides]
    with pytest.MonkeyPatch.context() as patch:  # _logged reads the last step's checkpoint, which a finished run removes
        patch.setattr(TrainingRun, "drop_last_checkpoint", lambda self: None)
        return CliRunner().invoke(cli, command), out


def _logged(out, key):
    log = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    return [entry[key] for entry in log if key in entry]


def test_the_tiny_models_vocabulary_is_built_from_an_env_that_raises():
    from helper_envs import registered

    from envhub_trl.tiny import environment_corpus

    with registered("test/Failing-v0", "helper_envs:FailingEnv", max_turns=3):
        text = "".join(environment_corpus(["test/Failing-v0"], seeds=4))
    assert "Say Ok to count, Win to finish." in text  # the system message
    assert text.count("<answer>Win</answer>") == 3  # seed 0 fails at reset; 1 on its first step, after its reply


@pytest.mark.slow
def test_a_failing_env_ends_only_its_own_episodes_and_the_run_stops_past_the_threshold(tmp_path):
    """An env that raises at reset on some seeds and on the first turn on others: the tiny model's
    vocabulary is built all the same, the failed episodes are left out and logged, and the run
    trains on; with no failure allowed it stops in one line naming the env's exception."""
    from helper_envs import registered

    with registered("test/Failing-v0", "helper_envs:FailingEnv", max_turns=3):
        result, out = _train(tmp_path / "on", "test/Failing-v0", "max_env_error_rate=0.9")
        assert result.exit_code == 0, result.output
        rates = _logged(out, "env/error_rate")
        assert len(rates) == 2 and any(0 < rate < 1 for rate in rates), rates
        assert "episodes of the batch were left out of training, e.g. test/Failing-v0 (seed " in result.stderr
        assert "ConnectionError: " in result.stderr and "max_prompt_tokens" not in result.output
        assert json.loads((out / "results.json").read_text())["rl_steps"] == 2

        stopped, out = _train(tmp_path / "off", "test/Failing-v0", "max_env_error_rate=0")
    assert stopped.exit_code == 1 and "Traceback" not in stopped.output, stopped.output
    line = stopped.output.strip().splitlines()[-1]
    assert " episodes of the batch failed, more than max_env_error_rate=0 allows; e.g. test/Failing-v0 (seed " in line
    assert "ConnectionError: cannot reset: the env's server is down" in line or "ConnectionError: lost the env's server" in line
    assert not (out / "results.json").exists()


@pytest.mark.slow
def test_a_nonfinite_reward_stops_training_in_one_line_or_is_dropped_and_counted(tmp_path):
    from helper_envs import registered

    from envhub_trl.trainer import EnvGRPOTrainer

    with registered("test/NanReward-v0", "helper_envs:NanRewardEnv", max_turns=3), pytest.MonkeyPatch.context() as patch:
        patch.setattr(EnvGRPOTrainer, "_build_generator", lambda self, model: HalfExpert(model, self.processing_class))  # the expert wins: NaN
        refused, out = _train(tmp_path / "refused", "test/NanReward-v0")
        assert refused.exit_code == 1 and "Traceback" not in refused.output, refused.output
        line = refused.output.strip().splitlines()[-1]
        assert line.startswith("Error: test/NanReward-v0 gave a non-finite reward (nan) at turn 0 of episode "), line
        assert line.endswith("or set nonfinite_rewards: drop to leave such episodes out of training"), line
        dropped, out = _train(tmp_path / "dropped", "test/NanReward-v0", "nonfinite_rewards=drop", "max_env_error_rate=1")
    assert dropped.exit_code == 0, dropped.output
    counts = _logged(out, "env/nonfinite_reward_episodes")
    assert len(counts) == 2 and all(count > 0 for count in counts), counts
    assert all(np.isfinite(loss) for loss in _logged(out, "loss"))


def test_log_sampler_gap_reads_zero_when_the_generator_samples_the_policy_and_not_when_it_lags(tiny, tmp_path):
    """log_sampler_gap in real runs: the transformers generator shares the policy's weights, so its
    sampling log-probs are the policy's (TRL's difference near 0, ratios near 1); a generator on a
    perturbed copy of the weights (what an unsynced vLLM would be) shows its gap."""
    import copy

    from transformers import AutoModelForCausalLM

    from envhub_trl.generators import HFGenerator
    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = tiny
    gaps = []
    for lag in (0.0, 0.05):
        model = AutoModelForCausalLM.from_pretrained(path)
        sampler = model
        if lag:
            sampler = copy.deepcopy(model)
            with torch.no_grad():
                for parameter in sampler.parameters():
                    parameter.add_(lag * torch.randn_like(parameter))
        config = _config(tmp_path / str(lag), log_sampler_gap=True, temperature=0.7)
        trainer = EnvGRPOTrainer(model, config, processing_class=tokenizer, generator=HFGenerator(sampler, tokenizer))
        trainer.train()
        logged = [entry for entry in trainer.state.log_history if "sampling/sampling_logp_difference/mean" in entry]
        assert len(logged) == 2
        gaps.append(max(entry["sampling/sampling_logp_difference/mean"] for entry in logged))
        if not lag:
            assert all(abs(entry["sampling/importance_sampling_ratio/min"] - 1) < 1e-3 and abs(entry["sampling/importance_sampling_ratio/max"] - 1) < 1e-3 for entry in logged)
    assert gaps[0] < 1e-4 < 1e-2 < gaps[1]


def test_sampler_gap_leaves_out_tokens_without_a_sampling_log_prob():
    from envhub_trl.async_rollout import model_token_mask, sampler_gap

    current = torch.zeros(2, 3)
    sampled = torch.tensor([[-0.5, -0.5, float("nan")], [0.5, 9.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    gap = sampler_gap(current, sampled, model_token_mask({"completion_mask": mask}))
    assert gap["sampling/sampling_logp_difference/mean"] == pytest.approx(0.5)
    assert gap["sampling/sampling_logp_difference/max"] == pytest.approx(0.5)
    assert gap["sampling/importance_sampling_ratio/min"] == pytest.approx(np.exp(-0.5))
    assert gap["sampling/importance_sampling_ratio/max"] == pytest.approx(np.exp(0.5))
    assert sampler_gap(current, sampled, torch.zeros_like(mask)) == {}
    assert model_token_mask({"completion_mask": mask, "tool_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}).tolist() == [[0, 1, 1], [1, 0, 0]]


def test_log_sampler_gap_scores_a_reinforce_pp_batch_once(tiny, tmp_path):
    """REINFORCE++ needs the policy's log-probs; with log_sampler_gap on, the gap's scoring serves
    the estimator too: one pass of the policy per generation batch, not two."""
    from transformers import AutoModelForCausalLM

    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = tiny
    passes = {}
    for gap in (False, True):
        config = _config(tmp_path / str(gap), advantage_estimator="reinforce++", log_sampler_gap=gap, temperature=0.7)
        trainer = EnvGRPOTrainer(AutoModelForCausalLM.from_pretrained(path), config, processing_class=tokenizer)
        score = trainer.token_logps
        calls = []

        def counted(model, output, batch_size=None, score=score, trainer=trainer, calls=calls):
            calls.append(model is trainer.model and trainer.model.training)
            return score(model, output, batch_size)

        trainer.token_logps = counted
        trainer.train()
        passes[gap] = sum(calls)
    assert passes[True] == passes[False] > 0, passes
