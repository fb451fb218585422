"""Executors: in-process, process pool and Ray actors give the same episodes; failures stay contained."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helper_envs import flaky_env, registered  # noqa: F401  (fixture)

from envhub.actions import UNFINISHED_REASON
from envhub.executors import InProcessExecutor, ProcessPoolExecutor, make_executor
from envhub.generation import Completion, RandomGenerator
from envhub.manager import EnvGroupManager
from envhub.rollout import rollout

LAKE = "frozenlake/FrozenLake-v0"


def summary(trajectories):
    return [(t.seed, t.end_reason, t.error, t.success, [(u.reply, u.reward, u.state_key) for u in t.turns]) for t in trajectories]


def play(executor, env_id=LAKE, groups=3, size=4, kill=None):
    """Roll out a batch; ``kill(executor)`` runs after the second turn."""
    manager = EnvGroupManager(env_id, groups, size, seed=5, executor=executor)
    turns = [0]

    def on_turn(m):
        turns[0] += 1
        if kill is not None and turns[0] == 2:
            kill(executor)

    return summary(rollout(manager, RandomGenerator(seed=9), epoch=1, on_turn=on_turn))


@pytest.fixture(scope="module")
def reference():
    return play(InProcessExecutor())


@pytest.fixture(scope="module")
def pool():
    executor = ProcessPoolExecutor(num_workers=2)
    yield executor
    executor.close()


def test_process_pool_plays_the_same_episodes(pool, reference):
    assert play(pool) == reference


def test_a_dead_process_is_replaced_and_its_episodes_replayed(pool, reference):
    before = pool.restarts

    def kill(executor):
        executor.workers[1].process.kill()
        executor.workers[1].process.join()

    assert play(pool, kill=kill) == reference
    assert pool.restarts == before + 1


def test_a_cut_off_reply_is_refused_in_a_worker_and_after_its_worker_is_replaced(pool):
    """unfinished_replies="invalid": a reply the token limit cut off is an invalid action, also in a
    process pool, and the mark survives the replay of a dead worker's episodes."""
    cut = Completion([1, 2], [0.0, 0.0], "<answer>Down</answer>", "length")
    done = Completion([1, 2], [0.0, 0.0], "<answer>Down</answer>", "stop")
    runs = []
    for executor in (InProcessExecutor(), pool):
        manager = EnvGroupManager("frozenlake/FrozenLakeNotSlippery-v0", 1, 4, seed=2, format_penalty=-0.5, unfinished_replies="invalid", executor=executor)
        manager.reset()
        manager.prompts()
        manager.step([cut, done, cut, done])
        if executor is pool:
            pool.workers[0].process.kill()
            pool.workers[0].process.join()
        manager.prompts()
        manager.step([done, done, done, done])
        runs.append([[(u.action, u.action_is_valid, u.invalid_reason, u.reward, u.state_key) for u in t.turns] for t in manager.trajectories()])
    assert runs[0] == runs[1]
    first = [turns[0] for turns in runs[0]]
    assert [valid for _, valid, _, _, _ in first] == [False, True, False, True]
    assert first[0][2] == UNFINISHED_REASON and first[0][3] == -0.5 and first[0][0] is None
    with EnvGroupManager("frozenlake/FrozenLakeNotSlippery-v0", 1, 1, seed=2) as manager:  # the default reads it
        manager.reset()
        manager.prompts()
        manager.step([cut])
        assert manager.trajectories()[0].turns[0].action == "Down"


def test_an_env_raising_in_a_worker_ends_only_its_episode(pool, flaky_env):
    manager = EnvGroupManager(flaky_env, 1, 4, executor=pool)
    manager.reset()
    manager.prompts()
    manager.step(["<answer>Ok</answer>", "<answer>Boom</answer>", "<answer>Ok</answer>", "<answer>Win</answer>"])
    ended = [t.end_reason for t in manager.trajectories()]
    assert ended == [None, "error", None, "terminated"]
    assert "RuntimeError: boom" in manager.trajectories()[1].error
    manager.prompts()
    manager.step(["<answer>Win</answer>", "<answer>Win</answer>"])
    assert [t.success for t in manager.trajectories()] == [True, False, True, True]


