"""``share_prompt_forward``: the RL-alone recipe's trainer step with one forward pass per distinct prompt,
against TRL's one forward pass per row, on the same batches.

The recipe is ``examples/frozenlake_rl_alone.yaml`` (16 maps of 8 episodes a step, the step layout
without history: a row is one turn, and the same local view comes back in many rows), on a freshly
built tiny model with the recipe's ``tiny`` options. The episodes are played by a seeded noisy expert
(``--epsilon`` of its moves random) rather than the model, so both settings train on the same
episodes step by step and what differs is the loss's forward and backward passes alone. A step is
TRL's ``step_time`` (generation, scoring and the optimizer step); the settings run in alternating
rounds (fresh trainers each round, the order swapped every round), so a busy machine slows both
alike; the ratio is of the medians over every timed step. Also printed: how many rows each prompt
pass served, and the largest difference between the two settings' log-probs on one batch.

    python bench/shared_prompts.py [--steps 4] [--rounds 3] [--groups 16] [--epsilon 0.3]

Prints the figures and writes bench/results/shared_prompts.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch

from envhub.generation import ExpertGenerator
from envhub_trl.config import EnvGRPOConfig
from envhub_trl.run_spec import load_config_file
from envhub_trl.tiny import TinySpec
from envhub_trl.trainer import EnvGRPOTrainer

RECIPE = Path(__file__).resolve().parent.parent / "examples" / "frozenlake_rl_alone.yaml"
#: The recipe's keys that are not trainer fields: the warm start is not timed, the model is built here.
NOT_TRAINER = ("warm_start", "tiny", "model")


def recipe_config(recipe: dict, out: str, steps: int, groups: int, shared: bool) -> EnvGRPOConfig:
    """The ``recipe``'s trainer fields, ``steps`` timed steps after a warm-up one, ``groups`` maps a step."""
    values = {k: v for k, v in recipe.items() if k not in NOT_TRAINER}
    values |= {
        "output_dir": out, "max_steps": steps + 1, "groups_per_step": groups,
        "per_device_train_batch_size": groups * values["group_size"], "share_prompt_forward": shared,
        "generator": "hf", "eval_steps": None, "eval_pass_k": None, "eval_sampled": False,
        "eval_strategy": "no",
    }
    return EnvGRPOConfig(**values)


class KeepsLastBatch(EnvGRPOTrainer):
    """The trainer, keeping the last generation batch as the loss reads it."""

    last_batch: dict | None = None

    def generation_batch(self, inputs):
        self.last_batch = super().generation_batch(inputs)
        return self.last_batch


def timed_run(model_and_tokenizer, config: EnvGRPOConfig, epsilon: float, keep: list | None = None) -> list[float]:
    """Step times (the warm-up step left out) of a trainer on a copy of the model; ``keep`` gets the trainer."""
    model, tokenizer = model_and_tokenizer
    generator = ExpertGenerator(tokenizer, epsilon=epsilon, seed=0)
    trainer = KeepsLastBatch(copy.deepcopy(model), config, processing_class=tokenizer, generator=generator)
    trainer.train()
    if keep is not None:
        keep.append(trainer)
    return [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry][1:]


def logp_difference(trainer: EnvGRPOTrainer, batch: dict) -> float:
    """The largest |log-prob difference| between the two settings on one batch's model tokens."""
    results = []
    with torch.no_grad():
        for shared in (True, False):
            trainer.args.share_prompt_forward = shared
            results.append(trainer.token_logps(trainer.model, batch))
    mask = batch["completion_mask"].bool()
    return float((results[0] - results[1])[mask].abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="Timed steps of each trainer (after one warm-up step).")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds of the two settings.")
    parser.add_argument("--groups", type=int, default=16, help="Maps (groups of the recipe's group_size episodes) a step.")
    parser.add_argument("--epsilon", type=float, default=0.3, help="The fraction of the noisy expert's moves that are random.")
    args = parser.parse_args()
    recipe = load_config_file(str(RECIPE))
    spec = TinySpec.from_mapping(recipe.get("tiny"))
    model_and_tokenizer = spec.build([recipe["env_id"]], seed=0, env_kwargs=recipe.get("env_kwargs"))
    times: dict[bool, list[float]] = {True: [], False: []}
    kept: list = []
    with tempfile.TemporaryDirectory() as out:
        for round_ in range(args.rounds):
            for shared in (False, True) if round_ % 2 == 0 else (True, False):
                config = recipe_config(recipe, out, args.steps, args.groups, shared)
                times[shared] += timed_run(model_and_tokenizer, config, args.epsilon, kept if shared and not kept else None)
    trainer = kept[0]
    served = [entry["perf/rows_per_prompt_forward"] for entry in trainer.state.log_history if "perf/rows_per_prompt_forward" in entry]
    whole, once = statistics.median(times[False]), statistics.median(times[True])
    figures = {
        "recipe": str(RECIPE.relative_to(RECIPE.parent.parent)),
        "groups_per_step": args.groups,
        "episodes_per_step": args.groups * recipe["group_size"],
        "timed_steps_each": len(times[True]),
        "step_s_one_forward_per_row": whole,
        "step_s_one_forward_per_prompt": once,
        "speedup": whole / once,
        "rows_per_prompt_forward": statistics.mean(served) if served else None,
    }
    figures["max_abs_logp_difference"] = logp_difference(trainer, trainer.last_batch)
    for key, value in figures.items():
        print(f"{key:<32} {value:.4g}" if isinstance(value, float) else f"{key:<32} {value}")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / "shared_prompts.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
