"""The conformance checker passes good environments and catches broken ones."""

import itertools

import pytest

import envhub
from envhub.checker import check_env, malformed_replies
from envhub.core import DiscreteTextEnv

_counter = itertools.count()


class Good(DiscreteTextEnv):
    instructions = "Walk right to cell 3."
    action_names = ("left", "right")

    def _reset(self, options):
        self.pos = int(self.np_random.integers(0, 2))
        return self.render_text(), {}

    def _step(self, action):
        self.pos = max(0, self.pos + (1 if action == "right" else -1))
        return self.render_text(), float(self.pos == 3), self.pos == 3, {}

    def state_key(self):
        return str(self.pos)

    def is_success(self):
        return self.pos == 3

    def render_text(self):
        return f"at {self.pos}"

    def expert_action(self):
        return "right"


class Nondeterministic(Good):
    def _reset(self, options):
        import random

        self.pos = random.randint(0, 2)  # not self.np_random: differs between instances
        return self.render_text(), {}


class CrashesOnJunk(Good):
    def parse_action(self, action):
        if "\x00" in action:
            raise KeyError("nul byte")
        return super().parse_action(action)


class InvalidMovesTheState(Good):
    def reject(self, reason):
        self.pos += 1
        return super().reject(reason)


class MissingInfoKey(Good):
    def _info(self, valid, extra):
        info = super()._info(valid, extra)
        del info["state_key"]
        return info


class IllegalExpert(Good):
    def expert_action(self):
        return "teleport"


class HashBased(Good):
    def state_key(self):
        return str(hash(("pos", self.pos)))

    def render_text(self):
        return f"at {self.pos} ({self.state_key()})"


@pytest.fixture
def registered():
    ids = []

    def _register(cls):
        env_id = f"checkertest/{cls.__name__}{next(_counter)}-v0"
        envhub.register(env_id, f"{__name__}:{cls.__name__}", max_turns=6)
        ids.append(env_id)
        return env_id

    yield _register
    for env_id in ids:
        envhub.registry.remove(env_id)


def failed(report):
    return {r.name for r in report.failures}


def test_a_good_env_passes(registered):
    report = check_env(registered(Good))
    assert report.ok, report.format()
    assert "7/7 checks passed" in report.format()


@pytest.mark.parametrize(
    "cls, check",
    [
        (Nondeterministic, "same seed, same episode (one process)"),
        (CrashesOnJunk, "fuzz of 1000 malformed replies"),
        (InvalidMovesTheState, "state_key is stable"),
        (MissingInfoKey, "reset/step types and info keys"),
        pytest.param(IllegalExpert, "expert_action is legal", marks=pytest.mark.slow),
        pytest.param(HashBased, "same seed, same episode (other processes)", marks=pytest.mark.slow),  # fresh interpreters
    ],
)
def test_broken_envs_fail_the_right_check(registered, cls, check):
    report = check_env(registered(cls))
    assert not report.ok
    assert check in failed(report), report.format()
    assert "FAIL" in report.format()


def test_fuzz_corpus_covers_the_named_kinds_of_junk():
    replies = list(malformed_replies(["Up", "Down"], 1000))
    assert len(replies) >= 1000
    assert "" in replies and any(len(r) >= 1 << 20 for r in replies)
    assert any("\x00" in r for r in replies) and any(ord(c) > 0x2000 for r in replies for c in r)
    assert any(r.count("<answer>") > 1 for r in replies) and "<answer>" in replies
    assert any("Up" in r and r != "<answer>Up</answer>" for r in replies)


@pytest.mark.slow
def test_an_env_whose_data_is_missing_is_skipped_once_with_the_reason(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from envhub.cli import cli

    monkeypatch.setenv("ENVHUB_WEBSHOP_DATA", str(tmp_path / "none"))
    result = CliRunner().invoke(cli, ["check", "webshop/WebShop-v0", "frozenlake/FrozenLakeNotSlippery-v0"])
    assert result.exit_code == 0, result.output
    assert result.output.count("SKIP  environment can be made: DataNotFound: WebShop data not found") == 1
    assert "Traceback" not in result.output and "0/0 checks passed, 1 skipped" in result.output
    assert "7/7 checks passed" in result.output


class NoExpert(Good):
    def expert_action(self):
        return None


def test_checks_that_do_not_apply_say_skipped():
    from helper_envs import registered

    with registered("test/NoExpert-v0", NoExpert, max_turns=6):
        report = check_env("test/NoExpert-v0", cross_process=False)
    expert = next(r for r in report.results if r.name == "expert_action is legal")
    assert report.ok and expert.skipped == "no expert"
    assert "SKIP  expert_action is legal: no expert" in report.format() and "PASS  expert_action" not in report.format()


def test_a_report_line_names_failed_and_skipped_checks_with_the_reason():
    from envhub.checker import CheckReport, CheckResult

    report = CheckReport("a/B-v0", [CheckResult("types", True), CheckResult("expert_action is legal", True, skipped="no expert"),
                                    CheckResult("fuzz", False, "raised KeyError")], seconds=1.5)
    assert report.line() == "FAIL  a/B-v0  1/2 checks passed, 1 skipped: expert_action is legal (no expert); failed: fuzz (1.5 s)"
