"""Curricula: training episodes that grow longer or harder as the agent learns.

A config's ``curriculum`` mapping takes two kinds of schedule, which may be combined:

- ``horizon``: the turn limit of training episodes by optimizer step, as AgentGym-RL's
  ScalingInter-RL grows the interaction horizon (short episodes first, when long ones would be
  mostly noise; longer ones later). A mapping ``{from_step: max_turns}``; ``{0: 4, 50: 8, 100: 20}``
  plays 4 turns until step 50, then 8, then 20.
- ``stages``: difficulty stages through env keyword arguments (Sokoban 6x6 with one box, then
  8x8 with two: ``[{env_kwargs: {height: 6, width: 6, num_boxes: 1}}, {env_kwargs: {height: 8,
  width: 8, num_boxes: 2}}]``); a stage may also set ``max_turns``. Training moves to the next
  stage when the mean training success (sampled) of the stage's env over the last ``window``
  generation batches reaches ``advance_at``, and stays on the last.

The curriculum shapes training only: held-out evaluation plays the run's own env settings (the
task the run is judged on). Each batch logs ``curriculum/stage`` and, with a horizon,
``curriculum/max_turns``; each advance is printed. A resumed run starts at the last logged
stage, with an empty window.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envhub_trl.mix import EnvEntry, check_keys

#: The keys of a ``curriculum`` mapping, and of one of its stages.
KEYS = ("horizon", "stages", "advance_at", "window", "env")
STAGE_KEYS = ("env_kwargs", "max_turns")


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where} must be an integer >= 1, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Curriculum:
    """A training curriculum (see the module docstring).

    Attributes:
        horizon: ``(from_step, max_turns)`` pairs by step; empty for no horizon schedule.
        stages: each stage's ``env_kwargs`` and optional ``max_turns``; empty for no stages.
        advance_at: the mean training success that moves training to the next stage.
        window: how many generation batches that mean covers.
        env: the env id the stages apply to (and whose success moves them on).
    """

    horizon: tuple[tuple[int, int], ...] = ()
    stages: tuple[dict[str, Any], ...] = ()
    advance_at: float = 0.8
    window: int = 5
    env: str | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], env_ids: Sequence[str]) -> Curriculum:
        """A curriculum from a config's ``curriculum`` mapping, for a run on ``env_ids``.

        Raises:
            ValueError: naming the field, for an unknown key or a bad value.
        """
        check_keys(values, KEYS, "curriculum")
        horizon_map = values.get("horizon") or {}
        if not isinstance(horizon_map, Mapping):
            raise ValueError(f"curriculum.horizon must map a first optimizer step to a turn limit ({{0: 4, 50: 8}}), got {horizon_map!r}")
        horizon = []
        for step, turns in horizon_map.items():
            first = int(step) if str(step).strip().isdigit() else -1
            if first < 0:
                raise ValueError(f"curriculum.horizon: {step!r} is not an optimizer step (an integer >= 0)")
            horizon.append((first, _positive_int(turns, f"curriculum.horizon[{first}]")))
        horizon.sort()
        if horizon and horizon[0][0] != 0:
            raise ValueError(f"curriculum.horizon must start at step 0 (it starts at {horizon[0][0]})")
        stages = values.get("stages") or []
        if not isinstance(stages, Sequence) or isinstance(stages, str):
            raise ValueError(f"curriculum.stages must be a list of {{env_kwargs: ..., max_turns: ...}}, got {stages!r}")
        parsed = []
        for k, stage in enumerate(stages):
            where = f"curriculum.stages[{k}]"
            check_keys(stage, STAGE_KEYS, where)
            kwargs = stage.get("env_kwargs") or {}
            if not isinstance(kwargs, Mapping):
                raise ValueError(f"{where}.env_kwargs must be a mapping, got {kwargs!r}")
            entry: dict[str, Any] = {"env_kwargs": dict(kwargs)}
            if stage.get("max_turns") is not None:
                if horizon:
                    raise ValueError(f"{where}.max_turns: a curriculum with a horizon schedule sets the turn limit there")
                entry["max_turns"] = _positive_int(stage["max_turns"], f"{where}.max_turns")
            parsed.append(entry)
        try:
            advance_at = float(values.get("advance_at", 0.8))
        except (TypeError, ValueError):
            raise ValueError(f"curriculum.advance_at must be a success rate in [0, 1], got {values.get('advance_at')!r}") from None
        if not 0.0 <= advance_at <= 1.0:
            raise ValueError(f"curriculum.advance_at must be a success rate in [0, 1], got {advance_at}")
        window = _positive_int(values.get("window", 5), "curriculum.window")
        env = values.get("env")
        if env is None:
            env = env_ids[0] if env_ids else None
        elif env not in env_ids:
            raise ValueError(f"curriculum.env {env!r} is not an env of this run ({', '.join(env_ids)})")
        if not horizon and not parsed:
            raise ValueError("curriculum needs a horizon schedule, stages, or both")
        return cls(tuple(horizon), tuple(parsed), advance_at, window, env)

    def max_turns_at(self, step: int) -> int | None:
        """The horizon schedule's turn limit at optimizer step ``step`` (None without one)."""
        turns = None
        for first, limit in self.horizon:
            if step >= first:
                turns = limit
        return turns


