"""RL alone on FrozenLake in seconds: the lever search for issue 40.

The trainer's RL-alone run (``examples/frozenlake_rl_alone.yaml``) takes 12 minutes; this loop takes
under two, so that a lever can be tried at several seeds before a trainer run confirms it. It keeps
what decides the learning and drops the rest:

- the game: the not-slippery 4x4 map of ``random_map`` (the env's own generator), the local view,
  8 turns, reward 1 at the goal, a hole ends the episode, a move off the edge stays put, an invalid
  reply costs the run's ``format_penalty`` (-0.1) and the turn;
- the advantages: :func:`envhub_trl.advantages.gigpo_advantages` or ``grpo_advantages``, exactly as
  the trainer computes them (anchors: the map's group and the position), normalised as
  ``advantage_norm`` does (``--norm``), positive ones weighted by ``--positive-weight``
  (``positive_advantage_weight``);
- the step: one AdamW step a batch on ``-mean(advantage * log p(move))`` (no ratio: one update per
  batch, which the trainer's ratio reduces to), gradient norm clipped at 1, a 10-step warm-up;
- the policy (``--policy``): ``model``, the run's tiny transformer reading the run's real prompt
  (system prompt, view, ``<answer>`` prefilled; checked token for token against the env's) and
  sampling the move token from its whole vocabulary; ``mlp``, a two-layer MLP on the view's one-hot
  features (row, column, each neighbour's tile); ``table``, one softmax per distinct view.

``--start init`` (``model``) makes the format-only start first: ``--format-steps`` supervised steps
towards the uniform distribution over the four moves on random-walk views, what
``warm_start.demonstrator: random`` teaches. Evaluation: greedy and sampled success on 256
validation maps (``random_map`` seeds from 5 * 10^8, which no run trains or is measured on), and the
entropy of the four moves' distribution given the view.

The levers the second plateau was screened with (docs/results-rl-alone.md): ``--step-weight``
(GiGPO's ω), ``--anchor context``, ``--entropy-coef``/``--entropy-floor`` (the trainer's
``action_entropy_coef``/``action_entropy_floor``), ``--temperature``, ``--groups``/``--group-size``; and where the episodes go: ``--replay`` (a share of
each step's maps replayed from those whose last group was neither all won nor all lost, drawn by
p(1-p), as sampling for learnability does) and ``--epsilon`` (a uniformly random move in place of
the sampled one, with that probability a turn).
``--format-loss set`` makes a start that learns the four moves' total probability, not their split
(``set-floor``: with their entropy held up to ``SET_FLOOR``), so that the start is not taught to
ignore its view. ``--adam-beta2`` and ``--max-grad-norm`` change the optimizer's step (``adam_beta2``,
``max_grad_norm``; 0 leaves the gradient unclipped).
Each evaluation also says how the greedy episodes that lost ended (``hole_in_view``: a step into a
hole the view showed). ``--save DIR`` keeps the trained model; ``--steps 0`` only evaluates a start.

``--whole-reply`` trains what the trainer trained before ``train_stop_strings`` (the move and
``</answer>``'s four tokens, each weighted alike); give it a start that knows the closing tag (a
trainer run's warm start, ``envhub train ... max_steps=1 learning_rate=1e-12``, its ``final``).

    python bench/frozenlake_sim.py --policy table --learning-rate 0.05
    python bench/frozenlake_sim.py --policy mlp
    python bench/frozenlake_sim.py --policy model --start init --learning-rate 5e-4 --steps 300
    python bench/frozenlake_sim.py --policy model --start init --learning-rate 1e-4 --steps 500 --seed 1
    python bench/frozenlake_sim.py --policy model --start WARM/final --whole-reply --steps 200 --eval-every 25

Writes bench/results/frozenlake_sim/NAME.json (the arguments and the curve).
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

from envhub_frozenlake.env import random_map
from envhub_trl.advantages import gigpo_advantages, grpo_advantages, weigh_positive
from envhub_trl.loss_inputs import entropy_bonus

ROOT = Path(__file__).resolve().parent
MOVES = ("Left", "Down", "Right", "Up")
DELTAS = ((0, -1), (1, 0), (0, 1), (-1, 0))
TILES = {"S": "ice", "F": "ice", "H": "hole", "G": "goal"}
SIDE, TURNS, P_ICE, FORMAT_PENALTY = 4, 8, 0.8, -0.1
VALIDATION = 5 * 10**8
RUN_CONFIG = ROOT.parent / "examples" / "frozenlake_rl_alone.yaml"


def view(desc: tuple[str, ...], row: int, col: int) -> str:
    """The local view as the env writes it (``FrozenLakeTextEnv._local_view``)."""
    around = []
    for name, (dr, dc) in zip(MOVES, DELTAS):
        r, c = row + dr, col + dc
        around.append(f"{name}: {TILES[desc[r][c]] if 0 <= r < SIDE and 0 <= c < SIDE else 'edge'}.")
    return f"Row {row + 1}, column {col + 1}.\n" + " ".join(around)


def features(text: str) -> np.ndarray:
    """The view's one-hot features: row, column, and each neighbour's tile."""
    head, around = text.split("\n")
    row, col = (int(part.split()[-1].rstrip(",.")) - 1 for part in head.split(", "))
    x = np.zeros(8 + 4 * 4, np.float32)
    x[row], x[4 + col] = 1, 1
    for k, clause in enumerate(around.split(". ")):
        x[8 + 4 * k + ("ice", "hole", "goal", "edge").index(clause.split(": ")[1].rstrip("."))] = 1
    return x


class TablePolicy(torch.nn.Module):
    """One softmax over the four moves per distinct view."""

    def __init__(self) -> None:
        super().__init__()
        self.index: dict[str, int] = {}
        self.logits = torch.nn.Parameter(torch.zeros(4096, 4))

    def forward(self, views: list[str]) -> torch.Tensor:
        rows = [self.index.setdefault(v, len(self.index)) for v in views]
        return torch.log_softmax(self.logits[rows], -1)


class MLPPolicy(torch.nn.Module):
    """A two-layer MLP (hidden 128) on the view's one-hot features."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(24, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))

    def forward(self, views: list[str]) -> torch.Tensor:
        return torch.log_softmax(self.net(torch.tensor(np.stack([features(v) for v in views]))), -1)


