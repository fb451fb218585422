"""The envhub-alfworld plugin: generated ALFWorld tasks, official-layout task folders, the envhub contract.

Each reset translates the task's PDDL problem with Fast Downward (about half a second on 2 cores),
so these tests play a handful of episodes each.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import envhub

pytest.importorskip("alfworld")
pytest.importorskip("fast_downward")
from envhub_alfworld.env import ALFWorldEnv  # noqa: E402
from envhub_alfworld.tasks import TASK_TYPES, generate_task, mangle, official_tasks  # noqa: E402

GENERATED = "alfworld/ALFWorldGenerated-v0"
ENVHUB = str(Path(sys.executable).parent / "envhub")


def play_expert(env, seed, turns=50):
    env.reset(seed=seed)
    for _ in range(turns):
        action = env.expert_action()
        if action is None:
            break
        _, _, terminated, truncated, info = env.step(action)
        assert info["action_is_valid"], action
        if terminated or truncated:
            break
    return env.is_success()


def test_mangle_writes_alfred_ids_as_alfworlds_pddl_does():
    assert mangle("Apple|-01.25|+00.90|-02.10") == "Apple_bar__minus_01_dot_25_bar__plus_00_dot_90_bar__minus_02_dot_10"
    assert mangle("Sink|+01.00|+00.90|-00.50|SinkBasin").endswith("_bar_SinkBasin")


def test_one_seed_generates_the_same_task_in_another_process():
    here = generate_task(11)
    code = "from envhub_alfworld.tasks import generate_task; t = generate_task(11); print(t.pddl_problem + t.sentence)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout == here.pddl_problem + here.sentence + "\n"
    assert generate_task(12).pddl_problem != here.pddl_problem


@pytest.mark.parametrize("task_type", list(TASK_TYPES.values()))
def test_every_task_type_is_generated_unsolved_and_the_planner_expert_wins_it(task_type):
    kind = next(k for k, v in TASK_TYPES.items() if v == task_type)
    env = ALFWorldEnv(task_types=[kind])
    observation, info = env.reset(seed=3)
    assert info["task_type"] == task_type and not info["success"]
    assert "Your task is to: " in observation and env.task in observation
    assert play_expert(env, 3)
    # Every later observation carries the task too (verl-agent's prompt does).
    env.reset(seed=3)
    observation, *_ = env.step(env.valid_actions()[0])
    assert observation.endswith(f"Your task is to: {env.task}")


def test_generated_objects_sit_where_alfred_lets_them_and_never_in_the_target_receptacle():
    import alfworld.gen.constants as constants

    for seed in range(20):
        task = generate_task(seed)
        params = task.traj_data["pddl_params"]
        for receptacle, objects in task.objects.items():
            kind = receptacle.split("|", 1)[0]
            kind = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}.get(kind, kind)
            for alfred_id in objects:
                obj = alfred_id.split("|", 1)[0]
                if obj in ("DeskLamp", "FloorLamp"):
                    assert obj == params["toggle_target"]
                    continue
                assert obj in constants.VAL_RECEPTACLE_OBJECTS[kind], (seed, obj, kind)
                if obj == params["object_target"]:
                    assert kind != params["parent_target"]


def test_a_command_outside_the_admissible_ones_is_invalid_and_changes_nothing():
    env = envhub.make(GENERATED)
    observation, info = env.reset(seed=5)
    key = info["state_key"]
    for bad in ("fly to the moon", "", "go to"):
        observation, reward, terminated, truncated, info = env.step(bad)
        assert info["action_is_valid"] is False and reward == 0.0 and not terminated
        assert observation.startswith("Invalid action:") and info["state_key"] == key


def _planner_copies():
    """The copies of Fast Downward's library this process has mapped (each a deleted temporary file)."""
    return len({line.split()[5] for line in Path("/proc/self/maps").read_text().splitlines() if "libdownward" in line})


def _planner_episode(env, seed):
    observation, _ = env.reset(seed=seed)
    seen = [observation]
    while (action := env.expert_action()) is not None:
        seen.append(env.step(action)[0])
    return seen


