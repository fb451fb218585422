"""Trainer benchmark: an EnvGRPOTrainer step against a plain trl.GRPOTrainer step on as many tokens,
each advantage estimator's step against GRPO's, and the GiGPO advantage time on a 16k-step batch.

Both trainers use the same freshly built tiny model on the CPU. The envhub run plays multi-turn
FrozenLake episodes (generation turn by turn, environment tokens between turns); the plain run
generates, in one go per prompt, a completion as long as an envhub episode's completion (model
and environment tokens) from a prompt as long as the episode's first prompt, so the loss sees the
same number of tokens. A step is TRL's ``step_time``: generation, scoring and the optimizer step.
The two trainers run in alternating rounds (fresh trainers each round) so that a busy machine
slows both alike; the ratio is of the medians over every timed step.

Per algorithm (``grpo``, ``gigpo``, ``rloo``, ``step_reinforce``, ``reinforce++``, ``ppo``): the same
batch for each, since the episodes are played by a seeded noisy expert rather than the model
(every algorithm sees the same episodes step by step), so what differs is what the algorithm adds:
REINFORCE++'s policy and reference forward passes, PPO's value read-out and value loss. Rounds
alternate the algorithms (in an order rotated each round); each ratio is of medians against GRPO. Targets: PPO at most 1.6x
GRPO, the others at most 1.1x.

    python bench/trainer.py [--episodes 16] [--steps 4] [--rounds 3] [--algorithms grpo ppo ...]
    python bench/trainer.py --algorithms-only --played-by model --algorithms grpo reinforce++

``--played-by model`` has the model sample the algorithms' episodes (a real run's step, where
generation dominates) instead of the noisy expert (generation free: each algorithm's whole extra
cost shows, the worst case). Prints the figures and writes bench/results/trainer.json
(``trainer_algorithms_PLAYED_BY.json`` with ``--algorithms-only``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import numpy as np
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from envhub.generation import ExpertGenerator
from envhub.trajectory import Sample
from envhub_trl.advantages import gigpo_advantages, grpo_advantages
from envhub_trl.config import EnvGRPOConfig
from envhub_trl.estimators import ESTIMATORS
from envhub_trl.pipeline import token_advantages
from envhub_trl.tiny import build_model, build_tokenizer, environment_corpus
from envhub_trl.trainer import EnvGRPOTrainer

ENV = "frozenlake/FrozenLakeNotSlippery-v0"
#: Step-time targets against GRPO on the same batch (issue: PPO with a shared-trunk head <= 1.6x).
ALGORITHM_TARGETS = {"ppo": 1.6}
DEFAULT_TARGET = 1.1


def step_times(trainer) -> list[float]:
    trainer.train()
    return [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry]


def bench_config(out: str, episodes: int, steps: int, turns: int, reply_tokens: int, **overrides) -> EnvGRPOConfig:
    """The envhub runs' config: groups of 4 episodes, ``steps`` timed steps after a warm-up one."""
    return EnvGRPOConfig(
        output_dir=out, env_id=ENV, max_turns=turns, groups_per_step=episodes // 4, group_size=4,
        per_device_train_batch_size=episodes, max_steps=steps + 1, max_turn_tokens=reply_tokens, logging_steps=1,
        report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, format_penalty=-0.1, **overrides,
    )


def envhub_run(tokenizer, episodes: int, steps: int, turns: int, reply_tokens: int, out: str, layout: str = "trajectory"):
    config = bench_config(out, episodes, steps, turns, reply_tokens, sample_layout=layout)
    trainer = EnvGRPOTrainer(build_model(tokenizer), config, processing_class=tokenizer)
    lengths = []
    rollout = trainer.rollout_columns

    def measured(prompts, trl_trainer):
        output = rollout(prompts, trl_trainer)
        lengths.append((np.mean([len(p) for p in output["prompt_ids"]]), np.mean([len(c) for c in output["completion_ids"]])))
        return output

    trainer.rollout_func = measured
    times = step_times(trainer)[1:]  # the first step pays one-off set-up
    return times, lengths


def algorithm_run(
    tokenizer, algorithm: str, episodes: int, steps: int, turns: int, reply_tokens: int, out: str, played_by: str = "expert"
) -> list[float]:
    """Step times of one estimator from a model built with a fixed seed, on the batches a seeded
    noisy expert plays (``played_by="expert"``: the same for every estimator, and generation costs
    nothing, so the ratio is the estimator's whole extra cost) or the model samples with the HF
    generator (``"model"``: what a user's run pays; episodes differ once the weights do)."""
    config = bench_config(out, episodes, steps, turns, reply_tokens, advantage_estimator=algorithm, seed=0)
    generator = ExpertGenerator(tokenizer, epsilon=0.3, seed=0) if played_by == "expert" else None
    trainer = EnvGRPOTrainer(build_model(tokenizer, seed=0), config, processing_class=tokenizer, generator=generator)
    return step_times(trainer)[1:]


def plain_run(tokenizer, episodes: int, steps: int, prompt_len: int, completion_len: int, out: str):
    words = tokenizer.decode(list(range(3, 3 + prompt_len)))
    ids = tokenizer(words, add_special_tokens=False)["input_ids"][:prompt_len]
    prompt = tokenizer.decode(ids)
    dataset = Dataset.from_dict({"prompt": [prompt] * 64})
    config = GRPOConfig(
        output_dir=out, num_generations=4, per_device_train_batch_size=episodes, max_steps=steps + 1,
        max_completion_length=completion_len, logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
        disable_tqdm=True, generation_kwargs={"min_new_tokens": completion_len},
    )
    rng = np.random.default_rng(0)
    trainer = GRPOTrainer(
        build_model(tokenizer), reward_funcs=lambda completions, **kw: rng.random(len(completions)).tolist(),
        args=config, train_dataset=dataset, processing_class=tokenizer,
    )
    return step_times(trainer)[1:]


