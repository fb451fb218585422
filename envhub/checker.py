"""The conformance checker shipped with envhub (like Gymnasium's ``check_env``).

``check_env(env_id)`` makes the environment and checks the contract every envhub environment
promises: Gymnasium's return types, the info keys, determinism in one process and across processes
(with different ``PYTHONHASHSEED``), a stable ``state_key``, a legal ``expert_action``, the turn limit,
and a fuzz of malformed LLM replies that must never raise and never change the state.

``python -m envhub.checker trace RECIPE SEED`` prints the trace the cross-process check compares;
the recipe (entry point, kwargs, turn limit) lets it rebuild envs registered at run time too.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from envhub.actions import apply_reply, env_format_name, get_format
from envhub.core import INFO_KEYS, TextEnv, ToolEnv, shorten
from envhub.error import MissingDependency
from envhub.registration import EnvSpec, make, spec

#: Length of the episodes the determinism checks replay.
TRACE_TURNS = 30


@dataclasses.dataclass
class CheckResult:
    """One check: its name, whether it passed, and what went wrong (or why it was skipped:
    ``skipped`` holds the reason, and a skipped check counts as passed)."""

    name: str
    passed: bool
    detail: str = ""
    skipped: str = ""


@dataclasses.dataclass
class CheckReport:
    """Every check run on one environment."""

    env_id: str
    results: list[CheckResult] = dataclasses.field(default_factory=list)
    #: Wall-clock seconds the checks took (set by :func:`check_envs`).
    seconds: float | None = None

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        """The checks that failed."""
        return [r for r in self.results if not r.passed]

    def format(self) -> str:
        """A readable report: one line per check, details indented under failures."""
        lines = [f"envhub check {self.env_id}"]
        for r in self.results:
            if r.skipped:
                lines.append(f"  SKIP  {r.name}: {r.skipped}")
                continue
            lines.append(f"  {'PASS' if r.passed else 'FAIL'}  {r.name}")
            if r.detail and not r.passed:
                lines.extend(f"        {line}" for line in r.detail.splitlines())
        lines.append(self.summary())
        return "\n".join(lines)

    def summary(self) -> str:
        """``"6/7 checks passed, 1 skipped"``: how many of the checks that ran passed."""
        ran = [r for r in self.results if not r.skipped]
        skipped = len(self.results) - len(ran)
        return f"{sum(r.passed for r in ran)}/{len(ran)} checks passed" + (f", {skipped} skipped" if skipped else "")

    def line(self) -> str:
        """One line for a run over many envs: PASS or FAIL, the id, the summary, the failed and the
        skipped checks (with the reason, cut to 40 characters), the time."""
        failed = "; failed: " + ", ".join(r.name for r in self.failures) if self.failures else ""
        skipped = ", ".join(f"{r.name} ({shorten(r.skipped, 40)})" for r in self.results if r.skipped)
        took = f" ({self.seconds:.1f} s)" if self.seconds is not None else ""
        return f"{'PASS' if self.ok else 'FAIL'}  {self.env_id}  {self.summary()}{': ' if skipped else ''}{skipped}{failed}{took}"

    def to_json(self) -> dict[str, Any]:
        """The report as the object ``envhub check --json`` prints."""
        return {"env_id": self.env_id, "ok": self.ok, "seconds": self.seconds, "checks": [dataclasses.asdict(r) for r in self.results]}


class _Failure(Exception):
    """A check's assertion failed; the message says how."""


