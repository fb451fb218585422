"""Rollout records: what an episode was, turn by turn, and the samples and arrays made from it.

A :class:`Trajectory` is one episode of one environment in a group; it holds a :class:`Turn` per
reply. :meth:`Trajectory.sample` and :meth:`Trajectory.step_samples` turn it into the token
samples a trainer consumes (the trajectory and step layouts), :func:`batch_columns` lays them out
as TRL's ``rollout_func`` returns them, :func:`step_arrays` gives the advantage estimators their
per-step inputs, and :func:`batch_metrics` sums a batch up. The turn loop that fills them is
:func:`envhub.rollout.rollout`; this module knows nothing of managers or generators.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Why an episode ended.
END_REASONS = ("terminated", "truncated", "context", "invalid", "error")


@dataclasses.dataclass(slots=True, kw_only=True)
class Turn:
    """One reply of the model and what the environment made of it.

    Attributes:
        index: the turn's number in its episode, from 0.
        user: the user message the reply answered (the rendered observation).
        observation: the observation the reply answered.
        reply: the reply's text.
        action: the first action the reply named (None when it did not parse).
        reward: the environment's reward plus the format penalty when the reply was invalid.
        env_reward: the environment's reward alone.
        action_is_valid: whether the reply parsed and named a legal action.
        format_valid: whether the reply followed the action format.
        state_key: the key of the state the reply was made in (the GiGPO anchor state).
        next_state_key: the key of the state after the reply.
        terminated: whether the episode terminated on this turn.
        truncated: whether the turn limit ended the episode on this turn.
        input_ids: the tokens before this reply that the model did not sample. In the trajectory
            layout, the environment's tokens since the previous reply (the whole first prompt on
            turn 0); in the step layout, the whole windowed prompt. Empty without a tokenizer.
        completion_ids: the sampled token ids, exactly as the generator returned them.
        logprobs: their sampling log-probabilities.
        finish_reason: the generator's finish reason (``"stop"`` or ``"length"``).
        invalid_reason: why the reply was invalid, else None.
        expert_action: the environment's oracle action in the state the reply was made in, when
            the generator asked for it (``uses_expert``), else None.
        env_messages: the messages the reply answered when they are not one user message with
            ``user`` (a tool env's ``tool`` messages, one per result); empty otherwise.
        valid_actions: the legal actions the env offered in the state the reply was made in, or
            None where it does not list them (free-form actions).
    """

    index: int
    user: str
    observation: str
    reply: str
    action: str | None
    reward: float
    env_reward: float
    action_is_valid: bool
    format_valid: bool
    state_key: str
    next_state_key: str
    terminated: bool = False
    truncated: bool = False
    input_ids: Sequence[int] = ()
    completion_ids: Sequence[int] = ()
    logprobs: Sequence[float] = ()
    finish_reason: str = "stop"
    invalid_reason: str | None = None
    expert_action: str | None = None
    env_messages: tuple[dict[str, str], ...] = ()
    valid_actions: Sequence[str] | None = None

    @property
    def messages(self) -> list[dict[str, str]]:
        """The messages before the reply (one user message, or a tool env's tool messages)."""
        return list(self.env_messages) if self.env_messages else [{"role": "user", "content": self.user}]


@dataclasses.dataclass(kw_only=True)
class Sample:
    """One training sample: a prompt and a completion in which some tokens are the model's.

    Attributes:
        prompt_ids: the prompt's token ids.
        completion_ids: every token after the prompt: the model's and, in the trajectory layout,
            the environment's between turns.
        env_mask: 1 where ``completion_ids`` holds a sampled (model) token, 0 on environment
            tokens (TRL's ``env_mask``).
        logprobs: the sampling log-probability of each completion token (0.0 on environment tokens).
        turn_ids: the turn each completion token belongs to; environment tokens carry the index of
            the turn they follow. A per-turn quantity ``x`` becomes per-token as ``x[turn_ids]``.
        group_id: the environment group of the episode.
        trajectory_index: the episode's index in the batch.
        turn_index: the turn (step layout) or None (trajectory layout: every turn).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float]
    turn_ids: list[int]
    group_id: int
    trajectory_index: int
    turn_index: int | None = None


@dataclasses.dataclass(kw_only=True)
class Trajectory:
    """One episode of one environment of a group.

    Attributes:
        env_id: the environment's id.
        group_id: the group (all members of a group start from the same seed).
        member: the index within the group.
        seed: the reset seed.
        index: the episode's index in the batch (``group_id * group_size + member``).
        layout: ``"trajectory"`` or ``"step"``, how the prompts were built.
        system: the system message.
        turns: one record per reply.
        terminated: the environment ended the episode.
        truncated: the turn limit or the context budget ended it.
        success: whether the task was accomplished.
        error: the environment's error, when it raised (the episode ends there).
        end_reason: one of ``END_REASONS``, or None while the episode runs.
        tools: a tool env's tool schemas (the ``tools=`` of the chat template), else None.
    """

    env_id: str
    group_id: int
    member: int
    seed: int
    index: int
    layout: str = "trajectory"
    system: str = ""
    turns: list[Turn] = dataclasses.field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    success: bool = False
    error: str | None = None
    end_reason: str | None = None
    #: The user message awaiting a reply while the episode runs (None once it has ended).
    pending_user: str | None = None
    #: The messages awaiting a reply when they are not one user message (tool results).
    pending_env_messages: tuple[dict[str, str], ...] = ()
    tools: list[dict[str, Any]] | None = None

    @property
    def messages(self) -> list[dict[str, str]]:
        """The conversation as chat messages: system, then user and assistant for each turn.

        A finished episode ends with the assistant's last reply; a running one with the pending
        user message.
        """
        messages = [{"role": "system", "content": self.system}]
        for turn in self.turns:
            if turn.env_messages:
                messages.extend(turn.env_messages)
            else:
                messages.append({"role": "user", "content": turn.user})
            messages.append({"role": "assistant", "content": turn.reply})
        if self.pending_user is not None:
            if self.pending_env_messages:
                messages.extend(self.pending_env_messages)
            else:
                messages.append({"role": "user", "content": self.pending_user})
        return messages

    @property
    def episode_return(self) -> float:
        """The sum of the turns' rewards (format penalties included)."""
        return float(sum(turn.reward for turn in self.turns))

    @property
    def num_turns(self) -> int:
        """How many replies the episode had."""
        return len(self.turns)

    @property
    def rewards(self) -> list[float]:
        """Each turn's reward."""
        return [turn.reward for turn in self.turns]

    @property
    def state_keys(self) -> list[str]:
        """The key of the state each turn's reply was made in."""
        return [turn.state_key for turn in self.turns]

    def sample(self) -> Sample:
        """The episode as one sample (trajectory layout): turns concatenated token by token.

        Raises:
            ValueError: if the episode was not rolled out in the trajectory layout with a tokenizer.
        """
        if self.layout != "trajectory":
            raise ValueError(f"episode {self.index} was rolled out in the {self.layout} layout; use step_samples()")
        if not self.turns or len(self.turns[0].input_ids) == 0:
            raise ValueError(f"episode {self.index} has no token ids; give the manager a tokenizer")
        completion: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        turn_ids: list[int] = []
        for turn in self.turns:
            if turn.index > 0:
                completion.extend(turn.input_ids)
                mask += [0] * len(turn.input_ids)
                logprobs += [0.0] * len(turn.input_ids)
                turn_ids += [turn.index - 1] * len(turn.input_ids)
            completion.extend(turn.completion_ids)
            mask += [1] * len(turn.completion_ids)
            logprobs.extend(turn.logprobs)
            turn_ids += [turn.index] * len(turn.completion_ids)
        return Sample(
            prompt_ids=list(self.turns[0].input_ids),
            completion_ids=completion,
            env_mask=mask,
            logprobs=logprobs,
            turn_ids=turn_ids,
            group_id=self.group_id,
            trajectory_index=self.index,
        )

    def step_samples(self) -> list[Sample]:
        """The episode as one sample per turn (step layout): each turn's windowed prompt and reply.

        Raises:
            ValueError: if the episode was not rolled out in the step layout with a tokenizer.
        """
        if self.layout != "step":
            raise ValueError(f"episode {self.index} was rolled out in the {self.layout} layout; use sample()")
        if self.turns and len(self.turns[0].input_ids) == 0:
            raise ValueError(f"episode {self.index} has no token ids; give the manager a tokenizer")
        return [
            Sample(
                prompt_ids=list(turn.input_ids),
                completion_ids=list(turn.completion_ids),
                env_mask=[1] * len(turn.completion_ids),
                logprobs=list(turn.logprobs),
                turn_ids=[turn.index] * len(turn.completion_ids),
                group_id=self.group_id,
                trajectory_index=self.index,
                turn_index=turn.index,
            )
            for turn in self.turns
        ]


def to_samples(trajectories: Sequence[Trajectory]) -> list[Sample]:
    """Every sample of a batch, in the layout each episode was rolled out in.

    Episodes without a single turn (an environment that failed on reset) give no sample.
    """
    samples: list[Sample] = []
    for trajectory in trajectories:
        if not trajectory.turns:
            continue
        if trajectory.layout == "trajectory":
            samples.append(trajectory.sample())
        else:
            samples.extend(trajectory.step_samples())
    return samples


def context_keys(trajectory: Trajectory) -> list[str]:
    """Per turn, a key of everything the policy was shown before its reply: equal keys, equal inputs.

    In the step layout with token ids, the windowed prompt's ids (the system message, the history
    window and the observation); otherwise a digest of the system message and every message and
    reply of the episode up to this turn's message (the trajectory layout's context), hashed as it
    grows, so an episode costs its length once, not once per turn. A baseline that depends on this
    key alone keeps the policy gradient unbiased, since the reply cannot change it.
    """
    keys, seen = [], hashlib.blake2b(trajectory.system.encode(), digest_size=16)
    for turn in trajectory.turns:
        if trajectory.layout == "step" and turn.input_ids:
            keys.append("ids:" + ",".join(map(str, turn.input_ids)))
        else:
            seen.update(b"\x1f" + repr(turn.messages).encode())
            keys.append("context:" + seen.hexdigest())
        seen.update(b"\x1f" + turn.reply.encode())
    return keys


def step_arrays(trajectories: Sequence[Trajectory]) -> dict[str, np.ndarray]:
    """The batch as flat per-step arrays, the inputs of the GRPO/GiGPO estimators.

    Returns:
        ``rewards``, ``traj_index`` (0..n_traj-1, the position in ``trajectories``),
        ``step_index`` (the turn), ``state_keys`` (the state each reply was made in),
        ``context_keys`` (what the policy was shown before the reply, :func:`context_keys`), one
        entry per turn of every episode; ``traj_groups`` and ``returns``, one entry per episode.
    """
    turns = [(i, turn) for i, t in enumerate(trajectories) for turn in t.turns]
    return {
        "context_keys": np.array([key for t in trajectories for key in context_keys(t)], dtype=object),
        "rewards": np.array([turn.reward for _, turn in turns], dtype=float),
        "traj_index": np.array([i for i, _ in turns], dtype=np.int64),
        "step_index": np.array([turn.index for _, turn in turns], dtype=np.int64),
        "state_keys": np.array([turn.state_key for _, turn in turns], dtype=object),
        "traj_groups": np.array([t.group_id for t in trajectories], dtype=np.int64),
        "returns": np.array([t.episode_return for t in trajectories], dtype=float),
    }


def batch_columns(samples: Sequence[Sample]) -> dict[str, list]:
    """Samples as columns, the shape of TRL's ``rollout_func`` output.

    ``prompt_ids``, ``completion_ids``, ``logprobs`` and ``env_mask`` are what
    ``trl.GRPOTrainer`` reads; ``turn_ids``, ``group_ids``, ``trajectory_index`` and ``turn_index``
    let a trainer spread per-turn advantages over tokens (``advantage[turn_ids]``).
    """
    return {
        "prompt_ids": [s.prompt_ids for s in samples],
        "completion_ids": [s.completion_ids for s in samples],
        "logprobs": [s.logprobs for s in samples],
        "env_mask": [s.env_mask for s in samples],
        "turn_ids": [s.turn_ids for s in samples],
        "group_ids": [s.group_id for s in samples],
        "trajectory_index": [s.trajectory_index for s in samples],
        "turn_index": [s.turn_index for s in samples],
    }


def batch_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Aggregate a batch of episodes.

    Returns:
        ``success_rate``, ``mean_return``, ``invalid_action_rate`` (invalid replies over all
        replies), ``mean_turns``, ``reward_std_per_group`` (the mean over groups of the standard
        deviation of returns within a group; near 0 means GRPO has little signal),
        ``zero_std_group_fraction``, ``truncated_rate``, ``error_rate``,
        ``mean_completion_tokens`` (tokens per reply, 0 without a tokenizer) and
        ``invalid_end_rate`` (episodes ended after too many invalid replies in a row, see
        ``EnvGroupManager``'s ``max_invalid_streak``; they count as truncated too).

    Raises:
        ValueError: on an empty batch.
    """
    if not trajectories:
        raise ValueError("batch_metrics needs at least one trajectory")
    returns = np.array([t.episode_return for t in trajectories])
    turns = sum(t.num_turns for t in trajectories)
    invalid = sum(not turn.action_is_valid for t in trajectories for turn in t.turns)
    tokens = sum(len(turn.completion_ids) for t in trajectories for turn in t.turns)
    groups: dict[int, list[float]] = {}
    for trajectory, value in zip(trajectories, returns):
        groups.setdefault(trajectory.group_id, []).append(float(value))
    stds = np.array([np.std(values) for values in groups.values()])
    return {
        "success_rate": float(np.mean([t.success for t in trajectories])),
        "mean_return": float(returns.mean()),
        "invalid_action_rate": invalid / turns if turns else 0.0,
        "mean_turns": turns / len(trajectories),
        "reward_std_per_group": float(stds.mean()),
        "zero_std_group_fraction": float(np.mean(stds < 1e-8)),
        "truncated_rate": float(np.mean([t.truncated for t in trajectories])),
        "error_rate": float(np.mean([t.error is not None for t in trajectories])),
        "mean_completion_tokens": tokens / turns if turns else 0.0,
        "invalid_end_rate": float(np.mean([t.end_reason == "invalid" for t in trajectories])),
    }
