"""``envhub eval`` (a model's success rate on an env) and ``envhub export-sft`` (expert episodes as a dataset)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from envhub.error import EnvhubError
from envhub.generation import ExpertGenerator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.rollout import batch_metrics, rollout


def _progress(label: str, total: int, to_stderr: bool) -> Any:
    """A progress bar over ``total`` episodes; on stderr when stdout carries JSON."""
    return click.progressbar(length=total, label=label, file=sys.stderr if to_stderr else None)


def _finished_counter(bar: Any, manager: EnvGroupManager) -> Callable[[EnvGroupManager], None]:
    """An ``on_turn`` callback that advances ``bar`` by the episodes finished since the last turn."""
    done = [0]

    def update(m: EnvGroupManager) -> None:
        finished = m.num_envs - m.num_active
        bar.update(finished - done[0])
        done[0] = finished

    return update


@click.command("eval")
@click.argument("env_id")
@click.option("--model", "model_path", required=True, help="tiny, smollm2-135m, a Hugging Face model folder or a hub id.")
@click.option("--episodes", default=32, show_default=True, type=click.IntRange(min=1), help="Episodes to play, one seed each.")
@click.option("--generator", "kind", type=click.Choice(["hf", "vllm"]), default="hf", show_default=True, help="Sample with transformers or vLLM.")
@click.option("--seed", default=0, show_default=True, help="Base seed of the episodes' seeds.")
@click.option("--max-turns", type=click.IntRange(min=1), default=None, help="Turn limit (default: the env's).")
@click.option("--temperature", default=0.0, show_default=True, help="Sampling temperature; 0 is greedy.")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(min=1), help="Longest reply.")
@click.option("--max-prompt-tokens", default=3072, show_default=True, type=click.IntRange(min=1), help="Context budget; longer episodes end truncated.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--no-references", is_flag=True, help="Skip the reference policies (random, open-loop, expert, optimal).")
def eval_command(
    env_id: str,
    model_path: str,
    episodes: int,
    kind: str,
    seed: int,
    max_turns: int | None,
    temperature: float,
    max_new_tokens: int,
    max_prompt_tokens: int,
    as_json: bool,
    no_references: bool,
) -> None:
    """Play EPISODES episodes of ENV_ID with a model and report its success rate, with the
    reference policies' on the same seeds (see envhub.baselines)."""
    from envhub_trl.generators import make_generator

    try:
        generator = make_generator(kind, model_path, env_ids=[env_id], seed=seed)
        manager = EnvGroupManager(
            env_id, episodes, 1, seed=seed, max_turns=max_turns,
            tokenizer=generator.tokenizer, max_prompt_tokens=max_prompt_tokens,
        )
        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        with _progress("episodes", episodes, as_json) as bar:
            trajectories = rollout(manager, generator, sampling, on_turn=_finished_counter(bar, manager))
    except EnvhubError as exc:
        raise click.ClickException(str(exc)) from exc
    metrics = batch_metrics(trajectories)
    report = {
        "env_id": env_id,
        "episodes": episodes,
        "success_rate": metrics["success_rate"],
        "mean_return": metrics["mean_return"],
        "invalid_action_rate": metrics["invalid_action_rate"],
        "mean_turns": metrics["mean_turns"],
    }
    extra = {} if no_references else _references(env_id, episodes, seed, max_turns)
    if as_json:
        click.echo(json.dumps({**report, **extra}))
        return
    for key, value in report.items():
        click.echo(f"{key:<20} {value:.3f}" if isinstance(value, float) else f"{key:<20} {value}")
    if extra.get("references"):
        click.echo("\nreference policies on the same seeds (success rate):")
        for name, rate in extra["references"].items():
            click.echo(f"{name:<20} {rate:.3f}")
    if extra.get("open_loop_actions") is not None:
        search = "exhaustive search" if extra["open_loop_exhaustive"] else "beam search, a lower estimate"
        click.echo(f"open-loop sequence   {', '.join(extra['open_loop_actions'])} ({search})")


def _references(env_id: str, episodes: int, seed: int, max_turns: int | None) -> dict[str, Any]:
    """The reference policies on the seeds ``eval`` played (``group_seeds(seed, 0, episodes)``)."""
    from envhub.baselines import best_open_loop, reference_policies
    from envhub.error import PolicyError
    from envhub.manager import group_seeds

    seeds = group_seeds(seed, 0, episodes)
    click.echo("reference policies on the same seeds...", err=True)
    try:
        open_loop = best_open_loop(env_id, seeds, max_turns)
    except PolicyError:
        open_loop = None
    try:
        references = reference_policies(env_id, seeds, max_turns=max_turns, seed=seed, open_loop=open_loop)
    except EnvhubError as exc:
        raise click.ClickException(str(exc)) from exc
    return {
        "references": references,
        "open_loop_actions": None if open_loop is None else list(open_loop.actions),
        "open_loop_exhaustive": None if open_loop is None else open_loop.exhaustive,
    }


@click.command("export-sft")
@click.argument("env_id")
@click.option("--episodes", default=256, show_default=True, type=click.IntRange(min=1), help="Expert episodes to play.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for the dataset (datasets.save_to_disk).")
@click.option("--seed", default=0, show_default=True, help="Base seed of the episodes' seeds.")
@click.option("--max-turns", type=click.IntRange(min=1), default=None, help="Turn limit (default: the env's).")
@click.option("--successful-only", is_flag=True, help="Keep only the episodes the expert won.")
def export_sft_command(env_id: str, episodes: int, out_dir: str, seed: int, max_turns: int | None, successful_only: bool) -> None:
    """Write ENV_ID's expert episodes as chat messages, a dataset for TRL's SFTTrainer."""
    from datasets import Dataset

    if Path(out_dir).exists() and any(Path(out_dir).iterdir()):
        raise click.ClickException(f"{out_dir} exists and is not empty; choose a new folder")
    try:
        manager = EnvGroupManager(env_id, episodes, 1, seed=seed, max_turns=max_turns)
        with _progress("episodes", episodes, False) as bar:
            trajectories = rollout(manager, ExpertGenerator(), SamplingParams(), on_turn=_finished_counter(bar, manager))
    except EnvhubError as exc:
        raise click.ClickException(str(exc)) from exc
    failed = [t for t in trajectories if t.error is not None]
    if failed:
        raise click.ClickException(f"{len(failed)} episodes raised, e.g. seed {failed[0].seed}: {failed[0].error}")
    rows = [
        {"messages": t.messages, "env_id": t.env_id, "seed": t.seed, "success": t.success, "return": t.episode_return}
        for t in trajectories
        if t.success or not successful_only
    ]
    if not rows:
        raise click.ClickException("the expert won no episode; drop --successful-only or play more episodes")
    Dataset.from_list(rows).save_to_disk(out_dir)
    wins = sum(row["success"] for row in rows)
    click.echo(f"wrote {len(rows)} episodes ({wins} successful) to {out_dir}")
