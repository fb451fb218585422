"""Gymnasium 1.x's own ways of reaching a plugin's envs, each in a fresh interpreter.

Gymnasium 1.0 removed the ``gymnasium.envs`` entry points, so ``import gymnasium`` alone cannot know
envhub's ids. What Gymnasium 1.x offers instead is importing the package that registers them: the
``"module:id"`` form of ``gymnasium.make``, or an import (``gymnasium.register_envs(module)``) first.
"""

import json
import subprocess
import sys

import pytest

#: Each plugin package, and one of its ids.
PLUGINS = [
    ("envhub_frozenlake", "frozenlake/FrozenLake-v0"),
    ("envhub_sokoban", "sokoban/Sokoban-v0"),
    ("envhub_webshop", "webshop/WebShop-v0"),
    ("envhub_tools", "tools/Countdown-v0"),
    ("envhub_textarena", "textarena/TicTacToe-v0"),
    ("envhub_textworld", "textworld/Simple-v0"),
    ("envhub_alfworld", "alfworld/ALFWorldGenerated-v0"),
]


def _python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize(("package", "env_id"), PLUGINS, ids=[p for p, _ in PLUGINS])
def test_importing_a_plugin_package_registers_its_ids_with_gymnasium_and_only_its_own(package, env_id):
    code = (
        f"import sys, json, gymnasium, {package}; gymnasium.register_envs({package}); "
        f"spec = gymnasium.spec({env_id!r}); "
        "others = sorted(m for m in sys.modules if m.endswith('.plugin') and m != 'envhub.plugins'); "
        "print(json.dumps([spec.id, others]))"
    )
    registered, plugin_modules = json.loads(_python(code))
    assert registered == env_id and plugin_modules == [f"{package}.plugin"]


def test_gymnasium_make_with_the_module_prefix_in_a_fresh_process():
    code = (
        "import gymnasium; env = gymnasium.make('envhub_frozenlake:frozenlake/FrozenLake-v0', max_turns=7); "
        "obs, info = env.reset(seed=0); print(type(env.unwrapped).__name__, env.unwrapped.max_turns, isinstance(obs, str))"
    )
    assert _python(code) == "FrozenLakeTextEnv 7 True"


def test_gymnasium_make_after_importing_the_plugin_in_a_fresh_process():
    code = (
        "import gymnasium, envhub_sokoban; env = gymnasium.make('sokoban/Sokoban-v0'); "
        "env.reset(seed=1); print(type(env.unwrapped).__name__)"
    )
    assert _python(code) == "SokobanEnv"


def test_an_imported_plugin_is_not_loaded_twice_by_envhub():
    code = (
        "import envhub_frozenlake, envhub, gymnasium; from envhub import plugins; "
        "envhub.make('frozenlake/FrozenLake-v0'); envhub.load_plugins(); "
        "info = plugins.host.infos['envhub-frozenlake']; "
        "print(info.error, info.conflicts, len(info.env_ids), len(set(info.env_ids)), "
        "gymnasium.spec('sokoban/Sokoban-v0').id)"
    )
    assert _python(code) == "None [] 4 4 sokoban/Sokoban-v0"


def test_envhub_loading_the_plugin_first_then_importing_it_registers_nothing_twice():
    code = (
        "import envhub; envhub.load_plugins(); import envhub_tools, gymnasium; "
        "from envhub import plugins; info = plugins.host.infos['envhub-tools']; "
        "print(info.error, len(info.env_ids) == len(set(info.env_ids)), gymnasium.spec('tools/Countdown-v0').id)"
    )
    assert _python(code) == "None True tools/Countdown-v0"
