"""The README and the docs pages work as written: their code runs, their commands exist, their
figures are the results page's, and every page is on the site."""

import dataclasses
import importlib
import re
import shlex

import click
import pytest
import yaml
from docs_pages import DOCS, README, ROOT, code_block, code_blocks, pages

import envhub
from envhub import plugins
from envhub.checker import check_env
from envhub.cli import cli


def test_readme_is_read_in_five_minutes():
    assert README.stat().st_size <= 12 * 1024


def test_readme_makes_resets_and_steps_in_six_lines(capsys):
    source = code_block(README, "python", lambda b: 'envhub.make("frozenlake/FrozenLake-v0")' in b)
    assert len([line for line in source.splitlines() if line.strip()]) == 6
    namespace: dict = {}
    exec(compile(source, "README.md", "exec"), namespace)  # noqa: S102
    env, info = namespace["env"], namespace["info"]
    printed = capsys.readouterr().out
    assert env.instructions in printed and "Down" in printed and printed.rstrip().endswith(info["state_key"])
    assert info["action_is_valid"] and isinstance(info["success"], bool) and namespace["reward"] in (0.0, 1.0)


def test_docs_home_block_plays_an_expert_step(capsys):
    source = code_block(DOCS / "index.md", "python", lambda b: "envhub.make(" in b)
    namespace: dict = {}
    exec(compile(source, "docs/index.md", "exec"), namespace)  # noqa: S102
    assert namespace["info"]["action_is_valid"] and capsys.readouterr().out


def test_environments_page_blocks_run_in_order():
    """The make/reset/step block, the reply block (which uses its env) and the Gymnasium block (in this
    process; tests/test_gymnasium_habits.py runs its habits in fresh ones)."""
    page = DOCS / "environments.md"
    namespace: dict = {}
    for wanted in ('envhub.make("frozenlake/FrozenLake-v0")', 'apply_reply(env, "<think>', "gymnasium.make("):
        source = code_block(page, "python", lambda b, wanted=wanted: wanted in b)
        exec(compile(source, "docs/environments.md", "exec"), namespace)  # noqa: S102
    assert namespace["outcome"].info["action_is_valid"] and namespace["outcome"].parsed is not None
    assert namespace["env"].spec.id == "frozenlake/FrozenLake-v0" and namespace["env"].unwrapped.max_turns == 30
    assert namespace["boxes"].spec.id == "sokoban/Sokoban-v0"


def test_plugin_page_example_registers_a_passing_env(tmp_path, monkeypatch):
    source = code_block(DOCS / "plugins.md", "python", lambda b: b.startswith("# my_envs/plugin.py"))
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


def test_plugin_page_pyproject_is_whole():
    import tomllib

    project = tomllib.loads(code_block(DOCS / "plugins.md", "toml", lambda b: "[project.entry-points.envhub]" in b))
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    assert project["project"]["name"] and project["project"]["version"] and "envhub" in project["project"]["dependencies"]
    assert project["project"]["entry-points"]["envhub"] == {"mine": "my_envs.plugin"}


@pytest.mark.slow
def test_training_page_example_runs_on_the_cpu(tmp_path, monkeypatch):
    """The training page's Python example, as written but for its sizes (one step of 2 x 2
    episodes) and the model (the tiny one, in a folder as the example expects)."""
    pytest.importorskip("trl")
    from envhub_trl.models import resolve_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = code_block(DOCS / "training.md", "python", lambda b: "EnvGRPOTrainer(model=" in b)
    model = resolve_model("tiny", ["sokoban/Sokoban-v0"], 0)
    for written, small in (
        ('"path/or/hub-id"', repr(str(model))),
        ("groups_per_step=8, group_size=8, per_device_train_batch_size=16, max_steps=200",
         "groups_per_step=2, group_size=2, per_device_train_batch_size=4, max_steps=1, eval_episodes=2, max_turn_tokens=8"),
    ):
        assert written in source, f"the training page's example changed: {written} is gone"
        source = source.replace(written, small)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(source, "docs/training.md", "exec"), namespace)  # noqa: S102
    assert namespace["trainer"].state.global_step == 1