def test_a_reply_that_kills_its_worker_twice_ends_those_episodes_only(flaky_env):
    with ProcessPoolExecutor(num_workers=2) as executor:
        manager = EnvGroupManager("test/Exit-v0", 1, 4, executor=executor)
        manager.reset()
        manager.prompts()
        manager.step(["<answer>Ok</answer>", "<answer>Boom</answer>", "<answer>Ok</answer>", "<answer>Ok</answer>"])
        trajectories = manager.trajectories()
        assert trajectories[1].end_reason == "error" and "WorkerDied" in trajectories[1].error
        assert [t.end_reason for t in trajectories[::2]] == [None, None]  # worker 0 untouched
        assert trajectories[3].end_reason is None and trajectories[3].num_turns == 1  # replayed on the new worker
        manager.prompts()
        manager.step(["<answer>Win</answer>"] * 3)
        assert [t.success for t in trajectories] == [True, False, True, True]


def test_make_executor_names():
    assert isinstance(make_executor("inprocess"), InProcessExecutor)
    with pytest.raises(ValueError, match="unknown executor"):
        make_executor("threads")


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    tests_dir = str(Path(__file__).parent)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")])}},
    )
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_actors_play_the_same_episodes_and_survive_a_dead_actor(ray_cluster, reference):
    from envhub.executors import RayExecutor

    executor = RayExecutor(num_workers=2)
    try:
        assert play(executor) == reference

        def kill(ex):
            ray_cluster.kill(ex.workers[0], no_restart=True)

        assert play(executor, kill=kill) == reference
        assert executor.restarts == 1
    finally:
        executor.close()


def test_an_unpicklable_info_is_reported_with_its_key_not_as_a_dead_worker():
    with registered("test/Unpicklable-v0", "helper_envs:UnpicklableInfoEnv", max_turns=5), ProcessPoolExecutor(num_workers=1) as executor:
        manager = EnvGroupManager("test/Unpicklable-v0", 1, 2, executor=executor)
        manager.reset()
        manager.prompts()
        manager.step(["<answer>Boom</answer>", "<answer>Ok</answer>"])
        bad, good = manager.trajectories()
        assert executor.restarts == 0
    assert bad.end_reason == "error" and "info key 'handle', a lock" in bad.error and "WorkerDied" not in bad.error
    assert good.end_reason is None and good.num_turns == 1


@pytest.mark.slow
def test_a_hung_step_ends_only_its_episode_within_the_deadline():
    import time

    with registered("test/Hang-v0", "helper_envs:HangEnv", max_turns=5), ProcessPoolExecutor(num_workers=2, step_timeout=2.0) as executor:
        manager = EnvGroupManager("test/Hang-v0", 1, 6, executor=executor)
        manager.reset()
        manager.prompts()
        started = time.perf_counter()
        # Slot 2 hangs; slots 0 and 4 share its worker, before and after it.
        manager.step(["<answer>Ok</answer>", "<answer>Ok</answer>", "<answer>Boom</answer>", "<answer>Ok</answer>",
                      "<answer>Ok</answer>", "<answer>Ok</answer>"])
        took = time.perf_counter() - started
        trajectories = manager.trajectories()
        assert trajectories[2].end_reason == "error" and "took longer than step_timeout=2s" in trajectories[2].error
        assert [t.end_reason for i, t in enumerate(trajectories) if i != 2] == [None] * 5
        assert [t.num_turns for t in trajectories] == [1, 1, 0, 1, 1, 1]
        manager.prompts()
        manager.step(["<answer>Win</answer>"] * 5)  # the others carry on, on the replaced worker too
        assert [t.success for t in trajectories] == [True, True, False, True, True, True]
    assert took < 2.0 + 8.0  # the deadline, plus starting a worker and replaying its episodes


def test_a_replay_that_does_not_reach_the_recorded_state_ends_that_episode():
    with registered("test/Nondet-v0", "helper_envs:NondeterministicEnv", max_turns=5), ProcessPoolExecutor(num_workers=2) as executor:
        manager = EnvGroupManager("test/Nondet-v0", 1, 4, executor=executor)
        manager.reset()
        manager.prompts()
        manager.step(["<answer>Ok</answer>"] * 4)
        executor.workers[1].process.kill()  # slots 1 and 3 live there
        executor.workers[1].process.join()
        manager.prompts()
        manager.step(["<answer>Ok</answer>"] * 4)
        trajectories = manager.trajectories()
    for t in trajectories[1::2]:
        assert t.end_reason == "error" and t.error.startswith("non-deterministic env: replaying this episode's seed")
        assert t.num_turns == 1  # no move recorded from a state the episode was never in
    assert [t.end_reason for t in trajectories[::2]] == [None, None] and all(t.num_turns == 2 for t in trajectories[::2])
