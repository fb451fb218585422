"""A training run's outcome, :class:`RunReport`: results.json, the tables ``envhub train`` prints and the learning curve."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from envhub.error import EnvhubError
from envhub_trl.run import STAGES, TrainingRun


def sampling_text(args: Any) -> str:
    """How training samples, in words (``T=1, top-k 4``)."""
    return f"T={args.temperature:g}" + (f", top-k {args.top_k}" if args.top_k else "") + (f", top-p {args.top_p:g}" if args.top_p < 1 else "")


def mean_over_envs(per_env: dict[str, Any]) -> Any:
    """The mean of numbers at the same place in each env's nested mapping (keys all envs share)."""
    values = list(per_env.values())
    if len(values) == 1:
        return values[0]
    if all(isinstance(v, dict) for v in values):
        shared = [k for k in values[0] if all(k in v for v in values[1:])]
        return {k: mean_over_envs({i: v[k] for i, v in zip(per_env, values)}) for k in shared}
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return float(sum(values) / len(values))
    return None


def env_figures(own: dict[str, Any], references: dict[str, float], open_loop: Any, start_key: str) -> dict[str, Any]:
    """One env's figures in results.json: its evaluations per stage (``own``), the reference
    policies, the open-loop search, and what RL gained from ``start_key``'s stage."""
    after = own[STAGES[2]]
    return {
        "evaluations": own,
        "references": references,
        "open_loop_actions": None if open_loop is None else list(open_loop.actions),
        "open_loop_exhaustive": None if open_loop is None else open_loop.exhaustive,
        "open_loop_description": None if open_loop is None else open_loop.describe(),
        "rl_success_gain": {m: after[m]["success_rate"] - own[start_key][m]["success_rate"] for m in after},
        "gain_over_open_loop": None if open_loop is None else {m: after[m]["success_rate"] - open_loop.success_rate for m in after},
    }


