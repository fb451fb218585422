"""``envhub train``: GRPO/GiGPO on an environment, with held-out success before and after.

The run leaves in ``--output-dir``: the trained model and tokenizer (``final/``), the learning
curve (``learning_curve.png``), and ``results.json`` with every evaluation and the config. With
checkpoints (``save_strategy: steps``), ``--resume`` continues a run from its last
``checkpoint-N`` (or a named one) to the figures the uninterrupted run would have given
(:mod:`envhub_trl.run_state`); a new run into a folder that holds an earlier run's checkpoints is
refused unless ``--resume`` or ``--overwrite`` says what to do with them. One run at a time may
use an output folder, and what it writes there is whole or absent, never half-written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import click

from envhub.error import EnvhubError
from envhub_trl.estimators import ESTIMATORS

#: Held-out evaluation stages, in the order the table lists them.
STAGES = ("initial model", "after warm start (SFT)", "after RL")


#: Keys of a config file that are not EnvGRPOConfig fields: the warm start (a mapping of
#: :class:`envhub_trl.warm_start.WarmStart` fields), how ``--model tiny`` is built (a mapping
#: of :class:`envhub_trl.tiny.TinySpec` fields) and a LoRA adapter (a mapping of
#: :class:`envhub_trl.lora.LoraSettings` fields).
RUN_KEYS = ("warm_start", "tiny", "lora")


def load_config_file(path: str | None, overrides: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """The fields of a YAML config file (empty without one) with Hydra-style ``KEY=VALUE``
    ``overrides`` applied: EnvGRPOConfig fields and :data:`RUN_KEYS`, each checked against its
    annotation (and converted where safe: ``1e-4`` read as a string becomes a float) before
    anything loads.

    Raises:
        click.ClickException: for malformed YAML, an unknown field or a value of the wrong type,
            naming the field and the type it expects.
    """
    from envhub_trl.config import EnvGRPOConfig
    from envhub_trl.config_file import ConfigError, apply_overrides, check_values, read_yaml_mapping

    try:
        values = read_yaml_mapping(path) if path is not None else {}
        values = apply_overrides(values, overrides, EnvGRPOConfig)
        return check_values(values, EnvGRPOConfig, extra=RUN_KEYS, source=path or "config")
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def split_warm_start(values: dict[str, Any], source: str | None = None, overrides: dict[str, Any] | None = None) -> Any:
    """Take the ``warm_start`` mapping out of config ``values`` (in place) as a
    :class:`~envhub_trl.warm_start.WarmStart`, with ``overrides`` (its fields) applied.

    Raises:
        click.ClickException: for a bad mapping, naming ``source`` (the config file).
    """
    from envhub_trl.warm_start import WarmStart

    mapping = values.pop("warm_start", None)
    try:
        if mapping is not None and not isinstance(mapping, dict):
            raise ValueError(f"warm_start must be a mapping of WarmStart fields, got {mapping!r}")
        return WarmStart.from_mapping({**(mapping or {}), **(overrides or {})})
    except ValueError as exc:
        raise click.ClickException(f"{source or 'config'}: {exc}") from exc


def _evaluate(trainer: Any, stage: str) -> dict[str, dict[str, dict[str, float]]]:
    """Per env of the run, held-out metrics of the greedy policy and, with ``eval_sampled``, of the
    policy sampled as in training (echoed to stderr, with the episodes cut for invalid replies)."""
    out = {}
    for entry in trainer.args.env_entries():
        name = f"{stage}, {entry.env_id}" if len(trainer.args.env_entries()) > 1 else stage
        metrics = {"greedy": trainer.evaluate_env(label=f"held-out, {name}, greedy", env=entry)}
        if trainer.args.eval_sampled:
            metrics["sampled"] = trainer.evaluate_env(greedy=False, label=f"held-out, {name}, sampled", env=entry)
        if trainer.args.eval_pass_k:
            k = trainer.args.eval_pass_k
            metrics[f"pass@{k}"] = trainer.evaluate_env(greedy=False, label=f"held-out, {name}, pass@{k}", env=entry, pass_k=k)
            metrics[f"pass@{k}"]["success_rate"] = metrics[f"pass@{k}"]["pass_at_k"]
        note = ""
        if any(m.get("invalid_end_rate") for m in metrics.values()):
            cut = " and ".join(f"{m['invalid_end_rate']:.0%} {mode}" for mode, m in metrics.items())
            note = f" ({cut} episodes ended after {trainer.args.eval_max_invalid_streak} invalid replies in a row)"
        rates = ", ".join(f"{m['success_rate']:.1%} {mode}" for mode, m in metrics.items())
        click.echo(f"held-out success, {name}: {rates}{note}", err=True)
        out[entry.env_id] = metrics
    return out


def _mean_over_envs(per_env: dict[str, Any]) -> Any:
    """The mean of numbers at the same place in each env's nested mapping (keys all envs share)."""
    values = list(per_env.values())
    if len(values) == 1:
        return values[0]
    if all(isinstance(v, dict) for v in values):
        shared = [k for k in values[0] if all(k in v for v in values[1:])]
        return {k: _mean_over_envs({i: v[k] for i, v in zip(per_env, values)}) for k in shared}
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return float(sum(values) / len(values))
    return None


