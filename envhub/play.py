"""``envhub run``: a *player* plays episodes through a 1x1 :class:`~envhub.manager.EnvGroupManager`.

There is one turn loop in envhub, :func:`envhub.rollout.rollout`: training, evaluation,
``export-sft`` and ``envhub run`` all render the conversation, apply replies in the reply format and
end episodes through the manager. A player is what ``envhub run --policy NAME`` plays with: a
generator plus the prompt settings and env settings it plays under. The built-in players are
model-free generators (``random``, ``expert``, ``human``); plugins add others through the
``make_policy`` hook (the trainer plugin returns a model's generator and the settings its checkpoint
trained with).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envhub.error import EnvhubError, PolicyError
from envhub.executors import InProcessExecutor
from envhub.generation import Completion, ExpertGenerator, Generator, Prompt, RandomGenerator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub.settings import EnvSettings
from envhub.rollout import Trajectory, rollout
from envhub.tools import call_from_python, describe_tools


class StopPlay(EOFError):
    """The person asked to stop (``quit``), or their input ended: no further episode should start."""


@dataclass
class Player:
    """Who plays ``envhub run``: a generator and what it sees.

    Attributes:
        generator: answers the prompts.
        tokenizer: the model's tokenizer, with a chat template; None plays in text (model-free
            generators read the prompt's legal actions, expert action and messages).
        sampling: how the generator samples (greedy by default).
        settings: the env settings it plays under (a checkpoint's ``envhub.json``: prompt settings,
            env kwargs, turn limit, layout); None: :data:`~envhub.prompts.BARE_PROMPT`, without a
            context budget, and the env's defaults. Without a tokenizer the budget is dropped: it
            counts tokens.
    """

    generator: Generator
    tokenizer: Any | None = None
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    settings: EnvSettings | None = None

    @property
    def stopped(self) -> bool:
        """Whether the player asked to stop playing (a person who typed ``quit``)."""
        return bool(getattr(self.generator, "stopped", False))

    def manager(self, env_id: str, *, env_kwargs: dict[str, Any] | None = None, max_turns: int | None = None) -> EnvGroupManager:
        """A 1x1 manager of ``env_id`` in this process, rendering as this player expects.

        ``env_kwargs`` are laid over the ones the player trained with; ``max_turns`` wins over its own.
        """
        own = self.settings.replace(env_id=env_id) if self.settings is not None else EnvSettings(env_id)
        settings = own.replace(
            max_turns=max_turns or own.max_turns, env_kwargs={**own.env_kwargs, **(env_kwargs or {})},
            prompt=own.prompt if self.tokenizer is not None else own.prompt.without_budget(),
        )
        return EnvGroupManager.from_settings(settings, 1, 1, tokenizer=self.tokenizer, executor=InProcessExecutor())


class HumanGenerator:
    """A person at the keyboard: each prompt's reply is the line they type.

    ``help`` (or ``?``) shows the legal actions and the instructions without spending a turn;
    ``quit`` (or ``exit``, or the end of input) raises :class:`StopPlay` and sets :attr:`stopped`.
    Anything else is the action, sent as ``<answer>TEXT</answer>`` (or as typed when it already
    holds a tag), and the environment judges it as it judges a model's reply. In a tool env ``help``
    lists the tools, and a call may be typed as Python, ``search("Brakmouth")``, or as JSON; it is
    sent as a ``<tool_call>``.
    """

    HELP = ("help", "?", "h")
    QUIT = ("quit", "exit", "q")

    def __init__(self, prompt: Callable[[str], str] = input, show: Callable[[str], Any] = print):
        self.prompt = prompt
        self.show = show
        self.stopped = False

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[Completion]:
        """One typed reply per prompt."""
        return [Completion([], [], p.continued(self._ask(p)), "stop") for p in prompts]

    def _ask(self, prompt: Prompt) -> str:
        legal = prompt.valid_actions
        schemas = {s["function"]["name"]: s for s in prompt.tools} if prompt.tools else None
        hint = f" [{' / '.join(legal)}]" if legal else (f" [call {', '.join(schemas)}]" if schemas else "")
        while True:
            try:
                text = self.prompt(f"action{hint} (help, quit)> ")
            except EOFError:
                self.stopped = True
                raise StopPlay("end of input") from None
            word = text.strip().lower()
            if word in self.QUIT:
                self.stopped = True
                raise StopPlay("quit")
            if word not in self.HELP:
                if "<" in text:
                    return text
                call = call_from_python(text, schemas) if schemas else None
                action = call.to_json() if call is not None else text.strip()
                return prompt.reply_format.render(action) if prompt.reply_format is not None else f"<answer>{action}</answer>"
            if schemas:
                actions = "Tools:\n" + describe_tools(list(schemas.values())) + '\nCall one as search("words") or as JSON {"name": ..., "arguments": {...}}.'
            else:
                actions = f"Legal actions now: {', '.join(legal)}." if legal else "Any text is an action here."
            instructions = prompt.messages[0]["content"] if prompt.messages else ""
            self.show(f"{actions}\n{instructions}\nType an action, or quit to stop.")


#: Players selectable by name in ``envhub run --policy``: factories taking ``seed=``.
PLAYERS: dict[str, Callable[..., Player]] = {
    "random": lambda seed=None: Player(RandomGenerator(seed)),
    "expert": lambda seed=None: Player(ExpertGenerator()),
    "human": lambda seed=None: Player(HumanGenerator()),
}


def get_player(name: str, env_id: str, seed: int | None = None) -> Player:
    """Return the player ``envhub run --policy NAME`` plays with.

    ``random``, ``expert`` and ``human`` are built in; any other name (a model path, say) is offered
    to the plugins' ``make_policy`` hooks, and the first that accepts it wins.

    Raises:
        PolicyError: when neither a built-in nor any plugin knows ``name``, or a plugin answers
            with something that is not a :class:`Player`.
    """
    if name in PLAYERS:
        return PLAYERS[name](seed=seed)
    from envhub.plugins import get_plugin_manager

    manager = get_plugin_manager()
    player = manager.hook.make_policy(name=name, env_id=env_id, seed=seed)
    if player is None:
        message = f"no policy called {name!r}: use one of {sorted(PLAYERS)}"
        if not manager.hook.make_policy.get_hookimpls():
            raise PolicyError(f"{message}, or a model path with the trainer plugin installed (pip install envhub-trl)")
        looks_like_path = "/" in name and (name.startswith((".", "/", "~")) or name.count("/") != 1)
        if looks_like_path:
            raise PolicyError(f"{message}; {name} is not a model folder (it does not exist or holds no config.json)")
        raise PolicyError(f"{message}, a model folder, 'tiny', 'smollm2-135m' or a Hugging Face model id")
    if not isinstance(player, Player):
        raise PolicyError(f"a make_policy hook answered {name!r} with a {type(player).__name__}, not an envhub.play.Player")
    return player


class StartError(EnvhubError):
    """The env could not be made or reset: ``kind`` is the exception's type name, ``detail`` its message."""

    def __init__(self, env_id: str, error: str):
        self.kind, _, detail = error.partition(": ")
        self.detail = detail.rsplit(" at ", 1)[0]  # the executor appends where it was raised
        super().__init__(f"{env_id} could not start: {error}")