def training_curve(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Training success per logged step (and per env of a mix), from the trainer's log."""
    return [
        {"step": entry["step"], "success_rate": entry["env/success_rate"],
         **{k.removeprefix("env/").removesuffix("/success_rate"): entry[k] for k in entry if k.endswith("/success_rate") and k.count("/") > 1}}
        for entry in log_history
        if "env/success_rate" in entry
    ]


@dataclass
class RunReport:
    """What a run leaves: ``results`` (results.json) and what the learning curve is drawn from.

    Attributes:
        results: results.json's body.
        log_history: the trainer's log (the curve's training lines).
        marks: per panel (env id, or "" for one env), the held-out points drawn over the curve.
        title: the curve's title.
    """

    results: dict[str, Any]
    log_history: list[dict[str, Any]]
    marks: dict[str, dict[str, dict[int, float]]]
    title: str

    @classmethod
    def of(cls, run: TrainingRun, seconds: float) -> RunReport:
        """The report of a finished :class:`~envhub_trl.run.TrainingRun` that took ``seconds``."""
        args, warm_start, trainer = run.spec.args, run.spec.warm_start, run.trainer
        entries = args.env_entries()
        start_key = STAGES[1] if warm_start.active else STAGES[0]
        per_env = {}
        for entry in entries:
            own = {stage: by_env[entry.env_id] for stage, by_env in run.evaluations.items()}
            per_env[entry.env_id] = env_figures(own, *run.searched[entry.env_id], start_key)
        # One env: its figures; a mix: the mean over its envs (each env's are under per_env).
        summary = per_env[entries[0].env_id] if len(entries) == 1 else {
            key: mean_over_envs({i: figures[key] for i, figures in per_env.items()})
            for key in ("evaluations", "references", "rl_success_gain", "gain_over_open_loop")
        }
        if len(entries) > 1:
            summary = {**summary, "open_loop_actions": None, "open_loop_exhaustive": None, "open_loop_description": None}
        end = trainer.state.global_step
        results = {
            "env_id": args.env_id,
            "env_ids": [e.env_id for e in entries],
            "model": run.spec.model,
            "advantage_estimator": args.advantage_estimator,
            "held_out_env_id": args.held_out_settings().env_id if len(entries) == 1 else None,
            "held_out_episodes": args.eval_episodes,
            "held_out_seed_offset": args.eval_seed_offset,
            "sampling": sampling_text(args),
            "evaluations": summary["evaluations"],
            "references": summary["references"] or {},
            "open_loop_actions": summary["open_loop_actions"],
            "open_loop_exhaustive": summary["open_loop_exhaustive"],
            "open_loop_description": summary["open_loop_description"],
            "rl_success_gain": summary["rl_success_gain"],
            "gain_over_open_loop": summary["gain_over_open_loop"],
            "per_env": per_env,
            "rl_steps": end - run.before_rl,
            "warm_start_steps": warm_start.steps,
            "warm_start": dataclasses.asdict(warm_start),
            "held_out_curve": run.periodic.points if run.periodic is not None else [],
            "validation": run.kept,
            "training_curve": training_curve(trainer.state.log_history),
            "seconds": seconds,
            "phase_seconds": run.phase_seconds,
            "config": dict(run.spec.config),
        }
        panels = per_env.items() if len(entries) > 1 else [("", summary)]
        marks = {env_id: _marks(figures, run, start_key, env_id, results["sampling"]) for env_id, figures in panels}
        return cls(results, trainer.state.log_history, marks, f"{' + '.join(results['env_ids'])}, {args.advantage_estimator}")

    def write(self, out: Path, then: str) -> None:
        """results.json (whole or not at all), then the learning curve: drawn last, as the figures
        are in results.json whatever happens to plotting.

        Raises:
            click.ClickException: a write that found no room, saying what to do (``then``).
        """
        from envhub_trl import run_files, run_state
        from envhub_trl.plots import plot_learning_curve

        try:
            text = json.dumps(self.results, indent=2)
            with run_files.room_errors(out / run_state.RESULTS_FILE, len(text), then):
                run_files.write_text(out / run_state.RESULTS_FILE, text)
            with run_files.room_errors(out / "learning_curve.png", 1 << 20, "free some space; the figures are in results.json"):
                plot_learning_curve(self.log_history, out / "learning_curve.png", self.marks, title=self.title)
        except EnvhubError as exc:
            raise click.ClickException(str(exc)) from None


def _marks(figures: dict[str, Any], run: TrainingRun, start_key: str, env_id: str, how: str) -> dict[str, dict[int, float]]:
    """One panel's held-out points: greedy (and sampled) before and after RL, the periodic
    evaluation, and the reference policies as flat lines."""
    own, start = figures["evaluations"], figures["evaluations"][start_key]
    before, end = run.before_rl, run.trainer.state.global_step
    panel = {"held-out, greedy": {before: start["greedy"]["success_rate"], end: own[STAGES[2]]["greedy"]["success_rate"]}}
    if "sampled" in start:
        panel[f"held-out, sampled ({how})"] = {before: start["sampled"]["success_rate"], end: own[STAGES[2]]["sampled"]["success_rate"]}
    periodic = run.periodic
    if periodic is not None and periodic.points:
        panel[f"held-out, greedy, every {run.spec.args.eval_steps:g} steps"] = {
            p["step"]: p["per_env"][env_id] if env_id else p["greedy"] for p in periodic.points
        }
    panel.update({f"{name} (held-out)": {before: rate, end: rate} for name, rate in figures["references"].items()})
    return panel


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


def print_env(name: str, figures: dict[str, Any], results: dict[str, Any]) -> None:
    """One env's table (held-out stages, then the reference policies) and its RL gains."""
    from envhub.cli import table

    evaluations, references = figures["evaluations"], figures["references"] or {}
    modes = "greedy and sampled" if "sampled" in figures["rl_success_gain"] else "greedy (sampled with eval_sampled: true)"
    played = results.get("held_out_env_id")
    of = f" of {played}" if played and played != results["env_id"] else ""
    click.echo(f"\n{name}: success on {results['held_out_episodes']} held-out seeds{of}, {modes} ({results['sampling']})\n")
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


def print_results(results: dict[str, Any], output_dir: str) -> None:
    """What ``envhub train`` prints at the end: each env's table, the mean over a mix's envs, and
    where the curve and the model are."""
    per_env = results["per_env"]
    for env_id, figures in per_env.items():
        print_env(env_id, figures, results)
    if len(per_env) > 1:
        print_env(f"mean over {len(per_env)} envs", results, results)
    out = Path(output_dir)
    click.echo(
        f"results: {out / 'results.json'}\nlearning curve: {out / 'learning_curve.png'}\nmodel: {out / 'final'}\n"
        f"total time: {results['seconds'] / 60:.1f} min"
    )