def _references(trainer: Any, entry: Any) -> tuple[dict[str, float], Any]:
    """The reference policies and the open-loop search on the held-out seeds of one env of the run
    (:func:`envhub_trl.evaluation.reference_figures`); random and expert play through
    ``evaluate_env``, under the training prompt settings."""
    from envhub_trl.evaluation import held_out_seeds, reference_figures

    args = trainer.args
    seeds = held_out_seeds(args.eval_seed_offset, args.eval_episodes)
    click.echo(f"reference policies on the {len(seeds)} held-out seeds of {entry.env_id}: searching the best open-loop policy", err=True)
    return reference_figures(
        args.env_settings(entry), seeds, seed=args.seed, tokenizer=trainer.processing_class, say=_say,
        play=lambda generator: trainer.evaluate_env(seeds, generator=generator, env=entry, label=f"reference, {type(generator).__name__}")["success_rate"],
    )


def _periodic_evaluation(trainer: Any, points: list[dict[str, Any]] = ()) -> Any:
    """With ``eval_steps`` set, a callback (added to ``trainer``) that measures held-out greedy
    success every ``eval_steps`` optimizer steps, as ROLL's validation runs do, so that a run that
    peaks and then collapses shows it; None without ``eval_steps``. ``points`` are those a resumed
    run measured before its checkpoint."""
    from transformers import TrainerCallback

    from envhub_trl.selection import greedy_point

    every = trainer.args.eval_steps
    if not every:
        return None
    every = max(1, int(every if every >= 1 else every * trainer.args.max_steps))

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


def _row(stage: str, metrics: dict[str, dict[str, float]]) -> list[str]:
    greedy, sampled = metrics["greedy"], metrics.get("sampled")  # sampled: with eval_sampled only
    return [
        stage,
        f"{greedy['success_rate']:.1%}",
        "-" if sampled is None else f"{sampled['success_rate']:.1%}",
        f"{greedy['invalid_action_rate']:.1%}",
        "-" if sampled is None else f"{sampled['invalid_action_rate']:.1%}",
        f"{greedy['mean_turns']:.2f}",
    ]


def _resume_point(output_dir: str, resume: str | bool | None, from_config: str | None, overwrite: bool) -> Path | None:
    """The checkpoint a run resumes from (None: a new run), from ``resume`` or the config's
    ``resume_from_checkpoint`` (``from_config``: it means the same), once the output folder is
    found fit for the run (:func:`envhub_trl.run_state.prepare_output_dir`; a damaged last
    checkpoint is passed over, saying so).

    Raises:
        click.ClickException: for both asked differently, or a folder or checkpoint that refuses.
    """
    from envhub_trl import run_state

    if from_config:
        if resume not in (None, False) and (resume in (True, "last") or Path(str(resume)).resolve() != Path(from_config).resolve()):
            raise click.ClickException(f"resume_from_checkpoint={from_config} and --resume {resume} ask for different checkpoints; give one")
        resume = from_config
    try:
        return run_state.prepare_output_dir(output_dir, resume, overwrite, say=_say)
    except EnvhubError as exc:
        raise click.ClickException(str(exc)) from None


