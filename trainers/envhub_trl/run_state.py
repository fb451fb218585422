"""What a training run's future depends on, and how a checkpoint folder keeps it, so that a resumed
run ends where the uninterrupted one would have.

``transformers.Trainer`` already saves the model, the optimizer, the learning-rate schedule, its
own state (the step, the log) and the RNG states of Python, NumPy and torch, and on resume skips
the data it has seen. What it does not know is the part of the run that lives in
:class:`~envhub_trl.trainer.EnvGRPOTrainer`, which ``checkpoint-N/envhub_run_state.json`` (and two
files beside it) holds:

- TRL's micro-step counter (:attr:`envhub_trl.trl_bridge.TRLBridge.micro_step`): with the optimizer step,
  it seeds each generation batch's sampling (:meth:`EnvGRPOTrainer._sampling`) and picks which
  slice of a generation batch a micro-step trains on. Left at 0 on resume, every batch after it
  is sampled with other seeds.
- The generation batch being trained (:func:`envhub_trl.trl_bridge.buffered_inputs`), when the
  checkpoint falls inside one (``num_iterations`` > 1 or ``steps_per_generation`` >
  ``gradient_accumulation_steps``): ``envhub_buffered_inputs_<process>.pt``. Without it TRL would
  play a new batch at the resumed step.
- The env seed stream: in lockstep and continuous rollouts it is the dataset's sampler, which the
  Trainer's data skipping restores; in async rollouts it is the producer's position (the next
  generation batch index), saved here.
- The curriculum's stage and its window of recent training success.
- Self-imitation's remembered wins (``envhub_win_memory_<process>.json``), which its loss term
  draws from.
- The training metrics gathered since the last log line, which that line averages.
- REINFORCE++'s frozen reference (``reference_model.safetensors``): the policy as RL started,
  not the checkpoint's weights.
- A LoRA run's weights under its adapter (``envhub_base_weights.safetensors``): the Trainer saves
  the adapter alone, but ``envhub train`` folds the warm start's adapter into those weights.

PPO's value head is saved in every checkpoint by the trainer itself (``value_head.safetensors``).

``envhub train`` adds its own record (``envhub_train.json``, :func:`read_record`): the model, the
config and warm start it ran with, and the held-out evaluations made before RL and during it, so
that a resumed run's ``results.json`` holds the same figures as an uninterrupted run's, and a
resume with another config is refused rather than silently mixing two runs. An output folder with
a finished run or checkpoints is never overwritten by a new run unless asked
(:func:`prepare_output_dir`), and then only what ``envhub train`` wrote there goes (:func:`clear_run`).

Every checkpoint is written whole or not at all (:mod:`envhub_trl.run_files`: under a staging
name, flushed, renamed when complete, with a manifest of its files). A resume checks the
checkpoint's files before it loads them (:func:`checkpoint_damage`): ``--resume`` passes over a
damaged last checkpoint to the one before it, saying so (:func:`resolve_resume`).

What holds: on the CPU, a run interrupted after checkpoint ``k`` and resumed ends with the
uninterrupted run's weights (``tests/test_resume.py``) in lockstep and continuous rollouts. In
async rollouts with ``max_staleness: 0`` it plays the same episodes; its weights come as close as
two uninterrupted async runs do (their HF generator batches requests as thread timing makes them
up, so the sampling log-probs the importance weights read carry float noise: up to 1.4e-4 in a
weight after 3 steps of the tiny model). With ``max_staleness`` ``s`` > 0 the producer's position
is restored (no env seed is played twice or skipped), but the batches it had played ahead with
older weights die with the process, so the first ``s`` batches after a resume are played with the
checkpoint's weights: the same seeds, other samples (which weights an uninterrupted async run's
producer picks up depends on timing anyway). On a GPU, cuBLAS and cuDNN kernels are not
bit-for-bit deterministic, so an uninterrupted run does not repeat itself exactly either; a
resumed run continues the same seed streams, data order and schedule, and ends close to, not
equal to, the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import warnings
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from envhub.error import ResumeError
from envhub_trl import run_files
from envhub_trl.selection import BEST_FILE

if TYPE_CHECKING:
    from envhub_trl.trainer import EnvGRPOTrainer

#: The state file in a checkpoint folder.
RUN_STATE_FILE = "envhub_run_state.json"
#: REINFORCE++'s frozen reference in a checkpoint folder.
REFERENCE_FILE = "reference_model.safetensors"
#: A LoRA run's weights under its adapter: the Trainer saves only the adapter, but the base holds
#: the warm start folded into it (``envhub train`` with ``lora:``), and the KL term's reference.
BASE_FILE = "envhub_base_weights.safetensors"
#: One process's generation batch under training, when the checkpoint falls inside one.
BUFFER_FILE = "envhub_buffered_inputs_{process}.pt"
#: Self-imitation's remembered wins, one file per process.
MEMORY_FILE = "envhub_win_memory_{process}.json"
#: ``envhub train``'s record in a checkpoint folder (what the trainer's ``run_record`` holds).
RECORD_FILE = "envhub_train.json"
#: Config fields a resumed run may change: they touch neither the run's course nor its figures.
FREE_FIELDS = ("save_strategy", "save_steps", "save_total_limit", "disable_tqdm", "report_to", "logging_dir")
#: The state file's layout; a checkpoint with another is refused rather than half-read.
VERSION = 1
#: What ``transformers.Trainer`` writes last in a checkpoint folder: a folder without it is not one.
TRAINER_STATE_FILE = "trainer_state.json"
#: A run's final results (``envhub train``): an output folder without them holds an unfinished run.
RESULTS_FILE = "results.json"
#: What ``envhub train`` writes in its output folder besides checkpoints (removed by ``--overwrite``).
RUN_OUTPUTS = (RESULTS_FILE, "final", "learning_curve.png", BEST_FILE)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoints(output_dir: str | Path) -> list[Path]:
    """The ``checkpoint-N`` folders of ``output_dir`` that the Trainer finished writing, by step."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CHECKPOINT.match(p.name)) and (p / TRAINER_STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def last_checkpoint(output_dir: str | Path) -> Path | None:
    """The latest complete checkpoint of ``output_dir`` (None without one)."""
    found = checkpoints(output_dir)
    return found[-1] if found else None