class ModelPolicy(torch.nn.Module):
    """The run's tiny transformer: log-probabilities over its whole vocabulary after the run's prompt."""

    def __init__(self, start: str, seed: int, format_sentence: bool = True) -> None:
        super().__init__()
        config = yaml.safe_load(RUN_CONFIG.read_text())
        sys.path.insert(0, str(ROOT))
        from view_reading import load, prompt_template

        self.model, self.tokenizer = load(start, {**config, "seed": seed})
        self.model.float().train()
        self.moves = [self.tokenizer.encode(m, add_special_tokens=False)[0] for m in MOVES]
        self.head, self.tail = prompt_template(self.tokenizer, config)
        if not format_sentence:  # the system message without envhub's reply-format sentence
            cut = self.head.index("\n\nReply with")
            self.head = self.head[:cut] + self.head[self.head.index("<|im_end|>", cut) :]
        self.cache: dict[str, list[int]] = {}

    def forward(self, views: list[str]) -> torch.Tensor:
        from view_reading import next_token_log_probs

        return next_token_log_probs(self.model, self.tokenizer, self.head, self.tail, self.cache, views)

    def reply_logps(self, views: list[str], tokens: list[int]) -> tuple[torch.Tensor, int]:
        """The summed log-probability of each reply as the trainer trains it (the sampled token, then
        ``</answer>``'s tokens), and how many tokens that is."""
        close = self.tokenizer.encode("</answer>", add_special_tokens=False)
        from view_reading import left_padded

        rows = [self.cache.setdefault(v, self.tokenizer.encode(self.head + v + self.tail, add_special_tokens=False)) + [t] + close for v, t in zip(views, tokens)]
        ids, mask = left_padded(rows)
        logp = torch.log_softmax(self.model(input_ids=ids, attention_mask=mask).logits[:, -len(close) - 2 : -1].float(), -1)
        return logp.gather(-1, ids[:, -len(close) - 1 :, None])[..., 0].sum(-1), len(close) + 1

    def move_logits(self, logp: torch.Tensor) -> torch.Tensor:
        return logp[:, self.moves]


class Tempered(torch.nn.Module):
    """A policy sampled at a temperature: log-probabilities of ``logits / temperature``."""

    def __init__(self, policy: Any, temperature: float) -> None:
        super().__init__()
        self.policy, self.temperature = policy, temperature
        if hasattr(policy, "moves"):
            self.moves = policy.moves

    def rescale(self, logp: torch.Tensor) -> torch.Tensor:
        """The wrapped policy's log-probabilities at this temperature."""
        return torch.log_softmax(logp / self.temperature, -1)

    def forward(self, views: list[str]) -> torch.Tensor:
        return self.rescale(self.policy(views))


