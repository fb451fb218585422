"""The model card of a trained model (``final/README.md``), written from the run's results.json.

TRL's own card (``Trainer.create_model_card``) knows the base model only by a hub id, so a model
built here (``--model tiny``) or loaded from a folder gets "None", and it knows nothing of the
env. ``envhub train`` writes this one instead: the env ids, the algorithm, the warm start, held-out
success at each stage beside the reference policies on the same seeds (random, open-loop, expert,
optimal, those the env has), and the command that made the model.
"""

from __future__ import annotations

from typing import Any

#: The card's file, in the model folder (where the Hub reads it).
CARD_FILE = "README.md"


def _percent(value: Any) -> str:
    return "-" if value is None else f"{value:.1%}"


def _warm_start_text(warm_start: dict[str, Any]) -> str:
    from envhub_trl.warm_start import WarmStart

    try:
        described = WarmStart.from_mapping(warm_start)
    except (TypeError, ValueError):
        return "as recorded in results.json"
    return described.describe() if described.active else "none (RL from the model as loaded)"


def model_card(results: dict[str, Any], command: str | None = None) -> str:
    """The card's Markdown (with the Hub's YAML header) for the run whose results.json is
    ``results``, made by the shell line ``command`` (None: from Python). The command stays out of
    results.json, which a resumed run writes equal to the uninterrupted run's."""
    envs = results["env_ids"]
    algorithm = results["advantage_estimator"]
    tags = ["envhub", "reinforcement-learning", algorithm, *(env.split("/")[0] for env in envs)]
    header = ["---", "library_name: transformers", "tags:", *(f"- {tag}" for tag in dict.fromkeys(tags)), "---", ""]
    lines = [
        f"# {' + '.join(envs)}: {results['model']} trained with {algorithm}",
        "",
        f"Trained by `envhub train` (envhub-trl) from `{results['model']}`.",
        "",
        f"- Environments: {', '.join(f'`{env}`' for env in envs)}",
        f"- Algorithm: {algorithm}, {results['rl_steps']} RL steps",
        f"- Warm start: {_warm_start_text(results.get('warm_start') or {})}",
    ]
    if results.get("validation"):
        kept = results["validation"]
        lines.append(f"- Kept the policy of step {kept['step']} of {kept['last_step']}, the best on the validation seeds")
    lines += ["", "## Held-out success", ""]
    for env_id, figures in results["per_env"].items():
        if len(envs) > 1:
            lines += [f"### {env_id}", ""]
        lines += _table(figures) + [""]
    lines += [
        f"Success on {results['held_out_episodes']} held-out seeds (from seed {results['held_out_seed_offset']}, none of them "
        f"trained on), greedy and, where evaluated, sampled ({results['sampling']}). The reference policies play the same seeds.",
        "",
        "## How it was made",
        "",
        "```bash",
        command or "envhub train  # from Python: the run's config is in results.json",
        "```",
        "",
        "The whole configuration and every figure are in the run's `results.json`.",
        "",
    ]
    return "\n".join(header + lines)


def _table(figures: dict[str, Any]) -> list[str]:
    """One env's stages and reference policies as a Markdown table."""
    rows = ["| policy | success (greedy) | success (sampled) |", "| --- | --- | --- |"]
    for stage, modes in figures["evaluations"].items():
        rows.append(f"| {stage} | {_percent(modes['greedy']['success_rate'])} | {_percent(modes.get('sampled', {}).get('success_rate'))} |")
    for name, rate in (figures.get("references") or {}).items():
        rows.append(f"| {name} (reference) | {_percent(rate)} | {_percent(rate)} |")
    return rows
