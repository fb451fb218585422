"""EnvGroupManager, rollout records and model-free generators (no torch needed)."""

from __future__ import annotations

import pytest

import envhub
from helper_envs import BAD_SEED, CharTokenizer, flaky_env  # noqa: F401  (fixture)

from envhub.chat import end_of_turn_ids, stop_token_ids
from envhub.error import PolicyError, UnknownEnv
from envhub.generation import Completion, ExpertGenerator, Prompt, RandomGenerator, SamplingParams, request_seeds
from envhub.manager import EnvGroupManager, group_seeds
from envhub.rollout import Trajectory, Turn, batch_columns, batch_metrics, rollout, step_arrays, to_samples

LAKE = "frozenlake/FrozenLake-v0"


def first_user_messages(manager: EnvGroupManager) -> list[str]:
    return [t.pending_user for t in manager.trajectories()]


def summary(trajectories: list[Trajectory]) -> list[tuple]:
    return [(t.seed, t.group_id, t.member, t.end_reason, t.error, [(u.reply, u.reward, u.state_key) for u in t.turns]) for t in trajectories]


def test_members_of_a_group_start_alike_and_groups_differ():
    manager = EnvGroupManager(LAKE, num_groups=6, group_size=4, seed=3)
    manager.reset()
    firsts = first_user_messages(manager)
    groups = [firsts[g * 4 : (g + 1) * 4] for g in range(6)]
    assert all(len(set(group)) == 1 for group in groups)
    assert len({group[0] for group in groups}) > 1
    seeds = [t.seed for t in manager.trajectories()]
    assert seeds == [s for s in group_seeds(3, 0, 6) for _ in range(4)]


def test_seeds_come_from_the_base_seed_and_epoch():
    assert group_seeds(7, 0, 5) == group_seeds(7, 0, 5)
    assert group_seeds(7, 0, 5) != group_seeds(7, 1, 5)
    assert group_seeds(7, 0, 5) != group_seeds(8, 0, 5)
    runs = []
    for _ in range(2):
        manager = EnvGroupManager(LAKE, 3, 2, seed=11)
        runs.append(summary(rollout(manager, RandomGenerator(seed=5), epoch=2)))
    assert runs[0] == runs[1]


def test_explicit_seeds_and_wrong_seed_count():
    manager = EnvGroupManager(LAKE, 2, 2)
    manager.reset(seeds=[5, 6])
    assert [t.seed for t in manager.trajectories()] == [5, 5, 6, 6]
    with pytest.raises(ValueError, match="one seed per group"):
        manager.reset(seeds=[1])


def test_a_mix_of_ids_is_partitioned_by_group(flaky_env):
    manager = EnvGroupManager({LAKE: 2, flaky_env: 1}, group_size=3, env_kwargs={LAKE: {"is_slippery": False}})
    assert manager.group_env_ids == [LAKE, LAKE, flaky_env]
    trajectories = rollout(manager, ExpertGenerator())
    assert [t.env_id for t in trajectories] == [LAKE] * 6 + [flaky_env] * 3
    assert all(t.success for t in trajectories[6:])
    with pytest.raises(ValueError, match="disagrees"):
        EnvGroupManager({LAKE: 2}, num_groups=3)


def test_each_env_of_a_mix_gets_its_own_instructions_turn_limit_and_legal_action_list():
    lake, sokoban = "frozenlake/FrozenLakeNotSlippery-v0", "sokoban/Sokoban-v0"
    manager = EnvGroupManager(
        {lake: 1, sokoban: 1}, group_size=2, instructions="Reach G.", show_legal_actions=True,
        per_env={sokoban: {"instructions": "Push X onto O.", "max_turns": 2, "show_legal_actions": False}},
    )
    trajectories = rollout(manager, RandomGenerator(seed=1))
    by_env = {t.env_id: t for t in trajectories}
    assert by_env[lake].system.startswith("Reach G.") and by_env[sokoban].system.startswith("Push X onto O.")
    assert "Legal actions" in by_env[lake].turns[0].user and "Legal actions" not in by_env[sokoban].turns[0].user
    assert all(t.num_turns <= 2 for t in trajectories if t.env_id == sokoban)
    assert max(t.num_turns for t in trajectories if t.env_id == lake) > 2 or all(t.terminated for t in trajectories if t.env_id == lake)
    with pytest.raises(ValueError, match="per_env"):
        EnvGroupManager({lake: 1}, group_size=1, per_env={lake: {"view": "local"}})
    with pytest.raises(ValueError, match="per_env"):
        EnvGroupManager({lake: 1}, group_size=1, per_env={sokoban: {"max_turns": 2}})


