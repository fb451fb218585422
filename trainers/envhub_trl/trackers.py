"""Trackers (``report_to``): TensorBoard, Weights & Biases and Trackio, through transformers' own
callbacks, with the held-out evaluations beside TRL's per-step metrics.

Each tracker comes with an extra of ``envhub-trl`` (:data:`TRACKERS`); :func:`check_trackers`
refuses one that is not installed, or a name transformers does not know, when the config is made,
so before any model loads. :class:`HeldOutToTrackers` sends every held-out evaluation of
``envhub train`` to them as scalars, under ``eval/`` (transformers' trackers put a key that
starts with ``eval_`` there, the per-step metrics under ``train/``):

- ``eval/held_out/success_rate``: the held-out curve, greedy success at the start of RL, at
  every periodic evaluation (``eval_steps``) and after RL; for a mix, the mean over its envs, and
  each env's under ``eval/held_out/<env id>/success_rate``;
- ``eval/<stage>/<mode>/<metric>``: every figure of each held-out evaluation stage
  (``initial_model``, ``after_warm_start``, ``after_rl``, and ``after_rl_last_step`` when
  validation kept another step's policy; modes ``greedy``, ``sampled``, ``pass@k``), at the step it
  was made (a mix adds the env id after the stage);
- ``eval/validation/success_rate``: the validation curve of ``keep_best_on_validation``.
"""

from __future__ import annotations

import copy
import importlib.util
import re
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import TrainerCallback

#: ``report_to`` name: (the module it needs, the extra of envhub-trl that installs it).
TRACKERS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "trackio": ("trackio", "trackio")}


def report_names(report_to: str | Sequence[str] | None) -> list[str]:
    """``report_to`` as a list of tracker names (``"none"`` and None: none; ``"all"``, which
    transformers turns into those installed, stays as it is)."""
    if report_to is None:
        return []
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    return [name for name in names if name != "none"]


def check_trackers(report_to: str | Sequence[str] | None) -> None:
    """Refuse a ``report_to`` that would fail once the model has loaded.

    Raises:
        ValueError: for a name transformers has no tracker for (with a did-you-mean), or a
            tracker whose package is not installed, naming the extra that installs it.
    """
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    from envhub_trl.config_file import did_you_mean

    for name in report_names(report_to):
        if name == "all":
            continue
        if name not in INTEGRATION_TO_CALLBACK:
            raise ValueError(f"report_to: no tracker {name!r}{did_you_mean(name, list(INTEGRATION_TO_CALLBACK))}; known: {', '.join(sorted(TRACKERS))} and transformers' others")
        if name in TRACKERS:
            module, extra = TRACKERS[name]
            if importlib.util.find_spec(module) is None:
                raise ValueError(
                    f"report_to={name} needs {module}, which is not installed: install the extra envhub-trl[{extra}] "
                    f"(pip install './trainers[{extra}]' in a checkout)"
                )


def _slug(stage: str) -> str:
    """A stage's name as a tag (``after warm start (SFT)`` -> ``after_warm_start``)."""
    return re.sub(r"[^a-z0-9]+", "_", re.sub(r"\(.*?\)", "", stage.lower())).strip("_")


def stage_scalars(stage: str, by_env: Mapping[str, Mapping[str, Mapping[str, float]]]) -> dict[str, float]:
    """Every number of one held-out evaluation stage (``{env: {mode: metrics}}``, as
    :func:`envhub_trl.run.evaluate` returns it), as tracker keys (see the module docstring)."""
    mix = len(by_env) > 1
    scalars = {}
    for env_id, modes in by_env.items():
        where = f"eval_{_slug(stage)}" + (f"/{env_id}" if mix else "")
        for mode, metrics in modes.items():
            scalars.update({f"{where}/{mode}/{name}": float(value) for name, value in metrics.items() if isinstance(value, (int, float))})
    return scalars


def curve_scalars(point: Mapping[str, Any], name: str = "held_out") -> dict[str, float]:
    """A point of the held-out (or validation) curve (``{"step", "greedy", "per_env"?}``) as tracker keys."""
    scalars = {f"eval_{name}/success_rate": float(point["greedy"])}
    scalars.update({f"eval_{name}/{env_id}/success_rate": float(rate) for env_id, rate in point.get("per_env", {}).items()})
    return scalars