def _say(line: str) -> None:
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
    """Train as ``envhub train`` does and return its ``results.json`` (also written, with the model).

    ``values`` are :class:`EnvGRPOConfig` fields (``output_dir`` included), and may hold ``tiny``
    (a mapping of :class:`~envhub_trl.tiny.TinySpec` fields, for ``--model tiny``) and ``lora`` (a
    mapping of :class:`~envhub_trl.lora.LoraSettings` fields: train an adapter, the warm start's
    folded into the weights before RL; the saved model is merged); ``warm_start`` is a
    :class:`~envhub_trl.warm_start.WarmStart` (None: none). The run evaluates on
    the held-out seeds before training, after the warm start and after RL, then plays the
    reference policies on the same seeds; progress goes to stderr. The learning benchmark calls
    this once per run.

    ``resume`` (True: the output folder's last ``checkpoint-N``; or a checkpoint's path; the
    config's ``resume_from_checkpoint`` means the same) continues an interrupted run: the same
    model, config and warm start, the evaluations it made before its checkpoint kept, so that it
    returns what the uninterrupted run would have; a resume of a finished run (its results.json)
    returns its results and changes nothing. ``overwrite`` removes what an earlier run wrote
    (:func:`~envhub_trl.run_state.clear_run`) once the new run's model and envs have loaded;
    without either, an output folder with an earlier run's checkpoints is refused. The output
    folder is locked for the whole run (:mod:`envhub_trl.run_lock`), and every checkpoint,
    ``final/`` and results.json are written whole or not at all (:mod:`envhub_trl.run_files`).

    Raises:
        click.ClickException: for a bad configuration, an output folder in use by another run or
            that cannot be used as asked, a damaged checkpoint with none whole before it, a write
            that found no room, or an environment error, with the reason.
    """
    from envhub_trl import run_files, run_lock, run_state
    from envhub_trl.config import EnvGRPOConfig
    from envhub_trl.lora import LoraSettings, fold_adapter, merged_model
    from envhub_trl.models import load_model_and_tokenizer
    from envhub_trl.plots import plot_learning_curve
    from envhub_trl.selection import ValidationSelection
    from envhub_trl.tiny import TinySpec
    from envhub_trl.trainer import EnvGRPOTrainer
    from envhub_trl.warm_start import WarmStart

    warm_start = warm_start if warm_start is not None else WarmStart()
    started = time.perf_counter()
    values = dict(values)
    values.setdefault("report_to", "none")
    from_config = values.pop("resume_from_checkpoint", None)  # a config's way of saying --resume PATH
    tiny_values = values.pop("tiny", None)
    lora_values = values.pop("lora", None)
    try:
        args = EnvGRPOConfig(**values)
        args.check_envs()
        tiny = TinySpec.from_mapping(tiny_values)
        lora = LoraSettings.from_mapping(lora_values)
        if tiny_values is not None and model_name != "tiny":
            raise ValueError(f"tiny settings are for --model tiny, not {model_name!r}")
    except (TypeError, ValueError, EnvhubError) as exc:
        raise click.ClickException(f"bad configuration: {exc}") from exc
    config = {k: v for k, v in values.items() if k != "output_dir"}
    if tiny_values is not None:
        config["tiny"] = dict(tiny_values)
    if lora is not None:
        config["lora"] = lora.record()
    try:  # one run at a time in an output folder, for the whole run
        lock = run_lock.OutputLock(args.output_dir).acquire()
    except EnvhubError as exc:
        raise click.ClickException(str(exc)) from None
    with lock:
        if lock.taken_over is not None:
            _say(lock.describe_taken_over())
        run_state.remove_partials(args.output_dir)  # what a killed run's unfinished writes left
        finished = run_state.finished_results(args.output_dir) if resume not in (None, False) or from_config else None
        if finished is not None:
            _say(f"{args.output_dir} holds a finished run ({run_state.RESULTS_FILE}): there is nothing to resume, and nothing was changed")
            return finished
        checkpoint = _resume_point(args.output_dir, resume, from_config, overwrite)
        record = None
        if checkpoint is not None:
            try:
                record = run_state.read_record(checkpoint)
                run_state.check_same_run(record, model_name, config, dataclasses.asdict(warm_start))
            except EnvhubError as exc:
                raise click.ClickException(str(exc)) from None
        entries = args.env_entries()
        # Wall time of the warm start (this process's; None when resumed past it) and of RL (its
        # validations included); "seconds" is the whole command's.
        phase_seconds: dict[str, float | None] = {"warm_start": None, "rl": None}
        try:
            model, tokenizer = load_model_and_tokenizer(
                model_name, [e.env_id for e in entries], args.seed, kwargs_by_env={e.env_id: e.env_kwargs for e in entries},
                tiny=tiny if model_name == "tiny" else None,
            )
            trainer = EnvGRPOTrainer(model, args, processing_class=tokenizer, peft_config=lora.peft_config() if lora is not None else None)
            if overwrite:  # only now that the config, the model and the envs have loaded
                run_state.clear_run(args.output_dir)
            if record is None:
                evaluations = {STAGES[0]: _evaluate(trainer, STAGES[0])}
                if warm_start.active:
                    click.echo(f"warm start: {warm_start.describe()}", err=True)
                    begun = time.perf_counter()
                    warm_start.run_on(
                        model, tokenizer, [args.env_settings(e) for e in entries], args.seed, on_round=_dagger_progress, bf16=bool(args.bf16),
                    )
                    phase_seconds["warm_start"] = time.perf_counter() - begun
                    fold_adapter(trainer.accelerator.unwrap_model(trainer.model))  # LoRA: RL's adapter starts at 0, its reference is the warm start
                    trainer.weights_changed()  # a vLLM generator still holds the initial weights
                    trainer.reference_from_policy()  # a KL term (beta > 0) holds RL near the warm start
                    evaluations[STAGES[1]] = _evaluate(trainer, STAGES[1])
                before_rl = trainer.state.global_step
            else:
                # The checkpoint's weights already hold the warm start; its evaluations are the record's.
                click.echo(f"resuming from {checkpoint}: the evaluations before RL are those the run made", err=True)
                evaluations, before_rl = record["evaluations"], record["before_rl"]
            periodic = _periodic_evaluation(trainer, record["held_out_curve"] if record is not None else [])
            selection = None
            if args.keep_best_on_validation:
                selection = ValidationSelection(trainer, (record or {}).get("validation_curve", []))
                trainer.add_callback(selection)
            # What each checkpoint keeps of this command's run (envhub_trl.run_state.save writes it).
            trainer.run_record = {
                "model": model_name, "config": config, "warm_start": dataclasses.asdict(warm_start), "evaluations": dict(evaluations),
                "before_rl": before_rl, "held_out_curve": periodic.points if periodic is not None else [],
                "validation_curve": selection.points if selection is not None else [],
            }
            begun = time.perf_counter()
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
            phase_seconds["rl"] = time.perf_counter() - begun
            kept = None
            if selection is not None:
                kept = {**selection.finish(), "curve": selection.points, "episodes": args.validation_episodes,
                        "seed_offset": args.validation_seed_offset, "held_out_last_step": None}
                if kept["step"] != kept["last_step"]:
                    # The last policy's held-out figures too, so that what the choice changed is on record.
                    kept["held_out_last_step"] = _evaluate(trainer, "after RL, last step (not kept)")
                    selection.restore()
            evaluations[STAGES[2]] = _evaluate(trainer, STAGES[2])
            searched = {e.env_id: _references(trainer, e) for e in entries}
        except EnvhubError as exc:
            raise click.ClickException(str(exc)) from exc
        out = Path(args.output_dir)
        last = run_state.last_checkpoint(out)
        then = f"free some space; --resume finishes the run from {last.name}" if last is not None else "free some space and run again"
        try:  # written whole or not at all; results.json, which says the run finished, only after it
            with run_files.writing_folder(out / "final", trainer.checkpoint_bytes(), then) as final:
                trainer.save_model(str(final))
                if lora is not None:  # the merged model, which loads without PEFT, instead of the adapter alone
                    for name in ("adapter_model.safetensors", "adapter_config.json"):
                        (final / name).unlink(missing_ok=True)
                    merged_model(trainer.accelerator.unwrap_model(trainer.model)).save_pretrained(str(final))
        except EnvhubError as exc:
            raise click.ClickException(str(exc)) from None
        start_key = STAGES[1] if warm_start.active else STAGES[0]
        end = trainer.state.global_step
        per_env = {}
        for entry in entries:
            own = {stage: by_env[entry.env_id] for stage, by_env in evaluations.items()}
            references, open_loop = searched[entry.env_id]
            per_env[entry.env_id] = {
                "evaluations": own,
                "references": references,
                "open_loop_actions": None if open_loop is None else list(open_loop.actions),
                "open_loop_exhaustive": None if open_loop is None else open_loop.exhaustive,
                "open_loop_description": None if open_loop is None else open_loop.describe(),
                "rl_success_gain": {m: own[STAGES[2]][m]["success_rate"] - own[start_key][m]["success_rate"] for m in own[STAGES[2]]},
                "gain_over_open_loop": None if open_loop is None else {
                    m: own[STAGES[2]][m]["success_rate"] - open_loop.success_rate for m in own[STAGES[2]]
                },
            }
        # One env: its figures; a mix: the mean over its envs (each env's are under per_env).
        summary = per_env[entries[0].env_id] if len(entries) == 1 else {
            key: _mean_over_envs({i: figures[key] for i, figures in per_env.items()})
            for key in ("evaluations", "references", "rl_success_gain", "gain_over_open_loop")
        }
        if len(entries) > 1:
            summary = {**summary, "open_loop_actions": None, "open_loop_exhaustive": None, "open_loop_description": None}
        results = {
            "env_id": args.env_id,
            "env_ids": [e.env_id for e in entries],
            "model": model_name,
            "advantage_estimator": args.advantage_estimator,
            "held_out_episodes": args.eval_episodes,
            "held_out_seed_offset": args.eval_seed_offset,
            "sampling": _sampling_text(args),
            "evaluations": summary["evaluations"],
            "references": summary["references"] or {},
            "open_loop_actions": summary["open_loop_actions"],
            "open_loop_exhaustive": summary["open_loop_exhaustive"],
            "open_loop_description": summary["open_loop_description"],
            "rl_success_gain": summary["rl_success_gain"],
            "gain_over_open_loop": summary["gain_over_open_loop"],
            "per_env": per_env,
            "rl_steps": end - before_rl,
            "warm_start_steps": warm_start.steps,
            "warm_start": dataclasses.asdict(warm_start),
            "held_out_curve": periodic.points if periodic is not None else [],
            "validation": kept,
            "training_curve": [
                {"step": entry["step"], "success_rate": entry["env/success_rate"],
                 **{k.removeprefix("env/").removesuffix("/success_rate"): entry[k] for k in entry if k.endswith("/success_rate") and k.count("/") > 1}}
                for entry in trainer.state.log_history
                if "env/success_rate" in entry
            ],
            "seconds": time.perf_counter() - started,
            "phase_seconds": phase_seconds,
            "config": config,
        }
        try:
            text = json.dumps(results, indent=2)
            with run_files.room_errors(out / run_state.RESULTS_FILE, len(text), then):
                run_files.write_text(out / run_state.RESULTS_FILE, text)
            # Drawn last: the figures are in results.json whatever happens to plotting.
            how = results["sampling"]
            marks: dict[str, dict[str, dict[int, float]]] = {}
            for env_id, figures in per_env.items() if len(entries) > 1 else [("", summary)]:
                own, start = figures["evaluations"], figures["evaluations"][start_key]
                panel = marks.setdefault(env_id, {})
                panel["held-out, greedy"] = {before_rl: start["greedy"]["success_rate"], end: own[STAGES[2]]["greedy"]["success_rate"]}
                if "sampled" in start:
                    panel[f"held-out, sampled ({how})"] = {before_rl: start["sampled"]["success_rate"], end: own[STAGES[2]]["sampled"]["success_rate"]}
                if periodic is not None and periodic.points:
                    panel[f"held-out, greedy, every {args.eval_steps:g} steps"] = {
                        p["step"]: p["per_env"][env_id] if env_id else p["greedy"] for p in periodic.points
                    }
                panel.update({f"{name} (held-out)": {before_rl: rate, end: rate} for name, rate in figures["references"].items()})
            with run_files.room_errors(out / "learning_curve.png", 1 << 20, "free some space; the figures are in results.json"):
                plot_learning_curve(trainer.state.log_history, out / "learning_curve.png", marks, title=f"{' + '.join(results['env_ids'])}, {args.advantage_estimator}")
        except EnvhubError as exc:
            raise click.ClickException(str(exc)) from None
        return results