def test_show_turns_false_leaves_the_turn_count_out_of_every_user_message_of_a_mix():
    """Without the count, a user message is the observation (and the legal actions): the model can
    no longer fit the expert's moves to the turn number instead of reading what it sees."""
    lake, sokoban = "frozenlake/FrozenLakeNotSlippery-v0", "sokoban/Sokoban-v0"
    counted = rollout(EnvGroupManager({lake: 1, sokoban: 1}, group_size=1, seed=4), ExpertGenerator())
    plain = rollout(EnvGroupManager({lake: 1, sokoban: 1}, group_size=1, seed=4, show_turns=False), ExpertGenerator())
    for with_count, without in zip(counted, plain):
        assert [turn.action for turn in with_count.turns] == [turn.action for turn in without.turns]
        for k, (a, b) in enumerate(zip(with_count.turns, without.turns)):
            assert a.user.startswith(f"Turn {k + 1}") and b.user == a.user.split("\n", 1)[1]


def test_unknown_id_fails_at_construction():
    with pytest.raises(UnknownEnv):
        EnvGroupManager("frozenlake/FrozenLak-v0", 1, 1)


def test_chat_rendering_invalid_feedback_and_format_penalty(flaky_env):
    manager = EnvGroupManager(flaky_env, 1, 2, format_penalty=-0.25)
    manager.reset()
    prompts = manager.prompts()
    system, first = prompts[0].messages[0]["content"], prompts[0].messages[1]["content"]
    assert "Say Ok to count" in system and "<answer>" in system
    assert first.startswith("Turn 1 of 5; 5 actions left.\ncount is ")
    assert first.endswith("Legal actions: Ok, Boom, Win")
    manager.step(["no tags at all", "<answer>Ok</answer>"])
    bad, good = manager.trajectories()
    assert (bad.turns[0].action_is_valid, bad.turns[0].format_valid, bad.turns[0].reward) == (False, False, -0.25)
    assert (good.turns[0].action_is_valid, good.turns[0].reward) == (True, 0.0)
    assert "answer" in bad.turns[0].invalid_reason
    assert bad.pending_user.startswith("Turn 2 of 5; 4 actions left.\nInvalid action:")
    assert bad.turns[0].next_state_key == bad.turns[0].state_key  # an invalid reply changes nothing
    manager.prompts()
    manager.step(["<answer>Jump</answer>", "<answer>Win</answer>"])
    assert bad.turns[1].format_valid and not bad.turns[1].action_is_valid and bad.turns[1].reward == -0.25
    assert good.end_reason == "terminated" and good.success and good.episode_return == 1.0
    assert [m["role"] for m in good.messages] == ["system", "user", "assistant", "user", "assistant"]


def test_max_turns_truncates(flaky_env):
    manager = EnvGroupManager(flaky_env, 1, 2, max_turns=3)
    manager.reset()
    while manager.prompts():
        manager.step(["<answer>Ok</answer>"] * manager.num_active)
    for trajectory in manager.trajectories():
        assert trajectory.num_turns == 3 and trajectory.truncated and not trajectory.terminated
        assert trajectory.end_reason == "truncated" and trajectory.turns[-1].truncated


def test_an_env_that_raises_ends_only_its_own_episode(flaky_env):
    manager = EnvGroupManager(flaky_env, 2, 2)
    manager.reset(seeds=[BAD_SEED, 1])
    failed = manager.trajectories()[:2]
    assert all(t.end_reason == "error" and "cannot reset" in t.error and not t.turns for t in failed)
    assert len(manager.prompts()) == 2
    manager.step(["<answer>Boom</answer>", "<answer>Ok</answer>"])
    boom, ok = manager.trajectories()[2:]
    assert boom.end_reason == "error" and "RuntimeError: boom" in boom.error
    assert ok.end_reason is None and ok.num_turns == 1
    manager.prompts()
    manager.step(["<answer>Win</answer>"])
    assert ok.success and manager.num_active == 0


