"""A training run's stages, in the order they run, for one :class:`~envhub_trl.run_spec.RunSpec`.

``envhub train`` (:mod:`envhub_trl.commands.train`) and the learning benchmark build a
:class:`RunSpec` (the :class:`~envhub_trl.config.EnvGRPOConfig`, the warm start, the model, the
tiny model's spec and a LoRA adapter), read from a YAML file and ``KEY=VALUE`` overrides in one
place (:meth:`RunSpec.read`), and hand it to :func:`train`:

1. lock the output folder, and find the checkpoint a resumed run continues from;
2. load the model and the trainer (:class:`TrainingRun`);
3. evaluate on the held-out seeds, warm-start, evaluate again (or take those figures from the
   checkpoint's record);
4. RL, with periodic held-out evaluations and validation selection where asked, then the last
   held-out evaluation;
5. the reference policies on the same seeds;
6. ``final/`` written whole with its model card (:mod:`envhub_trl.model_card`), then results.json
   and the learning curve (:mod:`envhub_trl.report`); then the checkpoint of the last step goes,
   which only duplicated ``final/``.

The output folder is locked for the whole run (:mod:`envhub_trl.run_lock`), and every checkpoint,
``final/`` and results.json are written whole or not at all (:mod:`envhub_trl.run_files`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from envhub.error import EnvhubError
from envhub_trl.run_files import RUN_AGAIN
from envhub_trl.run_spec import RUN_KEYS, RunSpec, load_config_file, split_warm_start

__all__ = ["RUN_KEYS", "STAGES", "RunSpec", "TrainingRun", "load_config_file", "run_training", "split_warm_start", "train"]

if TYPE_CHECKING:
    from envhub_trl.trainer import EnvGRPOTrainer

#: Held-out evaluation stages, in the order the table lists them.
STAGES = ("initial model", "after warm start (SFT)", "after RL")


def say(line: str) -> None:
    """One line of progress or warning on stderr."""
    click.echo(line, err=True)


def run_training(
    values: dict[str, Any],
    model_name: str = "tiny",
    *,
    warm_start: Any = None,
    resume: str | bool | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """:func:`train` on ``RunSpec.from_values(values, model_name, warm_start)``: the learning
    benchmark's and the tests' way in. Returns the run's ``results.json``."""
    return train(RunSpec.from_values(values, model_name, warm_start), resume=resume, overwrite=overwrite)


def train(
    spec: RunSpec, *, resume: str | bool | None = None, overwrite: bool = False, verbose: bool = True, command: str | None = None
) -> dict[str, Any]:
    """Train as ``envhub train`` does and return its ``results.json`` (also written, with the model
    and its card, ``final/README.md``, :mod:`envhub_trl.model_card`, which shows ``command``: the
    command line that made the run, None from Python).

    The run evaluates on the held-out seeds before training, after the warm start and after RL,
    then plays the reference policies on the same seeds; progress goes to stderr, one line per RL
    step (:class:`~envhub_trl.callbacks.StepProgress`). Without ``verbose``, the third-party output
    :mod:`envhub_trl.quiet` names is hidden, for the rest of the process.

    ``resume`` (True: the output folder's last ``checkpoint-N``; or a checkpoint's path; the
    config's ``resume_from_checkpoint`` means the same) continues an interrupted run: the same
    model, config and warm start, the evaluations it made before its checkpoint kept, so that it
    returns what the uninterrupted run would have; a resume of a finished run (its results.json)
    returns its results and changes nothing. Once results.json is written, the checkpoint the
    Trainer saved at the last step goes when ``final/`` holds the same policy
    (:meth:`TrainingRun.drop_last_checkpoint`); periodic checkpoints before it stay.
    ``overwrite`` removes what an earlier run wrote (:func:`~envhub_trl.run_state.clear_run`)
    once the new run's model and envs have loaded; without either, an output folder with a
    finished run or an earlier run's checkpoints is refused.

    Raises:
        click.ClickException: for an output folder in use by another run or that cannot be used
            as asked, a damaged checkpoint with none whole before it, a write that found no room,
            or an environment error, with the reason.
    """
    from envhub_trl import run_lock, run_state
    from envhub_trl.model_card import model_card
    from envhub_trl.quiet import hide_library_noise
    from envhub_trl.report import RunReport

    if not verbose:
        hide_library_noise()
    started = time.perf_counter()
    try:  # one run at a time in an output folder, for the whole run
        lock = run_lock.OutputLock(spec.args.output_dir).acquire()
    except EnvhubError as exc:
        raise click.ClickException(str(exc)) from None
    with lock:
        if lock.taken_over is not None:
            say(lock.describe_taken_over())
        run_state.remove_partials(spec.args.output_dir)  # what a killed run's unfinished writes left
        asked = resume not in (None, False) or spec.resume_from
        finished = run_state.finished_results(spec.args.output_dir) if asked else None
        if finished is not None:
            say(f"{spec.args.output_dir} holds a finished run ({run_state.RESULTS_FILE}): there is nothing to resume, and nothing was changed")
            return finished
        checkpoint, record = _resume_point(spec, resume, overwrite)
        run = TrainingRun(spec, checkpoint, record, verbose=verbose)
        try:
            run.load(overwrite)
            run.start()
            run.reinforce()
            run.search_references()
        except EnvhubError as exc:
            raise click.ClickException(str(exc)) from exc
        report = RunReport.of(run, seconds=time.perf_counter() - started)
        run.save_final(model_card(report.results, command))
        report.results["seconds"] = time.perf_counter() - started
        report.write(Path(spec.args.output_dir), run.then)
        run.drop_last_checkpoint()
        return report.results


