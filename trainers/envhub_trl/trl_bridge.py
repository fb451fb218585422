"""The seam to TRL: the one module that names TRL's (and ``transformers.Trainer``'s) private members.

TRL has no public hook for what envhub does to a generation batch (its tracker still has no
advantage hook: TRL #7291), so envhub reaches in, here and nowhere else. Written against TRL 1.16
(``trainers/pyproject.toml`` pins ``trl>=1.16,<1.17``); a TRL upgrade is checked against this file
alone. What it reaches:

- ``GRPOTrainer._generate_and_score_completions``: TRL makes a generation batch here. The bridge
  hands it to the trainer's :meth:`TRLBridge.generation_batch` (envhub's stages,
  :mod:`envhub_trl.pipeline`), which calls back :meth:`TRLBridge.trl_score` for TRL's own scoring
  of the rows; TRL's public ``rollout_func`` hook then returns the batch's columns.
- ``GRPOTrainer._get_per_token_logps_and_entropies``: the model's per-token log-probs, for the
  score stage and the lag correction; inside the loss, the per-turn importance ratio
  (``ratio_type="segment"``) replaces TRL's per-token one.
- ``GRPOTrainer._metrics`` and ``_logs``: where TRL averages the logged metrics, and its
  completions log (:meth:`TRLBridge.log_metrics`, :meth:`TRLBridge.log_row_advantages`).
- ``GRPOTrainer._step`` and ``_buffered_inputs``: the micro-step counter and the generation batch
  being trained, which a resumed run restores (:attr:`TRLBridge.micro_step`, :func:`buffered_inputs`...).
- ``GRPOTrainer._current_train_step_time``: TRL's timing of an optimizer step, to which the loss's
  chunked backward (``max_forward_tokens``), run after TRL's ``training_step``, is added.
- ``Trainer._save_checkpoint``, ``_save``, ``_load_from_checkpoint`` and ``_get_output_dir``:
  where a checkpoint is written and read, so that envhub's files go with it (the trainer's
  :meth:`~TRLBridge.on_checkpoint`, :meth:`~TRLBridge.on_save`, :meth:`~TRLBridge.on_load`), and
  so that it is written whole or not at all: ``_get_output_dir`` names a staging folder while the
  Trainer writes, which :func:`envhub_trl.run_files.commit` renames when complete, before the
  Trainer's ``rotate_checkpoints`` runs over the real ones.
- ``Trainer.train`` on a checkpoint at ``max_steps``: the Trainer would train one step past it
  (its loop checks the step count only after a step), so the checkpoint is loaded without
  training (:meth:`TRLBridge.train`).
- TRL's ``trl.trainer.grpo_trainer`` logger: its warning that every reward function returned None
  for a row is dropped when the row is a padding row of the step layout (``trajectory_index``
  -1), whose reward is None on purpose (:func:`episode_return`); TRL
  leaves such rows out of its reward statistics, and the warning came once per batch.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import TrainOutput, rotate_checkpoints
from trl import GRPOTrainer

from envhub_trl import run_files, run_state
from envhub_trl.chunked_loss import ChunkedLoss
from envhub_trl.critic import ValueHead, captured_hidden_states, final_norm, read_values, value_positions
from envhub_trl.lora import is_peft_model
from envhub_trl.pipeline import GenerationBatch
from envhub_trl.shared_prompts import shared_prompt_logps


def episode_return(
    prompts: list[Any], completions: list[Any], episode_return: list[float | None], **kwargs: Any
) -> list[float | None]:
    """TRL reward function: the episode's return, as the rollout recorded it (None on padding rows,
    which TRL then leaves out of its reward statistics)."""
    return [None if value is None else float(value) for value in episode_return]


def segment_mean(values: torch.Tensor, segments: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each position's mean of ``values`` over the masked positions of its segment, row by row
    (differentiable; 0 where ``mask`` is 0).

    Args:
        values: ``(B, T)``.
        segments: ``(B, T)`` non-negative integer segment ids (a turn's id for each token).
        mask: ``(B, T)``, 1 on the positions that count.
    """
    segments = segments.long()
    mask = mask.to(values.dtype)
    width = int(segments.max()) + 1 if segments.numel() else 1
    sums = torch.zeros(values.shape[0], width, dtype=values.dtype, device=values.device).scatter_add(1, segments, values * mask)
    counts = torch.zeros_like(sums).scatter_add(1, segments, mask)
    return (sums / counts.clamp(min=1.0)).gather(1, segments) * mask