def test_step_needs_one_reply_per_prompt():
    manager = EnvGroupManager(LAKE, 1, 2)
    manager.reset()
    manager.prompts()
    with pytest.raises(ValueError, match="2 prompts"):
        manager.step(["<answer>Left</answer>"])


def test_expert_generator_solves_the_deterministic_lake():
    manager = EnvGroupManager("frozenlake/FrozenLakeNotSlippery-v0", 8, 2, seed=0)
    metrics = batch_metrics(rollout(manager, ExpertGenerator()))
    assert metrics["success_rate"] == 1.0 and metrics["invalid_action_rate"] == 0.0


def test_trajectory_layout_is_token_exact_with_env_tokens_masked():
    tokenizer = CharTokenizer()
    manager = EnvGroupManager(LAKE, 2, 2, seed=1, tokenizer=tokenizer, max_turns=6)
    trajectories = rollout(manager, RandomGenerator(seed=0, tokenizer=tokenizer))
    for trajectory in trajectories:
        sample = trajectory.sample()
        expected = tokenizer.apply_chat_template(trajectory.messages, tokenize=True)
        # The conversation's template rendering, minus the "\n" after the final <|im_end|> that was never sampled.
        assert sample.prompt_ids + sample.completion_ids == expected[:-1]
        model = [t for t, m in zip(sample.completion_ids, sample.env_mask) if m]
        assert model == [t for turn in trajectory.turns for t in turn.completion_ids]
        assert len(sample.logprobs) == len(sample.completion_ids) == len(sample.turn_ids)
        assert sorted(set(sample.turn_ids)) == list(range(trajectory.num_turns))


class ImStartEosTokenizer(CharTokenizer):
    """Says its eos is <|im_start|>, as SmolLM2's GGUF tokenizer does, while turns end with <|im_end|>."""

    eos_token_id = 1
    all_special_ids = [0, 1, 2]


class PlainTemplateTokenizer(CharTokenizer):
    """A template that writes no special token after a reply."""

    all_special_ids = [0, 1, 2]

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + ("assistant: " if add_generation_prompt else "")
        return self.encode(text) if tokenize else text


def test_end_of_turn_comes_from_the_template_not_from_eos():
    tokenizer = ImStartEosTokenizer()
    assert end_of_turn_ids(tokenizer) == [2] and stop_token_ids(tokenizer) == [2, 1]
    assert end_of_turn_ids(PlainTemplateTokenizer()) == [2]  # nothing special after a reply: the eos tokens
    for generator in (RandomGenerator(seed=0, tokenizer=tokenizer), ExpertGenerator(tokenizer)):
        trajectories = rollout(EnvGroupManager("frozenlake/FrozenLakeNotSlippery-v0", 2, 2, seed=1, tokenizer=tokenizer, max_turns=6), generator)
        for trajectory in trajectories:
            assert all(turn.completion_ids[-1] == 2 for turn in trajectory.turns)
            sample = trajectory.sample()
            assert sample.prompt_ids + sample.completion_ids == tokenizer.apply_chat_template(trajectory.messages, tokenize=True)[:-1]


def test_sampled_ids_are_kept_even_when_not_canonical():
    """A reply sampled as odd tokens (here: an extra pad token) is trained as sampled, never re-tokenised."""
    tokenizer = CharTokenizer()

    class OddGenerator:
        def generate(self, prompts, sampling):
            ids = tokenizer.encode("<answer>Left</answer>") + [0, tokenizer.eos_token_id]
            return [Completion(ids, [-0.5] * len(ids), "<answer>Left</answer>") for _ in prompts]

    manager = EnvGroupManager(LAKE, 1, 1, tokenizer=tokenizer, max_turns=3)
    trajectory = rollout(manager, OddGenerator())[0]
    sample = trajectory.sample()
    model = [t for t, m in zip(sample.completion_ids, sample.env_mask) if m]
    assert model.count(0) == trajectory.num_turns
    assert [lp for lp, m in zip(sample.logprobs, sample.env_mask) if m] == [-0.5] * len(model)