def _resume_point(spec: RunSpec, resume: str | bool | None, overwrite: bool) -> tuple[Path | None, dict[str, Any] | None]:
    """The checkpoint a run resumes from and its record (None, None: a new run), from ``resume``
    or the config's ``resume_from_checkpoint``, once the output folder is found fit for the run
    (:func:`envhub_trl.run_state.prepare_output_dir`; a damaged last checkpoint is passed over,
    saying so).

    Raises:
        click.ClickException: for both asked differently, or a folder, checkpoint or record that refuses.
    """
    from envhub_trl import run_state

    from_config = spec.resume_from
    if from_config:
        if resume not in (None, False) and (resume in (True, "last") or Path(str(resume)).resolve() != Path(from_config).resolve()):
            raise click.ClickException(f"resume_from_checkpoint={from_config} and --resume {resume} ask for different checkpoints; give one")
        resume = from_config
    try:
        checkpoint = run_state.prepare_output_dir(spec.args.output_dir, resume, overwrite, say=say)
        if checkpoint is None:
            return None, None
        record = run_state.read_record(checkpoint)
        own = spec.record()
        run_state.check_same_run(record, own["model"], own["config"], own["warm_start"])
    except EnvhubError as exc:
        raise click.ClickException(str(exc)) from None
    return checkpoint, record


def evaluate(trainer: EnvGRPOTrainer, stage: str) -> dict[str, dict[str, dict[str, float]]]:
    """Per env of the run, held-out metrics of the greedy policy and, with ``eval_sampled``, of the
    policy sampled as in training (echoed to stderr, with the episodes cut for invalid replies)."""
    out = {}
    args = trainer.args
    for entry in args.env_entries():
        name = f"{stage}, {entry.env_id}" if len(args.env_entries()) > 1 else stage
        metrics = {"greedy": trainer.evaluate_env(label=f"held-out, {name}, greedy", env=entry)}
        if args.eval_sampled:
            metrics["sampled"] = trainer.evaluate_env(greedy=False, label=f"held-out, {name}, sampled", env=entry)
        if args.eval_pass_k:
            k = args.eval_pass_k
            metrics[f"pass@{k}"] = trainer.evaluate_env(greedy=False, label=f"held-out, {name}, pass@{k}", env=entry, pass_k=k)
            metrics[f"pass@{k}"]["success_rate"] = metrics[f"pass@{k}"]["pass_at_k"]
        note = ""
        if any(m.get("invalid_end_rate") for m in metrics.values()):
            cut = " and ".join(f"{m['invalid_end_rate']:.0%} {mode}" for mode, m in metrics.items())
            note = f" ({cut} episodes ended after {args.eval_max_invalid_streak} invalid replies in a row)"
        rates = ", ".join(f"{m['success_rate']:.1%} {mode}" for mode, m in metrics.items())
        say(f"held-out success, {name}: {rates}{note}")
        out[entry.env_id] = metrics
    return out


def references(trainer: EnvGRPOTrainer, entry: Any) -> tuple[dict[str, float], Any]:
    """The reference policies and the open-loop search on the held-out seeds of one env of the run
    (:func:`envhub_trl.evaluation.reference_figures`); random and expert play through
    ``evaluate_env``, under the training prompt settings."""
    from envhub_trl.evaluation import held_out_seeds, reference_figures

    args = trainer.args
    seeds = held_out_seeds(args.eval_seed_offset, args.eval_episodes)
    settings = args.held_out_settings(entry)
    say(f"reference policies on the {len(seeds)} held-out seeds of {settings.env_id}: searching the best open-loop policy")
    return reference_figures(
        settings, seeds, seed=args.seed, tokenizer=trainer.processing_class, say=say,
        play=lambda generator: trainer.evaluate_env(seeds, generator=generator, env=entry, label=f"reference, {type(generator).__name__}")["success_rate"],
    )