def loadable_reference(model: Any, args: Any, peft_config: Any = None) -> None:
    """Make TRL able to build its ``ref_model`` (``beta`` > 0) for a model built in memory.

    TRL loads the reference afresh from the model's ``config._name_or_path``; a model built here
    (``--model tiny``) has none, and TRL failed with a hub error about an empty repo id. Such a
    model is saved under ``output_dir/reference-initial-weights`` and named by that folder, so TRL
    loads the same weights, prepared as it prepares any reference."""
    if not args.beta or peft_config is not None or isinstance(model, str) or getattr(model.config, "_name_or_path", ""):
        return
    folder = Path(args.output_dir) / "reference-initial-weights"
    with run_files.writing_folder(folder, run_files.model_bytes(model), run_files.RUN_AGAIN) as staging:
        model.save_pretrained(staging)  # whole or not at all: a run killed here leaves no half reference
    model.config._name_or_path = str(folder)


class _PaddingRowsWarning(logging.Filter):
    """Drops TRL's "All reward functions returned None" warning when the row it names is padding."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("All reward functions returned None" in message and "'trajectory_index': -1" in message)


logging.getLogger("trl.trainer.grpo_trainer").addFilter(_PaddingRowsWarning())


class TRLBridge(GRPOTrainer):
    """``GRPOTrainer`` with its private hooks turned into envhub's.

    A subclass implements :meth:`generation_batch`, passes :meth:`rollout_columns` as
    ``rollout_func``, and may implement :meth:`on_checkpoint`, :meth:`on_save` and :meth:`on_load`.
    """

    _in_flight: GenerationBatch | None = None  # the batch TRL is scoring, until rollout_func takes its columns
    _loss_inputs: dict[str, Any] | None = None  # the micro-batch under the loss, with ratio_type="segment"
    _prompt_pass_width: int | None = None  # the last scoring's shared prompt pass's width (share_prompt_forward), else None
    _reference: Any | None = None  # the frozen reference copy REINFORCE++ reads (see reference_logps)
    _chunked: ChunkedLoss | None = None  # within a training step with max_forward_tokens, the loss's chunks

    # ------------------------------------------------------------------ generation

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        return self.generation_batch(inputs)

    def generation_batch(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """One generation batch from TRL's input rows, as TRL's loss reads it."""
        raise NotImplementedError

    def trl_score(self, batch: GenerationBatch) -> dict[str, Any]:
        """TRL's scoring of ``batch``'s rows (old and reference log-probs, its metrics and
        completions log), on the columns :meth:`rollout_columns` hands it."""
        self._in_flight = batch
        output = super()._generate_and_score_completions(list(batch.rows))
        self._mend_completion_metrics(batch)
        return output

    def _mend_completion_metrics(self, batch: GenerationBatch) -> None:
        """Re-measure TRL's ``completions/clipped_ratio`` and ``*_terminated_length`` by the replies.

        TRL calls a completion clipped when its last token is not end-of-sequence. An envhub row
        ends where a reply stopped: at a stop string (``</answer>``) or an env's text as often as at
        end-of-sequence, so TRL's figure read 1.0 on runs where no reply met its token limit. A row
        is clipped here when one of its replies was cut at ``max_turn_tokens`` (finish reason
        ``length``), which is what the name promises; the lengths stay TRL's (the row's model tokens).
        """
        mode = "train" if self.model.training else "eval"
        logged = self._metrics[mode]
        if not logged.get("completions/clipped_ratio"):
            return
        rows = [s for s in batch.samples if s.trajectory_index >= 0]
        clipped, lengths = [], []
        for sample in rows:
            turns = batch.episodes[sample.trajectory_index].turns
            mine = turns if sample.turn_index is None else turns[sample.turn_index : sample.turn_index + 1]
            clipped.append(any(turn.finish_reason == "length" for turn in mine))
            lengths.append(float(sum(sample.env_mask)))
        everyone = gather_object(list(zip(clipped, lengths)))
        if not everyone:
            return
        ended = [length for cut, length in everyone if not cut] or [0.0]
        logged["completions/clipped_ratio"][-1] = sum(cut for cut, _ in everyone) / len(everyone)
        logged["completions/mean_terminated_length"][-1] = sum(ended) / len(ended)
        logged["completions/min_terminated_length"][-1] = min(ended)
        logged["completions/max_terminated_length"][-1] = max(ended)

    def rollout_columns(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, list[Any]]:
        """TRL's ``rollout_func``: the columns of the batch being scored (played before TRL asks)."""
        batch, self._in_flight = self._in_flight, None
        if batch is None or len(batch.columns["prompt_ids"]) != len(prompts):
            raise RuntimeError("EnvGRPOTrainer plays its episodes in generation_batch; rows must carry env_seed")
        return dict(batch.columns)

    def token_logps(self, model: Any, output: Mapping[str, Any], batch_size: int | None = None) -> torch.Tensor:
        """``model``'s per-token log-probs of the completions of ``output`` (TRL's batch layout)."""
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        width = output["completion_ids"].shape[1]
        return self._get_per_token_logps_and_entropies(model, input_ids, attention, width, batch_size=batch_size)[0]

    def model_scores(
        self, output: Mapping[str, Any], needs: tuple[str, ...], value_head: ValueHead | None, starts: list[dict[int, int]] | None,
        logps: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """The score stage's model quantities for an estimator that ``needs`` them, as numpy arrays
        for :func:`envhub_trl.pipeline.score`: ``logps`` and ``ref_logps`` per completion token,
        read off ``logps`` (the policy's, when the caller already scored the batch) or TRL's
        scoring where it computed them, else computed here without gradients; ``values`` per row
        and turn, read where ``starts`` says (:func:`~envhub_trl.critic.turn_starts`)."""
        batch_size = self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size
        scores: dict[str, Any] = {}
        with torch.no_grad():
            logps = output.get("old_per_token_logps") if logps is None else logps
            if "values" in needs or ("logps" in needs and logps is None):
                capture = captured_hidden_states(self.model) if "values" in needs else contextlib.nullcontext([])
                with capture as hidden:
                    fresh = self.token_logps(self.model, output, batch_size)
                logps = fresh if logps is None else logps
                if "values" in needs:
                    positions, _ = value_positions(starts, output["prompt_ids"].shape[1])
                    scores["values"] = read_values(value_head, self.sequence_states(hidden), positions).float().cpu().numpy()
            if "logps" in needs:
                scores["logps"] = logps.float().cpu().numpy()
            if "ref_logps" in needs:
                ref = output.get("ref_per_token_logps")
                scores["ref_logps"] = (ref if ref is not None else self.reference_logps(output, batch_size)).float().cpu().numpy()
        return scores

    def reference_logps(self, output: Mapping[str, Any], batch_size: int | None) -> torch.Tensor:
        """Per-token log-probs of the reference model: TRL's own where it made one (``beta`` > 0),
        the base model under a PEFT adapter, else a frozen copy of the policy taken when RL first
        needs it (after any warm start; on a resumed run, the checkpoint's weights)."""
        model = self.accelerator.unwrap_model(self.model)
        if self.ref_model is not None:
            reference = self.ref_model
        elif is_peft_model(model):
            with model.disable_adapter():
                return self.token_logps(self.model, output, batch_size)
        else:
            if self._reference is None:
                self._reference = copy.deepcopy(model).eval().requires_grad_(False)
            reference = self._reference
        return self.token_logps(reference, output, batch_size)

    def reference_from_policy(self) -> None:
        """Make the policy's current weights the reference: TRL's ``ref_model`` (``beta`` > 0), which
        TRL copied from the model when the trainer was built, takes them, and the frozen copy is
        taken afresh when next needed. Called after a supervised warm start, so that a KL term
        holds RL near the warm-started policy, not near the random weights it started from."""
        if self.ref_model is not None:
            policy = self.accelerator.unwrap_model(self.model)
            reference = self.accelerator.unwrap_model(self.ref_model)
            reference.load_state_dict(policy.state_dict())
        self._reference = None

    def restore_reference(self, reference: Any) -> None:
        """Take ``reference`` as REINFORCE++'s frozen reference (a resumed run's, as its checkpoint saved it)."""
        self._reference = reference

    def log_metrics(self, mode: str, metrics: Mapping[str, float]) -> None:
        """Add one value per metric to what TRL averages into the next log line (``mode``:
        ``"train"`` or ``"eval"``)."""
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)

    def log_row_advantages(self, means: list[float]) -> None:
        """Put the advantages the loss uses in TRL's completions log (one per row: the mean over
        its model tokens), over TRL's sequence-level ones."""
        means = gather_object(means)
        logged = self._logs["advantages"]
        for back, value in enumerate(reversed(means), start=1):
            if back <= len(logged):
                logged[-back] = value

    @property
    def micro_step(self) -> int:
        """TRL's micro-step counter (it picks the slice of a generation batch a step trains on)."""
        return self._step

    # ------------------------------------------------------------------ loss

    @contextlib.contextmanager
    def loss_inputs(self, inputs: dict[str, Any]) -> Iterator[None]:
        """Within the block, the loss's log-probs take ``inputs``' per-turn ratio (with
        ``ratio_type="segment"``; see :meth:`_get_per_token_logps_and_entropies`)."""
        self._loss_inputs = inputs if self.args.ratio_type == "segment" else None
        try:
            yield
        finally:
            self._loss_inputs = None

    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, *args: Any, **kwargs: Any) -> Any:
        """TRL's per-token log-probs; inside the loss with ``ratio_type="segment"``, each model token's
        log-prob ``lp`` becomes ``old + mean over its turn of (lp - old)``, so that TRL's token ratio
        ``exp(lp' - old)`` is the turn's ratio: the geometric mean of its token ratios, clipped per
        turn by TRL's clipping, its gradient shared by the turn's tokens (GSPO's sequence ratio, per
        turn). Environment tokens are left alone (they are out of the loss)."""
        logps, *rest = self._scored(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        inputs = self._loss_inputs
        if inputs is not None and "turn_ids" in inputs:
            old = inputs.get("old_per_token_logps")
            old = logps.detach() if old is None else old
            mask = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
            logps = torch.where(mask.bool(), old + segment_mean(logps - old, inputs["turn_ids"], mask), logps)
        return (logps, *rest)

    def _scored(self, model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, batch_size: int | None = None, compute_entropy: bool = False, **kwargs: Any) -> Any:
        """TRL's ``_get_per_token_logps_and_entropies``; with ``share_prompt_forward`` (text rows, no
        MoE aux loss) each chunk of ``batch_size`` rows runs each distinct prompt once
        (:func:`~envhub_trl.shared_prompts.shared_prompt_logps`). With ``max_forward_tokens`` a chunk
        holds at most that many tokens, and inside a training step's loss the chunks run without
        gradients, their backward deferred to the end of the step (:mod:`envhub_trl.chunked_loss`)."""
        beyond_text = any(value is not None and value is not False for value in kwargs.values())  # images, an MoE aux loss
        shared = self.args.share_prompt_forward and not beyond_text and input_ids.shape[1] - logits_to_keep >= 2
        chunked = self._chunked if torch.is_grad_enabled() and not beyond_text else None
        if self.args.max_forward_tokens is not None:
            batch_size = max(1, min(batch_size or input_ids.size(0), self.args.max_forward_tokens // input_ids.shape[1]))
        if not shared and chunked is None:
            self._prompt_pass_width = None
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, **kwargs)
        self._prompt_pass_width = input_ids.shape[1] - logits_to_keep - 1 if shared else None
        parent = super()._get_per_token_logps_and_entropies

        def forward(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, int]:
            with self.accelerator.autocast():
                if shared:
                    return shared_prompt_logps(model, ids, mask, logits_to_keep, compute_entropy)
                logps, entropies, _ = parent(model, ids, mask, logits_to_keep, None, compute_entropy)
                return logps, entropies, 0

        batch_size = batch_size or input_ids.size(0)
        logps, entropies, prompts = [], [], 0
        for start in range(0, input_ids.size(0), batch_size):
            rows = (input_ids[start : start + batch_size], attention_mask[start : start + batch_size])
            chunk, entropy, distinct = forward(*rows) if chunked is None else chunked.forward(forward, *rows)
            logps.append(chunk)
            entropies.append(entropy)
            prompts += distinct
        mode = "train" if self.model.training else "eval"
        if shared:
            self.log_metrics(mode, {"perf/rows_per_prompt_forward": input_ids.size(0) / max(prompts, 1)})
        if chunked is not None:
            self.log_metrics(mode, {"perf/loss_forward_chunks": float(len(logps))})
        return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

    def loss_reads_hidden_states(self) -> bool:
        """Whether the loss reads the final hidden states besides the log-probs (a subclass's critic)."""
        return False

    @contextlib.contextmanager
    def loss_in_chunks(self, model: Any) -> Iterator[None]:
        """Within the block, the loss's forward passes run in chunks without gradients
        (:meth:`_scored`); when the block ends (after the loss's backward), each chunk runs its own
        backward (:class:`~envhub_trl.chunked_loss.ChunkedLoss`)."""
        self._chunked = ChunkedLoss(final_norm(model) if self.loss_reads_hidden_states() else None)
        try:
            yield
            started = time.perf_counter()
            self._chunked.backward()
            self._add_step_time(time.perf_counter() - started)
        finally:
            self._chunked = None

    def _add_step_time(self, seconds: float) -> None:
        """Count ``seconds`` spent after TRL's training step (the chunks' backward) in TRL's
        ``step_time``: on the step it logged if the micro-step just ended an optimizer step, else
        on the one being timed."""
        logged = self._metrics["train"]["step_time"]
        if logged and self._step % self.current_gradient_accumulation_steps == 0:
            logged[-1] += seconds
        else:
            self._current_train_step_time += seconds

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """TRL's training step; with ``max_forward_tokens``, the loss's chunks' backward after the
        loss's own, before the optimizer steps."""
        if self.args.max_forward_tokens is None:
            return super().training_step(model, inputs, num_items_in_batch)
        with self.loss_in_chunks(model):
            return super().training_step(model, inputs, num_items_in_batch)

    def sequence_states(self, hidden: list[torch.Tensor]) -> torch.Tensor:
        """The final hidden states :func:`~envhub_trl.critic.captured_hidden_states` captured over
        one scoring of the rows, ``(rows, length, size)`` in the rows' (prompt + completion) layout,
        where :func:`~envhub_trl.loss_inputs.choice_points` and
        :func:`~envhub_trl.critic.value_positions` read them.

        TRL's scoring runs each chunk of rows once. With ``share_prompt_forward`` each chunk ran its
        distinct prompts less their last token, then its rows from that token on: the second pass
        holds every position a turn's choice or value is read at (the last prompt token and after),
        and the positions before it are left zero here (nothing reads them)."""
        if self._prompt_pass_width is None:
            return hidden[0] if len(hidden) == 1 else torch.cat(hidden)
        return torch.nn.functional.pad(torch.cat(hidden[1::2]), (0, 0, self._prompt_pass_width, 0))

    # ------------------------------------------------------------------ checkpoints

    def on_checkpoint(self, folder: Path) -> None:
        """Write envhub's files into the checkpoint folder ``folder`` before the Trainer's."""

    def on_save(self, folder: str) -> None:
        """Save envhub's files beside a saved model in ``folder`` (every checkpoint, ``save_model``)."""

    def on_load(self, folder: str) -> None:
        """Load envhub's files from a checkpoint folder, after the Trainer loaded its own."""

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``transformers.Trainer.train``; from a checkpoint at the run's last step, the checkpoint
        loaded as the finished run's state and weights, with no step trained."""
        if isinstance(resume_from_checkpoint, str):
            state = TrainerState.load_from_json(str(Path(resume_from_checkpoint) / "trainer_state.json"))
            last = self.args.max_steps if self.args.max_steps > 0 else state.max_steps
            if state.global_step >= last:
                self.state = state
                self._load_from_checkpoint(resume_from_checkpoint)
                return TrainOutput(state.global_step, 0.0, {})
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def checkpoint_bytes(self) -> int:
        """About what a checkpoint takes on the disk: the model's weights and the optimizer's state."""
        tensors = list(self.accelerator.unwrap_model(self.model).state_dict().values())
        if self.optimizer is not None:
            tensors += [v for state in self.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
        return run_files.tensor_bytes(tensors)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        run_dir = Path(self._get_output_dir(trial=trial))
        folder = run_dir / f"checkpoint-{self.state.global_step}"
        staging = run_files.partial_path(folder)
        earlier = [p for p in run_state.checkpoints(run_dir) if p != folder]
        need = max([run_files.folder_bytes(earlier[-1])] if earlier else [self.checkpoint_bytes()])
        then = f"free some space; {earlier[-1].name} is whole and --resume continues from it" if earlier else run_files.RUN_AGAIN
        if self.accelerator.is_main_process:
            run_files.discard_partial(folder)
        self.accelerator.wait_for_everyone()
        with run_files.room_errors(folder, need, then):
            try:
                # envhub's files, then the Trainer's, into the staging folder; renamed once all are whole.
                self.on_checkpoint(staging)
                self._get_output_dir = lambda trial=None: str(staging.parent)
                try:
                    super()._save_checkpoint(model, trial)
                finally:
                    del self._get_output_dir
                self.accelerator.wait_for_everyone()
                if self.accelerator.is_main_process:
                    run_files.commit(folder)
            except BaseException:
                run_files.discard_partial(folder)
                raise
        if self.args.should_save:
            rotate_checkpoints(str(run_dir), self.args.save_total_limit, self.state.best_model_checkpoint, use_mtime=True)

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        super()._save(output_dir, state_dict)
        self.on_save(output_dir if output_dir is not None else self.args.output_dir)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.on_load(resume_from_checkpoint)


# ---------------------------------------------------------------------- run state (envhub_trl.run_state)


def set_micro_step(trainer: Any, step: int) -> None:
    trainer._step = step


def buffered_inputs(trainer: Any) -> Any:
    """The generation batch ``trainer`` is training on (None before the first)."""
    return trainer._buffered_inputs


def set_buffered_inputs(trainer: Any, inputs: Any) -> None:
    trainer._buffered_inputs = inputs


def pending_metrics(trainer: Any) -> dict[str, list[float]]:
    """The training metrics gathered since the last log line (which that line averages)."""
    return {name: list(values) for name, values in trainer._metrics["train"].items()}


def set_pending_metrics(trainer: Any, metrics: Mapping[str, list[float]]) -> None:
    for name, values in metrics.items():
        trainer._metrics["train"][name] = list(values)