def play(policy: Any, maps: list[tuple[str, ...]], greedy: bool = False, epsilon: float = 0.0) -> list[list[tuple[str, int, float, tuple[int, int]]]]:
    """Each map played once: per turn (view, token, reward, position before the move). With
    ``epsilon``, each sampled move is replaced by a uniformly random one with that probability."""
    moves = getattr(policy, "moves", [0, 1, 2, 3])
    where = [(0, 0)] * len(maps)
    live = list(range(len(maps)))
    episodes: list[list[Any]] = [[] for _ in maps]
    for _ in range(TURNS):
        if not live:
            break
        shown = [view(maps[i], *where[i]) for i in live]
        distinct = sorted(set(shown))
        with torch.no_grad():
            logp = policy(distinct)
        at = {v: k for k, v in enumerate(distinct)}
        rows = logp[[at[v] for v in shown]]
        tokens = rows.argmax(-1) if greedy else torch.distributions.Categorical(logits=rows).sample()
        if epsilon:
            swap = torch.rand(len(tokens)) < epsilon
            tokens = torch.where(swap, torch.tensor(moves)[torch.randint(len(moves), (len(tokens),))], tokens)
        still = []
        for i, text, token in zip(live, shown, tokens.tolist()):
            (row, col), reward = where[i], 0.0
            if token in moves:
                dr, dc = DELTAS[moves.index(token)]
                if 0 <= row + dr < SIDE and 0 <= col + dc < SIDE:
                    row, col = row + dr, col + dc
            else:
                reward = FORMAT_PENALTY
            tile = maps[i][row][col]
            reward += 1.0 if tile == "G" else 0.0
            episodes[i].append((text, token, reward, where[i]))
            where[i] = (row, col)
            if tile not in "HG":
                still.append(i)
        live = still
    return episodes


def move_entropies(policy: Any, logp: torch.Tensor) -> torch.Tensor:
    """Per row of the policy's log-probabilities, the entropy of the four moves' distribution
    (renormalised over them for the model, whose vocabulary has other tokens)."""
    q = torch.log_softmax(logp if not hasattr(policy, "moves") else policy.move_logits(logp), -1)
    return -(q.exp() * q).sum(-1)


def evaluate(policy: Any, maps: list[tuple[str, ...]]) -> dict[str, float]:
    policy.eval()
    greedy, sampled = play(policy, maps, greedy=True), play(policy, maps)
    with torch.no_grad():
        entropy = float(move_entropies(policy, policy(sorted({turn[0] for episode in sampled for turn in episode}))).mean())
    policy.train()
    won = lambda episodes: float(np.mean([e[-1][2] > 0.5 for e in episodes]))  # noqa: E731
    return {"greedy": won(greedy), "sampled": won(sampled), "move_entropy": entropy, **greedy_losses(policy, greedy)}


def greedy_losses(policy: Any, episodes: list[list[tuple[str, int, float, tuple[int, int]]]]) -> dict[str, float]:
    """How the greedy episodes that did not win ended, as shares of all episodes: in a hole the
    last view showed in the direction taken (``hole_in_view``), out of turns, or with invalid replies."""
    moves = getattr(policy, "moves", [0, 1, 2, 3])
    lost = [e for e in episodes if e[-1][2] <= 0.5]
    seen = [e[-1][1] in moves and f"{MOVES[moves.index(e[-1][1])]}: hole" in e[-1][0] for e in lost]
    late = sum(not hole and len(e) == TURNS for e, hole in zip(lost, seen))
    invalid = sum(any(turn[1] not in moves for turn in e) for e in lost)
    return {"hole_in_view": sum(seen) / len(episodes), "out_of_turns": late / len(episodes), "invalid": invalid / len(episodes)}


#: ``--format-loss set-floor``: the entropy (nats) the four moves are held up to; uniform is 1.386.
SET_FLOOR = 1.2