def test_resets_and_later_envs_reuse_the_planners_library_copies_and_play_the_same_episodes():
    """Each PddlEnv maps its own 34 MB copy of the planner's library, whose disk space stays held
    until the process ends: one a reset filled /tmp in an RL run. Resets reuse their env's copy, and
    a closed env's copy goes to the next env, which plays each episode as a fresh one does."""
    envs = [envhub.make(GENERATED) for _ in range(2)]
    first = [_planner_episode(env, seed) for env, seed in zip(envs, (3, 4))]
    held = _planner_copies()
    for env in envs:
        for seed in range(3):
            env.reset(seed=seed)
    assert _planner_copies() == held
    for env in envs:
        env.close()
    again = [envhub.make(GENERATED) for _ in range(2)]
    assert [_planner_episode(env, seed) for env, seed in zip(again, (3, 4))] == first
    assert _planner_copies() == held
    for env in again:
        env.close()


def _text_episode(env, seed, turns=12):
    """An episode's text: the planner's moves, then the first admissible command each turn."""
    observation, _ = env.reset(seed=seed)
    seen = [observation]
    for _ in range(turns):
        action = env.expert_action() if len(seen) % 2 else env.valid_actions()[0]
        observation, _, terminated, truncated, _ = env.step(action)
        seen.append((action, observation, tuple(env.valid_actions())))
        if terminated or truncated:
            break
    return seen


def test_textworlds_text_is_the_same_with_its_copies_and_parses_made_cheaper(monkeypatch):
    from textworld import logic
    from textworld.envs.pddl import textgen

    env = envhub.make(GENERATED)
    faster = [_text_episode(env, seed) for seed in (5, 6)]
    for module in (textgen, logic):
        memoized = module._parse_and_convert
        assert memoized.cache, module.__name__
        for (args, kwargs), parsed in list(memoized.cache.items())[:200]:
            fresh, again = memoized(*args, **dict(kwargs)), memoized(*args, **dict(kwargs))
            assert repr(fresh) == repr(memoized.parse(*args, **dict(kwargs))) == repr(parsed)
            assert fresh is not again and fresh is not parsed
        monkeypatch.setattr(module, "_parse_and_convert", memoized.parse)
    monkeypatch.setattr(textgen, "copy_context", textgen.envhub_originals["copy_context"])
    monkeypatch.setattr(textgen.Symbol, "copy", textgen.envhub_originals["copy"])
    assert [_text_episode(env, seed) for seed in (5, 6)] == faster


def test_the_state_key_repeats_when_the_world_does():
    env = envhub.make(GENERATED)
    _, info = env.reset(seed=7)
    start = info["state_key"]
    receptacle = next(a for a in env.valid_actions() if a.startswith("go to "))
    _, _, _, _, there = env.step(receptacle)
    assert there["state_key"] != start
    _, _, _, _, again = env.step(receptacle)  # going where the agent already is changes no fact
    assert again["state_key"] == there["state_key"]


def test_the_handcoded_expert_is_alfworlds_and_repeats_with_the_seed():
    runs = []
    for _ in range(2):
        env = ALFWorldEnv(expert="handcoded")
        env.reset(seed=2)
        actions = []
        for _ in range(12):
            action = env.expert_action()
            actions.append(action)
            if action is None or env.step(action)[2]:
                break
        runs.append(actions)
    assert runs[0] == runs[1] and runs[0][0] == "look"


def test_the_search_expert_looks_for_what_the_planner_would_know_and_wins():
    env = ALFWorldEnv(expert="search")
    env.reset(seed=3)
    assert env.plan()[:3] == ["go to cabinet 2", "open cabinet 2", "take pot 1 from cabinet 2"]
    commands = []
    for _ in range(50):
        command = env.expert_action()
        if command is None:
            break
        commands.append(command)
        _, _, terminated, _, info = env.step(command)
        assert info["action_is_valid"], command
        if terminated:
            break
    assert env.is_success()
    # The first receptacle listed, opened and found without the pot; then the next one, where it is.
    assert commands == ["go to cabinet 1", "open cabinet 1", "go to cabinet 2", "open cabinet 2",
                        "take pot 1 from cabinet 2", "go to stoveburner 2", "move pot 1 to stoveburner 2"]


