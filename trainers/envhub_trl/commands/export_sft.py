"""``envhub export-sft``: an env's expert episodes as chat messages, a dataset for TRL's SFTTrainer."""

from __future__ import annotations

from pathlib import Path

import click

from envhub.error import EnvhubError
from envhub.generation import ExpertGenerator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.rollout import rollout
from envhub.settings import EnvSettings
from envhub_trl.evaluation import finished_counter, progress_bar


@click.command("export-sft")
@click.argument("env_id")
@click.option("--episodes", default=256, show_default=True, type=click.IntRange(min=1), help="Expert episodes to play.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for the dataset (datasets.save_to_disk).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Base seed of the episodes' seeds.")
@click.option("--max-turns", type=click.IntRange(min=1), default=None, help="Turn limit (default: the env's).")
@click.option("--successful-only", is_flag=True, help="Keep only the episodes the expert won.")
def export_sft_command(env_id: str, episodes: int, out_dir: str, seed: int, max_turns: int | None, successful_only: bool) -> None:
    """Write ENV_ID's expert episodes as chat messages, a dataset for TRL's SFTTrainer."""
    from datasets import Dataset

    if Path(out_dir).exists() and any(Path(out_dir).iterdir()):
        raise click.ClickException(f"{out_dir} exists and is not empty; choose a new folder")
    try:  # made now, so that a folder that cannot be created fails before any episode is played
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(f"--out {out_dir}: cannot create the folder ({exc.strerror or exc}); pick a folder you can write") from None
    try:
        manager = EnvGroupManager.from_settings(EnvSettings(env_id, max_turns=max_turns), episodes, 1, seed=seed)
        with progress_bar("episodes", episodes) as bar:
            trajectories = rollout(manager, ExpertGenerator(), SamplingParams(), on_turn=finished_counter(bar))
    except EnvhubError as exc:
        raise click.ClickException(str(exc)) from exc
    failed = [t for t in trajectories if t.error is not None]
    if failed:
        raise click.ClickException(f"{len(failed)} episodes raised, e.g. seed {failed[0].seed}: {failed[0].error}")
    rows = [
        # A tool env's rows carry its schemas: TRL's SFTTrainer passes a dataset's "tools" column to the chat template.
        {"messages": t.messages, "env_id": t.env_id, "seed": t.seed, "success": t.success, "return": t.episode_return,
         **({"tools": t.tools} if t.tools else {})}
        for t in trajectories
        if t.success or not successful_only
    ]
    if not rows:
        raise click.ClickException("the expert won no episode; drop --successful-only or play more episodes")
    try:
        Dataset.from_list(rows).save_to_disk(out_dir)
    except OSError as exc:
        raise click.ClickException(f"--out {out_dir}: cannot write the dataset ({exc.strerror or exc})") from None
    wins = sum(row["success"] for row in rows)
    click.echo(f"wrote {len(rows)} episodes ({wins} successful) to {out_dir}")