def gigpo_batch(steps: int, group_size: int = 8, turns: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_traj = steps // turns
    traj_index = np.repeat(np.arange(n_traj), turns)
    return {
        "rewards": rng.random(steps),
        "traj_index": traj_index,
        "step_index": np.tile(np.arange(turns), n_traj),
        "traj_groups": np.arange(n_traj) // group_size,
        "state_keys": np.array([f"state-{k}" for k in rng.integers(0, 40, steps)], dtype=object),
    }


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16, help="Episodes (samples) per step; a multiple of 4.")
    parser.add_argument("--steps", type=int, default=4, help="Timed steps of each trainer (after one warm-up step).")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--reply-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds of the trainers.")
    parser.add_argument("--algorithms", nargs="+", choices=sorted(ESTIMATORS), default=["grpo", "gigpo", "rloo", "step_reinforce", "reinforce++", "ppo"],
                        help="Estimators timed against GRPO (GRPO is always timed).")
    parser.add_argument("--played-by", choices=["expert", "model"], default="expert",
                        help="Who plays the algorithms' episodes: a noisy expert (free generation: each algorithm's "
                             "whole extra cost shows) or the model sampling through the HF generator (a real run's cost).")
    parser.add_argument("--algorithms-only", action="store_true", help="Time the algorithms only (no plain-TRL comparison).")
    args = parser.parse_args()
    algorithms = ["grpo"] + [a for a in args.algorithms if a != "grpo"]
    torch.manual_seed(0)
    tokenizer = build_tokenizer(environment_corpus([ENV], seeds=4))
    ours, plain, step_layout, lengths = [], [], [], []
    by_algorithm: dict[str, list[float]] = {a: [] for a in algorithms}
    with tempfile.TemporaryDirectory() as out:
        for round_ in range(args.rounds):
            for algorithm in algorithms[round_ % len(algorithms) :] + algorithms[: round_ % len(algorithms)]:  # rotated: no algorithm always first
                by_algorithm[algorithm] += algorithm_run(
                    tokenizer, algorithm, args.episodes, args.steps, args.turns, args.reply_tokens, out, args.played_by
                )
            if args.algorithms_only:
                continue
            times, measured = envhub_run(tokenizer, args.episodes, args.steps, args.turns, args.reply_tokens, out)
            ours += times
            lengths += measured
            prompt_len = int(round(np.mean([p for p, _ in lengths])))
            completion_len = int(round(np.mean([c for _, c in lengths])))
            plain += plain_run(tokenizer, args.episodes, args.steps, prompt_len, completion_len, out)
            step_layout += envhub_run(tokenizer, args.episodes, args.steps, args.turns, args.reply_tokens, out, "step")[0]
    figures: dict = {"episodes_per_step": args.episodes, "algorithms_played_by": args.played_by}
    if not args.algorithms_only:
        batch = gigpo_batch(16_384)
        gigpo_s = best_of(lambda: gigpo_advantages(**batch))
        returns = np.bincount(batch["traj_index"], weights=batch["rewards"])
        grpo_s = best_of(lambda: grpo_advantages(returns, batch["traj_groups"]))
        per_turn = gigpo_advantages(**batch)["advantages"].reshape(-1, 32)
        turn_ids = np.repeat(np.arange(32), 8).tolist()
        samples = [Sample(prompt_ids=[], completion_ids=[], env_mask=[], logprobs=[], turn_ids=turn_ids, group_id=i // 8, trajectory_index=i) for i in range(len(per_turn))]
        spread_s = best_of(lambda: token_advantages(samples, per_turn, 256))
        figures |= {
            "prompt_tokens": prompt_len,
            "completion_tokens": completion_len,
            "envhub_step_s": statistics.median(ours),
            "plain_trl_step_s": statistics.median(plain),
            "step_ratio_envhub_over_plain": statistics.median(ours) / statistics.median(plain),
            "envhub_step_layout_step_s": statistics.median(step_layout),
            "step_layout_over_trajectory": statistics.median(step_layout) / statistics.median(ours),
            "timed_steps_each": len(ours),
            "gigpo_16k_steps_ms": gigpo_s * 1000,
            "grpo_16k_steps_ms": grpo_s * 1000,
            "gigpo_over_grpo": gigpo_s / grpo_s,
            "per_token_spread_512x256_ms": spread_s * 1000,
        }
    grpo_step = statistics.median(by_algorithm["grpo"])
    algorithm_figures = {
        a: {
            "step_s": statistics.median(times),
            "over_grpo": statistics.median(times) / grpo_step,
            "target_over_grpo": ALGORITHM_TARGETS.get(a, DEFAULT_TARGET) if a != "grpo" else None,
        }
        for a, times in by_algorithm.items()
    }
    for entry in algorithm_figures.values():
        entry["met"] = None if entry["target_over_grpo"] is None else entry["over_grpo"] <= entry["target_over_grpo"]
    for key, value in figures.items():
        print(f"{key:<32} {value:.4g}" if isinstance(value, float) else f"{key:<32} {value}")
    print("\nseconds per optimizer step on the same batches (medians), against GRPO")
    for a, entry in algorithm_figures.items():
        target = "" if entry["target_over_grpo"] is None else f"  target <= {entry['target_over_grpo']}x: {'met' if entry['met'] else 'MISSED'}"
        print(f"  {a:<16} {entry['step_s']:.3f} s  {entry['over_grpo']:.2f}x{target}")
    figures["algorithms"] = algorithm_figures
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    name = f"trainer_algorithms_{args.played_by}.json" if args.algorithms_only else "trainer.json"
    (results / name).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