def format_start(policy: ModelPolicy, steps: int, loss_kind: str = "uniform") -> None:
    """Supervised steps on random-walk views (lr 1e-3): towards uniform over the four moves
    (``uniform``, what imitating the random mover teaches), or towards the four moves' total
    probability, whatever their split (``set``: the format and nothing of which move)."""
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    for k in range(steps):
        maps = [random_map(SIDE, P_ICE, 7 * 10**8 + k * 64 + i) for i in range(64)]
        shown = [turn[0] for episode in play(policy, maps) for turn in episode][:256]
        moves = policy.move_logits(policy(shown))
        if loss_kind == "uniform":
            loss = -moves.mean()
        else:
            loss = -torch.logsumexp(moves, -1).mean()
            if loss_kind == "set-floor":  # the moves' entropy held up to a floor, not pushed to uniform
                q = torch.log_softmax(moves, -1)
                loss = loss - torch.clamp(-(q.exp() * q).sum(-1), max=SET_FLOOR).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def replay_pick(buffer: dict[int, float], count: int, rng: np.random.Generator) -> list[int]:
    """``count`` distinct map seeds from the buffer, drawn in proportion to their learnability."""
    count = min(count, len(buffer))
    if not count:
        return []
    seeds = sorted(buffer)
    weights = np.array([buffer[s] for s in seeds])
    return [int(s) for s in rng.choice(seeds, size=count, replace=False, p=weights / weights.sum())]


def replay_update(buffer: dict[int, float], seeds: list[int], success: np.ndarray, size: int) -> None:
    """Score each played map by p(1-p) of its group's success; keep the ``size`` most learnable."""
    for seed, p in zip(seeds, success):
        if 0.0 < p < 1.0:
            buffer[seed] = float(p * (1.0 - p))
        else:
            buffer.pop(seed, None)
    for seed in sorted(buffer, key=buffer.get)[: max(len(buffer) - size, 0)]:
        del buffer[seed]