def _print_env(name: str, figures: dict[str, Any], results: dict[str, Any]) -> None:
    """One env's table (held-out stages, then the reference policies) and its RL gains."""
    from envhub.cli import table

    evaluations, references = figures["evaluations"], figures["references"] or {}
    modes = "greedy and sampled" if "sampled" in figures["rl_success_gain"] else "greedy (sampled with eval_sampled: true)"
    click.echo(f"\n{name}: success on {results['held_out_episodes']} held-out seeds, {modes} ({results['sampling']})\n")
    headers = ["stage", "success (greedy)", "success (sampled)", "invalid (greedy)", "invalid (sampled)", "turns (greedy)"]
    rows = [_row(stage, m) for stage, m in evaluations.items()]
    rows += [[ref, f"{rate:.1%}", f"{rate:.1%}", "-", "-", "-"] for ref, rate in references.items()]
    click.echo(table(rows, headers))
    if figures.get("open_loop_description") is not None:
        click.echo(f"\nopen-loop: {figures['open_loop_description']}")
    gain, over = figures["rl_success_gain"], figures["gain_over_open_loop"]
    click.echo(
        f"\nRL phase ({results['rl_steps']} steps, {results['advantage_estimator']}): "
        + ", ".join(f"{points * 100:+.1f} points of {mode} success" for mode, points in gain.items())
    )
    if over is not None and "open-loop" in references:
        click.echo(
            f"learned policy over the best open-loop policy ({references['open-loop']:.1%}): "
            + ", ".join(f"{points * 100:+.1f} points {mode}" for mode, points in over.items())
        )