def checkpoint_damage(folder: str | Path) -> str | None:
    """What keeps the checkpoint ``folder`` from loading, in words (naming the file); None when it
    is whole: its files as :func:`envhub_trl.run_files.damage` checks them, a weights file, and
    a trainer state that says its step."""
    folder = Path(folder)
    problem = run_files.damage(folder, required=(TRAINER_STATE_FILE,), weights=True)
    if problem is None:
        state = json.loads((folder / TRAINER_STATE_FILE).read_text())
        if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
            problem = f"{TRAINER_STATE_FILE} does not say its step"
    return problem


def check_checkpoint(path: str | Path) -> Path:
    """``path`` as a checkpoint folder to resume from.

    Raises:
        ResumeError: when it is not a folder that ``transformers.Trainer`` finished writing, or
            its files are damaged (:func:`checkpoint_damage`).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ResumeError(f"cannot resume from {path}: no such folder (give a checkpoint-N folder of an earlier run)")
    if not (folder / TRAINER_STATE_FILE).is_file():
        raise ResumeError(f"cannot resume from {path}: it holds no {TRAINER_STATE_FILE}, so it is not a complete checkpoint-N folder")
    problem = checkpoint_damage(folder)
    if problem is not None:
        raise ResumeError(f"cannot resume from {path}: it is damaged ({problem}); resume from another checkpoint")
    return folder


def resolve_resume(output_dir: str | Path, resume: str | bool | None, say: Callable[[str], None] | None = None) -> Path | None:
    """The checkpoint a run resumes from: ``True`` (or ``"last"``) the last whole one in
    ``output_dir``, a path that folder, None/False none.

    A damaged checkpoint (:func:`checkpoint_damage`) is passed over for the one before it, with one
    line to ``say`` (by default a warning) naming it and what is wrong with it.

    Raises:
        ResumeError: for a path that is not a whole checkpoint, or ``True`` with no whole
            checkpoint to take.
    """
    if resume is None or resume is False:
        return None
    if resume is not True and resume != "last":
        return check_checkpoint(resume)
    found = checkpoints(output_dir)
    if not found:
        raise ResumeError(f"nothing to resume: {output_dir} holds no checkpoint-N folder (checkpoints need save_strategy: steps)")
    say = say or (lambda line: warnings.warn(line, stacklevel=3))
    damaged = []
    for checkpoint in reversed(found):
        problem = checkpoint_damage(checkpoint)
        if problem is None:
            if damaged:
                say(f"{'; '.join(damaged)}: resuming from {checkpoint.name}, the last whole checkpoint")
            return checkpoint
        damaged.append(f"{checkpoint.name} is damaged ({problem})")
    raise ResumeError(f"nothing to resume in {output_dir}: {'; '.join(damaged)}; --overwrite starts the run afresh")


def finished_results(output_dir: str | Path) -> dict[str, Any] | None:
    """The ``results.json`` of the finished run in ``output_dir`` (None when it holds none, or
    none that parses: a run that did not finish)."""
    path = Path(output_dir) / RESULTS_FILE
    if not path.is_file():
        return None
    try:
        results = json.loads(path.read_text())
    except ValueError:
        return None
    return results if isinstance(results, dict) else None


def describe_run(output_dir: str | Path) -> str | None:
    """Why a new run may not start in ``output_dir``, naming the flags that say what to do with the
    earlier one there; None when it holds neither results.json nor a checkpoint (an unfinished run
    without checkpoints has nothing to resume)."""
    found = last_checkpoint(output_dir)
    if (Path(output_dir) / RESULTS_FILE).is_file():
        kept = f", checkpoints up to {found.name}" if found is not None else ""
        return (
            f"{output_dir} holds a finished run ({RESULTS_FILE}, final/{kept}): --resume prints its results without training, "
            "--overwrite starts afresh"
        )
    if found is None:
        return None
    return f"{output_dir} holds an unfinished run (last checkpoint {found.name}, no {RESULTS_FILE}): add --resume to continue it, or --overwrite to start afresh"


def prepare_output_dir(
    output_dir: str | Path, resume: str | bool | None = None, overwrite: bool = False, say: Callable[[str], None] | None = None
) -> Path | None:
    """Check that ``output_dir`` can take the run as asked; return the checkpoint it resumes from
    (None: a new run). Nothing is removed here: with ``overwrite``, the caller removes the earlier
    run's outputs (:func:`clear_run`) once the new run has loaded.

    ``resume`` (and ``say``) are as :func:`resolve_resume` takes them. Without ``resume`` or
    ``overwrite``, a folder that holds a finished run (results.json) or an earlier run's
    checkpoints is refused: a new run would replace the finished one's results, or write its
    checkpoints among the earlier ones, and a later resume would pick up the wrong run.

    Raises:
        ResumeError: for both flags, a checkpoint that cannot be resumed, or a folder that holds a run.
    """
    if overwrite and resume not in (None, False):
        raise ResumeError("--resume continues the run in the output folder and --overwrite removes it; give one of them")
    if overwrite:
        return None
    checkpoint = resolve_resume(output_dir, resume, say)
    if checkpoint is None:
        earlier = describe_run(output_dir)
        if earlier is not None:
            raise ResumeError(earlier)
    return checkpoint


def clear_run(output_dir: str | Path) -> None:
    """Remove what an earlier ``envhub train`` run wrote in ``output_dir``: its ``checkpoint-N``
    folders (that exact name), final model, curve, results, best validation weights and staging
    leftovers; anything else there (``checkpoint-2.bak``, ``checkpoint-notes.txt``) stays."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return
    checkpoint_folders = [p for p in folder.iterdir() if _CHECKPOINT.match(p.name) and p.is_dir()]
    for path in [*checkpoint_folders, *(folder / name for name in RUN_OUTPUTS)]:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    remove_partials(folder)


