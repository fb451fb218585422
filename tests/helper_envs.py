"""Small environments that misbehave on purpose, for the manager and executor tests.

They are registered by fixtures only while a test runs, so the checker over every registered env
never sees them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

import envhub
from envhub.core import DiscreteTextEnv
from envhub.registration import registry

#: Seed on which ``FlakyEnv.reset`` raises.
BAD_SEED = 13


class FlakyEnv(DiscreteTextEnv):
    """Count up with ``Ok``; ``Win`` ends the episode with reward 1; ``Boom`` raises; seed 13 fails to reset."""

    action_names = ("Ok", "Boom", "Win")
    instructions = "Say Ok to count, Win to finish."

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if self.np_random_seed == BAD_SEED:
            raise RuntimeError("cannot reset with the bad seed")
        self.count = int(self.np_random.integers(0, 100))
        self.won = False
        return self.render_text(), {}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if action == "Boom":
            return self._boom()
        if action == "Win":
            self.won = True
            return self.render_text(), 1.0, True, {}
        self.count += 1
        return self.render_text(), 0.0, False, {}

    def state_key(self) -> str:
        return f"count={self.count} won={self.won}"

    def is_success(self) -> bool:
        return self.won

    def render_text(self) -> str:
        return f"count is {self.count}"

    def expert_action(self) -> str:
        return "Win"

    def _boom(self) -> tuple[str, float, bool, dict[str, Any]]:
        """What ``Boom`` does; the subclasses below fail in other ways."""
        raise RuntimeError("boom")


class ExitEnv(FlakyEnv):
    """``Boom`` kills the whole process, as a segfaulting native library would."""

    def _boom(self) -> tuple[str, float, bool, dict[str, Any]]:
        os._exit(3)


class UnpicklableInfoEnv(FlakyEnv):
    """``Boom`` puts a lock in the step's info: fine in-process, unpicklable for a worker's pipe."""

    def _boom(self) -> tuple[str, float, bool, dict[str, Any]]:
        import threading

        return self.render_text(), 0.0, False, {"handle": threading.Lock()}


class HangEnv(FlakyEnv):
    """``Boom`` sleeps for an hour, as an env stuck on a dead socket would."""

    def _boom(self) -> tuple[str, float, bool, dict[str, Any]]:
        import time

        time.sleep(3600)
        return super()._boom()


class NondeterministicEnv(FlakyEnv):
    """Resets from the process's own unseeded randomness: a replay in a new process differs."""

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        import random

        self.count, self.won = random.randrange(10**9), False
        return self.render_text(), {}


class SlowEnv(FlakyEnv):
    """Every step takes ``delay`` seconds (50 ms by default) and records when it ran, as an env that
    waits on a search engine or a tool would."""

    steps: list[tuple[float, float]] = []  # (start, end) of every step, in any instance

    def __init__(self, delay: float = 0.05, **kwargs: Any):
        super().__init__(**kwargs)
        self.delay = delay

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        import time

        start = time.perf_counter()
        time.sleep(self.delay)
        SlowEnv.steps.append((start, time.perf_counter()))
        return super()._step(action)


class FailingEnv(FlakyEnv):
    """:class:`FlakyEnv` whose env breaks on some seeds: it raises at reset on seeds 0 mod 4 and on
    the first step on seeds 1 mod 4, as an env behind a flaky server would."""

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if self.np_random_seed % 4 == 0:
            raise ConnectionError("cannot reset: the env's server is down")
        self.first_step = True
        return super()._reset(options)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.first_step and self.np_random_seed % 4 == 1:
            raise ConnectionError("lost the env's server on the first turn")
        self.first_step = False
        return super()._step(action)


class NanRewardEnv(FlakyEnv):
    """:class:`FlakyEnv` whose ``Win`` pays a NaN reward."""

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        observation, reward, terminated, info = super()._step(action)
        return observation, float("nan") if action == "Win" else reward, terminated, info


class CharTokenizer:
    """A torch-free stand-in for a Hugging Face tokenizer: one token per character, ChatML specials."""

    SPECIALS = ("<|pad|>", "<|im_start|>", "<|im_end|>")
    eos_token_id = 2

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text

    def encode(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            for sid, special in enumerate(self.SPECIALS):
                if text.startswith(special, i):
                    ids.append(sid)
                    i += len(special)
                    break
            else:
                ids.append(len(self.SPECIALS) + ord(text[i]))
                i += 1
        return ids

    def decode(self, ids, skip_special_tokens=False):
        out = []
        for t in ids:
            if t < len(self.SPECIALS):
                if not skip_special_tokens:
                    out.append(self.SPECIALS[t])
            else:
                out.append(chr(t - len(self.SPECIALS)))
        return "".join(out)


@contextlib.contextmanager
def registered(env_id: str, entry_point: str, **spec_kwargs: Any) -> Iterator[str]:
    """Register ``env_id`` for the ``with`` block (workers can make it: entry points are strings)."""
    envhub.register(env_id, entry_point, **spec_kwargs)
    try:
        yield env_id
    finally:
        registry.remove(env_id)


@pytest.fixture
def flaky_env():
    """Register ``test/Flaky-v0`` and ``test/Exit-v0`` for one test; yield the first id."""
    with registered("test/Flaky-v0", "helper_envs:FlakyEnv", max_turns=5), registered("test/Exit-v0", "helper_envs:ExitEnv", max_turns=5):
        yield "test/Flaky-v0"