def test_a_reply_cut_by_length_gets_its_turn_closed_by_env_tokens():
    tokenizer = CharTokenizer()

    class Truncated:
        def generate(self, prompts, sampling):
            ids = tokenizer.encode("<answer>Le")
            return [Completion(ids, [0.0] * len(ids), "<answer>Le", "length") for _ in prompts]

    manager = EnvGroupManager(LAKE, 1, 1, tokenizer=tokenizer, max_turns=2)
    trajectory = rollout(manager, Truncated())[0]
    second = trajectory.turns[1].input_ids
    assert tokenizer.decode(second).startswith("<|im_end|>\n<|im_start|>user\nTurn 2 of 2")
    assert not trajectory.turns[0].action_is_valid


def test_step_layout_windows_the_history(flaky_env):
    tokenizer = CharTokenizer()

    class SayOk:
        def generate(self, prompts, sampling):
            ids = tokenizer.encode("<answer>Ok</answer>") + [tokenizer.eos_token_id]
            return [Completion(ids, [0.0] * len(ids), "<answer>Ok</answer>") for _ in prompts]

    manager = EnvGroupManager(flaky_env, 1, 1, tokenizer=tokenizer, layout="step", history_turns=1)
    trajectory = rollout(manager, SayOk())[0]
    samples = trajectory.step_samples()
    assert len(samples) == trajectory.num_turns == 5
    third = tokenizer.decode(samples[2].prompt_ids)
    assert third.count("<|im_start|>user") == 2 and third.count("<|im_start|>assistant") == 2  # one past turn + now
    assert "Turn 2 of 5" in third and "Turn 1 of 5" not in third
    assert all(s.env_mask == [1] * len(s.completion_ids) and s.turn_index == i for i, s in enumerate(samples))
    assert to_samples([trajectory])[2].prompt_ids == samples[2].prompt_ids
    with pytest.raises(ValueError, match="step layout"):
        trajectory.sample()


def test_context_budget_ends_the_episode_truncated():
    tokenizer = CharTokenizer()
    manager = EnvGroupManager(LAKE, 1, 2, tokenizer=tokenizer, max_prompt_tokens=1200, max_turns=20)
    first_prompt = len(tokenizer.apply_chat_template([], add_generation_prompt=True))
    trajectories = rollout(manager, RandomGenerator(seed=2, tokenizer=tokenizer))
    for trajectory in trajectories:
        assert trajectory.end_reason in ("context", "terminated")
        assert trajectory.end_reason != "context" or trajectory.truncated
        assert len(trajectory.sample().prompt_ids) + len(trajectory.sample().completion_ids) <= 1200 + 64 + first_prompt
    assert any(t.end_reason == "context" for t in trajectories)
    tiny = EnvGroupManager(LAKE, 1, 1, tokenizer=tokenizer, max_prompt_tokens=10)
    assert rollout(tiny, RandomGenerator(seed=0))[0].end_reason == "context"
    with pytest.raises(ValueError, match="tokenizer"):
        EnvGroupManager(LAKE, 1, 1, max_prompt_tokens=10)


def test_batch_metrics_by_hand():
    def trajectory(group: int, rewards: list[float], valid: list[bool], success: bool) -> Trajectory:
        t = Trajectory(env_id="x/Y-v0", group_id=group, member=0, seed=0, index=0, success=success)
        t.turns = [
            Turn(index=i, user="u", observation="o", reply="r", action=None, reward=r, env_reward=r, action_is_valid=v,
                 format_valid=v, state_key="s", next_state_key="s")
            for i, (r, v) in enumerate(zip(rewards, valid))
        ]
        return t

    batch = [
        trajectory(0, [0.0, 1.0], [True, True], True),
        trajectory(0, [0.0, 0.0], [False, True], False),
        trajectory(1, [-0.1, 0.0, 0.0, 0.0], [False, True, True, True], False),
        trajectory(1, [0.0, 0.0], [True, True], False),
    ]
    metrics = batch_metrics(batch)
    assert metrics["success_rate"] == 0.25
    assert metrics["mean_return"] == pytest.approx((1.0 + 0.0 - 0.1 + 0.0) / 4)
    assert metrics["invalid_action_rate"] == pytest.approx(2 / 10)
    assert metrics["mean_turns"] == 2.5
    assert metrics["reward_std_per_group"] == pytest.approx((0.5 + 0.05) / 2)
    assert metrics["zero_std_group_fraction"] == 0.0
    with pytest.raises(ValueError):
        batch_metrics([])


