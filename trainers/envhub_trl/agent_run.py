"""``envhub train --agent MODULE:FUNCTION --tasks FILE``: GRPO/GiGPO on a user's agent, held-out reward before and after.

The run reads its config as ``envhub train`` does (a :class:`~envhub_trl.run_spec.RunSpec`), builds
``EnvGRPOTrainer(..., agent=..., tasks=...)`` (:mod:`envhub_trl.agent_rollouts`), plays the agent
greedily once on each held-out task before and after training, and every ``eval_steps`` steps
between (with ``eval_sampled``, once more at the run's temperature), and writes ``final/`` (the model
and tokenizer) and ``results.json`` (the figures, the agent, the config and the log history) into
the output folder.

An agent has no env expert to imitate, so its warm start is format-only
(``warm_start.demonstrator: random``): the agent plays ``warm_start.episodes`` training tasks with
a random tool caller answering its calls (:func:`envhub_trl.proxy.agents.format_samples`), and
the model learns those replies in the agent's own prompts for ``warm_start.steps`` steps. A model
that cannot yet call tools (a freshly built tiny model) then starts RL from valid, random calls,
where groups differ, instead of from replies that all fail alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from transformers import TrainerCallback

from envhub_trl.run_spec import RunSpec
from envhub_trl.selection import eval_every


def read_tasks(path: str) -> list[Any]:
    """The tasks of ``path``: a JSON list, or JSON Lines (one task per line, blank lines skipped).

    Raises:
        click.ClickException: for a file that is neither, or holds no task.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        tasks = json.loads(text) if text.lstrip().startswith("[") else [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"--tasks {path}: not JSON Lines nor a JSON list ({exc})") from None
    if not tasks:
        raise click.ClickException(f"--tasks {path} holds no task")
    return tasks


def train_agent(spec: RunSpec, agent_ref: str, tasks_path: str, eval_tasks_path: str | None = None, *, resume: str | None = None) -> dict[str, Any]:
    """Train ``spec``'s model on the agent ``agent_ref`` over the tasks of ``tasks_path``; evaluate it
    before and after on the tasks of ``eval_tasks_path`` (default: the first ``eval_episodes``
    training tasks, named as such in the results). Returns and writes ``results.json``.

    Raises:
        click.ClickException: for a bad agent reference, tasks file or warm start.
    """
    from envhub_trl.models import load_model_and_tokenizer
    from envhub_trl.proxy.agents import load_agent
    from envhub_trl.trainer import EnvGRPOTrainer

    warm_start = spec.warm_start
    if warm_start.active and (warm_start.demonstrator != "random" or warm_start.dagger_rounds or warm_start.world_model):
        raise click.ClickException(
            "an --agent run's warm start is format-only: warm_start.demonstrator: random (a random tool caller answers the "
            "agent's calls), without dagger_rounds or world_model; an agent has no env expert to imitate"
        )
    try:
        agent = load_agent(agent_ref)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    tasks = read_tasks(tasks_path)
    held_out = read_tasks(eval_tasks_path) if eval_tasks_path else tasks[: spec.args.eval_episodes]
    args, entries = spec.args, spec.args.env_entries()
    model, tokenizer = load_model_and_tokenizer(spec.model, [e.env_id for e in entries], args.seed, tiny=spec.tiny if spec.model == "tiny" else None)
    trainer = EnvGRPOTrainer(model, args, processing_class=tokenizer, agent=agent, tasks=tasks)
    click.echo(f"agent {agent_ref}: {len(tasks)} training tasks, {len(held_out)} held-out; evaluating the initial model", err=True)
    evaluations: dict[str, dict[str, float]] = {}

    def evaluate(stage: str) -> dict[str, float]:
        """Greedy on the held-out tasks, and with ``eval_sampled`` at the run's temperature too."""
        evaluations[stage] = trainer.agents.evaluate(trainer, held_out)
        if args.eval_sampled:
            evaluations[f"{stage}, sampled"] = trainer.agents.evaluate(trainer, held_out, greedy=False)
        return evaluations[stage]

    evaluate("initial model")
    every = eval_every(args)
    if every is not None:  # held-out success through RL, as envhub's own runs measure it
        trainer.add_callback(_EveryEvalSteps(every, evaluate))
    warm_seconds = 0.0
    if warm_start.active and not resume:  # a resumed run's checkpoint already holds it
        warm_seconds = _format_warm_start(trainer, agent, tasks, warm_start)
        evaluate("after the warm start")
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=True if resume == "last" else resume)
    seconds = time.perf_counter() - started
    evaluate("after RL")
    trainer.agents.close()
    out = Path(args.output_dir)
    trainer.save_model(str(out / "final"))
    tokenizer.save_pretrained(out / "final")
    results = {
        "agent": agent_ref,
        "model": spec.model,
        "tasks": tasks_path,
        "held_out": eval_tasks_path or f"the first {len(held_out)} training tasks",
        "evaluations": evaluations,
        "warm_start": warm_start.describe() if warm_start.active else None,
        "steps": trainer.state.global_step,
        "warm_start_seconds": warm_seconds,
        "rl_seconds": seconds,
        "estimator": args.advantage_estimator,
        "log_history": trainer.state.log_history,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    return results


class _EveryEvalSteps(TrainerCallback):
    """Evaluates on the held-out tasks every ``every`` optimizer steps before the last (``eval_steps``),
    as the stage ``at RL step N``."""

    def __init__(self, every: int, evaluate: Callable[[str], dict[str, float]]):
        self.every, self.evaluate = every, evaluate

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.every == 0 and state.global_step < state.max_steps:
            figures = self.evaluate(f"at RL step {state.global_step}")
            click.echo(f"held-out success at RL step {state.global_step}: {figures['success_rate']:.1%} greedy", err=True)


def _format_warm_start(trainer: Any, agent: Any, tasks: list[Any], warm_start: Any) -> float:
    """The format-only warm start on ``trainer``'s model (module docstring); returns its seconds."""
    from envhub_trl.proxy.agents import format_samples

    begun = time.perf_counter()
    args, tokenizer = trainer.args, trainer.processing_class
    played = [tasks[k % len(tasks)] for k in range(warm_start.episodes)]
    click.echo(f"warm start: the agent on {len(played)} training tasks with a random tool caller answering its calls", err=True)
    try:
        samples, _ = format_samples(agent, played, tokenizer, seed=args.seed)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"warm start: {warm_start.steps} supervised steps on {len(samples)} samples", err=True)
    warm_start.train_on(trainer.model, tokenizer, samples, seed=args.seed, bf16=bool(args.bf16))
    trainer.warm_started()
    return time.perf_counter() - begun


def print_agent_results(results: dict[str, Any], output_dir: str) -> None:
    """The before/after table ``envhub train --agent`` prints."""
    click.echo(f"{'':22}{'success':>10}{'mean reward':>14}{'failed':>8}")
    for stage, figures in results["evaluations"].items():
        click.echo(f"{stage:22}{figures['success_rate']:>10.1%}{figures['mean_reward']:>14.3f}{figures['failed']:>8.0f}")
    click.echo(f"held out: {results['held_out']}; {results['steps']} steps of {results['estimator']}\nresults: {Path(output_dir) / 'results.json'}")