def remove_partials(output_dir: str | Path) -> None:
    """Remove the staging leftovers of writes that a killed run cut short (never read: no reader
    takes them for a checkpoint); call it only while the folder's lock is held."""
    folder = Path(output_dir)
    for path in folder.glob(f"{run_files.PARTIAL_PREFIX}*") if folder.is_dir() else ():
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def _generate_every(trainer: EnvGRPOTrainer) -> int:
    return trainer.args.steps_per_generation * trainer.num_iterations


def save(trainer: EnvGRPOTrainer, folder: str | Path) -> None:
    """Write what ``trainer``'s future depends on beyond what ``transformers.Trainer`` saves into
    the checkpoint folder ``folder`` (see the module docstring)."""
    from envhub_trl import trl_bridge  # TRL's counters; imported here so that reading a record loads no TRL

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    buffered = trl_bridge.buffered_inputs(trainer) is not None and trainer.micro_step % _generate_every(trainer) != 0
    if buffered:
        torch.save(trl_bridge.buffered_inputs(trainer), folder / BUFFER_FILE.format(process=trainer.accelerator.process_index))
    if trainer.win_memory is not None:
        (folder / MEMORY_FILE.format(process=trainer.accelerator.process_index)).write_text(json.dumps(trainer.win_memory.state()))
    if not trainer.accelerator.is_main_process:
        return
    from safetensors.torch import save_model

    from envhub_trl.lora import is_peft_model

    reference = getattr(trainer, "_reference", None)
    if reference is not None:
        save_model(reference, str(folder / REFERENCE_FILE))  # handles tied weights, which save_file refuses
    model = trainer.accelerator.unwrap_model(trainer.model)
    adapter = is_peft_model(model)
    if adapter:
        save_model(model, str(folder / BASE_FILE))
    curriculum = trainer.curriculum
    state = {
        "version": VERSION,
        "global_step": trainer.state.global_step,
        "trl_step": trainer.micro_step,
        "buffered_inputs": buffered,
        "async_batches": trainer.async_batches,
        "curriculum": None if curriculum is None else {"stage": curriculum.stage, "recent": list(curriculum.recent)},
        "pending_metrics": trl_bridge.pending_metrics(trainer),
        "reference": reference is not None,
        "base_weights": adapter,
    }
    (folder / RUN_STATE_FILE).write_text(json.dumps(state, indent=1))
    record = trainer.run_record  # envhub train's; None for a trainer used from Python
    if record is not None:
        (folder / RECORD_FILE).write_text(json.dumps(record, indent=1))


