"""Keep the best policy of an RL run on validation seeds (``keep_best_on_validation``).

RL from a good warm start is noisy: on Sokoban, 50 GRPO steps moved held-out greedy success by
-4.6 to +1.5 points around a warm start of 82-91%. Practitioners validate as they train and keep the
best checkpoint (``transformers``' ``load_best_model_at_end``, ROLL's and verl's validation runs).
:class:`ValidationSelection` does that for an env run: greedy success on ``validation_episodes``
seeds from ``validation_seed_offset`` (apart from the training and the held-out seeds) at the start
of RL, every ``validation_steps`` optimizer steps and at the end; the run ends with the policy that
scored best (the earliest of equals), so RL cannot end below its start on the validation seeds. The
held-out seeds stay untouched by the choice; :func:`periodic_evaluation` only watches them.

The best policy's weights are written to ``<output_dir>/validation-best.pt`` whenever it changes
(whole or not at all, :func:`envhub_trl.run_files.write_file`), so a resumed run still ends with the
best of the whole run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import torch
from transformers import TrainerCallback

from envhub_trl import run_files
from envhub_trl.evaluation import held_out_seeds

if TYPE_CHECKING:
    from envhub_trl.trainer import EnvGRPOTrainer

#: The best policy's weights, in the run's output folder.
BEST_FILE = "validation-best.pt"


def greedy_point(trainer: EnvGRPOTrainer, step: int, what: str, seeds: list[int] | None = None) -> dict[str, Any]:
    """Greedy success of ``trainer``'s policy at optimizer ``step`` on ``seeds`` (None: the held-out
    ones) for every env of the run: ``{"step", "greedy"}`` (the mean over envs), with ``per_env``
    for a mix. ``what`` names the seeds in the progress labels."""
    entries = trainer.args.env_entries()
    rates = {
        e.env_id: trainer.evaluate_env(seeds, env=e, label=f"{what} at step {step}, {e.env_id}, greedy")["success_rate"] for e in entries
    }
    point = {"step": step, "greedy": sum(rates.values()) / len(rates)}
    if len(entries) > 1:
        point["per_env"] = rates
    return point


class ValidationSelection(TrainerCallback):
    """Validate ``trainer``'s policy through its run (:meth:`finish` at its end) and load the best one (:meth:`restore`).

    ``points`` are the validations a resumed run made before its checkpoint (its record's)."""

    def __init__(self, trainer: Any, points: list[dict[str, Any]] = ()):
        self.trainer = trainer
        args = trainer.args
        self.every = args.validation_steps
        self.seeds = held_out_seeds(args.validation_seed_offset, args.validation_episodes)
        self.path = Path(args.output_dir) / BEST_FILE
        self.points: list[dict[str, Any]] = list(points)

    @property
    def best(self) -> dict[str, Any] | None:
        """The first of the points with the highest success (None before the first validation)."""
        return max(self.points, key=lambda p: p["greedy"], default=None)  # max keeps the first of equals

    def validate(self, step: int) -> None:
        """Measure the current policy at optimizer step ``step``; keep its weights if it is the best so far."""
        trainer = self.trainer
        point = greedy_point(trainer, step, "validation", self.seeds)
        before = self.best
        self.points.append(point)
        if before is None or point["greedy"] > before["greedy"]:
            if trainer.accelerator.is_main_process:
                model = trainer.accelerator.unwrap_model(trainer.model)
                self.path.parent.mkdir(parents=True, exist_ok=True)
                weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
                size = sum(t.numel() * t.element_size() for t in weights.values())
                with run_files.room_errors(self.path, size, "free some space; --resume continues from the last checkpoint"):
                    run_files.write_file(self.path, lambda staging: torch.save(weights, staging))
            trainer.accelerator.wait_for_everyone()
        print(f"validation success at step {step}: {point['greedy']:.1%} greedy (best {self.best['greedy']:.1%} at step {self.best['step']})",
              file=sys.stderr, flush=True)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.points:  # a resumed run validated its start before the checkpoint
            self.validate(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.every == 0:
            self.validate(state.global_step)

    def finish(self) -> dict[str, Any]:
        """After training: validate the last policy if that has not been done; what is kept
        (``step`` and its validation ``greedy`` success) beside the run's ``last_step``."""
        last = self.trainer.state.global_step
        if not self.points or self.points[-1]["step"] != last:
            self.validate(last)
        best = self.best
        return {"step": best["step"], "greedy": best["greedy"], "last_step": last, "last_greedy": self.points[-1]["greedy"]}

    def restore(self) -> None:
        """Load the best policy's weights into the model (the generator gets them before it next samples)."""
        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model)
        model.load_state_dict(torch.load(self.path, map_location="cpu", weights_only=True))
        trainer.weights_changed()
        best = self.best
        print(f"kept the policy of step {best['step']} ({best['greedy']:.1%} on the validation seeds; the last: "
              f"{self.points[-1]['greedy']:.1%})", file=sys.stderr, flush=True)


def eval_every(args: Any) -> int | None:
    """How many optimizer steps apart the periodic held-out evaluations are: ``eval_steps``, or that
    share of ``max_steps`` when it is below 1 (as transformers reads it); None without it."""
    every = args.eval_steps
    if not every:
        return None
    return max(1, int(every if every >= 1 else every * args.max_steps))


def periodic_evaluation(trainer: EnvGRPOTrainer, points: list[dict[str, Any]] = ()) -> Any:
    """With ``eval_steps`` set, a callback (added to ``trainer``) that measures held-out greedy
    success every ``eval_steps`` optimizer steps, as ROLL's validation runs do, so that a run that
    peaks and then collapses shows it; None without ``eval_steps``. ``points`` are those a resumed
    run measured before its checkpoint."""
    every = eval_every(trainer.args)
    if every is None:
        return None

    class HeldOutEvaluation(TrainerCallback):
        def __init__(self) -> None:
            self.points: list[dict[str, Any]] = list(points)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step % every == 0 and state.global_step < state.max_steps:
                point = greedy_point(trainer, state.global_step, "held-out")
                self.points.append(point)
                click.echo(f"held-out success at step {state.global_step}: {point['greedy']:.1%} greedy", err=True)

    callback = HeldOutEvaluation()
    trainer.add_callback(callback)
    return callback