def _dagger_progress(round_: int, trajectories: list[Any]) -> None:
    """Echo how the model played in a DAgger round (its episodes on fresh training seeds)."""
    won = sum(t.success for t in trajectories) / max(1, len(trajectories))
    say(f"warm start, DAgger round {round_ + 1}: the model won {won:.1%} of {len(trajectories)} episodes it played")


class TrainingRun:
    """The stages of one run of a :class:`RunSpec`, each a method, called in order by :func:`train`.

    Attributes:
        spec: the run.
        checkpoint: the checkpoint a resumed run continues (None: a new run).
        record: that checkpoint's record of the run (None: a new run).
        trainer: the trainer (after :meth:`load`).
        evaluations: held-out figures per stage (:data:`STAGES`), per env.
        before_rl: the optimizer step RL started at (the warm start's are not counted).
        phase_seconds: wall time of the warm start (this process's; None when resumed past it)
            and of RL (its validations included).
        periodic: the periodic held-out evaluation (None without ``eval_steps``).
        kept: what validation selection kept (None without ``keep_best_on_validation``).
        searched: per env, the reference policies' figures and the open-loop search.
        then: what to do when ``final/`` or results.json finds no room.
        verbose: keep the Trainer's progress bar and raw metrics dicts beside the step lines.
    """

    def __init__(self, spec: RunSpec, checkpoint: Path | None = None, record: dict[str, Any] | None = None, *, verbose: bool = True):
        self.spec, self.checkpoint, self.record, self.verbose = spec, checkpoint, record, verbose
        self.trainer: EnvGRPOTrainer | None = None
        self.evaluations: dict[str, Any] = {}
        self.before_rl = 0
        self.phase_seconds: dict[str, float | None] = {"warm_start": None, "rl": None}
        self.periodic: Any = None
        self.kept: dict[str, Any] | None = None
        self.searched: dict[str, tuple[dict[str, float], Any]] = {}
        self.then = RUN_AGAIN

    def load(self, overwrite: bool) -> None:
        """The model, its tokenizer and the trainer; with ``overwrite``, only now that they have
        loaded, the earlier run's files go."""
        from envhub_trl import run_state
        from envhub_trl.models import load_model_and_tokenizer
        from envhub_trl.trainer import EnvGRPOTrainer

        spec, entries = self.spec, self.spec.args.env_entries()
        model, tokenizer = load_model_and_tokenizer(
            spec.model, [e.env_id for e in entries], spec.args.seed, kwargs_by_env={e.env_id: e.env_kwargs for e in entries},
            tiny=spec.tiny if spec.model == "tiny" else None,
        )
        peft = spec.lora.peft_config() if spec.lora is not None else None
        self.trainer = EnvGRPOTrainer(model, spec.args, processing_class=tokenizer, peft_config=peft)
        if overwrite:
            run_state.clear_run(spec.args.output_dir)

    def start(self) -> None:
        """Held-out figures of the initial model and, with a warm start, after it; a resumed run
        takes them from its checkpoint's record (its weights already hold the warm start)."""
        trainer, warm_start, args = self.trainer, self.spec.warm_start, self.spec.args
        if self.record is not None:
            say(f"resuming from {self.checkpoint}: the evaluations before RL are those the run made")
            self.evaluations, self.before_rl = self.record["evaluations"], self.record["before_rl"]
            return
        self.evaluations = {STAGES[0]: evaluate(trainer, STAGES[0])}
        if warm_start.active:
            say(f"warm start: {warm_start.describe()}")
            begun = time.perf_counter()
            model, tokenizer = trainer.model, trainer.processing_class
            settings = [args.env_settings(e) for e in args.env_entries()]
            warm_start.run_on(model, tokenizer, settings, args.seed, on_round=_dagger_progress, bf16=bool(args.bf16))
            self.phase_seconds["warm_start"] = time.perf_counter() - begun
            trainer.warm_started()
            self.evaluations[STAGES[1]] = evaluate(trainer, STAGES[1])
        self.before_rl = trainer.state.global_step

    def reinforce(self) -> None:
        """RL (from the checkpoint of a resumed run), with the periodic evaluation and the
        validation selection, then the held-out figures after it."""
        from envhub_trl.callbacks import StepProgress
        from envhub_trl.quiet import drop_trainer_printing
        from envhub_trl.selection import ValidationSelection, periodic_evaluation

        trainer, args, record = self.trainer, self.spec.args, self.record or {}
        trainer.add_callback(StepProgress(trainer, say))  # first, so a step's line comes before its evaluations
        if not self.verbose:
            drop_trainer_printing(trainer)
        self.periodic = periodic_evaluation(trainer, record.get("held_out_curve", []))
        selection = None
        if args.keep_best_on_validation:
            selection = ValidationSelection(trainer, record.get("validation_curve", []))
            trainer.add_callback(selection)
        tracking = self._tracking(selection)
        # What each checkpoint keeps of this command's run (envhub_trl.run_state.save writes it).
        trainer.run_record = {
            **self.spec.record(), "evaluations": dict(self.evaluations), "before_rl": self.before_rl,
            "held_out_curve": self.periodic.points if self.periodic is not None else [],
            "validation_curve": selection.points if selection is not None else [],
        }
        begun = time.perf_counter()
        trainer.train(resume_from_checkpoint=str(self.checkpoint) if self.checkpoint is not None else None)
        self.phase_seconds["rl"] = time.perf_counter() - begun
        if selection is not None:
            self.kept = {**selection.finish(), "curve": selection.points, "episodes": args.validation_episodes,
                         "seed_offset": args.validation_seed_offset, "held_out_last_step": None}
            if self.kept["step"] != self.kept["last_step"]:
                # The last policy's held-out figures too, so that what the choice changed is on record.
                self.kept["held_out_last_step"] = evaluate(trainer, "after RL, last step (not kept)")
                selection.restore()
        self.evaluations[STAGES[2]] = evaluate(trainer, STAGES[2])
        if tracking is not None:
            tracking.after_training(self._after_rl_scalars())

    def _tracking(self, selection: Any) -> Any:
        """With trackers (``report_to``), the callback that sends them the held-out evaluations
        (:class:`~envhub_trl.trackers.HeldOutToTrackers`), added to the trainer, with the figures
        before RL waiting in it (a resumed run sent those before its checkpoint); None without."""
        from envhub_trl.trackers import HeldOutToTrackers, curve_scalars, greedy_point, report_names, stage_scalars

        trainer = self.trainer
        if not report_names(trainer.args.report_to):
            return None
        tracking = HeldOutToTrackers(trainer, {"held_out": self.periodic, "validation": selection})
        if self.record is None:
            for stage, by_env in self.evaluations.items():
                tracking.send(stage_scalars(stage, by_env), self.before_rl)
            tracking.send(curve_scalars(greedy_point(list(self.evaluations.values())[-1], self.before_rl)), self.before_rl)
        trainer.add_callback(tracking)
        return tracking

    def _after_rl_scalars(self) -> dict[str, float]:
        """The held-out figures after RL as tracker scalars, with the held-out curve's last point
        (and the last policy's figures, when validation kept another step's)."""
        from envhub_trl.trackers import curve_scalars, greedy_point, stage_scalars

        after = self.evaluations[STAGES[2]]
        stages = {STAGES[2]: after}
        if self.kept is not None and self.kept["held_out_last_step"] is not None:
            stages = {"after RL, last step (not kept)": self.kept["held_out_last_step"], **stages}
        scalars = {key: value for stage, by_env in stages.items() for key, value in stage_scalars(stage, by_env).items()}
        return {**scalars, **curve_scalars(greedy_point(after, self.trainer.state.global_step))}

    def search_references(self) -> None:
        """The reference policies on the held-out seeds of each env."""
        self.searched = {e.env_id: references(self.trainer, e) for e in self.spec.args.env_entries()}

    def save_final(self, card: str | None = None) -> None:
        """``final/``, written whole or not at all (a LoRA run's merged model, which loads
        without PEFT, instead of the adapter alone), with the model ``card`` as its README.md."""
        from envhub_trl import run_files, run_state
        from envhub_trl.lora import merged_model
        from envhub_trl.model_card import CARD_FILE

        trainer, out = self.trainer, Path(self.spec.args.output_dir)
        last = run_state.last_checkpoint(out)
        if last is not None:
            self.then = f"free some space; --resume finishes the run from {last.name}"
        try:  # results.json, which says the run finished, only after it
            with run_files.writing_folder(out / "final", trainer.checkpoint_bytes(), self.then) as final:
                trainer.save_model(str(final))
                if self.spec.lora is not None:
                    for name in ("adapter_model.safetensors", "adapter_config.json"):
                        (final / name).unlink(missing_ok=True)
                    merged_model(trainer.accelerator.unwrap_model(trainer.model)).save_pretrained(str(final))
                if card is not None:
                    (final / CARD_FILE).write_text(card, encoding="utf-8")
        except EnvhubError as exc:
            raise click.ClickException(str(exc)) from None

    def drop_last_checkpoint(self) -> None:
        """Remove the checkpoint of the run's last step (the Trainer saves one when training ends,
        with ``save_strategy: steps``) once ``final/`` and results.json hold the run: it only
        duplicates ``final/``, and a resume of a finished run reads results.json. It stays when
        validation selection put another step's policy in ``final/`` (it then holds the last one)."""
        from envhub_trl import run_files, run_state

        last = run_state.last_checkpoint(self.spec.args.output_dir)
        if last is None or last.name != f"checkpoint-{self.trainer.state.global_step}":
            return
        if self.kept is not None and self.kept["step"] != self.kept["last_step"]:
            return
        run_files.remove_folder(last)