def read_record(checkpoint: str | Path) -> dict[str, Any]:
    """``envhub train``'s record in ``checkpoint`` (see the module docstring).

    Raises:
        ResumeError: when the checkpoint holds none (a run ``envhub train`` did not make).
    """
    path = Path(checkpoint) / RECORD_FILE
    if not path.is_file():
        raise ResumeError(
            f"{checkpoint} holds no {RECORD_FILE}, so envhub train did not write it; resume it from Python with "
            "EnvGRPOTrainer.train(resume_from_checkpoint=...)"
        )
    return json.loads(path.read_text())


def _with_defaults(warm_start: Any) -> Any:
    """A recorded warm start with the fields it lacks at their defaults: a record written before a
    :class:`~envhub_trl.warm_start.WarmStart` field existed ran with that field's default."""
    if not isinstance(warm_start, dict):
        return warm_start
    from envhub_trl.warm_start import WarmStart

    defaults = json.loads(json.dumps(dataclasses.asdict(WarmStart())))
    return {**defaults, **warm_start}


def check_same_run(record: dict[str, Any], model: str, config: dict[str, Any], warm_start: dict[str, Any]) -> None:
    """Refuse to resume the run ``record`` describes with another model, config or warm start
    (``config`` without ``output_dir``; the fields of :data:`FREE_FIELDS` may change).

    Raises:
        ResumeError: naming each field that differs, with both values.
    """
    now = json.loads(json.dumps({"model": model, "config": config, "warm_start": warm_start}))  # as the record stores it
    changes = [f"model: {record.get('model')!r} then, {now['model']!r} now"] if record.get("model") != now["model"] else []
    if _with_defaults(record.get("warm_start")) != _with_defaults(now["warm_start"]):
        changes.append(f"warm_start: {record.get('warm_start')} then, {now['warm_start']} now")
    then_config = record.get("config", {})
    for key in sorted(set(then_config) | set(now["config"])):
        if key not in FREE_FIELDS and then_config.get(key) != now["config"].get(key):
            changes.append(f"{key}: {then_config.get(key)!r} then, {now['config'].get(key)!r} now")
    if changes:
        raise ResumeError(f"cannot resume with another config ({'; '.join(changes)}); resume with the run's own, or --overwrite to start afresh")


