"""``envhub export-sft``: an env's expert episodes as chat messages, a dataset for TRL's SFTTrainer,
as a ``datasets`` folder (``--format arrow``, the default), a JSON Lines file or a Parquet file.

Nothing is written half: a folder is written by ``save_to_disk`` into a folder made for it, a file
under a staging name beside it, renamed once whole (:func:`envhub_trl.run_files.write_file`). The
output path is checked before any episode is played.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from envhub.error import EnvhubError
from envhub.generation import ExpertGenerator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.rollout import rollout
from envhub.settings import EnvSettings
from envhub_trl.evaluation import finished_counter, progress_bar


#: ``--format``: how each is read back with ``datasets``.
FORMATS = {
    "arrow": "a folder, datasets.load_from_disk(OUT)",
    "jsonl": "one JSON Lines file, datasets.load_dataset('json', data_files=OUT)",
    "parquet": "one Parquet file, datasets.load_dataset('parquet', data_files=OUT)",
}


def _check_out(out: str, fmt: str) -> None:
    """Refuse an output path that cannot take the dataset, before any episode is played (a folder
    is made now; a file's folder must be one that can be written).

    Raises:
        click.ClickException: one line naming the path and what to do.
    """
    path = Path(out)
    if fmt == "arrow":
        if path.exists() and not path.is_dir():
            raise click.ClickException(f"--out {out} is a file; --format arrow writes a folder: choose a new folder (or --format jsonl or parquet)")
        if path.exists() and any(path.iterdir()):
            raise click.ClickException(f"{out} exists and is not empty; choose a new folder")
        try:  # made now, so that a folder that cannot be created fails before any episode is played
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise click.ClickException(f"--out {out}: cannot create the folder ({exc.strerror or exc}); pick a folder you can write") from None
        return
    if path.is_dir():
        raise click.ClickException(f"--out {out} is a folder; --format {fmt} writes one file: give a file path such as {path / f'episodes.{fmt}'}")
    if path.exists():
        raise click.ClickException(f"{out} exists; choose a new file")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(f"--out {out}: cannot create its folder {parent} ({exc.strerror or exc}); pick a folder you can write") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise click.ClickException(f"--out {out}: {parent} cannot be written; pick a folder you can write")


def _write(dataset: object, out: str, fmt: str) -> None:
    """``dataset`` to ``out`` in ``fmt``; a file whole or not at all.

    Raises:
        click.ClickException: for a write that failed, naming the path and the reason.
    """
    from envhub_trl import run_files

    try:
        if fmt == "arrow":
            dataset.save_to_disk(out)
        elif fmt == "jsonl":
            run_files.write_file(out, lambda staging: dataset.to_json(str(staging), lines=True))
        else:
            run_files.write_file(out, lambda staging: dataset.to_parquet(str(staging)))
    except OSError as exc:
        raise click.ClickException(f"--out {out}: cannot write the dataset ({exc.strerror or exc})") from None


@click.command("export-sft")
@click.argument("env_id")
@click.option("--episodes", default=256, show_default=True, type=click.IntRange(min=1), help="Expert episodes to play.")
@click.option("--out", "out", required=True, type=click.Path(), help="Where the dataset goes: a new folder for arrow, a new file for jsonl and parquet.")
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="arrow", show_default=True,
              help="arrow: a datasets folder (load_from_disk); jsonl: a JSON Lines file; parquet: a Parquet file (load_dataset('json' or 'parquet', data_files=OUT)).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Base seed of the episodes' seeds.")
@click.option("--max-turns", type=click.IntRange(min=1), default=None, help="Turn limit (default: the env's).")
@click.option("--successful-only", is_flag=True, help="Keep only the episodes the expert won.")
def export_sft_command(env_id: str, episodes: int, out: str, fmt: str, seed: int, max_turns: int | None, successful_only: bool) -> None:
    """Write ENV_ID's expert episodes as chat messages, a dataset for TRL's SFTTrainer."""
    from datasets import Dataset

    _check_out(out, fmt)
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
    _write(Dataset.from_list(rows), out, fmt)
    wins = sum(row["success"] for row in rows)
    click.echo(f"wrote {len(rows)} episodes ({wins} successful) to {out} ({FORMATS[fmt]})")