def test_environments_page_tool_env_snippet_prints_what_its_comments_say(capsys):
    source = code_block(DOCS / "environments.md", "python", lambda b: b.startswith("# tool env"))
    exec(compile(source, "docs/environments.md", "exec"), {})  # noqa: S102
    printed = capsys.readouterr().out.splitlines()
    promised = [line.split("# ", 1)[1].strip() for line in source.splitlines() if line.startswith("print(")]
    assert printed == promised


def _envhub_commands() -> list[tuple[str, str]]:
    """Every ``envhub ...`` line of the shell blocks (bash, or no language) of the README and the
    docs pages, with continuation lines joined: (page, line)."""
    found = []
    for page in pages():
        for block in code_blocks(page, "bash") + code_blocks(page, ""):
            for line in block.replace("\\\n", " ").splitlines():
                if line.startswith("envhub "):
                    found.append((str(page.relative_to(ROOT)), line))
    return found


def _options(command: click.Command, ctx: click.Context) -> set[str]:
    names = set(ctx.help_option_names)
    for param in command.params:
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names


@pytest.mark.parametrize(("page", "line"), _envhub_commands(), ids=lambda value: " ".join(shlex.split(value, comments=True)[:3]))
def test_docs_commands_name_real_commands_and_options(page, line):
    """A command shown in the docs exists, and so does every option it shows (placeholders such as
    ``[--seed N]`` and ``--model PATH|smollm2-135m`` are read for their option names)."""
    words = shlex.split(line, comments=True)[1:]
    command: click.Command = cli
    # Contexts made as click makes them (with each command's context_settings): click caches a
    # command's help option from the first context that asks, and a bare one has no "-h".
    ctx = click.Context(cli, info_name="envhub", **cli.context_settings)
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        sub = command.get_command(ctx, words[0])
        assert sub is not None, f"{page}: `envhub ... {words[0]}` is not a command: {line}"
        command, ctx, words = sub, click.Context(sub, info_name=words[0], parent=ctx, **sub.context_settings), words[1:]
    assert not isinstance(command, click.Group), f"{page}: {line} names a group, not a command"
    known = _options(command, ctx)
    if ctx.command_path == "envhub train":  # any config field is a flag of train (--max-steps 50)
        from envhub_trl.config import EnvGRPOConfig

        known.update(f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(EnvGRPOConfig))
    for word in words:
        option = word.strip("[]").split("=", 1)[0]
        if option.startswith("-") and len(option) > 1:
            assert option in known, f"{page}: {option} is not an option of `{ctx.command_path}`: {line}"


def test_docs_show_commands():
    """The command check above runs over something: the README's tour and the training command."""
    lines = [line for page, line in _envhub_commands() if page == "README.md"]
    assert any(line.startswith("envhub train ") for line in lines) and len(lines) >= 10


def _nav_pages(nav) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(v) for v in nav.values()))
    return set().union(*(_nav_pages(v) for v in nav))


def test_every_docs_page_is_on_the_site_and_in_the_readme_table():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    on_site = _nav_pages(config["nav"])
    written = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert on_site == written
    linked = set(re.findall(r"\]\(docs/([\w/.-]+\.md)\)", README.read_text()))
    assert linked <= written
    assert written - linked == {"index.md", "api/trainer.md"}  # the home page is the README; one API link covers both


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_readme_training_command_and_figures_are_the_demo_and_its_results():
    """The README's one training command is what `make demo` runs, and each figure it quotes is in
    the results page's demo section, where the run that measured it is described."""
    train = _section(README.read_text(), "## Train an agent")
    command = code_block(README, "bash", lambda b: b.startswith("envhub train ") and "frozenlake_demo" in b).strip()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:.*\n\t.*/envhub " + re.escape(command.removeprefix("envhub ")) + "$", makefile, re.M)
    demo = _section((DOCS / "results.md").read_text(), "## The demo")
    figures = re.findall(r"\d[\d,.]*%|\d+(?:\.\d+)? minutes", train)
    assert {"74.2%", "89.8%", "43.0%", "96.1%", "0.0%", "5.2 minutes"} <= set(figures)
    for figure in figures:
        assert figure in demo, f"the README's {figure} is not in the results page's demo section"
    words = " ".join(demo.split())
    assert "warm start of 100 steps" in words and "on 256 episodes" in words and "100 GiGPO steps of 128 episodes" in words