def learning_rate(args: argparse.Namespace, step: int) -> float:
    warm = min(1.0, (step + 1) / args.warmup_steps)
    return args.learning_rate * warm * (0.5 * (1 + math.cos(math.pi * step / args.steps)) if args.schedule == "cosine" else 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", choices=("model", "mlp", "table"), default="model")
    parser.add_argument("--start", default="init", help="model: a model folder, or 'init' (the format-only start made here)")
    parser.add_argument("--format-steps", type=int, default=200)
    parser.add_argument("--format-loss", choices=("uniform", "set", "set-floor"), default="uniform", help="model, --start init: the start's target: uniform over the moves, or their total probability (set-floor: with the moves' entropy held up to SET_FLOOR nats)")
    parser.add_argument("--estimator", choices=("gigpo", "grpo"), default="gigpo")
    parser.add_argument("--norm", choices=("mean", "mean_std", "relative"), default="mean_std", help="the advantages' normalisation (advantage_norm)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--schedule", choices=("constant", "cosine"), default="constant")
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--groups", type=int, default=8, help="maps a step")
    parser.add_argument("--group-size", type=int, default=8, help="plays of each map")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--whole-reply", action="store_true", help="model: train the move and </answer>'s tokens, as the trainer does")
    parser.add_argument("--anchor", choices=("state", "context"), default="state", help="gigpo: the step level's anchors (step_anchor): the map's group and the position, or the view across the batch")
    parser.add_argument("--step-weight", type=float, default=1.0, help="gigpo: the step level's weight (step_advantage_weight)")
    parser.add_argument("--gamma", type=float, default=0.95, help="gigpo: the step returns' discount")
    parser.add_argument("--positive-weight", type=float, default=1.0, help="positive_advantage_weight: positive advantages weighted so, negative ones by 1 (W-REINFORCE's λ)")
    parser.add_argument("--entropy-coef", type=float, default=0.0, help="action_entropy_coef: the four moves' entropy (renormalised) added to the objective, weighted as a turn")
    parser.add_argument("--entropy-floor", type=float, default=None, help="action_entropy_floor: reward the entropy only up to this floor")
    parser.add_argument("--epsilon", type=float, default=0.0, help="the training episodes: each move replaced by a uniformly random one with this probability (trained on as sampled)")
    parser.add_argument("--replay", type=float, default=0.0, help="the share of a step's maps replayed from the learnable maps seen (0 < its group's success < 1), drawn by p(1-p) (sampling for learnability)")
    parser.add_argument("--replay-size", type=int, default=64, help="the most maps the replay buffer holds (the most learnable kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0, help="the training episodes' sampling temperature (the loss reads the same tempered log-probabilities, as TRL's does)")
    parser.add_argument("--save", default=None, help="model: save the trained model to this folder")
    parser.add_argument("--no-format-sentence", action="store_true", help="model: leave envhub's reply-format sentence out of the system message (the move is still sampled after a prefilled <answer>)")
    parser.add_argument("--adam-beta2", type=float, default=0.999, help="the optimizer's second-moment decay (adam_beta2)")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="the gradient's norm is clipped to this (max_grad_norm; 0: not clipped)")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    policy = {"table": TablePolicy, "mlp": MLPPolicy}[args.policy]() if args.policy != "model" else ModelPolicy(args.start, args.seed, not args.no_format_sentence)
    if args.policy == "model" and args.start == "init":
        format_start(policy, args.format_steps, args.format_loss)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.learning_rate, weight_decay=0.0, betas=(0.9, args.adam_beta2))
    tempered = policy if args.temperature == 1.0 else Tempered(policy, args.temperature)
    validation = [random_map(SIDE, P_ICE, VALIDATION + i) for i in range(256)]
    next_map, curve, started = args.seed * 10**6, [], time.time()
    buffer: dict[int, float] = {}
    rng = np.random.default_rng(args.seed)
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            curve.append({"step": step, **evaluate(policy, validation), "seconds": round(time.time() - started, 1)})
            print(" ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in curve[-1].items()), flush=True)
        if step == args.steps:
            break
        replayed = replay_pick(buffer, round(args.replay * args.groups), rng)
        seeds = replayed + list(range(next_map, next_map + args.groups - len(replayed)))
        next_map += args.groups - len(replayed)
        maps = [random_map(SIDE, P_ICE, s) for s in seeds for _ in range(args.group_size)]
        episodes = play(tempered, maps, epsilon=args.epsilon)
        turns = [(e, t, turn) for e, episode in enumerate(episodes) for t, turn in enumerate(episode)]
        rewards = np.array([turn[2] for _, _, turn in turns])
        trajectory = np.array([e for e, _, _ in turns])
        groups = np.arange(len(episodes)) // args.group_size
        if args.estimator == "gigpo":
            if args.anchor == "state":
                keys, pooled = np.array([f"{e // args.group_size}:{turn[3]}" for e, _, turn in turns]), None
            else:  # the policy's input, anchored across the batch's groups
                keys, pooled = np.array([turn[0] for _, _, turn in turns]), np.zeros(len(turns), dtype=int)
            advantages = gigpo_advantages(
                rewards, trajectory, np.array([t for _, t, _ in turns]), groups, keys,
                norm=args.norm, step_weight=args.step_weight, gamma=args.gamma, anchor_groups=pooled,
            )["advantages"]
        else:
            advantages = grpo_advantages(np.bincount(trajectory, weights=rewards, minlength=len(episodes)), groups, norm=args.norm)[trajectory]
        advantages = weigh_positive(advantages, args.positive_weight)
        if args.replay:
            won = np.bincount(trajectory, weights=rewards, minlength=len(episodes)) > 0.5
            replay_update(buffer, seeds, won.reshape(len(seeds), args.group_size).mean(axis=1), args.replay_size)
        distinct = sorted({turn[0] for _, _, turn in turns})
        at = {v: k for k, v in enumerate(distinct)}
        if args.whole_reply:  # as the trainer: the move and </answer>, each token weighted alike
            logp, per_reply = policy.reply_logps([turn[0] for _, _, turn in turns], [turn[1] for _, _, turn in turns])
            loss = -(torch.tensor(advantages, dtype=torch.float32) * logp).sum() / (per_reply * len(turns))
        else:
            scores = policy(distinct)
            logp = (scores if tempered is policy else tempered.rescale(scores))[[at[turn[0]] for _, _, turn in turns], [turn[1] for _, _, turn in turns]]
            loss = -(torch.tensor(advantages, dtype=torch.float32) * logp).mean()
        if args.entropy_coef:  # as the trainer's action_entropy_coef: the legal choice's entropy, per turn
            entropy = move_entropies(policy, policy(distinct) if args.whole_reply else scores)[[at[turn[0]] for _, _, turn in turns]]
            loss = loss - args.entropy_coef * entropy_bonus(entropy, args.entropy_floor).mean()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(args, step)
        optimizer.zero_grad()
        loss.backward()
        if args.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
        optimizer.step()
    if args.save and args.policy == "model":
        policy.model.save_pretrained(args.save)
        policy.tokenizer.save_pretrained(args.save)
    name = args.name or f"{args.policy}-{args.estimator}-lr{args.learning_rate:g}-{args.schedule}-seed{args.seed}"
    out = ROOT / "results" / "frozenlake_sim" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "curve": curve}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