def test_unknown_arguments_are_one_line_errors():
    from envhub.error import AdapterError

    with pytest.raises(AdapterError, match="source"):
        ALFWorldEnv(source="web")
    with pytest.raises(AdapterError, match="task_types"):
        ALFWorldEnv(task_types=[7])
    with pytest.raises(AdapterError, match="expert must be one of handcoded, planner, search"):
        ALFWorldEnv(expert="oracle")


def _official_layout(root, seeds):
    """An official download's layout, as ``alfworld-download`` leaves it, from generated tasks:
    ``json_2.1.1/<split>/<task>/<trial>/{traj_data.json, initial_state.pddl}`` (no game.tw-pddl),
    plus one movable-receptacle folder that ALFWorld's filter drops."""
    for split in ("train", "valid_seen", "valid_unseen"):
        for seed in seeds:
            task = generate_task(seed)
            params = task.traj_data["pddl_params"]
            folder = root / "json_2.1.1" / split / f"{task.task_type}-{params['object_target']}-None-{params['parent_target'] or 'None'}-{task.floor_plan}" / f"trial_T{seed:05d}"
            task.write(folder)
            (folder / "game.tw-pddl").unlink()
        moved = root / "json_2.1.1" / split / "pick_and_place_with_movable_recep-Apple-Bowl-Fridge-1" / "trial_T0"
        task.write(moved)


def test_official_layout_folders_are_found_and_filtered_as_alfworld_does(tmp_path):
    _official_layout(tmp_path, range(4))
    found = official_tasks(str(tmp_path / "json_2.1.1"), "eval_in_distribution")
    assert len(found) == 4 and all("movable" not in t.name for t in found)
    simple_only = official_tasks(str(tmp_path / "json_2.1.1"), "train", (1,))
    assert all(json.loads((t.folder / "traj_data.json").read_text())["task_type"] == "pick_and_place_simple" for t in simple_only)
    env = ALFWorldEnv(source="official", split="eval_out_of_distribution", data_root=str(tmp_path))
    observation, info = env.reset(seed=0)
    assert info["task"].split("/")[1].startswith("trial_T") and "Your task is to: " in observation
    assert play_expert(env, 0)


def test_an_unreadable_official_game_is_a_one_line_error(tmp_path):
    from envhub.error import AdapterError

    _official_layout(tmp_path, [0])
    for folder in (tmp_path / "json_2.1.1" / "train").glob("*/trial_T*"):
        if "movable" not in str(folder):
            (folder / "initial_state.pddl").write_text("(define (problem broken")
    env = ALFWorldEnv(source="official", split="train", data_root=str(tmp_path))
    with pytest.raises(AdapterError, match="does not load") as caught:
        env.reset(seed=0)
    assert "\n" not in str(caught.value)


