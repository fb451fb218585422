"""The estimate stage: advantage estimators registered by name, over one typed per-turn batch.

An estimator is a pure function ``(batch: TurnBatch, settings: EstimatorSettings) -> dict`` whose
``"advantages"`` entry holds one advantage per turn of the batch (extra entries are per-turn
diagnostics, such as GiGPO's ``anchor_size``). The trainer spreads each turn's advantage over
that turn's model tokens (environment tokens get none). Adding an estimator is one decorated
function here plus its test::

    @register("my_estimator")
    def my_estimator(batch: TurnBatch, settings: EstimatorSettings) -> dict[str, np.ndarray]:
        return {"advantages": ...}

``envhub train --algo`` and ``EnvGRPOConfig.advantage_estimator`` accept every registered name.

An estimator that needs model quantities names them when it registers
(``@register("reinforce++", needs=("logps", "ref_logps"))``): the trainer then runs it after the
score stage, with the batch's score-stage fields filled, and it may return ``"token_advantages"``
(one per model token, in the batch's token order) instead of per-turn ones.

Estimators here: ``grpo`` and ``gigpo`` (exact, checked against an independent reference in the
tests), ``rloo`` and ``step_reinforce`` work from rewards alone; ``reinforce++`` needs the
policy's and the reference model's log-probs, ``ppo`` the critic's values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from envhub.trajectory import Trajectory, step_arrays
from envhub_trl.advantages import Norm, discounted_returns, gigpo_advantages, group_normalize, grpo_advantages, weigh_positive


@dataclasses.dataclass(frozen=True)
class TurnBatch:
    """A batch of episodes, flattened to one entry per turn (and one per episode where named).

    Attributes:
        rewards: ``(n_turns,)``, each turn's reward (the format penalty included).
        traj_index: ``(n_turns,)``, the episode of each turn (``0 .. n_traj - 1``).
        step_index: ``(n_turns,)``, the turn's number within its episode.
        state_keys: ``(n_turns,)``, the state each reply was made in (GiGPO's anchors).
        context_keys: ``(n_turns,)``, what the policy was shown before each reply
            (:func:`~envhub.trajectory.context_keys`; GiGPO's anchors with ``step_anchor="context"``);
            None for a batch built without them.
        traj_groups: ``(n_traj,)``, each episode's env group (members share an initial state).
        env_ids: ``(n_traj,)``, each episode's environment id.
        token_turn: ``(n_tokens,)``, the turn (an index into the per-turn arrays) of each model
            token; tokens come turn by turn in batch order, each turn's in the order sampled (its
            span is where ``token_turn`` equals the turn). None before the score stage.
        logps: ``(n_tokens,)``, the policy's log-probability of each model token (score stage).
        ref_logps: ``(n_tokens,)``, the reference model's (score stage).
        values: ``(n_turns,)``, the critic's value of the state each reply was made in, read at
            the turn's last prompt token (score stage).
    """

    rewards: np.ndarray
    traj_index: np.ndarray
    step_index: np.ndarray
    state_keys: np.ndarray
    traj_groups: np.ndarray
    env_ids: np.ndarray
    context_keys: np.ndarray | None = None
    token_turn: np.ndarray | None = None
    logps: np.ndarray | None = None
    ref_logps: np.ndarray | None = None
    values: np.ndarray | None = None

    @classmethod
    def from_trajectories(cls, trajectories: Sequence[Trajectory]) -> TurnBatch:
        """The batch of ``trajectories`` (in order: episode ``i`` is ``trajectories[i]``)."""
        steps = step_arrays(trajectories)
        return cls(
            rewards=steps["rewards"],
            traj_index=steps["traj_index"],
            step_index=steps["step_index"],
            state_keys=steps["state_keys"],
            traj_groups=steps["traj_groups"],
            context_keys=steps["context_keys"],
            env_ids=np.array([t.env_id for t in trajectories], dtype=object),
        )

    def with_scores(self, token_turn: np.ndarray, **fields: np.ndarray | None) -> TurnBatch:
        """This batch with its score-stage fields (``token_turn`` and any of ``logps``, ``ref_logps``,
        ``values``)."""
        return dataclasses.replace(self, token_turn=np.asarray(token_turn, dtype=np.int64), **fields)

    @property
    def num_episodes(self) -> int:
        return len(self.traj_groups)

    @property
    def returns(self) -> np.ndarray:
        """``(n_traj,)``, each episode's undiscounted return."""
        return np.bincount(self.traj_index, weights=self.rewards, minlength=self.num_episodes)


@dataclasses.dataclass(frozen=True)
class EstimatorSettings:
    """What the estimators read from the config, under ROLL's names.

    Attributes:
        episode_reward_weight: the weight of the episode-level advantage (GiGPO).
        step_reward_weight: the weight of the step-level advantage (GiGPO's ω).
        step_reward_gamma: the discount of per-turn returns (GiGPO's γ, ``step_reinforce``'s).
        norm: ``"mean"``, ``"mean_std"`` or ``"relative"``: how group-relative advantages are normalised.
        step_anchor: GiGPO's step-level groups. ``"state"`` (the paper's): the turns of one env
            group made in the same state (``state_key``). ``"context"``: the turns of the whole
            batch made from the same policy input (:func:`~envhub.trajectory.context_keys`, one
            env id), so a memoryless policy's turns from one observation anchor together across
            env groups; a baseline that depends on the policy's input alone leaves the policy
            gradient unbiased.
        norm_scope: over which episodes they are normalised: ``"group"`` (each env group),
            ``"env"`` (every group of one env id: ROLL's per-tag, AgentRL's per-task
            normalisation for multi-env runs) or ``"batch"``; None for each estimator's own
            (``group`` for ``grpo``, ``gigpo``'s episode level and ``rloo``; ``batch`` for
            ``step_reinforce``, ``reinforce++`` and ``ppo``). GiGPO's step level always
            normalises within anchor-state groups.
        kl_coef: REINFORCE++'s β, the weight of the per-token KL penalty folded into the reward.
        gamma: PPO's discount per turn (GAE's γ).
        lam: PPO's GAE λ.
        positive_weight: the weight of positive advantages, negative ones keeping 1
            (:func:`turn_advantages`): W-REINFORCE's λ (Zhu et al. 2025, "The Surprising
            Effectiveness of Negative Reinforcement in LLM Reasoning", who use 0.1). 1.0 leaves
            every estimator as it is; 0 trains on failures alone (their NSR).
    """

    episode_reward_weight: float = 1.0
    step_reward_weight: float = 1.0
    step_reward_gamma: float = 0.95
    step_anchor: str = "state"
    norm: Norm = "mean_std"
    norm_scope: str | None = None
    kl_coef: float = 0.01
    gamma: float = 1.0
    lam: float = 0.95
    positive_weight: float = 1.0


Estimator = Callable[[TurnBatch, EstimatorSettings], dict[str, np.ndarray]]
#: Every registered estimator, by name.
ESTIMATORS: dict[str, Estimator] = {}
#: The score-stage fields of :class:`TurnBatch` each estimator needs (per token, or per turn for ``values``).
NEEDS: dict[str, tuple[str, ...]] = {}
SCORE_FIELDS = ("logps", "ref_logps", "values")
#: Where advantages may be normalised (``EstimatorSettings.norm_scope``).
NORM_SCOPES = ("group", "env", "batch")
#: What GiGPO's step-level groups share (``EstimatorSettings.step_anchor``).
STEP_ANCHORS = ("state", "context")


def scope_labels(batch: TurnBatch, scope: str | None, default: str) -> np.ndarray:
    """Per episode, the label of the set its advantage is normalised over: its env group, its env
    id, or one set for the batch (``scope``, or ``default`` when None). An episode without a turn
    (one set aside: its env failed) is a set of its own, in no other episode's statistics."""
    scope = scope or default
    if scope == "group":
        labels = np.asarray(batch.traj_groups, dtype=np.int64)
    elif scope == "env":
        labels = np.unique(batch.env_ids.astype(str), return_inverse=True)[1].astype(np.int64)
    elif scope == "batch":
        labels = np.zeros(batch.num_episodes, dtype=np.int64)
    else:
        raise ValueError(f"norm_scope must be one of {NORM_SCOPES}, got {scope!r}")
    empty = np.bincount(batch.traj_index, minlength=batch.num_episodes) == 0
    if empty.any():
        labels = np.where(empty, labels.max() + 1 + np.arange(batch.num_episodes), labels)
    return labels


def register(name: str, needs: Sequence[str] = ()) -> Callable[[Estimator], Estimator]:
    """Register an estimator under ``name`` (a second one under the same name is an error);
    ``needs`` names the score-stage fields of :class:`TurnBatch` it reads (see :data:`SCORE_FIELDS`)."""
    unknown = sorted(set(needs) - set(SCORE_FIELDS))
    if unknown:
        raise ValueError(f"estimator {name!r} needs unknown batch fields {unknown}; known: {list(SCORE_FIELDS)}")

    def decorate(function: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"an advantage estimator named {name!r} is already registered")
        ESTIMATORS[name] = function
        NEEDS[name] = tuple(needs)
        return function

    return decorate


def estimate(name: str, batch: TurnBatch, settings: EstimatorSettings | None = None) -> dict[str, Any]:
    """Run the estimator ``name`` on ``batch``; returns ``advantages`` (one per turn) or
    ``token_advantages`` (one per model token of ``batch.token_turn``)."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {sorted(ESTIMATORS)}")
    missing = [field for field in NEEDS[name] if getattr(batch, field) is None]
    if missing:
        raise ValueError(f"estimator {name!r} needs the batch's {', '.join(missing)} (filled by the trainer's score stage)")
    out = ESTIMATORS[name](batch, settings or EstimatorSettings())
    if "token_advantages" in out:
        expected, got, unit = np.shape(batch.token_turn), np.shape(out["token_advantages"]), "model tokens"
    else:
        expected, got, unit = np.shape(batch.rewards), np.shape(out["advantages"]), "turns"
    if got != expected:
        raise ValueError(f"estimator {name!r} returned {got} advantages for {expected[0] if expected else 0} {unit}")
    return out


@register("grpo")
def grpo(batch: TurnBatch, settings: EstimatorSettings) -> dict[str, np.ndarray]:
    """GRPO (Shao et al., 2024, outcome supervision): each episode's return normalised within its env
    group, on every one of its turns: ``A(τ_i) = (R(τ_i) - mean_j R(τ_j)) / F_norm``, ``F_norm`` the
    group's std (``norm="mean_std"``) or 1 (``"mean"``)."""
    labels = scope_labels(batch, settings.norm_scope, "group")
    return {"advantages": grpo_advantages(batch.returns, labels, settings.norm)[batch.traj_index]}


@register("gigpo")
def gigpo(batch: TurnBatch, settings: EstimatorSettings) -> dict[str, np.ndarray]:
    """GiGPO (Feng et al., 2025, arXiv:2505.10978): ``A = A^E(τ_i) + ω A^S(a_t)`` with
    ``episode_reward_weight`` on ``A^E`` and ``ω = step_reward_weight``.

    - ``A^E(τ_i) = (R(τ_i) - mean_j R(τ_j)) / F_norm`` over the env group (GRPO's);
    - ``A^S(a_t) = (R_t - mean R_t') / F_norm`` over the turn's anchor group, ``R_t`` the
      discounted return from turn ``t`` (``γ = step_reward_gamma``) and the anchor group the turns
      of the env group that saw the same state (``state_key``), or with ``step_anchor="context"``
      the same policy input anywhere in the batch."""
    if settings.step_anchor not in STEP_ANCHORS:
        raise ValueError(f"step_anchor must be one of {STEP_ANCHORS}, got {settings.step_anchor!r}")
    keys, anchor_groups = batch.state_keys, None
    if settings.step_anchor == "context":
        if batch.context_keys is None:
            raise ValueError("step_anchor='context' needs the batch's context_keys (TurnBatch.from_trajectories fills them)")
        keys = batch.context_keys
        anchor_groups = np.unique(batch.env_ids.astype(str), return_inverse=True)[1][batch.traj_index]
    out = gigpo_advantages(
        batch.rewards, batch.traj_index, batch.step_index, batch.traj_groups, keys,
        step_weight=settings.step_reward_weight, gamma=settings.step_reward_gamma, norm=settings.norm, anchor_groups=anchor_groups,
    )
    episode = out["episode"]
    if settings.norm_scope not in (None, "group"):
        episode = grpo_advantages(batch.returns, scope_labels(batch, settings.norm_scope, "group"), settings.norm)
    advantages = settings.episode_reward_weight * episode[batch.traj_index] + settings.step_reward_weight * out["step"]
    return {"advantages": advantages, "anchor_size": out["anchor_size"]}


@register("rloo")
def rloo(batch: TurnBatch, settings: EstimatorSettings) -> dict[str, np.ndarray]:
    """RLOO (Ahmadian et al., 2024): each episode's return minus the mean return of the *other*
    members of its env group (or of its ``norm_scope`` set); 0 in a group of one. Not divided by a std."""
    returns = batch.returns
    _, labels, counts = np.unique(scope_labels(batch, settings.norm_scope, "group"), return_inverse=True, return_counts=True)
    totals = np.bincount(labels, weights=returns)
    others = counts[labels] - 1
    baseline = np.divide(totals[labels] - returns, others, out=np.zeros_like(returns), where=others > 0)
    per_episode = np.where(others > 0, returns - baseline, 0.0)
    return {"advantages": per_episode[batch.traj_index]}


@register("step_reinforce")
def step_reinforce(batch: TurnBatch, settings: EstimatorSettings, eps: float = 1e-6) -> dict[str, np.ndarray]:
    """ROLL's ``step_reinforce``: each turn's discounted return to the episode's end
    (``step_reward_gamma``), normalised over the whole batch (or ``norm_scope``'s sets: mean, and
    the unbiased std with ``mean_std``); no group baseline, so env groups may have any size."""
    returns = discounted_returns(batch.rewards, batch.traj_index, batch.step_index, settings.step_reward_gamma)
    labels = scope_labels(batch, settings.norm_scope, "batch")[batch.traj_index]
    return {"advantages": group_normalize(returns, labels, settings.norm, eps)}


def _whiten(values: np.ndarray, eps: float, labels: np.ndarray | None = None) -> np.ndarray:
    """``values`` less their mean, over their (population) std + ``eps`` where there are two or
    more: OpenRLHF's and verl's whitening over a whole batch; with ``labels``, within each label's
    set instead."""
    if labels is None or not len(values):
        centred = values - values.mean() if len(values) else values
        return centred / (values.std() + eps) if len(values) > 1 else centred
    _, codes, counts = np.unique(labels, return_inverse=True, return_counts=True)
    centred = values - (np.bincount(codes, weights=values) / counts)[codes]
    std = np.sqrt(np.bincount(codes, weights=centred**2) / counts)[codes]
    return np.where(counts[codes] > 1, centred / (std + eps), centred)


@register("reinforce++", needs=("logps", "ref_logps"))
def reinforce_plus_plus(batch: TurnBatch, settings: EstimatorSettings, eps: float = 1e-8) -> dict[str, np.ndarray]:
    """REINFORCE++ (Hu, 2025; OpenRLHF's ``reinforce``): a token-level reward of ``-kl_coef`` x the
    KL estimate ``log pi - log pi_ref`` on every model token, plus each turn's environment reward
    on that turn's last model token; each token's advantage is the undiscounted sum of the rewards
    from it to the end of its episode (OpenRLHF's default ``gamma`` 1), whitened over every model
    token of the batch (no group baseline, so env groups may have any size).

    Returns:
        ``token_advantages`` (one per model token) and ``kl`` (the per-token estimate).
    """
    token_turn = batch.token_turn
    kl = np.asarray(batch.logps, dtype=np.float64) - np.asarray(batch.ref_logps, dtype=np.float64)
    rewards = -settings.kl_coef * kl
    if len(token_turn):
        last = np.flatnonzero(np.r_[token_turn[1:] != token_turn[:-1], True])  # each turn's last token
        rewards[last] += batch.rewards[token_turn[last]]
    # Rewards-to-go within each episode: a reversed cumulative sum, less what lies past the episode.
    episode = batch.traj_index[token_turn]
    to_go = np.cumsum(rewards[::-1])[::-1]
    ends = np.flatnonzero(np.r_[episode[1:] != episode[:-1], True])  # each episode's last token
    after_episode = np.r_[to_go[1:], 0.0][ends]  # what follows each episode's last token
    episode_of = np.cumsum(np.r_[0, episode[1:] != episode[:-1]]) if len(episode) else episode
    returns = to_go - after_episode[episode_of]
    labels = scope_labels(batch, settings.norm_scope, "batch")[episode] if settings.norm_scope not in (None, "batch") else None
    return {"token_advantages": _whiten(returns, eps, labels), "kl": kl}


def gae(rewards: np.ndarray, values: np.ndarray, traj_index: np.ndarray, step_index: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """Generalised advantage estimation per turn: ``delta_k = r_k + gamma V_{k+1} - V_k`` (``V`` 0
    after an episode's last turn, which ends it) and ``A_k = sum_l (gamma lam)^l delta_{k+l}``
    within each episode. Turns of an episode must come in order."""
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    same_episode_next = np.r_[traj_index[1:] == traj_index[:-1], False]
    next_values = np.where(same_episode_next, np.r_[values[1:], 0.0], 0.0)
    deltas = rewards + gamma * next_values - values
    return discounted_returns(deltas, traj_index, step_index, gamma * lam)


@register("ppo", needs=("values",))
def ppo(batch: TurnBatch, settings: EstimatorSettings, eps: float = 1e-8) -> dict[str, np.ndarray]:
    """PPO with a critic: per-turn GAE (``gamma``, ``lam``), each turn one step of the MDP and its
    value read at the turn's last prompt token (as Agent-R1 and verl-agent do); advantages
    whitened over the batch's turns, the critic's targets ``returns = A + V`` (unwhitened).

    Returns:
        ``advantages`` and ``returns`` (per turn).
    """
    advantages = gae(batch.rewards, batch.values, batch.traj_index, batch.step_index, settings.gamma, settings.lam)
    returns = advantages + np.asarray(batch.values, dtype=np.float64)
    labels = scope_labels(batch, settings.norm_scope, "batch")[batch.traj_index] if settings.norm_scope not in (None, "batch") else None
    return {"advantages": _whiten(advantages, eps, labels), "returns": returns}


def turn_advantages(
    batch: TurnBatch,
    estimator: str,
    settings: EstimatorSettings | None = None,
    *,
    keep: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Each turn's (or model token's) advantage under the registered ``estimator`` (:func:`estimate`),
    zero on the episodes the group filter dropped.

    ``keep`` is the group filter's verdict per episode (:func:`~envhub_trl.advantages.select_groups`,
    which the pipeline's gather stage applies); None keeps every episode.

    Positive advantages are then weighted by ``settings.positive_weight`` (negative ones keep
    theirs): a weight below 1 raises what won less than it lowers what failed, so a view's mass
    leaves a losing move for the others in their proportions instead of piling onto the move that
    won once, meant to keep the policy uncertain where it has not yet found a winning move (on
    FrozenLake it did not: docs/results-rl-alone.md).

    Returns:
        The estimator's output with ``advantages`` (or ``token_advantages``) set to 0 on the turns
        of dropped groups, and ``keep`` (per episode).
    """
    settings = settings or EstimatorSettings()
    if keep is None:
        keep = np.ones(len(batch.returns), dtype=bool)
    out = dict(estimate(estimator, batch, settings))
    key, episode = ("token_advantages", batch.traj_index[batch.token_turn]) if "token_advantages" in out else ("advantages", batch.traj_index)
    out[key] = np.where(keep[episode], weigh_positive(out[key], settings.positive_weight), 0.0)
    out["keep"] = keep
    return out