def test_request_seeds_differ_per_prompt_and_repeat_per_seed():
    seeds = request_seeds(4, 8)
    assert len(set(seeds)) == 8 and seeds == request_seeds(4, 8) and request_seeds(None, 2) == [None, None]


def test_sampling_params_reject_nonsense():
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="one logprob per token"):
        Completion([1, 2], [0.0], "x")


def test_step_arrays_and_columns_line_up_with_the_episodes(flaky_env):
    tokenizer = CharTokenizer()
    manager = EnvGroupManager(flaky_env, 2, 2, tokenizer=tokenizer, format_penalty=-0.5)
    manager.reset()
    manager.prompts()
    manager.step(["<answer>Ok</answer>", "<answer>Win</answer>", "oops", "<answer>Win</answer>"])
    manager.prompts()
    manager.step(["<answer>Win</answer>", "<answer>Win</answer>"])
    trajectories = manager.trajectories()
    arrays = step_arrays(trajectories)
    assert arrays["rewards"].tolist() == [0.0, 1.0, 1.0, -0.5, 1.0, 1.0]
    assert arrays["traj_index"].tolist() == [0, 0, 1, 2, 2, 3]
    assert arrays["step_index"].tolist() == [0, 1, 0, 0, 1, 0]
    assert arrays["traj_groups"].tolist() == [0, 0, 1, 1]
    assert arrays["returns"].tolist() == [1.0, 1.0, 0.5, 1.0]
    assert arrays["state_keys"][3] == arrays["state_keys"][4]  # the invalid reply left the state as it was
    columns = batch_columns(to_samples(trajectories))
    assert columns["group_ids"] == [0, 0, 1, 1]
    assert [sum(m) for m in columns["env_mask"]] == [sum(len(u.completion_ids) for u in t.turns) for t in trajectories]
    assert all(len(c) == len(m) == len(lp) == len(ti) for c, m, lp, ti in zip(columns["completion_ids"], columns["env_mask"], columns["logprobs"], columns["turn_ids"]))


def test_text_replies_are_tokenised_into_the_context():
    tokenizer = CharTokenizer()
    manager = EnvGroupManager(LAKE, 1, 1, tokenizer=tokenizer, max_turns=2)
    trajectory = rollout(manager, RandomGenerator(seed=0))[0]  # text only, no token ids
    sample = trajectory.sample()
    text = tokenizer.decode(sample.prompt_ids + sample.completion_ids)
    assert text + "<|im_end|>\n" == tokenizer.apply_chat_template(trajectory.messages)  # no end token was sampled


def test_instructions_replace_the_environments_own_in_the_system_message():
    manager = EnvGroupManager("frozenlake/FrozenLakeNotSlippery-v0", 1, 1, instructions="Reach G.", max_turns=2)
    trajectory = rollout(manager, ExpertGenerator(), SamplingParams())[0]
    assert trajectory.system.startswith("Reach G.")
    assert "frozen lake" not in trajectory.system


def test_noisy_expert_takes_random_legal_moves_as_often_as_asked():
    legal = ["Left", "Down", "Right", "Up"]
    prompts = [Prompt([], [], valid_actions=legal, expert_action="Down")] * 4000

    def actions(generator):
        return [c.text.removeprefix("<answer>").removesuffix("</answer>") for c in generator.generate(prompts, SamplingParams())]

    assert set(actions(ExpertGenerator())) == {"Down"}
    noisy = actions(ExpertGenerator(epsilon=0.4, seed=5))
    # Down comes from the expert (0.6) and from the noise (0.4 / 4); the others from the noise alone.
    shares = {a: noisy.count(a) / len(noisy) for a in legal}
    assert shares["Down"] == pytest.approx(0.7, abs=0.03)
    assert all(shares[a] == pytest.approx(0.1, abs=0.02) for a in ("Left", "Right", "Up"))
    assert noisy == actions(ExpertGenerator(epsilon=0.4, seed=5))  # seeded
    with pytest.raises(ValueError, match="between 0 and 1"):
        ExpertGenerator(epsilon=1.5)


