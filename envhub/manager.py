"""``EnvGroupManager``: ``num_groups x group_size`` environments that start each group from one seed.

GRPO and GiGPO compare several attempts at the same task, so every member of a group resets with
the same seed; group seeds come from one base seed and the batch's ``epoch``, so a validation set
is the same in every run. The manager renders each live environment's conversation as chat
messages (and token ids, given a tokenizer), applies the generator's replies through an
executor, and records a :class:`~envhub.rollout.Trajectory` per environment.

Episodes end when the environment terminates or truncates (its turn limit is ``max_turns``), when
the environment raises (recorded with the error), or when the next prompt would not fit
``max_prompt_tokens`` (recorded as truncated, end reason ``"context"``), or, with
``max_invalid_streak``, after that many invalid replies in a row (truncated, end reason
``"invalid"``: a model that cannot yet reply in format would otherwise play every turn to the limit;
the last reply also carries the format penalty of the turns left, so the cut changes no return).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envhub.actions import ReplyFormat, env_format_name, get_format
from envhub.chat import ChatRenderer, ChatTokens
from envhub.executors import EnvState, InProcessExecutor, ResetRequest, StepRequest
from envhub.generation import Completion, Prompt
from envhub.prompts import BARE_PROMPT, PromptSettings
from envhub.registration import spec
from envhub.settings import LAYOUTS, EnvSettings
from envhub.trajectory import Trajectory, Turn

#: The settings an env of a mix may set for itself (``per_env``).
PER_ENV = ("max_turns", "instructions", "system_prompt", "show_legal_actions")


def group_seeds(base_seed: int, epoch: int, num_groups: int) -> list[int]:
    """The reset seed of each group of batch ``epoch``: a pure function of ``base_seed`` and ``epoch``."""
    state = np.random.SeedSequence([base_seed, epoch]).generate_state(num_groups, dtype=np.uint32)
    return [int(s) for s in state]


class _Slot:
    """One environment's live state in the manager."""

    __slots__ = ("trajectory", "observation", "valid_actions", "expert_action", "state_key",
                 "max_turns", "renderer", "context", "next_input", "active", "tools", "fmt", "invalid_streak")

    def __init__(self, trajectory: Trajectory):
        self.trajectory = trajectory
        self.observation = ""
        self.valid_actions: list[str] | None = None
        self.expert_action: str | None = None
        self.state_key = ""
        self.max_turns: int | None = None
        self.renderer: ChatRenderer | None = None
        self.context: list[int] = []
        self.next_input: list[int] = []
        self.active = False
        #: A tool env's tool schemas, else None.
        self.tools: list[dict[str, Any]] | None = None
        self.fmt: ReplyFormat | None = None
        #: Invalid replies in a row, up to the last one.
        self.invalid_streak = 0


