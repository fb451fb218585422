"""Supervised warm start on expert episodes, token-exact, before RL.

The expert's episodes are rolled out through the same manager and chat rendering as training, so
the tokens the model learns from are exactly those it will see; the loss covers the reply tokens
only (``env_mask`` 1), as in the RL phase.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from envhub.generation import Completion, ExpertGenerator, Generator, Prompt, RandomGenerator, RandomMappingGenerator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.settings import EnvSettings
from envhub.rollout import Sample, Trajectory, rollout, to_samples


#: Whose moves a warm start imitates: the env's oracle, a uniformly random legal mover, or a fixed
#: random function of the observation (format-only starts: the reply format is learnt, nothing of the task).
DEMONSTRATORS = ("expert", "random", "random-mapping")


def expert_samples(
    tokenizer: Any,
    settings: EnvSettings,
    seeds: Sequence[int],
    epsilon: float = 0.0,
    seed: int = 0,
    demonstrator: str = "expert",
    mapping_share: float = 1.0,
    world_model: bool = False,
) -> list[Sample]:
    """The demonstrator's episodes on ``seeds`` as samples, played and laid out as ``settings`` say.

    ``demonstrator="expert"``: the env's oracle. With ``epsilon`` it takes a uniformly random legal
    move that often (noise seeded with ``seed``). Those moves are played but not imitated (their
    tokens get ``env_mask`` 0, as in DART, Laskey et al. 2017): the samples show states off the
    expert's path, such as dead ends, each labelled with the expert's move out of it.

    ``demonstrator="random"``: a uniformly random legal mover (seeded with ``seed``), every move
    imitated. The samples teach the reply format and nothing of the task; ``epsilon`` does not
    apply. Its moves are independent of what the model is shown, so imitating them teaches the
    model to ignore its observation (bench/view_reading.py measures exactly 0 nats between view and
    move after such a start on FrozenLake).

    ``demonstrator="random-mapping"``: a fixed random function of the prompt picks a legal move
    (:class:`~envhub.generation.RandomMappingGenerator`, keyed with ``seed``), every move imitated:
    still nothing of the task (uniform moves across observations), but each move depends on what
    was shown, so the model learns to read its observation, as an instruct model does.

    ``world_model``: besides, the samples of :func:`world_model_samples`: after each move, the
    observation it led to, learnt as the env's answer.
    """
    if demonstrator not in DEMONSTRATORS:
        raise ValueError(f"unknown demonstrator {demonstrator!r}; choose one of {list(DEMONSTRATORS)}")
    manager = EnvGroupManager.from_settings(settings, len(seeds), 1, tokenizer=tokenizer)
    if demonstrator == "random":
        player: Generator = RandomGenerator(seed=seed, tokenizer=tokenizer)
    elif demonstrator == "random-mapping":
        player = RandomMappingGenerator(seed=seed, tokenizer=tokenizer, share=mapping_share)
    else:
        player = ExpertGenerator(epsilon=epsilon, seed=seed, tokenizer=tokenizer)
    with manager:
        trajectories = rollout(manager, player, SamplingParams(), seeds=list(seeds))
    samples = []
    for sample in to_samples(trajectories):
        turns = trajectories[sample.trajectory_index].turns
        imitated = [demonstrator != "expert" or turn.action == turn.expert_action for turn in turns]
        mask = [int(m and imitated[turn]) for m, turn in zip(sample.env_mask, sample.turn_ids)]
        if any(mask):
            samples.append(dataclasses.replace(sample, env_mask=mask))
    return samples + (world_model_samples(trajectories, tokenizer) if world_model else [])


def world_model_samples(trajectories: Sequence[Trajectory], tokenizer: Any) -> list[Sample]:
    """Samples that teach what each move does: the loss on the observation that followed a move,
    given the context and the move (a world model, as SPA's cold start, Chen et al. 2025; no
    oracle, any demonstrator's moves will do). To predict where a move leads, a model has to read
    the observation it was made in, which imitating a random mover never asks of it.

    In the step layout, one sample per turn that has a next one: its prompt, its reply (out of
    the loss) and the next observation's tokens (in it). In the trajectory layout, the episode's
    sample with the loss on the environment's tokens after the first reply instead of on the
    replies. Episodes' last observations are not kept, so a final move teaches nothing.
    """
    samples = []
    for trajectory in trajectories:
        if not trajectory.turns:
            continue
        if trajectory.layout == "trajectory":
            sample = trajectory.sample()
            first = sample.env_mask.index(1) if 1 in sample.env_mask else len(sample.env_mask)
            mask = [int(k > first and not model) for k, model in enumerate(sample.env_mask)]
            if any(mask):
                samples.append(dataclasses.replace(sample, env_mask=mask))
            continue
        for sample, turn, after in zip(trajectory.step_samples(), trajectory.turns, trajectory.turns[1:]):
            following = tokenizer.encode(after.observation, add_special_tokens=False)
            samples.append(
                dataclasses.replace(
                    sample, completion_ids=sample.completion_ids + following, env_mask=[0] * len(turn.completion_ids) + [1] * len(following),
                    logprobs=sample.logprobs + [0.0] * len(following), turn_ids=sample.turn_ids + [turn.index] * len(following),
                )
            )
    return samples


class ExpertRelabeller:
    """Plays a student generator and records, for every prompt it answers, the expert's reply to
    that prompt: DAgger's data (Ross et al. 2011), the states the student visits, each labelled
    with the oracle's move.

    The manager fills ``Prompt.expert_action`` for it (``uses_expert``), and the label is the
    :class:`~envhub.generation.ExpertGenerator`'s reply, token-exact as a demonstration's. Each
    label is a sample whose prompt is the whole context the student saw (the conversation so far
    in the trajectory layout, the step window in the step layout), so the model learns the way
    out of the states its own mistakes lead to, such as dead ends the expert never enters.

    Args:
        student: the generator that plays (the model being warm-started).
        tokenizer: the model's tokenizer (labels are its token ids).
    """

    uses_expert = True

    def __init__(self, student: Generator, tokenizer: Any):
        self.student = student
        self.expert = ExpertGenerator(tokenizer=tokenizer)
        self.samples: list[Sample] = []

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[Completion]:
        """The student's replies; the expert's replies to the same prompts are kept in ``samples``."""
        for prompt, label in zip(prompts, self.expert.generate(prompts, sampling)):
            ids = list(label.token_ids)
            self.samples.append(
                Sample(
                    prompt_ids=list(prompt.token_ids), completion_ids=ids, env_mask=[1] * len(ids), logprobs=[0.0] * len(ids),
                    turn_ids=[0] * len(ids), group_id=0, trajectory_index=len(self.samples),
                )
            )
        return self.student.generate(prompts, sampling)


def relabelled_samples(
    student: Generator,
    tokenizer: Any,
    settings: EnvSettings,
    seeds: Sequence[int],
    temperature: float = 1.0,
    seed: int = 0,
) -> tuple[list[Sample], list[Trajectory]]:
    """The student's episodes on ``seeds`` (sampled at ``temperature``, replies of up to the
    settings' ``max_turn_tokens``, else 64), every turn labelled with the expert's reply: one
    sample per turn (:class:`ExpertRelabeller`), and the trajectories."""
    manager = EnvGroupManager.from_settings(settings, len(seeds), 1, tokenizer=tokenizer)
    relabeller = ExpertRelabeller(student, tokenizer)
    sampling = SamplingParams(max_new_tokens=settings.max_turn_tokens or 64, temperature=temperature, seed=seed)
    with manager:
        trajectories = rollout(manager, relabeller, sampling, seeds=list(seeds))
    return relabeller.samples, trajectories


def trainable_parameters(model: Any) -> list[Any]:
    """The parameters an optimizer should hold: those with ``requires_grad`` (every one of a plain
    model; a LoRA model's adapter, its base frozen)."""
    return [p for p in model.parameters() if p.requires_grad]


def supervised_steps(
    model: Any,
    samples: Sequence[Sample],
    steps: int,
    *,
    batch_size: int = 16,
    learning_rate: float = 1e-3,
    pad_id: int = 0,
    seed: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
    lr_schedule: str = "constant",
    warmup_steps: int = 0,
    max_grad_norm: float = 0.0,
    bf16: bool = False,
) -> list[float]:
    """Train ``model`` for ``steps`` AdamW steps of cross-entropy on the samples' reply tokens.

    Each step draws ``batch_size`` samples at random (from ``seed``). ``optimizer`` continues an
    earlier call's (None: a fresh AdamW at ``learning_rate``). The learning rate of step ``i``
    is ``learning_rate * lr_factor(i, steps, lr_schedule, warmup_steps)``; ``max_grad_norm > 0``
    clips the gradient's norm. ``bf16`` runs the forward pass under bf16 autocast (mixed
    precision, the weights and the optimizer's state staying as they are), as the RL phase does
    with the trainer's ``bf16``. Returns each step's loss.
    """
    if not samples:
        raise ValueError("no samples to learn from")
    rng = np.random.default_rng(seed)
    device = next(model.parameters()).device
    optimizer = optimizer if optimizer is not None else torch.optim.AdamW(trainable_parameters(model), lr=learning_rate)
    model.train()
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate * lr_factor(step, steps, lr_schedule, warmup_steps)
        batch = [samples[i] for i in rng.integers(len(samples), size=batch_size)]
        width = max(len(s.prompt_ids) + len(s.completion_ids) for s in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, s in enumerate(batch):
            tokens = torch.tensor(s.prompt_ids + s.completion_ids)
            ids[row, : len(tokens)] = tokens
            attention[row, : len(tokens)] = 1
            mask = torch.tensor([0] * len(s.prompt_ids) + list(s.env_mask), dtype=torch.bool)
            labels[row, : len(tokens)] = torch.where(mask, tokens, torch.tensor(-100))
        with torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = model(input_ids=ids.to(device), attention_mask=attention.to(device), labels=labels.to(device)).loss
        optimizer.zero_grad()
        loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
    return losses


#: The learning-rate schedules of the warm start (:func:`lr_factor`).
LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(step: int, steps: int, schedule: str = "constant", warmup_steps: int = 0) -> float:
    """The learning rate's multiplier at ``step`` (from 0) of ``steps``: a linear warm-up over the
    first ``warmup_steps`` (from ``1 / (warmup_steps + 1)`` to 1), then ``constant`` (1),
    ``linear`` (down to 0 at the last step's end) or ``cosine`` (half a cosine, down to 0)."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; known: {list(LR_SCHEDULES)}")
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """Supervised steps on a demonstrator's episodes before RL: the ``warm_start`` mapping of an
    ``envhub train`` config file (``envhub train --warm-start-*`` flags override its keys).

    Attributes:
        demonstrator: ``expert`` (the env's oracle), ``random`` (a uniformly random legal mover,
            every move imitated) or ``random-mapping`` (a fixed random function of the observation
            picks each legal move): format-only starts, from which RL alone must learn the task
            (:func:`expert_samples`). DAgger rounds always label with the expert.
        mapping_share: with ``random-mapping``, how often the mapping picks the move (otherwise a
            uniformly random legal move, imitated too): below 1, each observation's moves follow a
            random distribution instead of one move, and the start keeps exploring.
        world_model: also learn, after each demonstrated move, the observation it led to
            (:func:`world_model_samples`; as many samples again, drawn from one pool). With a
            format-only demonstrator the start still knows nothing of the task, but it reads
            its observation.
        steps: AdamW steps of cross-entropy on the demonstrator's replies (0: no warm start).
        episodes: demonstrator episodes, on training seeds ``0 .. episodes - 1``.
        learning_rate: the AdamW learning rate. At 1e-3 the tiny model fitted the moves to the
            turn number at training seed 1 and never read its view; 3e-4 read at seeds 0 and 1,
            not at seed 2 (validation seeds, see the README's "Learning results").
        batch_size: samples per step.
        epsilon: the probability that the demonstrator takes a uniformly random legal move instead
            of the expert's; such moves are played, not imitated (:func:`expert_samples`). A model
            that imitates the clean expert never sees the states a mistake leads to, and gives ~0
            probability to the moves that get out of them (backing out of a FrozenLake dead end),
            which RL then cannot find: it only reinforces moves it samples.
        dagger_rounds: rounds of on-policy expert relabelling (DAgger) after the ``steps`` on the
            demonstrations: each round the model plays ``dagger_episodes`` episodes on fresh
            training seeds, every turn it plays is labelled with the expert's move
            (:class:`ExpertRelabeller`), the labels join the data, and ``dagger_steps`` more
            supervised steps train on all of it. The model learns the way out of the states its
            own mistakes lead to, which no fixed set of demonstrations shows.
        dagger_episodes: the model's episodes per round.
        dagger_steps: supervised steps after each round (one optimizer throughout).
        dagger_temperature: the temperature the model plays at while its states are collected
            (1: the states RL's sampling will visit; 0: those greedy play visits).
        lr_schedule: ``constant``, ``linear`` or ``cosine`` (:func:`lr_factor`): how the learning
            rate falls over the ``steps`` (and again over each DAgger round's ``dagger_steps``).
            At a constant 1e-3 the loss of FrozenLake's warm start kept spiking to the end, and
            the step it stopped at decided whether the model read its view: training seed 4 ended
            at 90.6% with one torch thread and at 0.0% with two (the same steps summed in another
            order). A learning rate that falls to 0 ends in the basin it is in.
        warmup_steps: steps of linear warm-up before the schedule.
        max_grad_norm: clip the gradient's norm to this (0: no clipping).
    """

    demonstrator: str = "expert"
    mapping_share: float = 1.0
    world_model: bool = False
    steps: int = 0
    episodes: int = 512
    learning_rate: float = 3e-4
    batch_size: int = 16
    epsilon: float = 0.0
    dagger_rounds: int = 0
    dagger_episodes: int = 64
    dagger_steps: int = 100
    dagger_temperature: float = 1.0
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    max_grad_norm: float = 0.0

    def __post_init__(self) -> None:
        if self.demonstrator not in DEMONSTRATORS:
            raise ValueError(f"warm_start.demonstrator must be one of {list(DEMONSTRATORS)}, got {self.demonstrator!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"warm_start.lr_schedule must be one of {list(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if not isinstance(self.world_model, bool):
            raise ValueError(f"warm_start.world_model must be true or false, got {self.world_model!r}")
        kinds = {f.name: int if f.type in ("int", int) else float for f in dataclasses.fields(self) if f.type not in ("str", str, "bool", bool)}
        for name, kind in kinds.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
                raise ValueError(f"warm_start.{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
            object.__setattr__(self, name, kind(value))
        if self.steps < 0 or self.episodes < 1 or self.batch_size < 1 or self.learning_rate <= 0:
            raise ValueError("warm_start needs steps >= 0, episodes >= 1, batch_size >= 1 and learning_rate > 0")
        if not 0.0 <= self.mapping_share <= 1.0:
            raise ValueError(f"warm_start.mapping_share is a probability, between 0 and 1; got {self.mapping_share}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"warm_start.epsilon is a probability, between 0 and 1; got {self.epsilon}")
        if self.warmup_steps < 0 or self.max_grad_norm < 0:
            raise ValueError("warm_start needs warmup_steps >= 0 and max_grad_norm >= 0 (0: no clipping)")
        if self.dagger_rounds < 0 or self.dagger_episodes < 1 or self.dagger_steps < 0 or self.dagger_temperature < 0:
            raise ValueError(
                "warm_start needs dagger_rounds >= 0, dagger_episodes >= 1, dagger_steps >= 0 and dagger_temperature >= 0"
            )

    @property
    def active(self) -> bool:
        """Whether the warm start trains at all (supervised steps or DAgger rounds)."""
        return bool(self.steps or self.dagger_rounds)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> "WarmStart":
        """From a config file's ``warm_start`` mapping; numbers written as strings (PyYAML reads
        ``1e-3`` as one) are converted, and an unknown key is an error that lists the known ones."""
        if values is None:
            return cls()
        if not isinstance(values, Mapping):
            raise ValueError(f"warm_start must be a mapping of {[f.name for f in dataclasses.fields(cls)]}, got {values!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            from envhub_trl.config_file import unknown_keys_message

            raise ValueError(f"{unknown_keys_message(unknown, known, 'warm_start key')}; known: {sorted(known)}")
        converted = {}
        for key, value in values.items():
            if isinstance(value, str) and key not in ("lr_schedule", "demonstrator", "world_model"):
                try:
                    value = float(value)
                except ValueError:
                    raise ValueError(f"warm_start.{key} must be a number, got {value!r}") from None
            converted[key] = value
        return cls(**converted)

    def run(self, model: Any, tokenizer: Any, settings: EnvSettings, seed: int = 0, bf16: bool = False) -> list[float]:
        """Train ``model`` on the demonstrator's episodes of the env ``settings`` describe (noise
        and batches seeded with ``seed``); returns each step's loss (empty when it is not
        :attr:`active`). The settings' ``max_turn_tokens`` (the run's ``max_turn_tokens``) bounds
        the model's replies when it plays (DAgger rounds). ``bf16``: the run's mixed precision
        (:func:`supervised_steps`)."""
        return self.run_on(model, tokenizer, [settings], seed, bf16=bf16)

    def run_on(
        self,
        model: Any,
        tokenizer: Any,
        envs: Sequence[EnvSettings],
        seed: int = 0,
        on_round: Any = None,
        bf16: bool = False,
    ) -> list[float]:
        """:meth:`run` on a mix: ``episodes`` demonstrator episodes of each env's settings,
        drawn from in one pool; each DAgger
        round plays ``dagger_episodes`` of each env. ``on_round(round, trajectories)`` is called
        with each round's episodes (the model's play before that round's steps)."""
        if not self.active:
            return []
        samples = [
            sample
            for settings in envs
            for sample in expert_samples(
                tokenizer, settings, range(self.episodes), epsilon=self.epsilon, seed=seed, demonstrator=self.demonstrator,
                mapping_share=self.mapping_share, world_model=self.world_model,
            )
        ]
        train = self._train_settings(model, tokenizer, bf16)
        losses = supervised_steps(model, samples, self.steps, seed=seed, **train) if self.steps else []
        if self.dagger_rounds:
            from envhub_trl.generators import backend

            student = backend("hf").build(model, tokenizer, None, batch_size=max(64, self.dagger_episodes))
        for round_ in range(self.dagger_rounds):
            # Fresh training seeds each round, after the demonstrations' (all below the held-out offset).
            first = self.episodes + round_ * self.dagger_episodes
            played = []
            for settings in envs:
                labelled, trajectories = relabelled_samples(
                    student, tokenizer, settings, range(first, first + self.dagger_episodes),
                    temperature=self.dagger_temperature, seed=seed + round_,
                )
                samples.extend(labelled)
                played.extend(trajectories)
            if on_round is not None:
                on_round(round_, played)
            losses += supervised_steps(model, samples, self.dagger_steps, seed=seed + round_ + 1, **train)
        return losses

    def _train_settings(self, model: Any, tokenizer: Any, bf16: bool) -> dict[str, Any]:
        """:func:`supervised_steps`' settings, with one optimizer for every call that shares them."""
        return dict(
            batch_size=self.batch_size, pad_id=tokenizer.pad_token_id, learning_rate=self.learning_rate,
            optimizer=torch.optim.AdamW(trainable_parameters(model), lr=self.learning_rate),
            lr_schedule=self.lr_schedule, warmup_steps=self.warmup_steps, max_grad_norm=self.max_grad_norm, bf16=bf16,
        )

    def train_on(self, model: Any, tokenizer: Any, samples: Sequence[Sample], seed: int = 0, bf16: bool = False) -> list[float]:
        """The ``steps`` supervised steps on given ``samples`` (an agent's sessions with a random tool
        caller: :func:`envhub_trl.proxy.agents.format_samples`); returns each step's loss."""
        return supervised_steps(model, samples, self.steps, seed=seed, **self._train_settings(model, tokenizer, bf16)) if self.steps else []

    def describe(self) -> str:
        """In words, for progress messages."""
        schedule = ""
        if self.lr_schedule != "constant" or self.warmup_steps:
            warmup = f", {self.warmup_steps} warm-up steps" if self.warmup_steps else ""
            schedule = f" ({self.lr_schedule} learning rate{warmup})"
        noise = f", the expert taking a random move with probability {self.epsilon:g}" if self.epsilon else ""
        dagger = (
            f", then {self.dagger_rounds} DAgger rounds of {self.dagger_episodes} episodes played by the model and "
            f"labelled by the expert, {self.dagger_steps} steps each"
            if self.dagger_rounds
            else ""
        )
        steps = f"{self.steps} supervised step{'' if self.steps == 1 else 's'}"
        who = {"expert": "expert", "random": "random-mover (format-only)", "random-mapping": "random-mapping (format-only)"}[self.demonstrator]
        episodes = f"{self.episodes} {who} episode{'' if self.episodes == 1 else 's'}"
        world = ", and the observation each move led to" if self.world_model else ""
        return f"{steps}{schedule} on {episodes}{world}{noise}{dagger}"