class CurriculumState:
    """Where a run is in its curriculum: the current stage and the recent training success."""

    def __init__(self, curriculum: Curriculum, stage: int = 0):
        self.curriculum = curriculum
        self.stage = min(stage, max(len(curriculum.stages) - 1, 0))
        self.recent: collections.deque[float] = collections.deque(maxlen=curriculum.window)
        #: Whether the stage was restored (from a checkpoint's run state, or from the log).
        self.restored = False

    def restore_from_log(self, log_history: Sequence[Mapping[str, Any]]) -> None:
        """Once per run: on a run resumed from a checkpoint without envhub's run state
        (:mod:`envhub_trl.run_state` restores the stage and its window), start at the last stage
        the log recorded (the window of recent success starts afresh)."""
        if self.restored:
            return
        self.restored = True
        logged = [entry["curriculum/stage"] for entry in log_history if "curriculum/stage" in entry]
        if logged:
            self.stage = int(round(logged[-1]))

    def batch_played(self, trajectories: Sequence[Any], step: int) -> tuple[dict[str, float], str | None]:
        """Feed one training batch's success of the stage env (episodes with ``env_id`` and
        ``success``) at optimizer step ``step``; returns what to log (``curriculum/stage``: the
        stage the batch played; ``curriculum/max_turns``) and, when training moved on, a line
        saying so."""
        schedule, metrics, advanced = self.curriculum, {}, None
        if schedule.stages:
            metrics["curriculum/stage"] = float(self.stage)
            ours = [t.success for t in trajectories if t.env_id == schedule.env]
            if ours and self.observe(float(np.mean(ours))):
                advanced = (
                    f"curriculum: stage {self.stage + 1} of {len(schedule.stages)} ({schedule.env}, {schedule.stages[self.stage]}) "
                    f"from step {step + 1}: training success reached {schedule.advance_at:g} over {schedule.window} batches"
                )
        turns = schedule.max_turns_at(step)
        if turns is not None:
            metrics["curriculum/max_turns"] = float(turns)
        return metrics, advanced

    def observe(self, success_rate: float) -> bool:
        """Record one generation batch's training success of the stage env; True when that moved
        training to the next stage (the window then starts afresh)."""
        stages = self.curriculum.stages
        if self.stage >= len(stages) - 1:
            return False
        self.recent.append(float(success_rate))
        if len(self.recent) == self.recent.maxlen and sum(self.recent) / len(self.recent) >= self.curriculum.advance_at:
            self.stage += 1
            self.recent.clear()
            return True
        return False

    def entries(self, entries: Sequence[EnvEntry], step: int) -> list[EnvEntry]:
        """The run's envs as training plays them at optimizer step ``step``: the stage env with the
        current stage's ``env_kwargs`` (over its own) and ``max_turns``, and every env with the
        horizon schedule's turn limit."""
        curriculum = self.curriculum
        turns = curriculum.max_turns_at(step)
        out = []
        for entry in entries:
            if curriculum.stages and entry.env_id == curriculum.env:
                stage = curriculum.stages[self.stage]
                entry = dataclasses.replace(
                    entry, env_kwargs={**entry.env_kwargs, **stage["env_kwargs"]}, max_turns=stage.get("max_turns", entry.max_turns)
                )
            if turns is not None:
                entry = dataclasses.replace(entry, max_turns=turns)
            out.append(entry)
        return out
