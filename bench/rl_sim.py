"""A benchmark config's RL in minutes, with the policy of your choice: the lever search for issue 40.

The trainer's RL-alone Sokoban run takes 25-35 minutes on a core; this loop keeps what decides the
learning and drops the rest, so that a lever can be screened at several seeds before a trainer run
confirms it. It plays the config's env through the real env (``envhub.make`` with its
``env_kwargs``), ``groups_per_step`` levels of ``group_size`` plays, ``max_turns`` turns; computes the
trainer's own GRPO or GiGPO advantages (``table_rl.advantages``: anchors are the group and the env's
``state_key``); and takes one AdamW step a batch on ``-mean(advantage * log p(action))`` (the trainer's
on-policy update without KL: one update a batch, which its ratio reduces to), the gradient clipped at
1, a 10-step warm-up and a cosine decay.

The policy (``--policy``):

- ``model``: the run's tiny transformer reading the run's real prompt (system message, observation,
  ``<answer>`` prefilled; the template is taken from the run's manager and checked token for token)
  and sampling one token from its whole vocabulary: an action's token is the move, any other token an
  invalid reply (the config's ``format_penalty``, the turn spent, the state unchanged). ``--start``:
  a model folder, e.g. a trainer run's warm start alone (``envhub train ... max_steps=1
  learning_rate=1e-12``, its ``final``), so that the simulation starts where the trainer's RL does.
- ``mlp``: a two-layer MLP on the observation's words, each with its line and place in the line
  (one-hot), so that it must learn to read the text, not hand-made features.
- ``table``: one softmax per distinct observation (``table_rl``'s policy).

Greedy and sampled success on 256 validation seeds (from 5 * 10^8, as the benchmark's tuning runs),
and the moves' entropy given the observation on the sampled episodes.

    python bench/rl_sim.py --config bench/learning/format/sokoban6x6.yaml --policy model --start START/final --seed 0
    python bench/rl_sim.py --config bench/learning/format/sokoban6x6.yaml --policy mlp --seed 0

Writes bench/results/rl_sim/NAME.json (the arguments, the config and the curve) after every
evaluation, so that a stopped run keeps its curve; ``--save FOLDER`` keeps the trained model
(``bench/sokoban_failures.py`` reads where its episodes go wrong).

With ``history_turns: 1`` in the config the policy is shown the previous turn as the trainer shows
it (that observation, then its reply: ``reply_prefix``, the sampled token and the closing tag), the
template taken from the run's manager and checked token for token; a run then takes about twice
as long (prompts of about 150 tokens, of which only the system message is shared: 300 steps of
Sokoban 6x6 with the trainer's levers took 47-59 minutes, two runs on the 2 cores, against 27).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import yaml

import envhub

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from table_rl import TablePolicy, advantages  # noqa: E402


VALIDATION = 5 * 10**8


class WordsMLP(torch.nn.Module):
    """A two-layer MLP on the observation's words, one-hot by (line, place in the line, word)."""

    def __init__(self, actions: int, width: int = 256, capacity: int = 1 << 14) -> None:
        super().__init__()
        self.index: dict[tuple[int, int, str], int] = {}
        self.capacity = capacity
        self.net = torch.nn.Sequential(torch.nn.Linear(capacity, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, actions))

    def features(self, text: str) -> torch.Tensor:
        x = torch.zeros(self.capacity)
        for line, words in enumerate(text.split("\n")):
            for place, word in enumerate(words.split()):
                x[self.index.setdefault((line, place, word), len(self.index)) % self.capacity] = 1.0
        return x

    def forward(self, observations: list[str]) -> torch.Tensor:
        return torch.log_softmax(self.net(torch.stack([self.features(o) for o in observations])), -1)


class Critic(torch.nn.Module):
    """A value function on the observation's words (``WordsMLP``'s features), trained on the
    episodes' discounted returns to go."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.words = WordsMLP(1, width)

    def forward(self, observations: list[str]) -> torch.Tensor:
        return self.words.net(torch.stack([self.words.features(o) for o in observations]))[:, 0]


def gae(batch: list[list[tuple[str, int, float, str, int]]], values: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Per turn, in order: GAE(gamma, lam) against ``values`` (0 after an episode's last turn), and
    the discounted return to go."""
    advantage, to_go, k = np.zeros(len(values)), np.zeros(len(values)), 0
    for episode in batch:
        n = len(episode)
        v = np.append(values[k : k + n], 0.0)
        running, ret = 0.0, 0.0
        for t in reversed(range(n)):
            reward = episode[t][2]
            running = reward + gamma * v[t + 1] - v[t] + gamma * lam * running
            ret = reward + gamma * ret
            advantage[k + t], to_go[k + t] = running, ret
        k += n
    return advantage, to_go


