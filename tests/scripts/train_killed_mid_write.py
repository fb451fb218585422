"""``envhub train ARGS...`` that SIGKILLs itself halfway through writing the trainer state of
``checkpoint-STEP`` (half the file written and flushed), as a kill at that moment leaves it; run
by tests/test_resume.py. Plays with the tests' half-expert generator, as the in-process runs do.

Usage: python train_killed_mid_write.py STEP ARGS...
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from pathlib import Path

from transformers.trainer_callback import TrainerState

from envhub.cli import cli
from envhub_trl.trainer import EnvGRPOTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared generator
from trl_helpers import HalfExpert  # noqa: E402


def main(step: int, args: list[str]) -> None:
    save = TrainerState.save_to_json

    def save_then_die(self, json_path):
        if self.global_step != step:
            return save(self, json_path)
        text = json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"  # as save_to_json writes it
        with open(json_path, "w", encoding="utf-8") as handle:
            handle.write(text[: len(text) // 2])
            handle.flush()
            os.fsync(handle.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    TrainerState.save_to_json = save_then_die
    EnvGRPOTrainer._build_generator = lambda self, model: HalfExpert(model, self.processing_class)
    cli.main(args, prog_name="envhub")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
