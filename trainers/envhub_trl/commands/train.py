"""``envhub train``: GRPO/GiGPO on an environment, with held-out success before and after.

The run leaves in ``--output-dir``: the trained model and tokenizer (``final/``), the learning
curve (``learning_curve.png``), and ``results.json`` with every evaluation and the config. With
checkpoints (``save_strategy: steps``), ``--resume`` continues a run from its last
``checkpoint-N`` (or a named one) to the figures the uninterrupted run would have given
(:mod:`envhub_trl.run_state`); a new run into a folder that holds an earlier run's checkpoints is
refused unless ``--resume`` or ``--overwrite`` says what to do with them. One run at a time may
use an output folder, and what it writes there is whole or absent, never half-written.

The run itself is :mod:`envhub_trl.run` (a :class:`~envhub_trl.run.RunSpec` and its stages) and
its outcome :mod:`envhub_trl.report`; this module is the command line only.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from envhub_trl.estimators import ESTIMATORS


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
    from envhub_trl.report import print_results
    from envhub_trl.run import RunSpec, train

    if resume not in (None, "last") and "=" in resume and not Path(resume).exists():
        # `--resume max_steps=9`: a bare --resume followed by an override, not a checkpoint path.
        overrides, resume = (resume, *overrides), "last"
    given = {"env_id": env_id, "advantage_estimator": algo, "eval_episodes": eval_episodes, "lora": None if lora_r is None else {"r": lora_r}}
    flags = {
        "steps": warm_start_steps, "episodes": warm_start_episodes, "learning_rate": warm_start_lr, "epsilon": warm_start_epsilon,
        "dagger_rounds": warm_start_dagger_rounds, "lr_schedule": warm_start_schedule,
    }
    spec = RunSpec.read(
        config_file, overrides, model=model_name, fields={**{k: v for k, v in given.items() if v is not None}, "output_dir": output_dir},
        warm_start={k: v for k, v in flags.items() if v is not None},
    )
    print_results(train(spec, resume=resume, overwrite=overwrite), output_dir)