class ModelPolicy(torch.nn.Module):
    """The run's tiny transformer: log-probabilities over its whole vocabulary after the run's prompt.
    ``actions`` are the token ids of the env's actions, in the env's order."""

    def __init__(self, start: str, config: dict[str, Any], action_names: tuple[str, ...]) -> None:
        super().__init__()
        from view_reading import load, prompt_template

        self.model, self.tokenizer = load(start, config)
        self.model.float().train()
        ids = [self.tokenizer.encode(name, add_special_tokens=False) for name in action_names]
        if any(len(i) != 1 for i in ids):
            raise SystemExit(f"an action is not one token in this tokenizer: {dict(zip(action_names, ids))}")
        self.actions = [i[0] for i in ids]
        self.head, self.tail = prompt_template(self.tokenizer, config)
        self.cache: dict[str, list[int]] = {}
        self.history = int(config.get("history_turns") or 0)
        if self.history > 1:
            raise SystemExit("the simulation shows at most one turn of history (history_turns: 0 or 1)")
        if self.history:
            from view_reading import history_joints

            self.before, self.after = history_joints(self.tokenizer, config, self.head, self.tail)
            self.prefix, self.stop = config.get("reply_prefix") or "", (config.get("stop_strings") or ["</answer>"])[0]

    def shown(self, previous: str | None, token: int | None, observation: str) -> str:
        """What the prompt shows between its head and tail: the observation, after the previous turn
        (its observation and reply: the prefix, the token, the closing tag) with one turn of history."""
        if not self.history or previous is None:
            return observation
        reply = self.prefix + self.tokenizer.decode([token])
        return previous + self.before + (reply if self.stop in reply else reply + self.stop) + self.after + observation

    def forward(self, observations: list[str]) -> torch.Tensor:
        from view_reading import next_token_log_probs

        return next_token_log_probs(self.model, self.tokenizer, self.head, self.tail, self.cache, observations)


def choice_index(policy: Any) -> list[int]:
    """The columns of the policy's output that are the env's actions."""
    return policy.actions if isinstance(policy, ModelPolicy) else list(range(policy_width(policy)))


def policy_width(policy: Any) -> int:
    return policy.logits.shape[1] if isinstance(policy, TablePolicy) else policy.net[-1].out_features


def play(policy: Any, envs: list[Any], seeds: list[int], turns: int, penalty: float, greedy: bool = False, temperature: float = 1.0) -> tuple[list[list[tuple[str, int, float, str, int]]], list[bool]]:
    """Each seed played once in its own env. Per turn: (observation, output column, reward, state key, turn);
    a column that is no action is an invalid reply: ``penalty``, the turn spent, nothing moved.
    ``temperature``: the sampling temperature (the episode is trained on as if sampled at 1)."""
    actions = choice_index(policy)
    column = {c: k for k, c in enumerate(actions)}
    observations, keys = [], []
    shown = policy.shown if isinstance(policy, ModelPolicy) else lambda previous, token, observation: observation
    for env, seed in zip(envs, seeds):
        observation, info = env.reset(seed=int(seed))
        observations.append(observation)
        keys.append(str(info["state_key"]))
    raw = list(observations)  # the env's own observations; ``observations``: what the policy is shown
    episodes: list[list[Any]] = [[] for _ in seeds]
    won, live = [False] * len(seeds), list(range(len(seeds)))
    for turn in range(turns):
        if not live:
            break
        distinct = sorted({observations[i] for i in live})
        at = {o: k for k, o in enumerate(distinct)}
        with torch.no_grad():
            logp = policy(distinct)[[at[observations[i]] for i in live]]
        chosen = (logp.argmax(-1) if greedy else torch.distributions.Categorical(logits=logp / temperature).sample()).tolist()
        still = []
        for i, token in zip(live, chosen):
            if token in column:
                observation, reward, terminated, truncated, info = envs[i].step(envs[i].unwrapped.action_names[column[token]])
                done = terminated or truncated
            else:
                observation, reward, done, info = raw[i], penalty, False, {"state_key": keys[i], "success": False}
            episodes[i].append((observations[i], token, float(reward), keys[i], turn))
            observations[i], raw[i], keys[i] = shown(raw[i], token, observation), observation, str(info["state_key"])
            won[i] = won[i] or bool(info.get("success"))
            if not done:
                still.append(i)
        live = still
    return episodes, won


