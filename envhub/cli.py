"""The ``envhub`` command line: list, inspect, play and check environments.

Plugins add commands (``train``, ``eval``, ``webshop serve``) through the ``register_commands``
hook; they are attached the first time the group resolves a command.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

import envhub
from envhub import plugins
from envhub.checker import check_envs
from envhub.core import OUTCOME_KEY, ToolEnv, jsonable, shorten
from envhub.error import EnvhubError
from envhub.executors import DEFAULT_STEP_TIMEOUT
from envhub.manager import EnvGroupManager
from envhub.play import HumanGenerator, Player, StartError, Step, get_player, play
from envhub.registration import make, registry, spec
from envhub.tools import describe_tools

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class EnvhubGroup(click.Group):
    """A click group that attaches plugin commands once, on first lookup."""

    _plugins_attached = False

    def _attach_plugins(self) -> None:
        if not self._plugins_attached:
            self._plugins_attached = True
            plugins.host.register_commands(self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._attach_plugins()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._attach_plugins()
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in PLUGIN_COMMANDS:
            ctx.fail(f"`envhub {cmd_name}` comes with a plugin that is not installed: pip install '{PLUGIN_COMMANDS[cmd_name]}'")
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EnvhubError as exc:
            raise click.ClickException(str(exc)) from exc


#: Commands that plugins add, and the distribution of each (named when it is missing).
PLUGIN_COMMANDS = {"train": "envhub-trl", "eval": "envhub-trl", "export-sft": "envhub-trl", "webshop": "envhub-webshop"}


@click.group(cls=EnvhubGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(envhub.__version__, "--version", "-V", prog_name="envhub")
def cli() -> None:
    """envhub: multi-turn text environments for training LLM agents with RL."""


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table.")


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """Format ``rows`` as a plain-text table with ``headers``."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---------------------------------------------------------------------- list / plugins / info


def _warn_unmatched_plugins() -> None:
    """Warn on stderr about ENVHUB_PLUGINS names that match no installed plugin."""
    plugins.load_plugins()
    if plugins.host.unmatched_allowed:
        click.echo(
            f"warning: ENVHUB_PLUGINS names no installed plugin {plugins.host.unmatched_allowed}; "
            f"installed: {', '.join(plugins.host.available)}",
            err=True,
        )


def _is_pattern(text: str) -> bool:
    return any(c in text for c in "*?[")


def _matching(ids: Sequence[str], patterns: Sequence[str]) -> list[str]:
    """The ids that match any of the glob ``patterns`` (fnmatch, case-sensitive), in order.

    Raises:
        click.ClickException: for a pattern that matches nothing, naming the closest ids.
    """
    matched: dict[str, None] = {}
    for pattern in patterns:
        found = [i for i in ids if fnmatch.fnmatchcase(i, pattern)]
        if not found:
            candidates = list(ids) + sorted({f"{i.partition('/')[0]}/*" for i in ids})
            close = difflib.get_close_matches(pattern, candidates, n=3, cutoff=0.6)
            hint = f"; close: {', '.join(close)}" if close else ""
            raise click.ClickException(f"no environment id matches {pattern!r}{hint}. Run `envhub list` to see every id.")
        matched.update(dict.fromkeys(found))
    return list(matched)