def restore(trainer: EnvGRPOTrainer, checkpoint: str | Path) -> bool:
    """Put the state :func:`save` wrote in ``checkpoint`` back into ``trainer`` before it trains
    on (the Trainer loads the model, optimizer, schedule and RNG states itself). A checkpoint
    without it (written before envhub saved it) resumes with a warning: the weights and the
    schedule continue, the sampling seeds do not. Returns whether it held the state.

    Raises:
        ResumeError: for a state file of another layout, or one whose files are missing.
    """
    from envhub_trl import trl_bridge  # TRL's counters; imported here so that reading a record loads no TRL

    folder = Path(checkpoint)
    path = folder / RUN_STATE_FILE
    if not path.is_file():
        warnings.warn(
            f"{folder} holds no {RUN_STATE_FILE}: the run resumes its weights and schedule, but not its sampling seeds, so it "
            "will not end where an uninterrupted run would",
            stacklevel=3,
        )
        return False
    state = json.loads(path.read_text())
    if state.get("version") != VERSION:
        raise ResumeError(f"{path} has layout version {state.get('version')!r}; this envhub reads version {VERSION}")
    trl_bridge.set_micro_step(trainer, int(state["trl_step"]))
    trainer.async_batches = int(state["async_batches"])
    if state["buffered_inputs"]:
        buffer = folder / BUFFER_FILE.format(process=trainer.accelerator.process_index)
        if not buffer.is_file():
            raise ResumeError(f"{folder} was saved inside a generation batch but holds no {buffer.name}; resume from another checkpoint")
        device = trainer.accelerator.device
        trl_bridge.set_buffered_inputs(trainer, torch.load(buffer, map_location=device, weights_only=True))
    saved_curriculum = state["curriculum"]
    if trainer.curriculum is not None and saved_curriculum is not None:
        trainer.curriculum.stage = int(saved_curriculum["stage"])
        trainer.curriculum.recent.clear()
        trainer.curriculum.recent.extend(float(x) for x in saved_curriculum["recent"])
        trainer.curriculum.restored = True  # not again from the log
    trl_bridge.set_pending_metrics(trainer, state["pending_metrics"])
    if trainer.win_memory is not None:
        memory = folder / MEMORY_FILE.format(process=trainer.accelerator.process_index)
        if not memory.is_file():
            raise ResumeError(f"{folder} holds no {memory.name}, the self-imitation memory this run keeps; resume from another checkpoint")
        trainer.win_memory.load(json.loads(memory.read_text()))
    if state["reference"]:
        _restore_reference(trainer, folder)
    if state.get("base_weights"):  # absent in checkpoints from before it was saved
        _restore_base(trainer, folder)
    return True


def _restore_base(trainer: EnvGRPOTrainer, folder: Path) -> None:
    """A LoRA run's weights under its adapter (the Trainer then loads the adapter itself)."""
    from safetensors.torch import load_model

    path = folder / BASE_FILE
    if not path.is_file():
        raise ResumeError(f"{folder} was saved from a LoRA run but holds no {BASE_FILE}; resume from another checkpoint")
    model = trainer.accelerator.unwrap_model(trainer.model)
    load_model(model, str(path), device=str(next(model.parameters()).device))
    trainer.weights_changed()  # a generator with its own copy of the weights gets these


def _restore_reference(trainer: EnvGRPOTrainer, folder: Path) -> None:
    """REINFORCE++'s reference as the checkpoint saved it (a frozen copy of the policy's
    architecture holding the saved weights)."""
    import copy

    from safetensors.torch import load_model

    path = folder / REFERENCE_FILE
    if not path.is_file():
        raise ResumeError(f"{folder} was saved with a frozen reference model but holds no {REFERENCE_FILE}")
    model = trainer.accelerator.unwrap_model(trainer.model)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    load_model(reference, str(path), device=str(next(model.parameters()).device))
    trainer.restore_reference(reference)