def choice_entropy(policy: Any, logp: torch.Tensor) -> torch.Tensor:
    """Per row, the entropy of the actions' distribution, renormalised over them."""
    q = torch.log_softmax(logp[:, choice_index(policy)], -1)
    return -(q.exp() * q).sum(-1)


def evaluate(policy: Any, envs: list[Any], config: dict[str, Any], episodes: int) -> dict[str, float]:
    turns, penalty = int(config["max_turns"]), float(config.get("format_penalty", -0.1))
    figures: dict[str, list[Any]] = {"greedy": [], "sampled": [], "observations": []}
    policy.eval()
    for start in range(0, episodes, len(envs)):
        seeds = [VALIDATION + start + k for k in range(min(len(envs), episodes - start))]
        figures["greedy"] += play(policy, envs, seeds, turns, penalty, greedy=True)[1]
        played, won = play(policy, envs, seeds, turns, penalty)
        figures["sampled"] += won
        figures["observations"] += [t[0] for e in played for t in e]
    with torch.no_grad():
        entropy = float(choice_entropy(policy, policy(sorted(set(figures["observations"])))).mean())
    policy.train()
    return {"greedy": float(np.mean(figures["greedy"])), "sampled": float(np.mean(figures["sampled"])), "entropy": entropy}


def tied_baseline(batch: list[list[tuple[str, int, float, str, int]]], groups: np.ndarray) -> np.ndarray:
    """Per turn: for a group whose returns all tie, its trajectory's return against the batch's
    (minus the batch's mean return, over the batch's std); 0 elsewhere."""
    returns = np.array([sum(t[2] for t in episode) for episode in batch])
    _, labels = np.unique(groups, return_inverse=True)
    spread = np.array([returns[labels == g].std() for g in range(labels.max() + 1)])
    tied = spread[labels] < 1e-8
    value = np.where(tied, (returns - returns.mean()) / (returns.std() + 1e-6), 0.0)
    return np.array([value[e] for e, episode in enumerate(batch) for _ in episode])


