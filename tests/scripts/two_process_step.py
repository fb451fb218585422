"""One GiGPO (or PPO) generation batch on two CPU processes (run by torchrun from tests/test_trainer.py).

Each process writes what its rows were and the advantages its loss would use to OUT/rank-R.json;
the test rebuilds the global batch and checks the advantages against a single-process computation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from envhub_trl.config import EnvGRPOConfig
from envhub_trl.trainer import EnvGRPOTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared generator
from trl_helpers import HalfExpert  # noqa: E402


def main(model_path: str, out: str, layout: str, estimator: str = "gigpo") -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    config = EnvGRPOConfig(
        output_dir=out, env_id="frozenlake/FrozenLakeNotSlippery-v0", max_turns=7, groups_per_step=3, group_size=4,
        per_device_train_batch_size=6, max_steps=1, max_turn_tokens=8, report_to="none", use_cpu=True, save_strategy="no",
        disable_tqdm=True, seed=3, format_penalty=-0.1, step_gamma=0.9, sample_layout=layout, advantage_estimator=estimator,
    )
    seen = {}

    class Spy(EnvGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            mask = (output["tool_mask"] * output["completion_mask"]).bool()
            seen["advantages"] = [output["advantages"][row][mask[row]].tolist() for row in range(len(mask))]
            seen["episodes"] = [
                {"seed": t.seed, "rewards": [turn.reward for turn in t.turns], "state_keys": [turn.state_key for turn in t.turns],
                 "lengths": [len(turn.completion_ids) for turn in t.turns]}
                for t in self._managers["main"][0].trajectories()
            ]
            return output

    trainer = Spy(model, config, processing_class=tokenizer, generator=HalfExpert(model, tokenizer))
    trainer.train()
    rank = trainer.accelerator.process_index
    seen["world_size"] = trainer.accelerator.num_processes
    if trainer.value_head is not None:
        seen["value_head"] = [p.detach().flatten().tolist() for p in trainer.value_head.parameters()]
    Path(out, f"rank-{rank}.json").write_text(json.dumps(seen))
    torch.distributed.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
