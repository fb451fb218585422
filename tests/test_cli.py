"""The envhub command line, through click's runner and once through the installed script."""

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from envhub.cli import cli

ENV = "frozenlake/FrozenLakeNotSlippery-v0"


def invoke(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def test_version_and_short_help():
    assert invoke("--version").output.startswith("envhub, version ")
    result = invoke("-h")
    assert result.exit_code == 0 and "run" in result.output and "check" in result.output


def test_list_table_and_json():
    result = invoke("list")
    assert result.exit_code == 0 and "frozenlake/FrozenLake-v0" in result.output and "envhub-frozenlake" in result.output
    rows = json.loads(invoke("list", "--json").stdout)
    row = next(r for r in rows if r["id"] == "frozenlake/FrozenLake-v0")
    assert set(row) >= {"id", "plugin", "version", "entry_point", "description"}
    assert row["entry_point"] == "envhub_frozenlake.env:FrozenLakeTextEnv"


def test_plugins_json_lists_hooks_and_errors():
    rows = {r["name"]: r for r in json.loads(invoke("plugins", "--json").output)}
    assert rows["envhub-frozenlake"]["hooks"] == ["register_envs"] and rows["envhub-frozenlake"]["error"] is None
    assert set(rows["envhub-frozenlake"]) >= {"name", "version", "hooks", "error"}


def test_list_reports_a_broken_plugin_and_keeps_the_others(monkeypatch):
    from envhub import plugins

    broken = plugins.PluginInfo(name="envhub-broken", version="9.9", entry_point="envhub_broken.plugin",
                                error="RuntimeError: this plugin is broken on purpose")
    monkeypatch.setitem(plugins.host.infos, "envhub-broken", broken)
    rows = json.loads(invoke("list", "--json").stdout)
    failed = [r for r in rows if r["error"]]
    assert failed == [{"id": None, "plugin": "envhub-broken", "version": "9.9", "entry_point": "envhub_broken.plugin",
                       "description": None, "error": "RuntimeError: this plugin is broken on purpose"}]
    assert any(r["id"] == "frozenlake/FrozenLake-v0" for r in rows)
    result = CliRunner().invoke(cli, ["list"])
    assert "plugin envhub-broken failed to load: RuntimeError" in result.output


def test_info_shows_spec_instructions_and_first_observation():
    result = invoke("info", "frozenlake/FrozenLake-v0")
    assert result.exit_code == 0
    assert "max turns:   20" in result.output and "Legend" in result.output and "First observation" in result.output
    payload = json.loads(invoke("info", ENV, "--json").output)
    assert payload["kwargs"]["is_slippery"] is False and payload["valid_actions"] == ["Left", "Down", "Right", "Up"]


def test_run_json_one_line_per_episode():
    result = invoke("run", ENV, "--policy", "expert", "--episodes", "3", "--seed", "5", "--json")
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [r["seed"] for r in lines] == [5, 6, 7]
    for record in lines:
        assert set(record) == {"env_id", "seed", "return", "success", "turns", "invalid_actions", "transcript"}
        assert record["success"] and record["return"] == 1.0 and record["invalid_actions"] == 0
        assert record["turns"] == len(record["transcript"]) - 1
        assert set(record["transcript"][1]) == {"observation", "action", "reward", "info"}


def test_run_for_people_shows_boards_and_a_summary():
    result = invoke("run", ENV, "--policy", "random", "--episodes", "2", "--max-turns", "4")
    assert result.exit_code == 0
    assert "turn 1:" in result.output and "2 episodes: success" in result.output


def test_run_human_reads_actions_from_stdin():
    result = invoke("run", ENV, "--policy", "human", "--json", input="Right\njump\n")
    record = json.loads(result.stdout)
    actions = [t["action"] for t in record["transcript"][1:]]
    assert actions == ["Right", "jump"] and record["invalid_actions"] == 1


def test_run_takes_env_keyword_arguments_and_refuses_bad_ones_in_one_line():
    record = json.loads(invoke("run", ENV, "--policy", "expert", "--env-kwarg", "view=local", "--json").output)
    assert record["transcript"][0]["observation"].startswith("Row 1, column 1.") and record["success"]
    for args, message in (
        (["--env-kwarg", "view"], "'view' is not KEY=VALUE"),
        (["--env-kwarg", "colour=red"], "does not take these settings (colour)"),
        (["--env-kwarg", "view=sideways"], "refuses --env-kwarg view: unknown view 'sideways'"),
    ):
        result = CliRunner().invoke(cli, ["run", ENV, *args])
        assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output


def test_run_unknown_env_and_policy_are_one_line_errors():
    result = CliRunner().invoke(cli, ["run", "frozenlake/FrozenLak-v0"])
    assert result.exit_code == 1 and "Did you mean 'frozenlake/FrozenLake-v0'" in result.output
    result = CliRunner().invoke(cli, ["run", ENV, "--policy", "psychic"])
    assert result.exit_code == 1 and "no policy called 'psychic'" in result.output


def test_check_passes_and_prints_json():
    result = invoke("check", ENV, "--json")
    assert result.exit_code == 0
    report = json.loads(result.output[result.output.index("{"):])
    assert report["ok"] and any(c["name"].startswith("fuzz of 1000") for c in report["checks"])


def test_check_takes_env_kwargs_and_refuses_bad_ones_in_one_line(monkeypatch):
    from envhub import checker

    seen = []
    real = checker.check_env
    monkeypatch.setattr(checker, "check_env", lambda env_id, **kw: seen.append(kw) or real(env_id, **kw))
    result = invoke("check", "sokoban/Sokoban-v0", "--env-kwarg", "view=local", "--fuzz", "50")
    assert result.exit_code == 0 and "checks passed" in result.output
    assert seen == [{"fuzz": 50, "view": "local"}]
    result = CliRunner().invoke(cli, ["check", "sokoban/Sokoban-v0", "--env-kwarg", "view=map"])
    assert result.exit_code == 1 and "sokoban/Sokoban-v0 refuses --env-kwarg view: unknown view 'map'" in result.output
    assert "Traceback" not in result.output


def test_check_exits_non_zero_with_a_readable_report(monkeypatch):
    from envhub_frozenlake.env import FrozenLakeTextEnv

    monkeypatch.setattr(FrozenLakeTextEnv, "expert_action", lambda self: "Jump")
    result = CliRunner().invoke(cli, ["check", ENV, "--fuzz", "1000"])
    assert result.exit_code == 1
    assert "FAIL  expert_action is legal" in result.output and "'Jump'" in result.output


def test_list_takes_glob_patterns_and_names_close_ids_when_none_match():
    result = invoke("list", "sokoban/*8x8*", "frozenlake/*NotSlippery*", "--json")
    assert [r["id"] for r in json.loads(result.output)] == [
        "frozenlake/FrozenLake8x8NotSlippery-v0", "frozenlake/FrozenLakeNotSlippery-v0", "sokoban/Sokoban8x8-v0"]
    result = CliRunner().invoke(cli, ["list", "sokobn/*"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "no environment id matches 'sokobn/*'; close: sokoban/*" in result.output and "Traceback" not in result.output


def test_check_takes_patterns_and_refuses_one_that_matches_nothing():
    result = CliRunner().invoke(cli, ["check", "frozenlake/FrozenLake8x8*", "--fuzz", "20"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("PASS")]
    assert sorted(line.split()[1] for line in lines) == ["frozenlake/FrozenLake8x8-v0", "frozenlake/FrozenLake8x8NotSlippery-v0"]
    assert "2/2 environments passed" in result.output
    result = CliRunner().invoke(cli, ["check", "frozenlake/Frozen*-v9"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "no environment id matches 'frozenlake/Frozen*-v9'; close: frozenlake/" in result.output
    result = CliRunner().invoke(cli, ["check", "--all", "sokoban/*"])
    assert result.exit_code == 2 and "not both" in result.output


class _Sleeper:
    """An entry point whose env never finishes making: what --timeout is for."""

    def __call__(self, **kwargs):
        import time

        time.sleep(600)


def test_check_timeout_fails_the_slow_env_and_the_run_goes_on():
    import envhub

    envhub.register("slowtest/Sleeps-v0", _Sleeper())
    try:
        result = CliRunner().invoke(cli, ["check", "slowtest/Sleeps-v0", ENV, "-j", "2", "--timeout", "20", "--fuzz", "20"])
    finally:
        envhub.registry.remove("slowtest/Sleeps-v0")
    assert result.exit_code == 1, result.output
    assert "FAIL  slowtest/Sleeps-v0  0/1 checks passed; failed: finishes within the timeout" in result.output
    assert "not finished after 20 s (--timeout); stopped" in result.output
    assert f"PASS  {ENV}  7/7 checks passed" in result.output and "1/2 environments passed" in result.output


def test_check_streams_one_line_per_env_to_a_pipe_as_each_finishes():
    script = Path(sys.executable).parent / "envhub"
    ids = [ENV, "frozenlake/FrozenLake-v0", "sokoban/Sokoban-v0"]
    with subprocess.Popen([str(script), "check", *ids, "-j", "1", "--timeout", "300", "--fuzz", "20"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}) as proc:
        first = proc.stdout.readline()
        still_running = proc.poll() is None  # the first line came while the other envs were being checked
        rest = proc.stdout.read()
        proc.wait(timeout=300)
    assert first.startswith(f"PASS  {ENV}  7/7 checks passed") and still_running
    assert proc.returncode == 0 and "3/3 environments passed" in rest and "Traceback" not in rest


def test_installed_envhub_script_runs_in_a_subprocess():
    script = Path(sys.executable).parent / "envhub"
    assert script.exists(), "the envhub console script is not installed next to this Python"
    out = subprocess.run([str(script), "run", ENV, "--policy", "expert", "--json"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "3"}, timeout=120, check=True).stdout
    assert json.loads(out)["success"] is True
    out = subprocess.run([str(script), "list", "--json"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert any(r["id"] == ENV for r in json.loads(out))


# ---------------------------------------------------------------------- what a new user meets (issue 15)


def test_bad_run_arguments_are_one_line_errors_not_tracebacks(tmp_path):
    result = CliRunner().invoke(cli, ["run", ENV, "--seed", "-5"])
    assert result.exit_code == 2 and "-5 is not in the range x>=0" in result.output
    result = CliRunner().invoke(cli, ["run", ENV, "--render", str(tmp_path / "fl.gif")])
    assert result.exit_code == 1 and result.output.startswith(f"Error: {ENV} cannot draw pictures")
    result = CliRunner().invoke(cli, ["run", "sokoban/Sokoban-v0", "--render", str(tmp_path / "boards.txt")])
    assert result.exit_code == 1 and "cannot write '.txt' pictures" in result.output
    assert not (tmp_path / "boards.txt").exists()


def test_render_writes_jpeg_files_not_folders(tmp_path):
    target = tmp_path / "board.jpg"
    result = invoke("run", "sokoban/Sokoban-v0", "--policy", "expert", "--render", str(target))
    assert result.exit_code == 0 and target.is_file() and target.read_bytes()[:3] == b"\xff\xd8\xff"
    two = tmp_path / "two.jpeg"
    invoke("run", "sokoban/Sokoban-v0", "--policy", "expert", "--episodes", "2", "--render", str(two))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("two")) == ["two-ep0.jpeg", "two-ep1.jpeg"]


def test_short_version_flag_python_m_and_counted_nouns():
    assert invoke("-V").output.startswith("envhub, version ")
    out = subprocess.run([sys.executable, "-m", "envhub", "-V"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith("envhub, version ")
    result = invoke("run", ENV, "--policy", "random", "--max-turns", "1")
    assert "in 1 turn," in result.output and "1 turns" not in result.output
    assert "Episodes to play, one seed each." in invoke("run", "--help").output


def test_info_names_the_legal_actions_once():
    output = invoke("info", "frozenlake/FrozenLake-v0").output
    assert output.count("Legal actions on the first turn:") == 1


def test_unknown_id_hints_name_only_real_distributions(monkeypatch):
    from envhub import registration

    result = CliRunner().invoke(cli, ["info", "nosuch"])
    assert result.exit_code == 1 and "pip install" not in result.output and "envhub list" in result.output
    result = CliRunner().invoke(cli, ["info", "frozenlake/FrozenLak-v0"])
    assert "Did you mean 'frozenlake/FrozenLake-v0'" in result.output and "pip install" not in result.output
    # A namespace of a known plugin that is not installed gets that plugin's real name.
    # (envhub-textarena and envhub-alfworld are installed now, so a namespace no distribution here
    # provides stands in.)
    monkeypatch.setitem(registration.KNOWN_PLUGINS, "minigrid", "envhub-minigrid")
    result = CliRunner().invoke(cli, ["info", "minigrid/Empty-v0"])
    assert "Its plugin is not installed: pip install 'envhub-minigrid'" in result.output


def test_policy_errors_point_at_the_real_cure():
    result = CliRunner().invoke(cli, ["run", ENV, "--policy", "/nonexistent/model"])
    assert result.exit_code == 1 and "is not a model folder" in result.output and "pip install" not in result.output
    result = CliRunner().invoke(cli, ["run", ENV, "--policy", "psychic"])
    assert "a model folder, 'tiny', 'smollm2-135m' or a Hugging Face model id" in result.output


def test_missing_plugin_commands_and_unmatched_plugin_filters_are_named():
    env = {**os.environ, "ENVHUB_PLUGINS": "frozenlake,nosuch", "HF_HUB_OFFLINE": "1"}
    script = Path(sys.executable).parent / "envhub"
    result = subprocess.run([str(script), "eval", ENV], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2 and "`envhub eval` comes with a plugin that is not installed: pip install 'envhub-trl'" in result.stderr
    result = subprocess.run([str(script), "list"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and "warning: ENVHUB_PLUGINS names no installed plugin ['nosuch']" in result.stderr
    assert "frozenlake/FrozenLake-v0" in result.stdout


def test_human_help_costs_no_turn_and_quit_or_end_of_input_stops_every_episode():
    result = invoke("run", ENV, "--policy", "human", "--episodes", "3", "--json", input="help\nRight\nquit\n")
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 1  # quit stops the run, not only the episode
    assert [t["action"] for t in records[0]["transcript"][1:]] == ["Right"] and records[0]["turns"] == 1
    assert "Legal actions now: Left, Down, Right, Up." in result.stderr
    assert "stopped after 1 episode of 3" in result.stderr
    result = invoke("run", ENV, "--policy", "human", "--episodes", "2", "--json", input="Up\n")  # input ends mid-episode
    assert len(result.stdout.splitlines()) == 1


def test_people_see_what_a_move_did_when_it_is_not_what_they_chose():
    from envhub import make

    env = make("frozenlake/FrozenLake-v0")
    env.reset(seed=0)
    slid = False
    for _ in range(20):
        _, _, terminated, truncated, info = env.step("Right")
        assert info["moved"] in ("Left", "Down", "Right", "Up", "nowhere")
        slid |= info["moved"] not in ("Right", "nowhere")
        if terminated or truncated:
            break
    lines = invoke("run", "frozenlake/FrozenLake-v0", "--policy", "random", "--seed", "3", "--max-turns", "8").output
    assert "(you slid: moved " in lines
    lines = invoke("run", ENV, "--policy", "human", input="Up\nquit\n").output
    assert "turn 1: Up (you did not move) -> reward +0" in lines  # the top edge


def test_taxi_pictures_print_no_display_warning(tmp_path):
    script = Path(sys.executable).parent / "envhub"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SDL_", "XDG_RUNTIME"))}
    result = subprocess.run([str(script), "run", "gym/Taxi-v3", "--max-turns", "1", "--render", str(tmp_path / "taxi.png")],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and (tmp_path / "taxi.png").is_file()
    assert "XDG_RUNTIME_DIR" not in result.stderr + result.stdout


def test_run_plays_through_the_managers_turn_loop():
    """``envhub run`` is the training turn loop on a 1x1 manager: the same seeds and generator give
    the same episode as :func:`envhub.rollout.rollout` does."""
    from envhub.generation import RandomGenerator
    from envhub.manager import EnvGroupManager
    from envhub.rollout import rollout

    record = json.loads(invoke("run", "frozenlake/FrozenLake-v0", "--policy", "random", "--seed", "3", "--max-turns", "12", "--json").output)
    with EnvGroupManager("frozenlake/FrozenLake-v0", 1, 1, max_turns=12) as manager:
        (trajectory,) = rollout(manager, RandomGenerator(3), seeds=[3])
    assert [t["action"] for t in record["transcript"][1:]] == [turn.action for turn in trajectory.turns]
    assert [t["observation"] for t in record["transcript"][1:]] == [t.observation for t in trajectory.turns[1:]] + [record["transcript"][-1]["observation"]]
    assert record["success"] == trajectory.success and record["turns"] == trajectory.num_turns


def test_run_reports_an_env_that_fails_mid_episode_and_one_that_cannot_start():
    from helper_envs import BAD_SEED, registered

    with registered("test/Flaky-v0", "helper_envs:FlakyEnv", max_turns=5):
        record = json.loads(invoke("run", "test/Flaky-v0", "--policy", "human", "--json", input="Ok\nBoom\n").stdout)
        assert record["turns"] == 1 and record["error"].startswith("RuntimeError: boom")
        result = CliRunner().invoke(cli, ["run", "test/Flaky-v0", "--seed", str(BAD_SEED)])
        assert result.exit_code == 1 and "test/Flaky-v0 could not start: RuntimeError: cannot reset with the bad seed" in result.output
        assert "Traceback" not in result.output


def test_run_json_writes_a_nonfinite_reward_as_null_with_a_flag():
    from helper_envs import registered

    with registered("test/NanReward-v0", "helper_envs:NanRewardEnv", max_turns=5):
        output = invoke("run", "test/NanReward-v0", "--policy", "expert", "--json").stdout

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    record = json.loads(output, parse_constant=refuse)  # NaN, Infinity: not JSON
    assert record["return"] is None and record["nonfinite_reward"] is True
    assert record["transcript"][-1]["reward"] is None and record["turns"] == 1
    clean = json.loads(invoke("run", ENV, "--policy", "expert", "--json").stdout)
    assert "nonfinite_reward" not in clean and clean["return"] == 1.0