def train(policy: Any, envs: list[Any], config: dict[str, Any], rate: float, estimator: str, rng: np.random.Generator, eval_every: int, episodes: int, levers: dict[str, float] | None = None, on_evaluation: Any = None) -> list[dict[str, Any]]:
    """The config's RL on ``policy``; returns the validation curve (every ``eval_every`` steps and at the
    end), which ``on_evaluation`` is also given after each evaluation."""
    groups, size, turns, steps = (int(config[k]) for k in ("groups_per_step", "group_size", "max_turns", "max_steps"))
    penalty = float(config.get("format_penalty", -0.1))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=rate, weight_decay=0.0)
    levers = levers or {}
    critic = Critic() if levers.get("critic") else None
    critic_optimizer = torch.optim.Adam(critic.parameters(), lr=1e-3) if critic is not None else None
    curve, started, extra_played, memory = [], time.time(), [0], []
    trace: dict[str, list[float]] = {"train_success": [], "imitation_nll": [], "memory": []}  # since the last evaluation
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            since = {k: round(float(np.mean(v)), 4) for k, v in trace.items() if v}
            curve.append({"step": step, **evaluate(policy, envs, config, episodes), **since, "seconds": round(time.time() - started, 1), "extra_episodes": int(np.sum(extra_played))})
            trace = {k: [] for k in trace}
            print(" ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in curve[-1].items()), flush=True)
            if on_evaluation is not None:
                on_evaluation(curve)
        if step == steps:
            break
        levels = rng.integers(0, VALIDATION, groups)
        seeds = np.repeat(levels, size).tolist()
        batch, won = play(policy, envs, seeds, turns, penalty)
        trace["train_success"].append(float(np.mean(won)))
        labels = np.repeat(np.arange(groups), size)
        if levers.get("extra_plays"):  # the levels no play won, played again, round by round until won
            solved = {g for g in range(groups) if any(won[g * size : (g + 1) * size])}
            for _ in range(int(levers.get("extra_rounds", 1))):
                extra = np.repeat([g for g in range(groups) if g not in solved], int(levers["extra_plays"]))
                if not len(extra):
                    break
                for start in range(0, len(extra), len(envs)):
                    part = extra[start : start + len(envs)]
                    played, won_extra = play(policy, envs, [int(levels[g]) for g in part], turns, penalty, temperature=levers.get("extra_temperature", 1.0))
                    batch += played
                    solved |= {int(g) for g, w in zip(part, won_extra) if w}
                labels = np.concatenate([labels, extra]).astype(int)
            extra_played.append(len(batch) - groups * size)
        if levers.get("retry_rounds"):  # rounds of a whole batch's plays, shared by the levels not yet won
            solved = {g for g in range(groups) if any(won[g * size : (g + 1) * size])}
            for _ in range(int(levers["retry_rounds"])):
                unsolved = [g for g in range(groups) if g not in solved]
                if not unsolved:
                    break
                extra = np.repeat([unsolved[k % len(unsolved)] for k in range(groups)], size)
                played, won_extra = play(policy, envs, [int(levels[g]) for g in extra], turns, penalty, temperature=levers.get("retry_temperature", 1.0))
                extra_played.append(len(played))
                if levers.get("retry_keep", "all") == "all":
                    batch += played
                    labels = np.concatenate([labels, extra]).astype(int)
                else:  # a level's wins take the places of its failed plays, up to half its group
                    for g in unsolved:
                        wins = [e for e, h, w in zip(played, extra, won_extra) if h == g and w][: size // 2]
                        for k, episode in enumerate(wins):
                            batch[g * size + k], won[g * size + k] = episode, True
                solved |= {int(g) for g, w in zip(extra, won_extra) if w}
        if levers.get("self_imitation"):  # the wins of levels not every play won, kept to imitate
            if len(won) != len(batch):
                raise SystemExit("--self-imitation goes with --retry-keep swap or no retries")
            success, moves = np.array(won), set(choice_index(policy))
            for e, episode in enumerate(batch):
                if success[e] and not success[labels == labels[e]].all():
                    memory.extend((t[0], t[1]) for t in episode if t[1] in moves)  # a win's invalid replies left out, as the trainer's
            del memory[: max(len(memory) - int(levers.get("memory", 4096)), 0)]
        turns_played = [turn for episode in batch for turn in episode]
        advantage = advantages(config, estimator, batch, labels)
        if levers.get("tied_baseline"):
            advantage = advantage + levers["tied_baseline"] * tied_baseline(batch, labels)
        if critic is not None:
            observed = [t[0] for t in turns_played]
            with torch.no_grad():
                values = critic(observed).numpy().astype(np.float64)
            td, to_go = gae(batch, values, float(config.get("step_reward_gamma", 0.95)), levers.get("critic_lambda", 0.95))
            td = td / (td.std() + 1e-6)
            if levers.get("critic_where", "tied") == "tied":
                returns = np.array([sum(t[2] for t in episode) for episode in batch])
                _, codes = np.unique(labels, return_inverse=True)
                spread = np.array([returns[codes == g].std() for g in range(codes.max() + 1)])
                turn_episode = np.array([e for e, episode in enumerate(batch) for _ in episode])
                td = np.where(spread[codes][turn_episode] < 1e-8, td, 0.0)
            advantage = advantage + levers["critic"] * td
            value_loss = ((critic(observed) - torch.tensor(to_go, dtype=torch.float32)) ** 2).mean()
            critic_optimizer.zero_grad()
            value_loss.backward()
            critic_optimizer.step()
        advantage = torch.tensor(advantage, dtype=torch.float32)
        distinct = sorted({t[0] for t in turns_played})
        at = {o: k for k, o in enumerate(distinct)}
        logp = policy(distinct)[[at[t[0]] for t in turns_played], [t[1] for t in turns_played]]
        loss = -(advantage * logp).mean()
        if levers.get("self_imitation") and memory:
            picked = [memory[k] for k in rng.integers(0, len(memory), min(256, len(memory)))]
            shown = sorted({o for o, _ in picked})
            where = {o: k for k, o in enumerate(shown)}
            nll = -policy(shown)[[where[o] for o, _ in picked], [a for _, a in picked]].mean()
            trace["imitation_nll"].append(float(nll.detach()))
            trace["memory"].append(float(len(memory)))
            loss = loss + levers["self_imitation"] * nll
        for group in optimizer.param_groups:
            group["lr"] = rate * min(1.0, (step + 1) / 10) * 0.5 * (1 + math.cos(math.pi * step / steps))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a benchmark or recipe YAML")
    parser.add_argument("--policy", choices=("model", "mlp", "table"), default="model")
    parser.add_argument("--start", default="init", help="model: a model folder, or 'init' (the untrained tiny model)")
    parser.add_argument("--estimator", choices=("gigpo", "grpo"), default="gigpo")
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default: the config's max_steps)")
    parser.add_argument("--groups", type=int, default=None, help="levels a step (default: the config's groups_per_step)")
    parser.add_argument("--group-size", type=int, default=None, help="plays of each level (default: the config's group_size)")
    parser.add_argument("--learning-rate", type=float, default=None, help="default: the config's (model), 1e-3 (mlp), 0.05 (table)")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--episodes", type=int, default=256, help="validation seeds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tied-baseline", type=float, default=0.0, help="groups whose returns tie: their return against the batch's, times this")
    parser.add_argument("--extra-plays", type=int, default=0, help="levels that no play of a step won: played this many more times, in their group")
    parser.add_argument("--critic", type=float, default=0.0, help="a value function's GAE advantages (normalised over the batch), times this, added to the estimator's")
    parser.add_argument("--critic-where", choices=("tied", "all"), default="tied", help="--critic: on the turns of tied groups only, or on every turn")
    parser.add_argument("--critic-lambda", type=float, default=0.95)
    parser.add_argument("--retry-rounds", type=int, default=0, help="rounds of a whole batch of plays (groups x group size), shared out over the levels that no play has won yet")
    parser.add_argument("--retry-keep", choices=("all", "swap"), default="all", help="--retry-rounds: train on every play, or put a level's wins in the places of its failed plays (up to half its group) and leave the rest out")
    parser.add_argument("--retry-temperature", type=float, default=1.0, help="--retry-rounds: their sampling temperature (trained on as if sampled at 1)")
    parser.add_argument("--self-imitation", type=float, default=0.0, help="self-imitation: this times the log-likelihood of the moves (invalid replies left out) of remembered wins of levels not every play won (SIL, Oh et al. 2018)")
    parser.add_argument("--memory", type=int, default=4096, help="--self-imitation: the turns of wins remembered (the latest)")
    parser.add_argument("--extra-rounds", type=int, default=1, help="--extra-plays: rounds of them, each on the levels still not won")
    parser.add_argument("--extra-temperature", type=float, default=1.0, help="--extra-plays: their sampling temperature")
    parser.add_argument("--name", default=None)
    parser.add_argument("--save", default=None, help="model: save the trained model and tokenizer in this folder (for bench/sokoban_failures.py)")
    args = parser.parse_args()
    if args.save and args.policy != "model":
        raise SystemExit("--save saves the model policy's transformer")
    config = yaml.safe_load(Path(args.config).read_text())
    config["seed"] = args.seed
    for key, value in (("groups_per_step", args.groups), ("group_size", args.group_size), ("max_steps", args.steps)):
        if value:
            config[key] = value
    groups, size = int(config["groups_per_step"]), int(config["group_size"])
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    envs = [envhub.make(config["env_id"], **config.get("env_kwargs", {})) for _ in range(groups * size)]
    names = tuple(envs[0].unwrapped.action_names)
    if args.policy == "model":
        policy: Any = ModelPolicy(args.start, config, names)
    elif config.get("history_turns"):
        raise SystemExit("history_turns goes with --policy model")
    else:
        policy = TablePolicy(len(names)) if args.policy == "table" else WordsMLP(len(names))
    rate = args.learning_rate or {"model": float(config.get("learning_rate", 5e-4)), "mlp": 1e-3, "table": 0.05}[args.policy]
    name = args.name or f"{Path(args.config).stem}-{args.policy}-{args.estimator}-seed{args.seed}"
    out = ROOT / "results" / "rl_sim" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(curve: list[dict[str, Any]]) -> None:  # after every evaluation: a stopped run keeps its curve
        partial = out.with_suffix(".json.tmp")
        partial.write_text(json.dumps({"args": vars(args), "config": config, "curve": curve}, indent=1) + "\n")
        partial.replace(out)

    curve = train(policy, envs, config, rate, args.estimator, rng, args.eval_every, args.episodes, {"tied_baseline": args.tied_baseline, "extra_plays": args.extra_plays, "extra_temperature": args.extra_temperature, "extra_rounds": args.extra_rounds, "retry_rounds": args.retry_rounds, "retry_keep": args.retry_keep, "retry_temperature": args.retry_temperature, "self_imitation": args.self_imitation, "memory": args.memory, "critic": args.critic, "critic_where": args.critic_where, "critic_lambda": args.critic_lambda}, on_evaluation=write)
    print(f"wrote {out}")
    if args.save:
        policy.model.save_pretrained(args.save)
        policy.tokenizer.save_pretrained(args.save)
        print(f"saved the model in {args.save}")


if __name__ == "__main__":
    main()