def _dagger_progress(round_: int, trajectories: list[Any]) -> None:
    """Echo how the model played in a DAgger round (its episodes on fresh training seeds)."""
    won = sum(t.success for t in trajectories) / max(1, len(trajectories))
    click.echo(f"warm start, DAgger round {round_ + 1}: the model won {won:.1%} of {len(trajectories)} episodes it played", err=True)


def _sampling_text(args: Any) -> str:
    """How training samples, in words (``T=1, top-k 4``)."""
    return f"T={args.temperature:g}" + (f", top-k {args.top_k}" if args.top_k else "") + (f", top-p {args.top_p:g}" if args.top_p < 1 else "")


@click.command("train")
@click.option("--env", "env_id", default=None, help="Environment id (default: the config file's env_id, else frozenlake/FrozenLake-v0).")
@click.option("--model", "model_name", default="tiny", show_default=True,
              help="'tiny' (a fresh tiny Qwen2 built here), 'smollm2-135m' (SmolLM2-135M-Instruct, offline from PyPI), a model folder or a hub id.")
@click.option("--algo", type=click.Choice(sorted(ESTIMATORS)), default=None, help="Advantage estimator (default: the config's, else gigpo).")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False), default=None, help="YAML file of EnvGRPOConfig fields.")
@click.option("--output-dir", required=True, type=click.Path(file_okay=False), help="Folder for the model, the curve and results.json.")
@click.option("--warm-start-steps", default=None, type=click.IntRange(min=0),
              help="Supervised steps on expert episodes before RL (default: the config's warm_start.steps, else 0).")
