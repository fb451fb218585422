"""The trainer's play stage for a user's agent: its sessions through the in-process proxy.

:class:`AgentRollouts` is what ``EnvGRPOTrainer(..., agent=..., tasks=...)`` plays instead of an
env manager. For each generation batch it runs the agent ``group_size`` times per task of the
batch (the dataset's rows are task indices; TRL repeats each ``num_generations`` times, so each run
of equal indices is one group), concurrently, against a :class:`~envhub_trl.proxy.ChatProxy` over
the trainer's own generator, which samples at the run's temperature whatever the agent asks. The
recorded sessions become the batch's episodes (:meth:`~envhub_trl.proxy.agents.AgentBatch.trajectories`),
and the trainer's stages go on unchanged: gather, rows (one per folded session, one per call of a
session that did not fold), score, the same estimator, the same loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from transformers import TrainerCallback

from envhub.trajectory import Trajectory
from envhub_trl.proxy import ChatProxy, ProxyServer
from envhub_trl.proxy.agent_processes import AgentProcesses
from envhub_trl.proxy.agents import Agent, AgentBatch, play_agents

if TYPE_CHECKING:
    from envhub_trl.trainer import EnvGRPOTrainer


class AgentRollouts:
    """Plays ``agent`` on ``tasks`` for a trainer (see the module's docstring).

    Args:
        agent: ``agent(base_url, api_key, task) -> reward``.
        tasks: the training tasks; the dataset's row ``i`` is ``tasks[i]``.
        deadline: seconds one batch's sessions may take.
        processes: run the sessions in this many worker processes (:class:`AgentProcesses`); 0:
            threads of the trainer's process.

    Raises:
        ValueError: for no tasks, or ``processes`` with an agent a worker process cannot load.
    """

    def __init__(self, agent: Agent, tasks: Sequence[Any], deadline: float = 600.0, processes: int = 0):
        if not tasks:
            raise ValueError("an agent trains on tasks; give at least one (tasks=[...] or --tasks FILE)")
        self.agent = agent
        self.tasks = list(tasks)
        self.deadline = deadline
        self.processes = AgentProcesses(agent, processes) if processes else None
        self._server: ProxyServer | None = None
        self._names: dict[str, int] = {}

    def _name(self, base: str) -> str:
        """A batch's name: ``base`` (the step; a repeat gets ``.1``, ``.2``, ...). Sessions are named
        by it and the proxy keys its sampler seeds by session, so every run of the config, a resumed
        one too, samples the same replies at the same step."""
        seen = self._names[base] = self._names.get(base, -1) + 1
        return base if not seen else f"{base}.{seen}"

    def attach(self, trainer: EnvGRPOTrainer) -> AgentRollouts:
        """Check ``trainer``'s config fits an agent, and stop the proxy when its training ends.

        Raises:
            ValueError: for ``rollout_mode: async`` (its producer plays envhub's own loop).
        """
        if trainer.args.rollout_mode == "async":
            raise ValueError("rollout_mode: async plays envhub's own turn loop; an agent plays each batch in turn (lockstep or continuous)")
        trainer.add_callback(_CloseProxy(self))
        return self

    def server(self, trainer: EnvGRPOTrainer) -> ProxyServer:
        """The proxy over ``trainer``'s generator (started on first use), its weights current."""
        generator = trainer.generator  # a generator with its own copy of the weights syncs here
        if self._server is None:
            proxy = ChatProxy(generator, trainer.processing_class, model="*", temperature=trainer.args.temperature,
                              top_p=trainer.args.top_p, seed=trainer.args.seed)
            # No bound on the envs its agents play on it: the batch is what bounds the sessions.
            self._server = ProxyServer(proxy, max_envs=None).start()
        return self._server

    def play(self, trainer: EnvGRPOTrainer, seeds: Sequence[int], group_size: int, round: int = 0) -> tuple[list[Trajectory], AgentBatch]:
        """The episodes of one generation batch, whose rows hold task indices ``seeds`` (each group's
        ``group_size`` rows one index), and the batch's sessions; ``round`` > 0 names a further
        round of the same step (dynamic sampling), whose sessions and samples are its own."""
        tasks = [self.tasks[int(seed) % len(self.tasks)] for seed in seeds[::group_size]]
        server = self.server(trainer)
        with trainer.generator_lock:
            batch = play_agents(self.agent, tasks, group_size, server, deadline=self.deadline, batch=self._name(f"step{trainer.state.global_step}" + (f"r{round}" if round else "")),
                                processes=self.processes)
        trajectories = batch.trajectories()
        for trajectory, seed in zip(trajectories, np.repeat(seeds[::group_size], group_size)):
            trajectory.seed = int(seed)
        return trajectories, batch

    def evaluate(self, trainer: EnvGRPOTrainer, tasks: Sequence[Any], greedy: bool = True) -> dict[str, float]:
        """The agent once on each of ``tasks`` (greedy, or at the run's temperature): its
        ``success_rate`` (:meth:`~envhub_trl.proxy.sessions.Session.won`: a reward above 0, or the
        success of the env it played on the proxy), ``mean_reward`` (the sessions' returns) and
        ``failed`` (sessions without a reward)."""
        server = self.server(trainer)
        proxy = server.proxy
        proxy.temperature = 0.0 if greedy else trainer.args.temperature
        try:
            with trainer.generator_lock:
                batch = play_agents(self.agent, list(tasks), 1, server, deadline=self.deadline,
                                    batch=self._name(f"eval{trainer.state.global_step}-{'greedy' if greedy else 'sampled'}"), processes=self.processes)
        finally:
            proxy.temperature = trainer.args.temperature
        sessions = [s for group in batch.sessions for s in group]
        rewards = [s.episode_return() for s in sessions]
        scored = [r for r in rewards if r is not None]
        return {
            "success_rate": float(np.mean([r is not None and s.won() for s, r in zip(sessions, rewards)])),
            "mean_reward": float(np.mean(scored)) if scored else 0.0,
            "failed": float(sum(r is None for r in rewards)),
        }

    def close(self) -> None:
        """Stop the proxy and the agents' worker processes (a later batch or evaluation starts them again)."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self.processes is not None:
            self.processes.close()


class _CloseProxy(TrainerCallback):
    """Stops the agents' proxy when training ends."""

    def __init__(self, rollouts: AgentRollouts):
        self.rollouts = rollouts

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.rollouts.close()