def test_the_random_mapping_demonstrator_is_a_fixed_random_function_of_what_it_is_shown():
    from envhub.generation import RandomMappingGenerator

    legal = ["Left", "Down", "Right", "Up"]
    prompts = [Prompt([], [{"role": "user", "content": f"view {k % 400}"}], valid_actions=legal) for k in range(4000)]

    def actions(generator):
        return [c.text.removeprefix("<answer>").removesuffix("</answer>") for c in generator.generate(prompts, SamplingParams())]

    mapped = actions(RandomMappingGenerator(seed=3))
    # The same observation always gets the same move...
    assert all(mapped[k] == mapped[k % 400] for k in range(4000))
    # ...and across observations the moves are uniform, with another mapping for another seed.
    shares = {a: mapped[:400].count(a) / 400 for a in legal}
    assert all(share == pytest.approx(0.25, abs=0.07) for share in shares.values())
    assert mapped == actions(RandomMappingGenerator(seed=3)) != actions(RandomMappingGenerator(seed=4))
    # Token-id prompts (a manager with a tokenizer) are keyed by their ids.
    by_ids = RandomMappingGenerator(seed=3).generate([Prompt([1, 2, 3], [], valid_actions=legal)] * 2, SamplingParams())
    assert by_ids[0].text == by_ids[1].text
    with pytest.raises(PolicyError, match="legal actions"):
        RandomMappingGenerator().generate([Prompt([], [{"role": "user", "content": "x"}])], SamplingParams())


def test_turns_and_their_friends_are_built_with_keywords_only():
    """Twenty positional fields are easy to misorder silently; a positional call is a TypeError."""
    from envhub.executors import EnvState, ResetRequest, StepRequest
    from envhub.trajectory import Sample

    for cls, args in [
        (Turn, (0, "u", "o", "r", None, 0.0, 0.0, True, True, "s", "s")),
        (Trajectory, ("x/Y-v0", 0, 0, 0, 0)),
        (Sample, ([], [], [], [], [], 0, 0)),
        (ResetRequest, (0, envhub.spec("frozenlake/FrozenLake-v0"), 0)),
        (StepRequest, ([0], ["Down"], None)),
        (EnvState, ("an observation",)),
    ]:
        with pytest.raises(TypeError, match="positional"):
            cls(*args)


def test_a_random_mapping_with_a_share_mixes_in_uniform_moves():
    from envhub.generation import RandomMappingGenerator

    legal = ["Left", "Down", "Right", "Up"]
    prompts = [Prompt([], [{"role": "user", "content": "one view"}], valid_actions=legal)] * 4000
    moves = [c.text.removeprefix("<answer>").removesuffix("</answer>") for c in RandomMappingGenerator(seed=2, share=0.5).generate(prompts, SamplingParams())]
    mapped = RandomMappingGenerator(seed=2).generate(prompts[:1], SamplingParams())[0].text.removeprefix("<answer>").removesuffix("</answer>")
    # The mapped move half the time plus its share of the uniform half; the others 1/8 each.
    assert moves.count(mapped) / 4000 == pytest.approx(0.625, abs=0.03)
    assert all(moves.count(a) / 4000 == pytest.approx(0.125, abs=0.03) for a in legal if a != mapped)
    with pytest.raises(ValueError, match="between 0 and 1"):
        RandomMappingGenerator(share=1.5)


