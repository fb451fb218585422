"""Continuous rollouts against the lockstep reference (no torch needed)."""

from __future__ import annotations

import hashlib
import time

import pytest
from helper_envs import CharTokenizer, SlowEnv, flaky_env, registered  # noqa: F401  (fixture)

from envhub.executors import ProcessPoolExecutor
from envhub.generation import BatchStream, Completion, ExpertGenerator, Prompt, RandomGenerator, SamplingParams, as_stream
from envhub.manager import EnvGroupManager
from envhub.rollout import RolloutStats, request_sampling, rollout

LAKE = "frozenlake/FrozenLake-v0"


class PromptHashGenerator:
    """Deterministic: the reply is a function of the prompt alone (a legal action picked by its hash,
    or now and then junk), whatever batch the prompt arrives in."""

    def generate(self, prompts, sampling):
        out = []
        for prompt in prompts:
            digest = hashlib.sha256(repr((prompt.token_ids, prompt.messages)).encode()).digest()
            legal = prompt.valid_actions or ["x"]
            text = "no tags" if digest[1] % 7 == 0 else f"<answer>{legal[digest[0] % len(legal)]}</answer>"
            out.append(Completion([], [], text))
        return out


def records(trajectories):
    return [
        (t.env_id, t.seed, t.group_id, t.member, t.end_reason, t.success, t.messages,
         [(u.reply, u.action, u.reward, u.action_is_valid, u.state_key, u.next_state_key, list(u.input_ids), list(u.completion_ids)) for u in t.turns])
        for t in trajectories
    ]


@pytest.mark.parametrize("tokenizer", [None, CharTokenizer()], ids=["text", "tokens"])
def test_continuous_gives_the_lockstep_trajectories_with_a_deterministic_generator(tokenizer):
    def play(mode):
        with EnvGroupManager({LAKE: 3, "frozenlake/FrozenLakeNotSlippery-v0": 2}, None, 4, seed=5, max_turns=12, tokenizer=tokenizer) as manager:
            return records(rollout(manager, PromptHashGenerator(), epoch=1, mode=mode))

    lockstep = play("lockstep")
    assert len(lockstep) == 20 and len({len(r[-1]) for r in lockstep}) > 1  # episodes of different lengths
    assert play("continuous") == lockstep


def test_continuous_expert_solves_the_lake_with_a_process_pool():
    with EnvGroupManager("frozenlake/FrozenLakeNotSlippery-v0", 4, 2, seed=1, executor=ProcessPoolExecutor(2)) as manager:
        stats = RolloutStats()
        trajectories = rollout(manager, ExpertGenerator(), mode="continuous", stats=stats)
    assert all(t.success for t in trajectories)
    assert stats.turns == sum(t.num_turns for t in trajectories) and stats.turns_per_s > 0


def test_a_slow_env_step_does_not_stop_other_episodes_from_generating():
    """Half the envs take 50 ms a step; while one of those steps runs, the other episodes' prompts
    keep reaching the generator (lockstep: none does)."""
    calls: list[float] = []

    class Recording(RandomGenerator):
        def generate(self, prompts, sampling):
            calls.append(time.perf_counter())
            return super().generate(prompts, sampling)

    def overlapped(mode):
        SlowEnv.steps.clear()
        calls.clear()
        with registered("test/Slow-v0", "helper_envs:SlowEnv", max_turns=6), registered("test/Fast-v0", "helper_envs:FlakyEnv", max_turns=6):
            with EnvGroupManager({"test/Slow-v0": 1, "test/Fast-v0": 1}, None, 2, seed=0) as manager:
                stats = RolloutStats()
                rollout(manager, Recording(seed=0), mode=mode, stats=stats)
        return sum(any(start < call < end for call in calls) for start, end in SlowEnv.steps), stats

    during, stats = overlapped("continuous")
    assert during >= 1
    assert stats.env_busy_s > 0 and 0.0 <= stats.generator_idle_fraction <= 1.0
    assert overlapped("lockstep")[0] == 0


def test_seeded_requests_get_the_seed_of_their_slot_and_turn():
    sampling = SamplingParams(seed=7)
    assert request_sampling(sampling, 3, 2) == request_sampling(sampling, 3, 2)
    assert len({request_sampling(sampling, slot, turn).seed for slot in range(4) for turn in range(4)}) == 16
    assert request_sampling(SamplingParams(), 3, 2).seed is None


def test_batch_stream_completes_what_is_queued_in_one_batch():
    sizes = []

    class Counting(RandomGenerator):
        def generate(self, prompts, sampling):
            sizes.append(len(prompts))
            return super().generate(prompts, sampling)

    stream = as_stream(Counting(seed=0))
    assert isinstance(stream, BatchStream) and as_stream(stream) is stream
    for key in "abc":
        stream.submit(key, Prompt([], [], ["Up", "Down"]), SamplingParams())
    assert stream.pending() == 3
    finished = stream.poll()
    assert [key for key, _ in finished] == ["a", "b", "c"] and sizes == [3] and stream.pending() == 0 and stream.poll() == []
    assert as_stream(ExpertGenerator()).uses_expert


def test_unknown_mode_is_refused():
    with EnvGroupManager(LAKE, 1, 1) as manager, pytest.raises(ValueError, match="mode must be one of"):
        rollout(manager, RandomGenerator(0), mode="sideways")