@click.option("--warm-start-episodes", default=None, type=click.IntRange(min=1), help="Expert episodes for the warm start (default 512).")
@click.option("--warm-start-lr", default=None, type=click.FloatRange(min=0, min_open=True), help="Learning rate of the warm start (default 3e-4).")
@click.option("--warm-start-epsilon", default=None, type=click.FloatRange(0, 1),
              help="Probability that the demonstrator takes a random move instead of the expert's (default 0).")
@click.option("--warm-start-dagger-rounds", default=None, type=click.IntRange(min=0),
              help="Rounds of on-policy expert relabelling (DAgger) after the warm start's steps: the model plays, the expert labels every state it visits (default 0).")
@click.option("--warm-start-schedule", default=None, type=click.Choice(["constant", "linear", "cosine"]),
              help="How the warm start's learning rate falls over its steps (default: constant; the FrozenLake demo's: cosine).")
@click.option("--lora-r", default=None, type=click.IntRange(min=1),
              help="Train a LoRA adapter of this rank instead of every weight (the config's lora.r; lora.alpha defaults to 32).")
@click.option("--eval-episodes", default=None, type=click.IntRange(min=1), help="Held-out episodes per evaluation (default: the config's eval_episodes, else 128).")
@click.option("--resume", "resume", is_flag=False, flag_value="last", default=None, metavar="[CHECKPOINT]",
              help="Continue the run in --output-dir from its last checkpoint-N (or from CHECKPOINT), with the same config.")