def test_readme_quick_start_is_the_shipped_config_and_its_figures_are_the_results_pages():
    """The quick start's command runs examples/quickstart.yaml, and each figure the README quotes
    (success rates, seconds) is in the results page's quick-start section, beside its command."""
    quick = _section(README.read_text(), "## Quick start")
    command = code_block(README, "bash", lambda b: "examples/quickstart.yaml" in b).strip()
    assert command == "envhub train --model tiny --config examples/quickstart.yaml --output-dir quickstart"
    results = _section((DOCS / "results.md").read_text(), "## The quick start")
    assert command in results
    figures = re.findall(r"\d[\d,.]*%|\d+ seconds", quick)
    assert {"0.0%", "90.6%", "52 seconds"} <= set(figures)
    for figure in figures:
        assert figure in results, f"the README's {figure} is not in the results page's quick-start section"

def test_training_page_generator_registration_registers_a_backend():
    pytest.importorskip("trl")
    from envhub_trl.generators import BACKENDS, capabilities_of

    source = code_block(DOCS / "training.md", "python", lambda b: "@register_generator(" in b)
    namespace: dict = {}
    exec(compile(source, "docs/training.md", "exec"), namespace)  # noqa: S102
    try:
        generator = BACKENDS["mine"].build("model", "tokenizer", None, batch_size=4)
        assert isinstance(generator, namespace["MyGenerator"]) and generator.options == {"batch_size": 4}
        assert capabilities_of(generator).weight_sync == "local" and BACKENDS["mine"].from_path is not None
    finally:
        BACKENDS.pop("mine", None)


@pytest.mark.slow
def test_training_page_rollout_by_hand_plays_a_batch(capsys):
    """The training page's rollout example as written but for its sizes and the model (the tiny one)."""
    pytest.importorskip("trl")
    from envhub_trl.models import resolve_model

    source = code_block(DOCS / "training.md", "python", lambda b: "rollout(manager, generator" in b)
    for written, small in (
        ('"path/to/model"', repr(str(resolve_model("tiny", ["frozenlake/FrozenLake-v0"], 0)))),
        ("num_groups=16, group_size=8", "num_groups=2, group_size=2"),
        ("max_new_tokens=64", "max_new_tokens=8"),
    ):
        assert written in source, f"the training page's example changed: {written} is gone"
        source = source.replace(written, small)
    namespace: dict = {}
    exec(compile(source, "docs/training.md", "exec"), namespace)  # noqa: S102
    assert len(namespace["trajectories"]) == 4 and "success_rate" in capsys.readouterr().out
    assert {"prompt_ids", "completion_ids", "env_mask"} <= set(namespace["columns"])


def test_training_page_mix_config_loads_as_envhub_train_loads_it(tmp_path):
    """The training page's mix and curriculum block is a valid config fragment: loaded exactly as
    a shipped config is (its fields, envs and curriculum checked against EnvGRPOConfig)."""
    pytest.importorskip("trl")
    from test_shipped_configs import test_a_shipped_config_loads

    source = code_block(DOCS / "training.md", "yaml", lambda b: b.startswith("envs:"))
    assert "curriculum:" in source
    path = tmp_path / "mix.yaml"
    path.write_text(source, encoding="utf-8")
    test_a_shipped_config_loads(path, tmp_path)


def test_docs_make_targets_exist():
    """Every `make TARGET` line of the shell blocks of the README and the docs pages names a target
    of the Makefile."""
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    shown = [
        (page, line)
        for page in pages()
        for block in code_blocks(page, "bash")
        for line in block.splitlines()
        if line.startswith("make ")
    ]
    assert len(shown) >= 8
    for page, line in shown:
        target = shlex.split(line, comments=True)[1]
        assert target in targets, f"{page.relative_to(ROOT)}: make {target} is not a Makefile target"