@cli.command("list")
@click.argument("patterns", nargs=-1, metavar="[PATTERN]...")
@json_option
@click.option("--unavailable", is_flag=True, help="List the ids plugins know but cannot offer here, with the reason.")
def list_envs(patterns: tuple[str, ...], as_json: bool, unavailable: bool) -> None:
    """List every registered environment, and plugins that failed to load.

    PATTERN keeps the ids that match it, as a shell glob: 'sokoban/*', '*8x8*'.
    """
    if unavailable:
        missing = plugins.unavailable_envs()
        if patterns:
            missing = {i: missing[i] for i in _matching(sorted(missing), patterns)}
        if as_json:
            rows = [{"id": i, "plugin": plugin, "reason": reason} for i, (plugin, reason) in sorted(missing.items())]
            click.echo(json.dumps(rows, indent=2))
        else:
            click.echo(table([(i, plugin, reason) for i, (plugin, reason) in sorted(missing.items())], ["id", "plugin", "reason"]))
        return
    specs = registry.values()
    if patterns:
        keep = set(_matching([s.id for s in specs], patterns))
        specs = [s for s in specs if s.id in keep]
    _warn_unmatched_plugins()
    broken = [p for p in plugins.plugin_infos() if p.error]
    if as_json:
        rows = [
            {"id": s.id, "plugin": s.plugin, "version": s.version, "entry_point": s.entry_point_str,
             "description": s.description, "error": None}
            for s in specs
        ]
        rows += [
            {"id": None, "plugin": p.name, "version": p.version, "entry_point": p.entry_point,
             "description": None, "error": p.error}
            for p in broken
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(table([(s.id, s.plugin, s.version, s.description) for s in specs], ["id", "plugin", "version", "description"]))
    for p in broken:
        click.echo(f"\nplugin {p.name} failed to load: {p.error}", err=True)


@cli.command("plugins")
@json_option
def list_plugins(as_json: bool) -> None:
    """List the plugins envhub found, with their hooks and any load error."""
    infos = plugins.plugin_infos()
    _warn_unmatched_plugins()
    if as_json:
        click.echo(json.dumps([p.to_json() for p in infos], indent=2))
        return
    rows = [(p.name, p.version, ", ".join(p.hooks), p.error or "", "; ".join(p.conflicts)) for p in infos]
    click.echo(table(rows, ["name", "version", "hooks", "error", "conflicts"]))


@cli.command("info")
@click.argument("env_id")
@json_option
def info(env_id: str, as_json: bool) -> None:
    """Show an environment's spec, instructions and a sample first observation."""
    env_spec = spec(env_id)
    env = env_spec.make()
    observation, first_info = env.reset(seed=0)
    payload = {
        "id": env_spec.id,
        "plugin": env_spec.plugin,
        "version": env_spec.version,
        "entry_point": env_spec.entry_point_str,
        "kwargs": env_spec.kwargs,
        "max_turns": env_spec.max_turns,
        "description": env_spec.description,
        "valid_actions": env.valid_actions(),
        "instructions": env.instructions,
        "observation": observation,
    }
    if as_json:
        click.echo(json.dumps(payload, indent=2, default=str))
        return
    click.echo(f"{env_spec.id}  ({env_spec.plugin} {env_spec.version})")
    click.echo(f"  entry point: {payload['entry_point']}")
    brief = {k: shorten(v) if isinstance(v, str) else v for k, v in env_spec.kwargs.items()}
    click.echo(f"  kwargs:      {json.dumps(brief, default=str, ensure_ascii=False)}")
    click.echo(f"  max turns:   {env_spec.max_turns}")
    if env_spec.description:
        click.echo(f"  {env_spec.description}")
    click.echo(f"\nInstructions:\n{env.instructions}")
    if payload["valid_actions"] is not None:
        click.echo(f"\nLegal actions on the first turn: {', '.join(payload['valid_actions'])}")
    click.echo(f"\nFirst observation (seed 0):\n{observation}")


# ---------------------------------------------------------------------- run


def _ask(text: str) -> str:
    """One line from the person (the prompt on stderr, so that --json output stays clean)."""
    try:
        return click.prompt(text.rstrip("> "), prompt_suffix="> ", err=True)
    except click.Abort:  # click turns the end of input into Abort
        raise EOFError from None


def _player(name: str, env_id: str, seed: int) -> Player:
    if name == "human":  # prompts go to stderr so that --json output stays clean
        return Player(HumanGenerator(prompt=_ask, show=lambda text: click.echo(text, err=True)))
    return get_player(name, env_id, seed)


#: ``--render FILE`` suffixes written as one picture of each episode's last frame.
STILL_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


class FrameSink:
    """Collects ``rgb_array`` frames and writes them as ``--render`` asks: a picture of each
    episode's last frame (``.png``, ``.jpg``, ``.jpeg``, ``.webp``, ``.bmp``), one GIF of every
    frame, or, for a path without a suffix, a folder of PNG frames."""

    def __init__(self, path: Path):
        suffix = path.suffix.lower()
        if suffix and suffix != ".gif" and suffix not in STILL_SUFFIXES:
            raise EnvhubError(
                f"--render {path}: cannot write {suffix!r} pictures; use .gif (every frame), "
                f"{', '.join(STILL_SUFFIXES)} (each episode's last frame) or a folder name without a suffix"
            )
        try:
            from PIL import Image
        except ImportError as exc:
            raise EnvhubError("--render needs Pillow: pip install 'envhub[render]'") from exc
        self.image = Image
        self.path = path
        self.frames: list[list[Any]] = []
        # The folder is made now, so that a path that cannot be written fails before any episode is played.
        folder = path if not suffix else path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EnvhubError(f"--render {path}: cannot create the folder {folder} ({exc.strerror or exc}); pick a path you can write") from None

    def start_episode(self) -> None:
        self.frames.append([])

    def add(self, frame: Any) -> None:
        self.frames[-1].append(frame)

    def write(self) -> list[Path]:
        """Write what was collected; return the files written."""
        suffix = self.path.suffix.lower()
        written: list[Path] = []
        if suffix == ".gif":
            images = [self.image.fromarray(f) for episode in self.frames for f in episode]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            images[0].save(self.path, save_all=True, append_images=images[1:], duration=400, loop=0)
            written.append(self.path)
        elif suffix in STILL_SUFFIXES:
            for i, episode in enumerate(self.frames):
                target = self.path if len(self.frames) == 1 else self.path.with_name(f"{self.path.stem}-ep{i}{self.path.suffix}")
                target.parent.mkdir(parents=True, exist_ok=True)
                self.image.fromarray(episode[-1]).save(target)
                written.append(target)
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            for i, episode in enumerate(self.frames):
                for t, frame in enumerate(episode):
                    target = self.path / f"ep{i}_turn{t:03d}.png"
                    self.image.fromarray(frame).save(target)
                    written.append(target)
        return written


def _count(n: int, noun: str) -> str:
    """``1 turn``, ``2 turns``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _what_happened(info: dict[str, Any]) -> str:
    """What a move did when it is not what was chosen, as the env says it (``info["outcome"]``,
    :data:`envhub.core.OUTCOME_KEY`): slid elsewhere on ice, or blocked."""
    outcome = info.get(OUTCOME_KEY)
    return f" ({outcome})" if outcome else ""


def play_episode(
    manager: EnvGroupManager, player: Player, seed: int, *, echo: bool, sink: FrameSink | None = None, show_instructions: bool = False
) -> dict[str, Any]:
    """Play one episode from ``reset(seed=seed)`` through ``manager`` (1x1); return the ``envhub run --json`` record."""
    env_id = manager.group_env_ids[0]

    def start(step: Step, env: Any) -> None:
        if show_instructions:
            click.echo(env.instructions)
            if isinstance(env, ToolEnv):
                click.echo("\nTools:\n" + describe_tools(env.tool_schemas()))
                click.echo('Call a tool as Python, search("words"), or as JSON {"name": "search", "arguments": {"query": "words"}}.')
        if sink is not None:
            sink.start_episode()
            sink.add(env.render_rgb())
        if echo:
            click.echo(f"\n=== {env_id}  seed {seed} ===\n{step.observation}")

    def turn(step: Step, env: Any) -> None:
        if sink is not None:
            sink.add(env.render_rgb())
        if echo:
            valid = step.info["action_is_valid"]
            flag = "" if valid else "  (invalid)"
            click.echo(f"\nturn {env.turn}: {step.action}{_what_happened(step.info)} -> reward {step.reward:+g}{flag}\n{step.observation}")

    trajectory, steps = play(manager, player, seed, on_start=start, on_step=turn)
    turns = len(steps) - 1
    invalid = sum(not s.info["action_is_valid"] for s in steps[1:])
    total = sum(s.reward for s in steps)
    success = bool(steps[-1].info.get("success"))
    record = {
        "env_id": env_id,
        "seed": seed,
        "return": total,
        "success": success,
        "turns": turns,
        "invalid_actions": invalid,
        "transcript": [{"observation": s.observation, "action": s.action, "reward": s.reward, "info": jsonable(s.info)} for s in steps],
    }
    if trajectory.error is not None:
        record["error"] = trajectory.error
    if not all(math.isfinite(s.reward) for s in steps):  # written as null in JSON
        record["nonfinite_reward"] = True
    if echo:
        if trajectory.error is not None:
            click.echo(f"--- the environment failed: {trajectory.error}")
        outcome = "success" if success else "no success"
        click.echo(f"--- {outcome}: return {total:g} in {_count(turns, 'turn')}, {_count(invalid, 'invalid action')}")
    return record


def _start_error(exc: StartError, env_id: str, env_kwargs: dict[str, Any], render: bool) -> click.ClickException:
    """A one-line error that names what ``envhub run``'s options did wrong, where they did."""
    if render and exc.kind == "ValueError" and "render_mode" in exc.detail:
        return click.ClickException(f"{env_id} cannot draw pictures, which --render needs: {exc.detail}")
    if env_kwargs and exc.kind == "TypeError":
        return click.ClickException(f"{env_id} does not take these settings ({', '.join(env_kwargs)}): {exc.detail}")
    if env_kwargs and exc.kind == "ValueError":
        return click.ClickException(f"{env_id} refuses --env-kwarg {', '.join(env_kwargs)}: {exc.detail}")
    return click.ClickException(str(exc))


def _env_kwargs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any]:
    """``--env-kwarg KEY=VALUE`` options as a mapping; VALUE is read as JSON where it parses."""
    kwargs: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE (e.g. view=local)", ctx=ctx, param=param)
        try:
            kwargs[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            kwargs[key.strip()] = raw
    return kwargs


@cli.command("run")
@click.argument("env_id")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the first episode; episode i uses seed+i.")
@click.option("--episodes", type=click.IntRange(min=1), default=1, show_default=True, help="Episodes to play, one seed each.")
@click.option("--policy", default="random", show_default=True,
              help="random, expert, human, or a model path (with envhub-trl installed).")
@click.option("--max-turns", type=click.IntRange(min=1), default=None, help="Override the registered turn limit.")
@click.option("--env-kwarg", "env_kwargs", multiple=True, metavar="KEY=VALUE", callback=_env_kwargs,
              help="A keyword argument of the env (repeatable), e.g. view=local; VALUE is read as JSON where it parses (8, false), else as text.")
@click.option("--render", "render_path", type=click.Path(path_type=Path), default=None,
              help="Save pictures: FILE.png (last frame per episode), FILE.gif, or a folder of frames.")
@json_option
def run(
    env_id: str, seed: int, episodes: int, policy: str, max_turns: int | None, env_kwargs: dict[str, Any], render_path: Path | None, as_json: bool
) -> None:
    """Play episodes of ENV_ID with a policy; people see the board, scripts get JSON lines."""
    spec(env_id)  # fail fast, with suggestions, on a typo
    chosen = _player(policy, env_id, seed)
    # A model knows the env settings it trained on (its checkpoint's envhub.json).
    trained_kwargs = dict(chosen.settings.env_kwargs) if chosen.settings is not None else {}
    trained_turns = chosen.settings.max_turns if chosen.settings is not None else None
    if trained_kwargs or trained_turns:
        click.echo(f"env settings the model trained with: {trained_kwargs}, max_turns={trained_turns}", err=True)
    overridden = sorted(key for key in env_kwargs if key in trained_kwargs and trained_kwargs[key] != env_kwargs[key])
    if overridden:
        click.echo(f"--env-kwarg overrides what the model trained with: {', '.join(overridden)}", err=True)
    sink = FrameSink(render_path) if render_path else None
    manager = chosen.manager(env_id, env_kwargs={**env_kwargs, **({"render_mode": "rgb_array"} if render_path else {})}, max_turns=max_turns)
    results = []
    for i in range(episodes):
        try:
            record = play_episode(manager, chosen, seed + i, echo=not as_json, sink=sink, show_instructions=i == 0 and policy == "human" and not as_json)
        except StartError as exc:
            raise _start_error(exc, env_id, env_kwargs, render_path is not None) from None
        results.append(record)
        if as_json:
            click.echo(json.dumps(jsonable(record), allow_nan=False))
        if getattr(chosen, "stopped", False):  # the person quit, or their input ended
            if i + 1 < episodes:
                click.echo(f"stopped after {_count(i + 1, 'episode')} of {episodes}", err=True)
            episodes = i + 1
            break
    if sink is not None:
        try:
            written = sink.write()
        except OSError as exc:
            raise click.ClickException(f"--render {render_path}: cannot write {exc.filename or render_path} ({exc.strerror or exc})") from None
        click.echo(f"wrote {len(written)} picture file(s) to {render_path}", err=as_json)
    if not as_json and episodes > 1:
        successes = sum(r["success"] for r in results)
        mean_return = sum(r["return"] for r in results) / episodes
        click.echo(f"\n{episodes} episodes: success {successes}/{episodes}, mean return {mean_return:.3f}")


# ---------------------------------------------------------------------- serve


def _check_listen_address(host: str, port: int) -> None:
    """Refuse, in one line, a ``--host`` that is not an address (``999.1.1.1``), one this machine
    does not have, or a port that is taken.

    Raises:
        click.ClickException: naming which of them is wrong.
    """
    import errno
    import ipaddress
    import socket

    looks_numeric = all(c.isdigit() or c == "." for c in host)
    try:
        if looks_numeric:
            ipaddress.ip_address(host)  # 999.1.1.1 must not be looked up as a name
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (ValueError, socket.gaierror, UnicodeError):
        raise click.ClickException(f"--host {host} is not a valid address or a name known here; use e.g. 127.0.0.1 or 0.0.0.0") from None
    with socket.socket(family, kind, proto) as probe:
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise click.ClickException(f"port {port} on {host} is in use; pick another with --port") from None
            raise click.ClickException(f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick an address of this machine with --host") from None


@cli.command("serve")
@click.argument("env_id")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port to listen on.")
@click.option("--max-sessions", type=click.IntRange(min=1), default=64, show_default=True,
              help="Concurrent WebSocket sessions, each with its own environment.")
@click.option("--action-format", type=click.Choice(["answer", "think-answer", "none"]), default="answer", show_default=True,
              help="How an action's text is read: a reply in that format, or (none) the action itself.")
@click.option("--max-turns", type=click.IntRange(min=1), default=None, help="Override the registered turn limit.")
@click.option("--env-kwarg", "env_kwargs", multiple=True, metavar="KEY=VALUE", callback=_env_kwargs,
              help="A keyword argument of the env (repeatable); VALUE is read as JSON where it parses.")
@click.option("--idle-timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Seconds a session may send nothing before it is closed and its slot freed.")
@click.option("--step-timeout", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_STEP_TIMEOUT, show_default=True,
              help="Seconds one reset or step may take before its session gets an error, is closed and its slot freed.")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=1 << 20, show_default=True,
              help="The largest HTTP request body read; a larger one is answered 413.")
def serve(
    env_id: str, host: str, port: int, max_sessions: int, action_format: str, max_turns: int | None, env_kwargs: dict[str, Any],
    idle_timeout: float, step_timeout: float, max_body_bytes: int,
) -> None:
    """Serve ENV_ID over OpenEnv's HTTP/WebSocket protocol, one environment per client session.

    Any OpenEnv client works against it; the action is {"text": reply}. Episodes are played over
    the WebSocket route /ws; POST /step answers 400, naming it.
    """
    spec(env_id)  # an unknown id fails here, with suggestions, before anything is imported
    try:
        from envhub.integrations.openenv import create_app
    except ImportError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        app = create_app(env_id, max_turns=max_turns, action_format=None if action_format == "none" else action_format,
                         env_kwargs=env_kwargs, max_sessions=max_sessions, idle_timeout=idle_timeout, step_timeout=step_timeout,
                         max_body_bytes=max_body_bytes)
    except (TypeError, ValueError) as exc:
        raise click.ClickException(f"{env_id} refuses --env-kwarg {', '.join(env_kwargs) or '(none)'}: {exc}") from exc
    _check_listen_address(host, port)
    import logging

    import uvicorn

    # One line per session that ends (a client gone, a silent or stuck session closed), on stderr.
    session_log = logging.getLogger("envhub.serve")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    session_log.addHandler(handler)
    session_log.setLevel(logging.INFO)
    click.echo(
        f"serving {env_id} on http://{host}:{port} (OpenEnv protocol, up to {max_sessions} sessions; "
        f"idle timeout {idle_timeout:g} s, step timeout {step_timeout:g} s, HTTP bodies up to {max_body_bytes} bytes)",
        err=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")


# ---------------------------------------------------------------------- check


@cli.command("check")
@click.argument("env_ids", nargs=-1, metavar="[ENV_ID|PATTERN]...")
@click.option("--all", "check_all", is_flag=True, help="Check every registered environment.")
@click.option("--fuzz", type=click.IntRange(min=1), default=1000, show_default=True, help="Malformed replies to try.")
@click.option("--env-kwarg", "env_kwargs", multiple=True, metavar="KEY=VALUE", callback=_env_kwargs,
              help="Check the env made with this keyword argument (repeatable), e.g. view=local; VALUE is read as JSON where it parses.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Envs to check at once, each in its own process.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds one env may take; a slower one is stopped and reported as failed, and the run goes on.")
@json_option
def check(env_ids: tuple[str, ...], check_all: bool, fuzz: int, env_kwargs: dict[str, Any], jobs: int,
          timeout: float | None, as_json: bool) -> None:
    """Check environments against the envhub contract; exit 1 if any check fails.

    An ENV_ID may be a shell glob ('sokoban/*'). One line is printed per env as it finishes; then
    the whole report of each env that failed or could not be checked at all, or of the one env checked.
    """
    if check_all and env_ids:
        raise click.UsageError("give ids or patterns, or --all, not both")
    if check_all:
        ids = list(registry)
    elif any(_is_pattern(e) for e in env_ids):
        every = list(registry)
        ids = list(dict.fromkeys(i for e in env_ids for i in (_matching(every, [e]) if _is_pattern(e) else [e])))
    else:
        ids = list(dict.fromkeys(env_ids))
    if not ids:
        raise click.UsageError("name at least one environment id or pattern, or pass --all")
    for env_id in ids:
        spec(env_id)  # fail fast, with suggestions, on a typo
        if env_kwargs:
            try:
                make(env_id, **env_kwargs).close()
            except (TypeError, ValueError) as exc:
                raise click.ClickException(f"{env_id} refuses --env-kwarg {', '.join(env_kwargs)}: {exc}") from None
    started = time.monotonic()
    reports = {}
    # As each env finishes, one line: on stdout for people, on stderr under --json (stdout is the
    # JSON). click.echo flushes, so a pipe sees each line when it is written.
    for report in check_envs(ids, jobs=jobs, timeout=timeout, fuzz=fuzz, **env_kwargs):
        reports[report.env_id] = report
        click.echo(report.line(), err=as_json)
    ordered = [reports[i] for i in ids]
    if as_json:
        click.echo(json.dumps([r.to_json() for r in ordered] if len(ordered) > 1 else ordered[0].to_json(), indent=2))
    else:
        # Whole reports where the line is not enough: a failure, or an env nothing could be checked on.
        details = [r for r in ordered if len(ordered) == 1 or not r.ok or all(c.skipped for c in r.results)]
        if details:
            click.echo("\n" + "\n\n".join(r.format() for r in details))
        if len(ordered) > 1:
            passed = sum(r.ok for r in ordered)
            click.echo(f"\n{passed}/{len(ordered)} environments passed in {time.monotonic() - started:.0f} s")
    if not all(r.ok for r in ordered):
        sys.exit(1)