@click.option("--overwrite", is_flag=True,
              help="Start afresh in an --output-dir that holds an earlier run (once the new run has loaded, the earlier run's checkpoint-N folders, final/ and results are removed; nothing else).")
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
def train_command(
    env_id, model_name, algo, config_file, output_dir, warm_start_steps, warm_start_episodes, warm_start_lr, warm_start_epsilon,
    warm_start_dagger_rounds, warm_start_schedule, lora_r, eval_episodes, resume, overwrite, overrides,
):
    """Train a model on an environment with GRPO or GiGPO; report held-out success before and after.

    KEY=VALUE arguments override the config file's fields, as Hydra's do (max_steps=200
    learning_rate=1e-5 warm_start.steps=100), with the same type checks.

    With checkpoints (save_strategy: steps), --resume continues an interrupted run to the figures
    the uninterrupted one would have given, from its last whole checkpoint; a new run into a folder
    that holds an earlier run's checkpoints is refused unless --resume or --overwrite is given, and
    one run at a time may use a folder."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if resume not in (None, "last") and "=" in resume and not Path(resume).exists():
        # `--resume max_steps=9`: a bare --resume followed by an override, not a checkpoint path.
        overrides, resume = (resume, *overrides), "last"
    values = load_config_file(config_file, overrides)
    if env_id is not None:
        values["env_id"] = env_id
    if algo is not None:
        values["advantage_estimator"] = algo
    if eval_episodes is not None:
        values["eval_episodes"] = eval_episodes
    if lora_r is not None:
        values["lora"] = {**(values.get("lora") or {}), "r": lora_r}
    values["output_dir"] = output_dir
    flags = {
        "steps": warm_start_steps, "episodes": warm_start_episodes, "learning_rate": warm_start_lr, "epsilon": warm_start_epsilon,
        "dagger_rounds": warm_start_dagger_rounds, "lr_schedule": warm_start_schedule,
    }
    warm_start = split_warm_start(values, config_file, {k: v for k, v in flags.items() if v is not None})
    results = run_training(values, model_name, warm_start=warm_start, resume=resume, overwrite=overwrite)
    per_env = results["per_env"]
    for env_id, figures in per_env.items():
        _print_env(env_id, figures, results)
    if len(per_env) > 1:
        _print_env(f"mean over {len(per_env)} envs", results, results)
    out = Path(output_dir)
    click.echo(f"learning curve: {out / 'learning_curve.png'}\nmodel: {out / 'final'}\ntotal time: {results['seconds'] / 60:.1f} min")
