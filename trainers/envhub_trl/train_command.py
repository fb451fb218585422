"""``envhub train``: GRPO/GiGPO on an environment, with held-out success before and after.

The run leaves in ``--output-dir``: the trained model and tokenizer (``final/``), the learning
curve (``learning_curve.png``), and ``results.json`` with every evaluation and the config.
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
#: :class:`envhub_trl.warm_start.WarmStart` fields).
RUN_KEYS = ("warm_start",)


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
        values = apply_overrides(values, overrides)
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


def _evaluate(trainer: Any, stage: str) -> dict[str, dict[str, float]]:
    """Held-out metrics of the greedy policy and of the policy sampled as in training (echoed to stderr)."""
    metrics = {
        "greedy": trainer.evaluate_env(label=f"held-out, {stage}, greedy"),
        "sampled": trainer.evaluate_env(greedy=False, label=f"held-out, {stage}, sampled"),
    }
    click.echo(
        f"held-out success, {stage}: {metrics['greedy']['success_rate']:.1%} greedy, {metrics['sampled']['success_rate']:.1%} sampled",
        err=True,
    )
    return metrics


def _references(trainer: Any) -> tuple[dict[str, float], Any]:
    """The reference policies on the same held-out seeds (the scale of the table, see
    :func:`envhub.baselines.reference_policies`), and the open-loop search behind one of them
    (None where the env has no finite action list). Random and expert play through
    ``evaluate_env``, under the training prompt settings."""
    from envhub.baselines import best_open_loop, reference_policies
    from envhub.error import PolicyError
    from envhub_trl.evaluation import held_out_seeds

    args = trainer.args
    seeds = held_out_seeds(args.eval_seed_offset, args.eval_episodes)
    searched = time.perf_counter()
    try:
        open_loop = best_open_loop(args.env_id, seeds, args.max_turns, args.env_kwargs)
    except PolicyError:
        open_loop = None
    else:
        how = "exhaustive" if open_loop.exhaustive else f"beam of {open_loop.beam_width}"
        click.echo(f"open-loop search: {open_loop.joint_states} joint states ({how}) in {time.perf_counter() - searched:.1f}s", err=True)
    references = reference_policies(
        args.env_id, seeds, max_turns=args.max_turns, env_kwargs=args.env_kwargs, seed=args.seed,
        tokenizer=trainer.processing_class, open_loop=open_loop,
        play=lambda generator: trainer.evaluate_env(seeds, generator=generator)["success_rate"],
    )
    return references, open_loop


def _periodic_evaluation(trainer: Any) -> Any:
    """With ``eval_steps`` set, a callback (added to ``trainer``) that measures held-out greedy
    success every ``eval_steps`` optimizer steps, as ROLL's validation runs do, so that a run that
    peaks and then collapses shows it; None without ``eval_steps``."""
    from transformers import TrainerCallback

    every = trainer.args.eval_steps
    if not every:
        return None
    every = max(1, int(every if every >= 1 else every * trainer.args.max_steps))

    class HeldOutEvaluation(TrainerCallback):
        def __init__(self) -> None:
            self.points: list[dict[str, float]] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step % every == 0 and state.global_step < state.max_steps:
                rate = trainer.evaluate_env(label=f"held-out at step {state.global_step}, greedy")["success_rate"]
                self.points.append({"step": state.global_step, "greedy": rate})
                click.echo(f"held-out success at step {state.global_step}: {rate:.1%} greedy", err=True)

    callback = HeldOutEvaluation()
    trainer.add_callback(callback)
    return callback


def _row(stage: str, metrics: dict[str, dict[str, float]]) -> list[str]:
    greedy, sampled = metrics["greedy"], metrics["sampled"]
    return [
        stage,
        f"{greedy['success_rate']:.1%}",
        f"{sampled['success_rate']:.1%}",
        f"{greedy['invalid_action_rate']:.1%}",
        f"{sampled['invalid_action_rate']:.1%}",
        f"{greedy['mean_turns']:.2f}",
    ]


def run_training(
    values: dict[str, Any],
    model_name: str = "tiny",
    *,
    warm_start: Any = None,
) -> dict[str, Any]:
    """Train as ``envhub train`` does and return its ``results.json`` (also written, with the model).

    ``values`` are :class:`EnvGRPOConfig` fields (``output_dir`` included); ``warm_start`` is a
    :class:`~envhub_trl.warm_start.WarmStart` (None: none). The run evaluates on
    the held-out seeds before training, after the warm start and after RL, then plays the
    reference policies on the same seeds; progress goes to stderr. The learning benchmark calls
    this once per run.

    Raises:
        click.ClickException: for a bad configuration or an environment error, with the reason.
    """
    from envhub_trl.config import EnvGRPOConfig
    from envhub_trl.models import load_model_and_tokenizer
    from envhub_trl.plots import plot_learning_curve
    from envhub_trl.trainer import EnvGRPOTrainer
    from envhub_trl.warm_start import WarmStart

    warm_start = warm_start if warm_start is not None else WarmStart()
    started = time.perf_counter()
    values = dict(values)
    values.setdefault("report_to", "none")
    try:
        args = EnvGRPOConfig(**values)
    except (TypeError, ValueError) as exc:
        raise click.ClickException(f"bad configuration: {exc}") from exc
    try:
        model, tokenizer = load_model_and_tokenizer(model_name, [args.env_id], args.seed, env_kwargs=args.env_kwargs)
        trainer = EnvGRPOTrainer(model, args, processing_class=tokenizer)
        evaluations = {STAGES[0]: _evaluate(trainer, STAGES[0])}
        if warm_start.steps:
            click.echo(f"warm start: {warm_start.describe()}", err=True)
            warm_start.run(model, tokenizer, args.env_id, args.seed, **args.manager_kwargs())
            trainer.weights_changed()  # a vLLM generator still holds the initial weights
            evaluations[STAGES[1]] = _evaluate(trainer, STAGES[1])
        before_rl = trainer.state.global_step
        periodic = _periodic_evaluation(trainer)
        trainer.train()
        evaluations[STAGES[2]] = _evaluate(trainer, STAGES[2])
        references, open_loop = _references(trainer)
    except EnvhubError as exc:
        raise click.ClickException(str(exc)) from exc
    out = Path(args.output_dir)
    trainer.save_model(str(out / "final"))
    start_key = STAGES[1] if warm_start.steps else STAGES[0]
    end = trainer.state.global_step
    gain = {mode: evaluations[STAGES[2]][mode]["success_rate"] - evaluations[start_key][mode]["success_rate"] for mode in ("greedy", "sampled")}
    over_open_loop = None if open_loop is None else {
        mode: evaluations[STAGES[2]][mode]["success_rate"] - open_loop.success_rate for mode in ("greedy", "sampled")
    }
    results = {
        "env_id": args.env_id,
        "model": model_name,
        "advantage_estimator": args.advantage_estimator,
        "held_out_episodes": args.eval_episodes,
        "held_out_seed_offset": args.eval_seed_offset,
        "sampling": _sampling_text(args),
        "evaluations": evaluations,
        "references": references,
        "open_loop_actions": None if open_loop is None else list(open_loop.actions),
        "open_loop_exhaustive": None if open_loop is None else open_loop.exhaustive,
        "open_loop_description": None if open_loop is None else open_loop.describe(),
        "rl_success_gain": gain,
        "gain_over_open_loop": over_open_loop,
        "rl_steps": end - before_rl,
        "warm_start_steps": warm_start.steps,
        "warm_start": dataclasses.asdict(warm_start),
        "held_out_curve": periodic.points if periodic is not None else [],
        "training_curve": [
            {"step": entry["step"], "success_rate": entry["env/success_rate"]}
            for entry in trainer.state.log_history
            if "env/success_rate" in entry
        ],
        "seconds": time.perf_counter() - started,
        "config": {k: v for k, v in values.items() if k != "output_dir"},
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    # Drawn last: the figures are in results.json whatever happens to plotting.
    how = results["sampling"]
    plot_learning_curve(
        trainer.state.log_history,
        out / "learning_curve.png",
        {
            "held-out, greedy": {before_rl: evaluations[start_key]["greedy"]["success_rate"], end: evaluations[STAGES[2]]["greedy"]["success_rate"]},
            f"held-out, sampled ({how})": {
                before_rl: evaluations[start_key]["sampled"]["success_rate"], end: evaluations[STAGES[2]]["sampled"]["success_rate"],
            },
            **({f"held-out, greedy, every {args.eval_steps:g} steps": {p["step"]: p["greedy"] for p in periodic.points}}
               if periodic is not None and periodic.points else {}),
            **{f"{name} (held-out)": {before_rl: rate, end: rate} for name, rate in references.items()},
        },
        title=f"{args.env_id}, {args.advantage_estimator}",
    )
    return results


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
@click.option("--warm-start-lr", default=None, type=click.FloatRange(min=0, min_open=True), help="Learning rate of the warm start (default 1e-3).")
@click.option("--warm-start-epsilon", default=None, type=click.FloatRange(0, 1),
              help="Probability that the demonstrator takes a random move instead of the expert's (default 0).")
@click.option("--eval-episodes", default=None, type=click.IntRange(min=1), help="Held-out episodes per evaluation (default: the config's eval_episodes, else 128).")
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
def train_command(
    env_id, model_name, algo, config_file, output_dir, warm_start_steps, warm_start_episodes, warm_start_lr, warm_start_epsilon,
    eval_episodes, overrides,
):
    """Train a model on an environment with GRPO or GiGPO; report held-out success before and after.

    KEY=VALUE arguments override the config file's fields, as Hydra's do (max_steps=200
    learning_rate=1e-5 warm_start.steps=100), with the same type checks."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from envhub.cli import table

    values = load_config_file(config_file, overrides)
    if env_id is not None:
        values["env_id"] = env_id
    if algo is not None:
        values["advantage_estimator"] = algo
    if eval_episodes is not None:
        values["eval_episodes"] = eval_episodes
    values["output_dir"] = output_dir
    flags = {"steps": warm_start_steps, "episodes": warm_start_episodes, "learning_rate": warm_start_lr, "epsilon": warm_start_epsilon}
    warm_start = split_warm_start(values, config_file, {k: v for k, v in flags.items() if v is not None})
    results = run_training(values, model_name, warm_start=warm_start)
    evaluations, references = results["evaluations"], results["references"]
    click.echo(f"\n{results['env_id']}: success on {results['held_out_episodes']} held-out seeds, greedy and sampled ({results['sampling']})\n")
    headers = ["stage", "success (greedy)", "success (sampled)", "invalid (greedy)", "invalid (sampled)", "turns (greedy)"]
    rows = [_row(stage, m) for stage, m in evaluations.items()]
    rows += [[name, f"{rate:.1%}", f"{rate:.1%}", "-", "-", "-"] for name, rate in references.items()]
    click.echo(table(rows, headers))
    if results["open_loop_description"] is not None:
        click.echo(f"\nopen-loop: {results['open_loop_description']}")
    gain, over = results["rl_success_gain"], results["gain_over_open_loop"]
    click.echo(
        f"\nRL phase ({results['rl_steps']} steps, {results['advantage_estimator']}): {gain['greedy'] * 100:+.1f} points of greedy success, "
        f"{gain['sampled'] * 100:+.1f} points of sampled success"
    )
    if over is not None:
        click.echo(
            f"learned policy over the best open-loop policy ({references['open-loop']:.1%}): "
            f"{over['greedy'] * 100:+.1f} points greedy, {over['sampled'] * 100:+.1f} points sampled"
        )
    out = Path(output_dir)
    click.echo(f"learning curve: {out / 'learning_curve.png'}\nmodel: {out / 'final'}\ntotal time: {results['seconds'] / 60:.1f} min")