def greedy_point(by_env: Mapping[str, Mapping[str, Mapping[str, float]]], step: int) -> dict[str, Any]:
    """A stage's greedy success as a curve point (the mean over a mix's envs, and each env's)."""
    rates = {env_id: modes["greedy"]["success_rate"] for env_id, modes in by_env.items()}
    point = {"step": step, "greedy": sum(rates.values()) / len(rates)}
    if len(rates) > 1:
        point["per_env"] = rates
    return point


class HeldOutToTrackers(TrainerCallback):
    """Send held-out evaluations to ``trainer``'s trackers (its ``report_to`` callbacks) as scalars.

    Figures given before training are held until the trackers have started (their
    ``on_train_begin`` names the log folder); the periodic and validation curves (``curves``:
    ``{name: callback with .points}``) are sent as their points appear; :meth:`after_training`
    sends the last figures and closes the trackers that the Trainer had already closed.
    """

    def __init__(self, trainer: Any, curves: Mapping[str, Any] | None = None):
        self.trainer = trainer
        self.curves = {name: source for name, source in (curves or {}).items() if source is not None}
        self.sent = {name: len(source.points) for name, source in self.curves.items()}  # a resumed run's were sent before
        self.waiting: list[tuple[dict[str, float], int | None]] = []
        self.started = False
        if "trackio" in report_names(trainer.args.report_to) and trainer.args.run_name is None:
            # Trackio names a run at random when it starts; the figures after training continue this one.
            from pathlib import Path

            trainer.args.run_name = Path(trainer.args.output_dir).resolve().name

    def trackers(self) -> list[Any]:
        """The trainer's tracker callbacks (those of ``report_to``)."""
        from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

        kinds = tuple(INTEGRATION_TO_CALLBACK[name] for name in report_names(self.trainer.args.report_to) if name in INTEGRATION_TO_CALLBACK)
        return [cb for cb in self.trainer.callback_handler.callbacks if kinds and isinstance(cb, kinds)]

    def send(self, scalars: Mapping[str, float], step: int | None = None) -> None:
        """Log ``scalars`` to every tracker at optimizer ``step`` (None: the trainer's current
        one); held until training starts."""
        if not self.started:
            self.waiting.append((dict(scalars), step))
            return
        trainer = self.trainer
        state = trainer.state
        if step is not None and step != state.global_step:
            state = copy.copy(state)  # the trackers log at the state's step
            state.global_step = step
        for tracker in self.trackers():
            tracker.on_log(trainer.args, state, trainer.control, logs=dict(scalars), model=trainer.model)

    def send_curves(self) -> None:
        """The curves' points not sent yet, each at its own step."""
        for name, source in self.curves.items():
            for point in source.points[self.sent[name]:]:
                self.send(curve_scalars(point, name), point["step"])
            self.sent[name] = len(source.points)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = True  # the trackers' own on_train_begin ran before this one (they were added first)
        for scalars, step in self.waiting:
            self.send(scalars, step)
        self.waiting.clear()
        self.send_curves()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.send_curves()

    def after_training(self, scalars: Mapping[str, float]) -> None:
        """Send the figures made after ``train()`` returned, then close the trackers it had closed
        (TensorBoard's writer, Trackio's run; a W&B run stays open until the process ends, as the
        Trainer leaves it)."""
        from transformers.integrations.integration_utils import TensorBoardCallback, TrackioCallback

        trainer, trackers = self.trainer, self.trackers()
        if not self.started:  # a resume at the last step trains nothing: the trackers never began
            for tracker in trackers:
                tracker.on_train_begin(trainer.args, trainer.state, trainer.control, model=trainer.model)
            self.on_train_begin(trainer.args, trainer.state, trainer.control)
        self.send_curves()  # a last validation point
        self.send(scalars)
        for tracker in trackers:
            if isinstance(tracker, (TensorBoardCallback, TrackioCallback)):
                tracker.on_train_end(trainer.args, trainer.state, trainer.control, model=trainer.model)