def test_without_the_download_the_official_ids_are_listed_unavailable_with_the_command(tmp_path):
    env = {**os.environ, "ALFWORLD_DATA": str(tmp_path / "nothing"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([ENVHUB, "list", "--unavailable", "alfworld/*"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "alfworld/ALFWorldEvalOutOfDistribution-v0" in out.stdout and "alfworld-download" in out.stdout


@pytest.mark.slow
def test_envhub_check_passes_on_the_official_ids_over_an_official_layout_fixture(tmp_path):
    _official_layout(tmp_path, range(3))
    env = {**os.environ, "ALFWORLD_DATA": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    listed = subprocess.run([ENVHUB, "list", "alfworld/*"], capture_output=True, text=True, timeout=120, env=env)
    assert "alfworld/ALFWorld-v0" in listed.stdout, listed.stderr
    out = subprocess.run([ENVHUB, "check", "alfworld/ALFWorldEvalInDistribution-v0"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0 and "checks passed" in out.stdout, out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("expert", ["planner", "search"])
def test_the_planner_and_search_experts_win_every_one_of_24_generated_tasks(expert):
    env = envhub.make(GENERATED, expert=expert)
    assert all(play_expert(env, seed) for seed in range(24))


def _expert_record(seed):
    from click.testing import CliRunner

    from envhub.cli import cli

    result = CliRunner().invoke(cli, ["run", GENERATED, "--policy", "expert", "--seed", str(seed), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.slow
def test_trls_environment_factory_plays_the_episode_envhub_run_plays():
    from envhub.integrations.trl import environment_factory

    record = _expert_record(2)
    env = environment_factory(GENERATED)()
    prompt = env.reset(seed=2)
    assert record["transcript"][0]["observation"] in prompt
    for turn in record["transcript"][1:]:
        result = env.act(turn["action"])
        assert turn["observation"] in result
    assert env.success is True and env.get_reward() == pytest.approx(record["return"]) == 1.0


@pytest.mark.slow
def test_envhub_serve_plays_the_episode_envhub_run_plays():
    pytest.importorskip("openenv")
    from openenv.core import GenericEnvClient
    from serve_helpers import serving

    with serving(GENERATED) as url:
        record = _expert_record(2)
        with GenericEnvClient(base_url=url).sync() as client:
            result = client.reset(seed=2)
            assert result.observation["text"] == record["transcript"][0]["observation"]
            for turn in record["transcript"][1:]:
                result = client.step({"text": f"<answer>{turn['action']}</answer>"})
                assert result.observation["text"] == turn["observation"]
            assert result.done is True and client.state()["success"] is True


def test_bench_alfworld_replies_counts_a_run_against_the_search_expert(tmp_path):
    """bench/alfworld_replies.py on the search expert's own episode, with two invalid repeats put
    first: every other command agrees, the repeat is counted, and the first disagreement is them."""
    played = subprocess.run(
        [ENVHUB, "run", GENERATED, "--policy", "expert", "--seed", "3", "--env-kwarg", "expert=search", "--json"],
        capture_output=True, text=True, timeout=300, check=True,
    )
    record = json.loads(played.stdout.splitlines()[0])
    assert record["success"]
    refused = {"observation": "", "action": "go to cabinet 99", "reward": 0.0, "info": {"action_is_valid": False}}
    record["transcript"][1:1] = [refused, refused]
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(record) + "\n")
    script = Path(__file__).parents[1] / "bench" / "alfworld_replies.py"
    subprocess.run([sys.executable, str(script), str(runs), "--results", str(tmp_path / "out.json")], capture_output=True, text=True, timeout=300, check=True)
    out = json.loads((tmp_path / "out.json").read_text())
    commands = len(record["transcript"]) - 1
    assert (out["episodes"], out["won"], out["commands"], out["invalid"], out["invalid_repeating_the_previous"]) == (1, 1, commands, 2, 1)
    assert sum(kind["of"] - kind["same"] for kind in out["agreement"].values()) == 2
    assert out["first_disagreements"][0]["model"] == "go to cabinet 99"


def test_bench_alfworld_steps_fixed_policy_sends_the_kth_admissible_command_clamped():
    """bench/alfworld_steps.py's fixed-policy reference: index:K sends the K-th admissible command
    (the last where the list is shorter, counted from the end for K < 0) and reads nothing else."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("alfworld_steps", Path(__file__).parents[1] / "bench" / "alfworld_steps.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sent = []
    step = ALFWorldEnv.step

    def recording(env, action):
        sent.append((action, env.valid_actions()))
        return step(env, action)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ALFWorldEnv, "step", recording)
        rows = [bench.policy_success(1, 10**9, policy, turns=3) for policy in ("index:0", "index:999", "index:-2")]
    assert [(row["won"], row["commands_per_task"]) for row in rows] == [(0, 3.0)] * 3
    assert [action == legal[k] for (action, legal), k in zip(sent, [0] * 3 + [-1] * 3 + [-2] * 3)] == [True] * 9