class _Skip(Exception):
    """A check does not apply to this environment; the message says why."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise _Failure(message)


# ---------------------------------------------------------------------- traces


def trace_episode(env: TextEnv, seed: int, turns: int = TRACE_TURNS) -> list[dict[str, Any]]:
    """Play ``turns`` turns from ``reset(seed=seed)`` with actions drawn from a generator seeded by
    ``seed`` (legal ones, one in five junk), resetting when an episode ends.

    Returns:
        One record per reset and step: observation, reward, flags and state key, JSON-ready.
    """
    rng = np.random.default_rng(seed)
    observation, info = env.reset(seed=seed)
    records = [{"observation": observation, "state_key": info["state_key"], "success": info["success"]}]
    for _ in range(turns):
        legal = env.valid_actions()
        if legal and rng.random() < 0.8:
            action = legal[int(rng.integers(len(legal)))]
        else:
            expert = env.expert_action()
            action = expert if expert is not None and rng.random() < 0.5 else "not an action"
        observation, reward, terminated, truncated, info = env.step(action)
        records.append(
            {
                "action": action,
                "observation": observation,
                "reward": float(reward),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "state_key": info["state_key"],
                "valid": bool(info["action_is_valid"]),
                "success": bool(info["success"]),
            }
        )
        if terminated or truncated:
            observation, info = env.reset()
            records.append({"observation": observation, "state_key": info["state_key"], "success": info["success"]})
    return records


def _first_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            keys = [k for k in x if x.get(k) != y.get(k)]
            return f"record {i} differs in {keys}: {str(x)[:300]} vs {str(y)[:300]}"
    return f"traces differ in length: {len(a)} vs {len(b)}"


# ---------------------------------------------------------------------- fuzz corpus


def malformed_replies(legal: list[str] | None, count: int = 1000, seed: int = 0) -> Iterator[str]:
    """Yield at least ``count`` malformed LLM replies: empty, whitespace, a megabyte, unicode,
    control characters, unclosed and nested tags, and every legal action with junk around it."""
    rng = np.random.default_rng(seed)
    actions = legal or ["search[shoes]", "click[buy now]", "Left"]
    fixed = [
        "",
        " ",
        "\n\t\r ",
        "x" * (1 << 20),
        "<answer>" * 50_000,
        "<answer>" + "Up" * 300_000 + "</answer>",
        "🧊🧊🧊 ∑∫ 汉字 עברית",
        "<answer>🧊</answer>",
        "\x00\x01\x02\x1b[31m",
        "<answer>\x00</answer>",
        "<answer>",
        "</answer>",
        "<answer></answer>",
        "<answer>   </answer>",
        "<answer><answer>Up</answer></answer>",
        "<think>unclosed",
        "<think><think></think></think><answer>Up</answer>",
        "<answer>Up</answer><think>late</think>",
        "</answer>Up<answer>",
        "<ANSWER>||</ANSWER>",
        "<answer>" + "[" * 1000 + "]" * 1000 + "</answer>",
        "<answer>search[</answer>",
        "<answer>click[]</answer>",
        "<answer>search[]]</answer>",
        "<answer>None</answer>",
        "<answer>\ud800</answer>",
    ]
    yield from fixed
    produced = len(fixed)
    junk = ["!", "...", "\x00", "🙂", "<", ">", "[x]", "\n\n", " please", "ⅠⅡ", "\u200b", "%s", "{}", "\\"]
    while produced < count:
        action = actions[produced % len(actions)]
        left = junk[int(rng.integers(len(junk)))]
        right = junk[int(rng.integers(len(junk)))]
        shape = produced % 6
        if shape == 0:
            reply = f"<answer>{left}{action}{right}</answer>"
        elif shape == 1:
            reply = f"{left}{action}{right}"
        elif shape == 2:
            reply = f"<answer>{action}"
        elif shape == 3:
            reply = f"<answer><answer>{action}</answer>{right}</answer>"
        elif shape == 4:
            reply = f"<think>{left}</think><answer>{action}{right}</answer>"
        else:
            length = int(rng.integers(1, 64))
            reply = "".join(chr(int(c)) for c in rng.integers(1, 0x2FFF, size=length) if not 0xD800 <= c <= 0xDFFF)
        yield reply
        produced += 1


def malformed_tool_calls(schemas: list[dict[str, Any]], count: int = 500, seed: int = 0) -> Iterator[str]:
    """Yield at least ``count`` bad tool-call replies for tools with ``schemas``: malformed JSON,
    unknown tools, missing, unexpected and mistyped arguments, huge arguments, arguments as the
    wrong JSON kind, nested and unclosed tags, deep nesting."""
    rng = np.random.default_rng(seed)
    names = [s["function"]["name"] for s in schemas] or ["tool"]
    params = {s["function"]["name"]: list(s["function"]["parameters"].get("properties", {})) for s in schemas}

    def call(body: str) -> str:
        return f"<tool_call>{body}</tool_call>"

    first = names[0]
    arg = (params.get(first) or ["x"])[0]
    fixed = [
        "<tool_call>",
        "</tool_call>",
        "<tool_call></tool_call>",
        call("   "),
        call("{"),
        call("{'name': '%s', 'arguments': {}}" % first),  # Python, not JSON
        call('{"name": "%s", "arguments": {"%s": "x"}' % (first, arg)),  # unclosed
        call('{"name": "%s", "arguments": {"%s": "x"}}}' % (first, arg)),  # extra brace
        call("[]"),
        call("null"),
        call("42"),
        call('"%s"' % first),
        call('{"arguments": {}}'),
        call('{"name": 7, "arguments": {}}'),
        call('{"name": "", "arguments": {}}'),
        call('{"name": "no_such_tool", "arguments": {}}'),
        call('{"name": "%s", "arguments": []}' % first),
        call('{"name": "%s", "arguments": "not json"}' % first),
        call('{"name": "%s", "arguments": {}, "extra": 1}' % first),
        call('{"name": "%s", "arguments": {"%s": "%s"}}' % (first, arg, "x" * (1 << 20))),  # a megabyte argument
        call('{"name": "%s", "arguments": {"%s": %s}}' % (first, arg, "[" * 100_000 + "]" * 100_000)),  # deep nesting
        call('{"name": "%s", "arguments": {"%s": "%s"}}' % (first, arg, "\ud800")),
        "<tool_call><tool_call>{}</tool_call></tool_call>",
        call('{"name": "%s", "arguments": {}}' % first) + "<tool_call>",
        "</tool_call>" + call('{"name": "%s", "arguments": {}}' % first),
        "<tool_call>" * 50_000,
        call(call('{"name": "%s", "arguments": {}}' % first)),
        '{"name": "%s", "arguments": {"%s": 1}}' % (first, arg),  # bare JSON with a wrong type
    ]
    yield from fixed
    produced = len(fixed)
    wrong_values = ["1", "1.5", "true", "null", "[]", "{}", '["a", 1]', '"\u0000"', '"🧊"', "-1e309"]
    while produced < count:
        name = names[produced % len(names)]
        keys = params.get(name) or ["x"]
        shape = produced % 5
        if shape == 0:  # every argument of the wrong kind
            body = {k: "__V__" for k in keys}
            text = json.dumps({"name": name, "arguments": body}).replace('"__V__"', wrong_values[int(rng.integers(len(wrong_values)))])
        elif shape == 1:  # a required argument missing, an unknown one added
            text = json.dumps({"name": name, "arguments": {f"{keys[0]}_{produced}": "x"}})
        elif shape == 2:  # a misspelt tool name
            text = json.dumps({"name": name[::-1] + str(produced), "arguments": {}})
        elif shape == 3:  # JSON cut short at a random point
            whole = json.dumps({"name": name, "arguments": {k: "v" for k in keys}})
            text = whole[: int(rng.integers(1, len(whole)))]
        else:  # random bytes between the tags
            length = int(rng.integers(1, 64))
            text = "".join(chr(int(c)) for c in rng.integers(1, 0x2FFF, size=length) if not 0xD800 <= c <= 0xDFFF)
        yield call(text)
        produced += 1


# ---------------------------------------------------------------------- the checks


def _check_types(env: TextEnv) -> None:
    _require(isinstance(env, TextEnv), f"make() returned {type(env).__name__}, not a TextEnv")
    _require(isinstance(env.instructions, str) and env.instructions.strip() != "", "instructions must be non-empty text")
    observation, info = env.reset(seed=0)
    _require(isinstance(observation, str), f"reset() observation is {type(observation).__name__}, not str")
    _check_info(info, "reset()")
    legal = env.valid_actions()
    _require(legal is None or (isinstance(legal, list) and all(isinstance(a, str) for a in legal)),
             "valid_actions() must return a list of str or None")
    action = legal[0] if legal else (env.expert_action() or "noop")
    result = env.step(action)
    _require(isinstance(result, tuple) and len(result) == 5, "step() must return a 5-tuple")
    observation, reward, terminated, truncated, info = result
    _require(isinstance(observation, str), "step() observation must be str")
    _require(isinstance(reward, (int, float)) and math.isfinite(float(reward)), f"reward {reward!r} must be a finite number")
    _require(isinstance(terminated, bool) and isinstance(truncated, bool), "terminated and truncated must be bool")
    _check_info(info, "step()")
    _require(isinstance(env.render(), str), "render() must return text when render_mode is None or 'ansi'")


def _check_info(info: Any, where: str) -> None:
    _require(isinstance(info, dict), f"{where} info must be a dict")
    for key, kind in INFO_KEYS.items():
        _require(key in info, f"{where} info lacks {key!r}")
        _require(isinstance(info[key], kind), f"{where} info[{key!r}] is {type(info[key]).__name__}, not {kind.__name__}")


def _check_same_process(make_env: Callable[[], TextEnv]) -> None:
    for seed in (0, 1, 12345):
        a, b = trace_episode(make_env(), seed), trace_episode(make_env(), seed)
        _require(a == b, f"seed {seed}: two instances diverge: {_first_difference(a, b)}")
        again_env = make_env()
        trace_episode(again_env, seed + 1)  # a used instance must reset to the same episode
        c = trace_episode(again_env, seed)
        _require(a == c, f"seed {seed}: reset(seed) after other episodes diverges: {_first_difference(a, c)}")


def _check_cross_process(env_spec: EnvSpec, make_kwargs: dict[str, Any], make_env: Callable[[], TextEnv]) -> None:
    seed = 7
    local = trace_episode(make_env(), seed)
    recipe = {
        "entry_point": env_spec.entry_point_str,
        "kwargs": {**env_spec.kwargs, **make_kwargs},
        "max_turns": env_spec.max_turns,
    }
    for hash_seed in ("0", "4242"):
        environ = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        cmd = [sys.executable, "-m", "envhub.checker", "trace", json.dumps(recipe), str(seed)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=environ, timeout=300)
        _require(proc.returncode == 0, f"trace subprocess failed: {proc.stderr.strip()[-1500:]}")
        remote = json.loads(proc.stdout)
        _require(remote == local, f"PYTHONHASHSEED={hash_seed}: another process diverges: {_first_difference(local, remote)}")


def _check_state_key(env: TextEnv) -> None:
    _, first = env.reset(seed=3)
    _, second = env.reset(seed=3)
    _require(first["state_key"] == second["state_key"], "the same seed gave two state keys for the initial state")
    _require(first["state_key"] == env.state_key(), "info['state_key'] differs from state_key()")
    _, _, _, _, info = env.reject("checker: invalid on purpose")
    _require(info["state_key"] == first["state_key"], "an invalid action changed state_key")
    _require(info["action_is_valid"] is False, "reject() must report action_is_valid=False")


def _check_expert(env: TextEnv) -> None:
    env.reset(seed=0)
    if env.expert_action() is None:
        raise _Skip("no expert")
    for seed in range(3):
        env.reset(seed=seed)
        for _ in range(env.max_turns or 50):
            action = env.expert_action()
            if action is None:
                return
            _require(isinstance(action, str), f"expert_action() returned {type(action).__name__}")
            legal = env.valid_actions()
            _require(legal is None or action in legal, f"expert_action() {action!r} is not in valid_actions() {legal}")
            _, _, terminated, truncated, info = env.step(action)
            _require(info["action_is_valid"], f"the expert's action {action!r} was rejected: {info.get('invalid_reason')}")
            if terminated or truncated:
                break


def _check_turn_limit(env: TextEnv) -> None:
    if env.max_turns is None:
        raise _Skip("no turn limit")
    env.reset(seed=11)
    for turn in range(1, env.max_turns + 1):
        _, _, terminated, truncated, _ = env.reject("checker: burn a turn")
        _require(not terminated, "an invalid action terminated the episode")
        _require(truncated == (turn == env.max_turns), f"turn {turn} of {env.max_turns}: truncated={truncated}")


def _check_fuzz(env: TextEnv, count: int) -> None:
    """Send every reply through the env's reply format, and straight to ``step`` as a raw action
    (a tool env also gets :func:`malformed_tool_calls`)."""
    fmt = get_format(env_format_name(env))
    env.reset(seed=5)
    crashes: list[str] = []
    changed: list[str] = []
    n = 0
    replies = malformed_replies(env.valid_actions(), count)
    if isinstance(env, ToolEnv):
        replies = itertools.chain(replies, malformed_tool_calls(env.tool_schemas(), count // 2))
    for reply in replies:
        n += 1
        for route in ("reply", "raw action"):
            before = env.state_key()
            try:
                if route == "reply":
                    outcome = apply_reply(env, reply, fmt)
                    observation, terminated, truncated, info = outcome.observation, outcome.terminated, outcome.truncated, outcome.info
                else:
                    observation, _, terminated, truncated, info = env.step(reply)
            except Exception as exc:  # the point of the fuzz is that nothing escapes
                crashes.append(f"{route} {reply[:80]!r}: {type(exc).__name__}: {exc}")
                env.reset()
                continue
            if not info["action_is_valid"] and info["state_key"] != before:
                changed.append(f"{route} {reply[:80]!r}")
            _require(isinstance(observation, str), f"{route} {reply[:80]!r} gave a non-text observation")
            if terminated or truncated:
                env.reset()
    _require(n >= count, f"only {n} replies fuzzed")
    _require(not crashes, f"{len(crashes)} of {2 * n} fuzzed steps raised, e.g.\n" + "\n".join(crashes[:5]))
    _require(not changed, f"{len(changed)} invalid replies changed the state, e.g. {', '.join(changed[:5])}")


def check_env(env_id: str, *, fuzz: int = 1000, cross_process: bool = True, **make_kwargs: Any) -> CheckReport:
    """Check the environment registered as ``env_id`` against the envhub contract.

    Args:
        env_id: a registered id.
        fuzz: how many malformed replies to try (at least 1000 for the standard check).
        cross_process: also replay an episode in two fresh processes with other hash seeds.
        **make_kwargs: passed to ``make`` (JSON-serialisable when ``cross_process``).

    Returns:
        A report; ``report.ok`` is True only when every check passed.
    """
    report = CheckReport(env_id)

    def make_env() -> TextEnv:
        return make(env_id, **make_kwargs)

    try:
        make_env().reset(seed=0)
    except (FileNotFoundError, MissingDependency) as exc:
        # Data or an optional dependency is missing: nothing can be checked, and nothing is wrong
        # with the environment itself. Reported once, as skipped, with the reason.
        report.results.append(CheckResult("environment can be made", True, skipped=f"{type(exc).__name__}: {exc}"))
        return report

    checks: list[tuple[str, Callable[[], None]]] = [
        ("reset/step types and info keys", lambda: _check_types(make_env())),
        ("same seed, same episode (one process)", lambda: _check_same_process(make_env)),
        ("state_key is stable", lambda: _check_state_key(make_env())),
        ("expert_action is legal", lambda: _check_expert(make_env())),
        ("turn limit truncates", lambda: _check_turn_limit(make_env())),
        (f"fuzz of {fuzz} malformed replies", lambda: _check_fuzz(make_env(), fuzz)),
    ]
    if cross_process:
        env_spec = spec(env_id)
        checks.insert(2, ("same seed, same episode (other processes)", lambda: _check_cross_process(env_spec, make_kwargs, make_env)))
    for name, run in checks:
        try:
            run()
        except _Skip as exc:
            report.results.append(CheckResult(name, True, skipped=str(exc)))
        except _Failure as exc:
            report.results.append(CheckResult(name, False, str(exc)))
        except Exception as exc:
            tail = "".join(traceback.format_exception(exc)[-3:])
            report.results.append(CheckResult(name, False, f"raised {type(exc).__name__}: {exc}\n{tail}"))
        else:
            report.results.append(CheckResult(name, True))
        if name.startswith("reset/step") and not report.results[-1].passed:
            break  # nothing else can run on an env that cannot reset and step
    return report


def check_envs(
    env_ids: Sequence[str], *, jobs: int = 1, timeout: float | None = None, fuzz: int = 1000, **make_kwargs: Any
) -> Iterator[CheckReport]:
    """Check every id and yield each report as soon as its env is done (not in the order given).

    Args:
        env_ids: registered ids.
        jobs: how many envs to check at once, each in its own process.
        timeout: seconds one env may take; an env that takes longer is stopped (with every process
            it started) and reported as failed with the reason, and the others go on.
        fuzz: as for :func:`check_env`.
        **make_kwargs: as for :func:`check_env`.

    With ``jobs=1`` and no timeout the envs are checked in this process, one after the other.
    Otherwise each env is checked in a child process: forked where the platform can fork, so that
    envs registered at run time are checked too.
    """
    if jobs == 1 and timeout is None:
        for env_id in env_ids:
            started = time.monotonic()
            report = check_env(env_id, fuzz=fuzz, **make_kwargs)
            report.seconds = time.monotonic() - started
            yield report
        return
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    pending = list(env_ids)
    running: dict[Any, tuple[Any, str, float]] = {}  # result pipe -> (process, id, start time)
    try:
        while pending or running:
            while pending and len(running) < jobs:
                env_id = pending.pop(0)
                reader, writer = context.Pipe(duplex=False)
                process = context.Process(target=_check_in_child, args=(writer, env_id, fuzz, make_kwargs), daemon=True)
                process.start()
                writer.close()
                running[reader] = (process, env_id, time.monotonic())
            wait = None
            if timeout is not None:
                wait = max(0.0, min(started + timeout for _, _, started in running.values()) - time.monotonic())
            for reader in multiprocessing.connection.wait(list(running), timeout=wait):
                process, env_id, started = running.pop(reader)
                try:
                    report = reader.recv()
                except EOFError:  # the child died before it could report (killed, or os._exit in an env)
                    report = CheckReport(env_id, [CheckResult("checker process", False, f"exited with code {process.exitcode} before reporting")])
                reader.close()
                process.join()
                report.seconds = time.monotonic() - started
                yield report
            if timeout is None:
                continue
            for reader, (process, env_id, started) in list(running.items()):
                if time.monotonic() - started >= timeout:
                    del running[reader]
                    _stop(process)
                    reader.close()
                    message = f"not finished after {timeout:g} s (--timeout); stopped"
                    yield CheckReport(env_id, [CheckResult("finishes within the timeout", False, message)], seconds=time.monotonic() - started)
    finally:
        for process, _, _ in running.values():
            _stop(process)


def _check_in_child(writer: Any, env_id: str, fuzz: int, make_kwargs: dict[str, Any]) -> None:
    if hasattr(os, "setsid"):
        os.setsid()  # its own process group, so that a timeout stops the interpreters it starts too
    try:
        report = check_env(env_id, fuzz=fuzz, **make_kwargs)
    except Exception as exc:  # check_env reports failures itself; this is for what escapes it
        report = CheckReport(env_id, [CheckResult("environment can be checked", False, f"raised {type(exc).__name__}: {exc}")])
    writer.send(report)
    writer.close()


def _stop(process: Any) -> None:
    """Kill ``process`` and its process group, and reap it."""
    if hasattr(os, "killpg"):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    process.kill()
    process.join()


def _main(argv: list[str]) -> int:
    """``trace RECIPE_JSON SEED``: replay an episode of the env the recipe describes, print JSON."""
    if len(argv) == 3 and argv[0] == "trace":
        recipe = json.loads(argv[1])
        env_spec = EnvSpec(id="checker/Trace-v0", entry_point=recipe["entry_point"], kwargs=recipe["kwargs"], max_turns=recipe["max_turns"])
        print(json.dumps(trace_episode(env_spec.make(), int(argv[2]))))
        return 0
    print("usage: python -m envhub.checker trace RECIPE_JSON SEED", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
