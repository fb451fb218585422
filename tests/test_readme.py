"""The README's plugin example works as written."""

import importlib
import re
from pathlib import Path

import pytest

import envhub
from envhub import plugins
from envhub.checker import check_env

README = Path(__file__).parents[1] / "README.md"


def test_readme_plugin_example_registers_a_passing_env(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    source = next(b for b in blocks if b.startswith("# my_envs/plugin.py"))
    package = tmp_path / "my_envs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("my_envs.plugin")
    plugins.host.add(module, name="mine")
    try:
        assert envhub.spec("mine/Guess-v0").plugin == "mine"
        report = check_env("mine/Guess-v0")
        assert report.ok, report.format()
    finally:
        plugins.host.remove("mine")


def test_readme_plugin_pyproject_is_whole():
    import tomllib

    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), re.S)
    project = tomllib.loads(next(b for b in blocks if "[project.entry-points.envhub]" in b))
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    assert project["project"]["name"] and project["project"]["version"] and "envhub" in project["project"]["dependencies"]
    assert project["project"]["entry-points"]["envhub"] == {"mine": "my_envs.plugin"}


@pytest.mark.slow
def test_readme_training_example_runs_on_the_cpu(tmp_path, monkeypatch):
    """The README's Python training example, as written but for its sizes (one step of 2 x 2
    episodes) and the model (the tiny one, in a folder as the example expects)."""
    import pytest

    pytest.importorskip("trl")
    from envhub_trl.models import resolve_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    source = next(b for b in blocks if "EnvGRPOTrainer(model=" in b)
    model = resolve_model("tiny", ["sokoban/Sokoban-v0"], 0)
    for written, small in (
        ('"path/or/hub-id"', repr(str(model))),
        ("groups_per_step=8, group_size=8, per_device_train_batch_size=16, max_steps=200",
         "groups_per_step=2, group_size=2, per_device_train_batch_size=4, max_steps=1, eval_episodes=2, max_turn_tokens=8"),
    ):
        assert written in source, f"the README example changed: {written} is gone"
        source = source.replace(written, small)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(source, "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["trainer"].state.global_step == 1


def test_readme_tool_env_snippet_prints_what_its_comments_say(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    source = next(b for b in blocks if b.startswith("# tool env"))
    exec(compile(source, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    promised = [line.split("# ", 1)[1].strip() for line in source.splitlines() if line.startswith("print(")]
    assert printed == promised
