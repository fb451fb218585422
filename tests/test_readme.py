"""The README's plugin example works as written."""

import importlib
import re
from pathlib import Path

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