@dataclass
class Step:
    """One turn as ``envhub run`` reports it."""

    observation: str
    action: str | None
    reward: float
    info: dict[str, Any]


def play(
    manager: EnvGroupManager,
    player: Player,
    seed: int,
    *,
    on_start: Callable[[Step, Any], Any] | None = None,
    on_step: Callable[[Step, Any], Any] | None = None,
) -> tuple[Trajectory, list[Step]]:
    """Play one episode of ``manager``'s single env from ``reset(seed=seed)``.

    Args:
        manager: a 1x1 manager (:meth:`Player.manager`).
        player: who plays.
        seed: the reset seed.
        on_start: called with the reset as a :class:`Step` (no action) and the env object.
        on_step: called after every turn with its :class:`Step` and the env object.

    Returns:
        The episode's trajectory and its steps, the reset first. A person who stops ends the
        episode where it stands (:attr:`Player.stopped` is then set).

    Raises:
        StartError: when the env cannot be made or reset.
    """
    if manager.num_envs != 1:
        raise ValueError(f"play() plays one env; the manager holds {manager.num_envs}")
    steps: list[Step] = []
    env = lambda: manager.executor.env(0)  # noqa: E731  (the in-process env object, for pictures)

    def started(m: EnvGroupManager) -> None:
        state = m.last_states[0]
        if state.error is not None:
            raise StartError(m.group_env_ids[0], state.error)
        steps.append(Step(state.observation, None, 0.0, state.info))
        if on_start is not None:
            on_start(steps[-1], env())

    def stepped(m: EnvGroupManager) -> None:
        state = m.last_states[0]
        trajectory = m.trajectories()[0]
        if state.error is not None:
            return
        turn = trajectory.turns[-1]
        steps.append(Step(state.observation, turn.action or turn.reply, float(state.reward), state.info))
        if on_step is not None:
            on_step(steps[-1], env())

    sampling = player.sampling if player.sampling.seed is None else dataclasses.replace(player.sampling, seed=player.sampling.seed + seed)
    try:
        rollout(manager, player.generator, sampling, seeds=[seed], on_reset=started, on_turn=stepped)
    except StopPlay:
        pass
    return manager.trajectories()[0], steps