def test_the_random_tool_caller_draws_a_tool_and_its_arguments_from_the_schemas():
    import json

    from envhub.generation import RandomToolCallGenerator
    from envhub.tools import parse_tool_calls

    def tool(name, properties, required):
        return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties, "required": required}}}

    tools = [
        tool("move", {"direction": {"type": "string", "enum": ["left", "down"]}, "note": {"type": "string"}}, ["direction"]),
        tool("wait", {"long": {"type": "boolean"}, "turns": {"type": "integer", "minimum": 1, "maximum": 3}}, ["long", "turns"]),
    ]
    prompts = [Prompt([], [{"role": "user", "content": "go"}], tools=tools)] * 400
    texts = [c.text for c in RandomToolCallGenerator(seed=3).generate(prompts, SamplingParams())]
    calls = [parse_tool_calls(text, {t["function"]["name"]: t for t in tools}).calls[0] for text in texts]
    assert {c.name for c in calls} == {"move", "wait"}
    assert {json.dumps(dict(c.arguments), sort_keys=True) for c in calls if c.name == "move"} == {'{"direction": "left"}', '{"direction": "down"}'}
    waits = [dict(c.arguments) for c in calls if c.name == "wait"]
    assert {w["long"] for w in waits} == {True, False} and {w["turns"] for w in waits} == {1, 2, 3}
    assert texts == [c.text for c in RandomToolCallGenerator(seed=3).generate(prompts, SamplingParams())]  # seeded
    tokenizer = CharTokenizer()
    prefilled = RandomToolCallGenerator(seed=3, tokenizer=tokenizer).generate([Prompt([], [], tools=tools[:1], reply_prefix="<tool_call>")], SamplingParams())[0]
    assert prefilled.text.startswith('\n{"name": "move"') and prefilled.token_ids[-1:] == end_of_turn_ids(tokenizer)[:1]
    with pytest.raises(PolicyError, match="needs the prompt's tools"):
        RandomToolCallGenerator().generate([Prompt([], [])], SamplingParams())
    free = [tool("say", {"text": {"type": "string"}}, ["text"])]
    with pytest.raises(PolicyError, match="cannot draw say.text"):
        RandomToolCallGenerator().generate([Prompt([], [], tools=free)], SamplingParams())


@pytest.mark.parametrize("layout", ["trajectory", "step"])
def test_a_reply_prefix_ends_every_prompt_and_starts_every_reply(layout):
    """An assistant prefill: the prompt ends with the prefix's tokens (not sampled, env-masked),
    a model-free generator writes what follows it, and the env reads the prefix plus the reply."""
    tokenizer = CharTokenizer()
    prefix = tokenizer.encode("<answer>")
    manager = EnvGroupManager(LAKE, 2, 2, seed=1, tokenizer=tokenizer, max_turns=6, layout=layout, reply_prefix="<answer>", stop_strings=["</answer>"])
    manager.reset()
    prompts = manager.prompts()
    assert all(p.token_ids[-len(prefix) :] == prefix and p.reply_prefix == "<answer>" and p.stop_strings == ("</answer>",) for p in prompts)
    trajectories = rollout(manager, RandomGenerator(seed=0, tokenizer=tokenizer))
    turns = [turn for trajectory in trajectories for turn in trajectory.turns]
    assert turns and all(turn.action_is_valid for turn in turns)
    for turn in turns:
        assert turn.reply == f"<answer>{turn.action}</answer>"
        assert tokenizer.decode(turn.completion_ids[:-1]) == f"{turn.action}</answer>"  # the prefix was not sampled
        assert turn.input_ids[-len(prefix) :] == prefix
    if layout == "trajectory":
        for trajectory in trajectories:
            sample = trajectory.sample()
            model = [t for t, m in zip(sample.completion_ids, sample.env_mask) if m]
            assert model == [t for turn in trajectory.turns for t in turn.completion_ids]


def test_a_text_reply_continues_the_prefix():
    tokenizer = CharTokenizer()
    manager = EnvGroupManager(LAKE, 1, 1, seed=1, tokenizer=tokenizer, max_turns=2, reply_prefix="<answer>")
    manager.reset()
    manager.prompts()
    manager.step(["Left</answer>"])  # text replies continue the prefix too
    manager.prompts()
    manager.step(["<answer>Left</answer>"])  # a second prefix is part of the reply: not an action
    first, second = manager.trajectories()[0].turns
    assert first.action_is_valid and first.reply == "<answer>Left</answer>"
    assert not second.action_is_valid and second.reply == "<answer><answer>Left</answer>"