class EnvGroupManager:
    """Groups of environments of one id (or a mix of ids), rendered as chat, stepped in batches.

    Args:
        env_id: an environment id, or a mapping ``{env_id: number_of_groups}`` for a mix (groups
            are assigned to ids in the mapping's order, as ROLL's tags partition its envs).
        num_groups: how many groups; with a mapping, None or the mapping's total.
        group_size: environments per group, all reset with the group's seed.
        seed: the base seed every group seed is derived from.
        max_turns: the turn limit of every episode; None keeps each id's registered limit.
        env_kwargs: keyword arguments for ``envhub.make``; with a mapping of ids, a mapping from
            id to its keyword arguments.
        layout: ``"trajectory"`` (one sample per episode) or ``"step"`` (one per turn).
        tokenizer: a Hugging Face tokenizer with a chat template; None keeps the manager in text
            (no token ids), enough for model-free policies.
        prompt: what the model sees and how its replies are read (:class:`~envhub.prompts.PromptSettings`:
            instructions, system prompt, reply format, legal actions, turn count, context
            budget, history window, format penalty, unfinished replies); None:
            :data:`~envhub.prompts.BARE_PROMPT`, the defaults without a context budget. A
            budget (``max_prompt_tokens``) needs a tokenizer; ``action_format`` may also be a
            format object.
        executor: where the environments live (default: in this process).
        per_env: with a mix, settings an env id sets for itself, overriding the arguments above:
            ``max_turns``, ``instructions``, ``system_prompt``, ``show_legal_actions`` (a mix of
            FrozenLake and Sokoban needs two sets of short instructions and turn limits).
        max_invalid_streak: end an episode (truncated, end reason ``"invalid"``) after this many
            invalid replies in a row, its last reply charged ``format_penalty`` for each turn left
            too; None plays on to the turn limit.
        **prompt_fields: fields of ``prompt`` given one by one (``history_turns=1``), over
            ``prompt``'s.
    """

    def __init__(
        self,
        env_id: str | Mapping[str, int],
        num_groups: int | None = None,
        group_size: int = 8,
        *,
        seed: int = 0,
        max_turns: int | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        layout: str = "trajectory",
        tokenizer: Any | None = None,
        prompt: PromptSettings | None = None,
        executor: Any | None = None,
        per_env: Mapping[str, Mapping[str, Any]] | None = None,
        max_invalid_streak: int | None = None,
        **prompt_fields: Any,
    ):
        unknown = sorted(set(prompt_fields) - {f.name for f in dataclasses.fields(PromptSettings)})
        if unknown:
            raise TypeError(f"EnvGroupManager got unexpected keyword arguments {unknown}")
        #: What the model sees and how its replies are read (PromptSettings checks its own rules).
        self.prompt = dataclasses.replace(prompt if prompt is not None else BARE_PROMPT, **prompt_fields)
        history_turns, max_prompt_tokens = self.prompt.history_turns, self.prompt.max_prompt_tokens
        system_prompt, instructions, action_format = self.prompt.system_prompt, self.prompt.instructions, self.prompt.action_format
        show_legal_actions, show_turns = self.prompt.show_legal_actions, self.prompt.show_turns
        if isinstance(env_id, str):
            if num_groups is None:
                raise ValueError("num_groups is required with a single env id")
            partition = {env_id: num_groups}
            kwargs_by_id = {env_id: dict(env_kwargs or {})}
        else:
            partition = dict(env_id)
            if num_groups is not None and num_groups != sum(partition.values()):
                raise ValueError(f"num_groups={num_groups} disagrees with the partition {partition} (total {sum(partition.values())})")
            kwargs_by_id = {i: dict((env_kwargs or {}).get(i, {})) for i in partition}
        for i, count in partition.items():
            if count < 1:
                raise ValueError(f"every env id needs at least one group; {i} has {count}")
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if max_prompt_tokens is not None and tokenizer is None:
            raise ValueError("max_prompt_tokens counts tokens: give the manager a tokenizer too")
        if max_invalid_streak is not None and max_invalid_streak < 1:
            raise ValueError(f"max_invalid_streak must be at least 1 (or None), got {max_invalid_streak}")
        self.max_invalid_streak = max_invalid_streak
        self.specs = {i: spec(i) for i in partition}  # an unknown id fails here, with suggestions
        #: The env id of each group.
        self.group_env_ids: list[str] = [i for i, count in partition.items() for _ in range(count)]
        self.num_groups = len(self.group_env_ids)
        self.group_size = group_size
        self.seed = seed
        self.max_turns = max_turns
        self.env_kwargs = kwargs_by_id
        self.layout = layout
        self.history_turns = history_turns
        self.max_prompt_tokens = max_prompt_tokens
        self.format_penalty = float(self.prompt.format_penalty)
        self.unfinished_replies = self.prompt.unfinished_replies
        chosen = get_format(action_format) if isinstance(action_format, str) else action_format
        #: The reply format of each env id (a mix of tool and text envs plays each in its own).
        self.formats: dict[str, ReplyFormat] = {i: chosen if chosen is not None else get_format(env_format_name(s.load())) for i, s in self.specs.items()}
        #: The reply format of the first env id.
        self.fmt = self.formats[self.group_env_ids[0]]
        self.renderer = ChatRenderer(self.fmt, system_prompt, show_legal_actions, show_turns)
        self.instructions = instructions
        #: Per env id: its turn limit, instructions override and renderer.
        self._per_env = self._per_env_settings(partition, per_env or {}, max_turns)
        self.tokens = ChatTokens(tokenizer) if tokenizer is not None else None
        #: The reply prefix's token ids, at the end of every prompt (none without a tokenizer).
        self._prefix_ids: list[int] = list(self.tokens.encode(self.prompt.reply_prefix)) if self.tokens is not None and self.prompt.reply_prefix else []
        self.executor = executor if executor is not None else InProcessExecutor()
        #: Whether this batch's prompts carry the expert's action (an argument of :meth:`reset`).
        self.expert_hints = False
        #: The environments' answers to the last :meth:`reset` (one per slot) or :meth:`step` (one
        #: per prompt of that turn, in order): their info, rewards and errors as the envs gave them.
        self.last_states: list[EnvState] = []
        self._slots: list[_Slot] = []
        self._order: list[int] = []

    @classmethod
    def from_settings(
        cls,
        settings: EnvSettings | Mapping[EnvSettings, int],
        num_groups: int | None = None,
        group_size: int = 8,
        *,
        seed: int = 0,
        tokenizer: Any | None = None,
        executor: Any | None = None,
    ) -> EnvGroupManager:
        """The manager of one env's :class:`~envhub.settings.EnvSettings` (``num_groups`` groups),
        or of a mix: a mapping from each env's settings to its number of groups, in order.

        The envs of a mix may differ in env kwargs, turn limit and the prompt fields of
        :data:`~envhub.prompts.ENV_PROMPT_FIELDS`; the rest (layout, reply format, context budget,
        invalid streak...) is one per manager, as the first env's settings give it.

        Raises:
            ValueError: for a mix whose envs differ in a setting that is one per manager.
        """
        if isinstance(settings, EnvSettings):
            return cls(
                settings.env_id, num_groups, group_size, seed=seed, max_turns=settings.max_turns, env_kwargs=settings.env_kwargs,
                layout=settings.layout, tokenizer=tokenizer, prompt=settings.prompt, executor=executor,
                max_invalid_streak=settings.max_invalid_streak,
            )
        mix = list(settings.items())
        first = mix[0][0]
        shared = {name: None for name in PER_ENV if name != "max_turns"}
        def held_once(s: EnvSettings) -> tuple[Any, ...]:
            return s.layout, s.max_invalid_streak, dataclasses.replace(s.prompt, **shared)

        for own, _ in mix[1:]:
            if held_once(own) != held_once(first):
                raise ValueError(f"{own.env_id} and {first.env_id} differ in a setting a manager holds once (only {list(PER_ENV)} and env kwargs may)")
        return cls(
            {s.env_id: count for s, count in mix}, num_groups, group_size, seed=seed, env_kwargs={s.env_id: s.env_kwargs for s, _ in mix},
            per_env={s.env_id: {"max_turns": s.max_turns, **{name: getattr(s.prompt, name) for name in shared}} for s, _ in mix},
            layout=first.layout, tokenizer=tokenizer, prompt=first.prompt, executor=executor, max_invalid_streak=first.max_invalid_streak,
        )

    def _per_env_settings(
        self, partition: Mapping[str, int], per_env: Mapping[str, Mapping[str, Any]], max_turns: int | None
    ) -> dict[str, tuple[int | None, str | None, ChatRenderer]]:
        """Each env id's turn limit, instructions override and renderer: the manager's, with what
        ``per_env`` sets for that id (a renderer is shared by the ids that render alike)."""
        unknown = {i: sorted(set(values) - set(PER_ENV)) for i, values in per_env.items()}
        unknown = {i: keys for i, keys in unknown.items() if keys}
        if unknown or set(per_env) - set(partition):
            raise ValueError(
                f"per_env takes, for env ids of the mix {sorted(partition)}, the settings {list(PER_ENV)}; got {dict(per_env)}"
            )
        prompt = self.prompt
        defaults = {
            "max_turns": max_turns, "instructions": prompt.instructions, "system_prompt": prompt.system_prompt,
            "show_legal_actions": prompt.show_legal_actions,
        }
        out = {}
        renderers = {(self.fmt, prompt.system_prompt, prompt.show_legal_actions): self.renderer}
        for i in partition:
            own = {**defaults, **per_env.get(i, {})}
            key = (self.formats[i], own["system_prompt"], own["show_legal_actions"])
            renderer = renderers.get(key)
            if renderer is None:
                renderer = renderers[key] = ChatRenderer(*key, show_turns=prompt.show_turns)
            out[i] = (own["max_turns"], own["instructions"], renderer)
        return out

    @property
    def num_envs(self) -> int:
        """``num_groups * group_size``."""
        return self.num_groups * self.group_size

    @property
    def num_active(self) -> int:
        """How many episodes are still running."""
        return sum(slot.active for slot in self._slots)

    def reset(self, epoch: int = 0, seeds: Sequence[int] | None = None, expert_hints: bool = False) -> None:
        """Start a new batch: every group resets with its seed and every episode starts afresh.

        Args:
            epoch: picks the group seeds from the base seed (see :func:`group_seeds`).
            seeds: one seed per group, instead of the derived ones.
            expert_hints: fill ``Prompt.expert_action`` and ``Turn.expert_action`` with the
                environment's oracle move (for generators that use it; it costs a plan per turn).
        """
        self.expert_hints = bool(expert_hints)
        if seeds is None:
            seeds = group_seeds(self.seed, epoch, self.num_groups)
        elif len(seeds) != self.num_groups:
            raise ValueError(f"need one seed per group: {self.num_groups} groups, {len(seeds)} seeds")
        self._slots = []
        requests = []
        for group, env_id in enumerate(self.group_env_ids):
            for member in range(self.group_size):
                index = group * self.group_size + member
                trajectory = Trajectory(env_id=env_id, group_id=group, member=member, seed=int(seeds[group]), index=index, layout=self.layout)
                self._slots.append(_Slot(trajectory))
                requests.append(
                    ResetRequest(
                        slot=index,
                        spec=self.specs[env_id],
                        seed=int(seeds[group]),
                        env_kwargs=self.env_kwargs[env_id],
                        max_turns=self._per_env[env_id][0],
                        expert=self.expert_hints,
                    )
                )
        self.last_states = self.executor.reset(requests)
        for slot, state in zip(self._slots, self.last_states):
            if state.error is not None:
                self._end(slot, "error", error=state.error)
                continue
            slot.active = True
            slot.max_turns = state.max_turns
            slot.fmt = self.formats[slot.trajectory.env_id]
            slot.tools = slot.trajectory.tools = state.tools
            _, instructions, slot.renderer = self._per_env[slot.trajectory.env_id]
            # Tools reach the model through the chat template's tools= where it renders them, else
            # written into the system message (envhub.tools.tools_text).
            written_tools = state.tools if state.tools and (self.tokens is None or not self.tokens.renders_tools) else None
            slot.trajectory.system = slot.renderer.system(state.instructions if instructions is None else instructions, written_tools)
            self._observe(slot, state)
            if self.tokens is not None:
                ids = self.tokens.prompt(self._prompt_messages(slot), slot.tools) + self._prefix_ids
                slot.next_input = ids
                slot.context = list(ids) if self.layout == "trajectory" else []
                self._check_budget(slot)
        self._order = []

    def prompts(self) -> list[Prompt]:
        """The prompt of every running episode, in slot order; ``step`` takes replies in this order.

        Prompts carry token ids when the manager has a tokenizer, and the chat messages when it
        has none (for generators that talk to a chat API).
        """
        self._order = self.active_slots()
        return [self.prompt_of(i) for i in self._order]

    def active_slots(self) -> list[int]:
        """The slots whose episodes are running, in order."""
        return [i for i, slot in enumerate(self._slots) if slot.active]

    def is_active(self, slot: int) -> bool:
        """Whether the episode of ``slot`` is running."""
        return self._slots[slot].active

    def prompt_of(self, slot: int) -> Prompt:
        """The next prompt of the running episode of ``slot`` (the continuous rollout asks slot by slot)."""
        state = self._slots[slot]
        prefix, stops = self.prompt.reply_prefix, self.prompt.stop_strings
        if self.tokens is None:
            return Prompt([], self._prompt_messages(state), state.valid_actions, state.expert_action, state.tools, state.fmt, prefix, stops)
        ids = state.context if self.layout == "trajectory" else state.next_input
        return Prompt(list(ids), [], state.valid_actions, state.expert_action, state.tools, state.fmt, prefix, stops)

    def step(self, replies: Sequence[Completion | str]) -> None:
        """Apply one reply per prompt of the last ``prompts()`` call, in that order.

        A reply is a generator's :class:`Completion` (its token ids are kept as sampled) or plain
        text; text, or a completion without token ids, is tokenised here when the manager has a
        tokenizer.

        Raises:
            ValueError: if the number of replies differs from the number of prompts.
        """
        if len(replies) != len(self._order):
            raise ValueError(f"got {len(replies)} replies for {len(self._order)} prompts; call prompts() first")
        self.step_slots(self._order, replies)
        self._order = []

    def step_slots(self, slots: Sequence[int], replies: Sequence[Completion | str]) -> None:
        """Apply ``replies`` to the running episodes of ``slots`` (same order): the env steps, then
        :meth:`apply`. Any subset of the running slots may step: the continuous rollout steps
        each env as soon as its reply is done."""
        self.apply(slots, replies, self.step_states(slots, replies))

    def step_states(self, slots: Sequence[int], replies: Sequence[Completion | str]) -> list[EnvState]:
        """The env steps of ``replies`` on ``slots`` through the executor, one request per reply
        format (a mix may hold text and tool envs); the envs' answers in order. It changes nothing
        of the manager, so it may run in another thread (the continuous rollout's env threads)
        while this one records other answers with :meth:`apply`."""
        texts = [self.prompt.reply_prefix + (r if isinstance(r, str) else r.text) for r in replies]
        cut: Sequence[bool] = ()
        if self.unfinished_replies == "invalid":
            cut = [not isinstance(r, str) and r.finish_reason == "length" for r in replies]
            cut = cut if any(cut) else ()
        by_format: dict[Any, list[int]] = {}
        for position, i in enumerate(slots):
            by_format.setdefault(self._slots[i].fmt, []).append(position)
        if len(by_format) == 1:
            return self.executor.step(StepRequest(slots=list(slots), replies=texts, fmt=self._slots[slots[0]].fmt, expert=self.expert_hints, cut=cut))
        states: list[Any] = [None] * len(texts)
        for fmt, positions in by_format.items():  # a mix of reply formats: answers put back in order
            flags = [cut[p] for p in positions] if cut else ()
            request = StepRequest(slots=[slots[p] for p in positions], replies=[texts[p] for p in positions], fmt=fmt, expert=self.expert_hints, cut=flags)
            for p, state in zip(positions, self.executor.step(request)):
                states[p] = state
        return states

    def apply(self, slots: Sequence[int], replies: Sequence[Completion | str], states: Sequence[EnvState]) -> None:
        """Record the envs' answers ``states`` to ``replies`` (from :meth:`step_request` run by the
        executor): the turns, the next prompts, and the ends of episodes."""
        self.last_states = list(states)
        for i, reply, state in zip(slots, replies, states):
            self._apply(self._slots[i], reply, reply if isinstance(reply, str) else reply.text, state)

    def trajectories(self) -> list[Trajectory]:
        """Every episode of the batch in slot order (group by group, member by member)."""
        return [slot.trajectory for slot in self._slots]

    def close(self) -> None:
        """Release the executor's environments and workers."""
        self.executor.close()

    def __enter__(self) -> EnvGroupManager:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _observe(self, slot: _Slot, state: EnvState) -> None:
        slot.observation = state.observation
        slot.valid_actions = state.valid_actions
        slot.expert_action = state.expert_action
        slot.state_key = state.info["state_key"]
        trajectory = slot.trajectory
        trajectory.pending_user = slot.renderer.user(state.observation, len(trajectory.turns), slot.max_turns, state.valid_actions)

    def _prompt_messages(self, slot: _Slot) -> list[dict[str, str]]:
        trajectory = slot.trajectory
        if self.layout == "trajectory":
            return trajectory.messages
        # The step layout's window: the system message, the last history_turns turns whole
        # (a tool turn may carry several tool messages), then the messages awaiting a reply.
        messages = [{"role": "system", "content": trajectory.system}]
        for turn in trajectory.turns[len(trajectory.turns) - self.history_turns :] if self.history_turns else ():
            messages.extend(turn.messages)
            messages.append({"role": "assistant", "content": turn.reply})
        if trajectory.pending_user is not None:
            messages.extend(trajectory.pending_env_messages or ({"role": "user", "content": trajectory.pending_user},))
        return messages

    def _apply(self, slot: _Slot, reply: Completion | str, text: str, state: EnvState) -> None:
        trajectory = slot.trajectory
        if state.error is not None:
            self._end(slot, "error", error=state.error)
            return
        info = state.info
        valid = info["action_is_valid"]
        reward = state.reward
        if isinstance(reply, str) or not reply.token_ids:
            # Text with no sampled ids (a model-free policy): tokenised, so the context holds it.
            ids: Sequence[int] = self.tokens.encode(text) if self.tokens is not None else ()
            logprobs: Sequence[float] = [0.0] * len(ids) if ids else ()
            finish = "stop"
        else:
            ids, logprobs, finish = reply.token_ids, reply.logprobs, reply.finish_reason
        trajectory.turns.append(
            Turn(
                index=len(trajectory.turns),
                user=trajectory.pending_user,
                observation=slot.observation,
                reply=self.prompt.reply_prefix + text,
                action=state.action,
                reward=reward if valid else reward + self.format_penalty,
                env_reward=reward,
                action_is_valid=valid,
                format_valid=state.format_valid,
                state_key=slot.state_key,
                next_state_key=info["state_key"],
                terminated=state.terminated,
                truncated=state.truncated,
                input_ids=slot.next_input,
                completion_ids=ids,
                logprobs=logprobs,
                finish_reason=finish,
                invalid_reason=state.invalid_reason,
                expert_action=slot.expert_action if self.expert_hints else None,
                env_messages=trajectory.pending_env_messages,
                valid_actions=slot.valid_actions,
            )
        )
        trajectory.success = info["success"]
        if state.terminated or state.truncated:
            self._end(slot, "terminated" if state.terminated else "truncated")
            return
        slot.invalid_streak = 0 if valid else slot.invalid_streak + 1
        if self.max_invalid_streak is not None and slot.invalid_streak >= self.max_invalid_streak:
            # The cut saves compute, not reward: the last reply also carries the format penalty of
            # every turn left, as if the streak went on to the turn limit. Else quitting by three
            # invalid replies costs less than playing on, and RL learns to quit.
            trajectory.turns[-1].reward += self.format_penalty * (slot.max_turns - len(trajectory.turns))
            self._end(slot, "invalid")
            return
        # _observe, inlined: this runs once per env per turn
        slot.observation = state.observation
        slot.valid_actions = state.valid_actions
        slot.expert_action = state.expert_action
        slot.state_key = info["state_key"]
        if slot.tools is None:
            trajectory.pending_user = slot.renderer.user(state.observation, len(trajectory.turns), slot.max_turns, state.valid_actions)
            new_messages = [{"role": "user", "content": trajectory.pending_user}]
        else:  # each call's result comes back as a tool message
            results = state.observations or (state.observation,)
            new_messages = slot.renderer.tool_messages(results, self.tokens.tool_role if self.tokens is not None else "tool")
            trajectory.pending_user = "\n\n".join(results)
            trajectory.pending_env_messages = tuple(new_messages)
        if self.tokens is None:
            return
        if self.layout == "trajectory":
            following = self.tokens.continuation(ids, finish, new_messages, slot.tools) + self._prefix_ids
            slot.context += ids
            slot.context += following
            slot.next_input = following
        else:
            slot.next_input = self.tokens.prompt(self._prompt_messages(slot), slot.tools) + self._prefix_ids
        self._check_budget(slot)

    def _check_budget(self, slot: _Slot) -> None:
        if self.max_prompt_tokens is None:
            return
        length = len(slot.context) if self.layout == "trajectory" else len(slot.next_input)
        if length > self.max_prompt_tokens:
            self._end(slot, "context")

    def _end(self, slot: _Slot, reason: str, error: str | None = None) -> None:
        slot.active = False
        slot.context = []
        trajectory = slot.trajectory
        trajectory.pending_user = None
        trajectory.pending_env_messages = ()
        trajectory.end_reason = reason
        trajectory.error = error
        trajectory.terminated = reason == "terminated"
        trajectory.truncated = reason in ("truncated", "context", "invalid")
