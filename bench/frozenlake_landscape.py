"""Where does exact policy gradient go on FrozenLake's local view? The landscape RL alone climbs.

RL alone on the not-slippery 4x4 FrozenLake (local view, 8 turns; docs/results-rl-alone.md) reads
its view and then often stops at a fixed rule that wins 70-82% of the maps, under the best
memoryless policy's 92.2%. Is that the estimator's noise, or the objective itself? This script takes
the noise away. It enumerates every map the env can draw (``ViewPlanner``: each inner tile a hole
with probability 1 - p, kept when a path exists, weighted as drawn), and computes a memoryless
policy's success exactly: a table of four move probabilities per local view (what the prompt shows:
the position and the four neighbouring tiles), the player's position distribution pushed through
8 turns on every map at once. Autograd then gives the exact policy gradient.

It reports:

- a check against the env: the Down-then-Right rule played through ``envhub.make`` on 300
  validation maps, map by map against the exact outcome;
- for named rules, and for random deterministic tables, the best single-view switch (every view,
  every other move, the exact gain) and where coordinate ascent from them ends: a rule no switch
  improves is a local optimum of the memoryless objective;
- exact softmax policy gradient (Adam on the logits, as the trainer steps) from the uniform policy,
  from the Down-then-Right rule made 95% and 99.9% sure, and from ``--inits`` random logit tables;
- how one sampled batch's step lines up with the exact gradient, for GRPO and GiGPO variants,
  computed with the trainer's own advantage functions (over the table and on the first square's view);
- the recipe's sampled GiGPO on the table (16 maps x 8 plays, 300 cosine-decayed steps) at
  ``--sampled-seeds`` seeds, scored exactly.

``--model DIR`` scores one trained model of ``examples/frozenlake_rl_alone.yaml``'s prompt exactly
instead (its four moves' probabilities read on every view) and says where its greedy policy could gain.

    python bench/frozenlake_landscape.py
    python bench/frozenlake_landscape.py --model OUT/final

Writes bench/results/frozenlake_landscape.json (``--model``: frozenlake_landscape_model.json). CPU only.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envhub_frozenlake.view_planning import DELTAS, ViewPlanner
from envhub_trl.advantages import gigpo_advantages, grpo_advantages

MOVES = ("Left", "Down", "Right", "Up")  # the env's action_names order, DELTAS' order
SIZE = 4


class Landscape:
    """Every 4x4 map with its weight, and each (map, square)'s local view as an index."""

    def __init__(self, p: float, turns: int):
        planner = ViewPlanner(SIZE, p)
        self.turns = turns
        holes = self.hole = planner.hole  # (maps, 4, 4)
        self.weight = torch.tensor(planner.weight, dtype=torch.float64)
        maps, cells = holes.shape[0], SIZE * SIZE
        goal = cells - 1
        views: dict[tuple, int] = {}
        view_of = np.zeros((maps, cells), np.int64)
        step_to = np.zeros((maps, cells, 4), np.int64)
        for m in range(maps):
            tile = lambda r, c: "goal" if (r, c) == (SIZE - 1, SIZE - 1) else ("hole" if holes[m, r, c] else "ice")  # noqa: E731
            for s in range(cells):
                r, c = divmod(s, SIZE)
                seen = tuple(tile(r + dr, c + dc) if 0 <= r + dr < SIZE and 0 <= c + dc < SIZE else "edge" for dr, dc in DELTAS)
                view_of[m, s] = views.setdefault((r, c, *seen), len(views))
                for a, (dr, dc) in enumerate(DELTAS):
                    q = (r + dr, c + dc)
                    step_to[m, s, a] = q[0] * SIZE + q[1] if 0 <= q[0] < SIZE and 0 <= q[1] < SIZE else s
        self.views = list(views)
        self.view_of = torch.tensor(view_of)
        self.step_to = torch.tensor(step_to)
        stop = torch.tensor(holes.reshape(maps, cells))
        stop[:, goal] = True
        self.live = (~stop).double()  # mass on a hole or the goal leaves the walk
        self.goal = goal

    def success(self, probs: torch.Tensor, per_map: bool = False) -> torch.Tensor:
        """Exact probability of reaching the goal within ``turns``, averaged over maps by weight.
        ``probs``: (views, 4) move probabilities. Differentiable in ``probs``."""
        maps, cells = self.view_of.shape
        where = torch.zeros(maps, cells, dtype=torch.float64)
        where[:, 0] = 1.0
        won = torch.zeros(maps, dtype=torch.float64)
        moves = probs[self.view_of]  # (maps, cells, 4)
        for _ in range(self.turns):
            flow = where.unsqueeze(-1) * moves  # (maps, cells, 4)
            nxt = torch.zeros_like(where).scatter_add(1, self.step_to.reshape(maps, -1), flow.reshape(maps, -1))
            won = won + nxt[:, self.goal]
            where = nxt * self.live
        return won if per_map else (won * self.weight).sum()

    def greedy(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(probs.argmax(-1), 4).double()

    def best_switch(self, probs: torch.Tensor) -> tuple[float, str]:
        """The largest exact gain of changing one view's move of a deterministic ``probs``, and which change."""
        gain, view, move = self._best_switch(probs)
        return gain, f"{self.views[view]} -> {MOVES[move]}" if gain > 0 else "none"

    def _best_switch(self, probs: torch.Tensor) -> tuple[float, int, int]:
        base = float(self.success(probs))
        best = (0.0, -1, -1)
        for v in range(len(self.views)):
            for a in range(4):
                if probs[v, a] == 1.0:
                    continue
                trial = probs.clone()
                trial[v] = 0.0
                trial[v, a] = 1.0
                gain = float(self.success(trial)) - base
                if gain > best[0]:
                    best = (gain, v, a)
        return best

    def coordinate_ascent(self, probs: torch.Tensor) -> torch.Tensor:
        """Switch one view's move at a time while any switch gains (a deterministic local optimum)."""
        probs = probs.clone()
        while True:
            gain, view, move = self._best_switch(probs)
            if gain <= 1e-12:
                return probs
            probs[view] = 0.0
            probs[view, move] = 1.0


def play(land: Landscape, probs: torch.Tensor, maps: np.ndarray, rng: np.random.Generator) -> list[tuple[int, int, int, int, float, int]]:
    """Each map in ``maps`` (indices) played once with ``probs``: per turn (episode, turn, view,
    move, reward, square)."""
    cumulative = probs.numpy().cumsum(-1)
    turns = []
    for e, m in enumerate(maps):
        s = 0
        for t in range(land.turns):
            v = int(land.view_of[m, s])
            a = min(int((cumulative[v] < rng.random()).sum()), 3)
            nxt = int(land.step_to[m, s, a])
            won = nxt == land.goal
            turns.append((e, t, v, a, float(won), s))
            s = nxt
            if won or not land.live[m, nxt]:
                break
    return turns


ESTIMATORS = {
    "grpo": {"estimator": "grpo"},
    "grpo, norm mean": {"estimator": "grpo", "norm": "mean"},
    "gigpo": {"estimator": "gigpo"},
    "gigpo, step weight 2": {"estimator": "gigpo", "step_weight": 2.0},
    "gigpo, norm mean": {"estimator": "gigpo", "norm": "mean"},
    "gigpo, gamma 1": {"estimator": "gigpo", "gamma": 1.0},
}


def update(land: Landscape, probs: torch.Tensor, turns: list[tuple], group_size: int, options: dict[str, Any]) -> torch.Tensor:
    """The direction the loss ``-mean(advantage * log p(move))`` steps the logit table in (its negative gradient)."""
    episode, step, view, move, reward, square = (np.array(column) for column in zip(*turns))
    episodes = int(episode.max()) + 1
    groups = np.arange(episodes) // group_size
    norm = options.get("norm", "mean_std")
    if options["estimator"] == "gigpo":
        keys = np.array([f"{e // group_size}:{s}" for e, s in zip(episode, square)])
        advantage = gigpo_advantages(reward, episode, step, groups, keys, norm=norm, step_weight=options.get("step_weight", 1.0), gamma=options.get("gamma", 0.95))["advantages"]
    else:
        advantage = grpo_advantages(np.bincount(episode, weights=reward, minlength=episodes), groups, norm=norm)[episode]
    direction = torch.zeros_like(probs)
    weight = torch.tensor(advantage / len(turns))
    direction.index_add_(0, torch.tensor(view), weight[:, None] * (torch.nn.functional.one_hot(torch.tensor(move), 4).double() - probs[torch.tensor(view)]))
    return direction


def alignment(land: Landscape, logits: torch.Tensor, batches: int, groups: int, group_size: int, seed: int) -> dict[str, Any]:
    """How each estimator's step lines up with the exact gradient at the policy ``softmax(logits)``:
    the cosine of its mean step over ``batches`` batches (the bias) and the mean cosine of one batch's
    step (how much of one step is signal), over the whole table and on the first square's view alone."""
    logits = logits.clone().requires_grad_(True)
    land.success(logits.softmax(-1)).backward()
    exact = logits.grad.detach()
    probs = logits.detach().softmax(-1)
    start = int(land.view_of[0, 0])
    cos = lambda a, b: float((a * b).sum() / (a.norm() * b.norm()).clamp_min(1e-30))  # noqa: E731
    rng = np.random.default_rng(seed)
    out = {}
    steps = {name: [] for name in ESTIMATORS}
    for _ in range(batches):
        maps = np.repeat(rng.choice(len(land.weight), size=groups, p=land.weight.numpy()), group_size)
        turns = play(land, probs, maps, rng)
        for name, options in ESTIMATORS.items():
            steps[name].append(update(land, probs, turns, group_size, options))
    for name, directions in steps.items():
        mean = torch.stack(directions).mean(0)
        out[name] = {
            "mean_step_cosine": cos(mean, exact),
            "one_batch_cosine": float(np.mean([cos(d, exact) for d in directions])),
            "first_view_mean_step_cosine": cos(mean[start], exact[start]),
            "first_view_one_batch_cosine": float(np.mean([cos(d[start], exact[start]) for d in directions])),
        }
    return out


def sampled_climb(land: Landscape, seed: int, steps: int, groups: int, group_size: int, lr: float, options: dict[str, Any]) -> torch.Tensor:
    """The recipe's RL on the logit table: ``groups`` maps of ``group_size`` sampled plays a step,
    the estimator's advantages, Adam at ``lr`` with a 10-step warm-up and a cosine decay, the
    gradient norm clipped at 1. Returns the final move probabilities."""
    rng = np.random.default_rng(seed)
    logits = torch.zeros(len(land.views), 4, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=lr)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 10) * 0.5 * (1 + math.cos(math.pi * step / steps))
        probs = logits.detach().softmax(-1)
        maps = np.repeat(rng.choice(len(land.weight), size=groups, p=land.weight.numpy()), group_size)
        opt.zero_grad()
        logits.grad = -update(land, probs, play(land, probs, maps, rng), group_size, options)
        torch.nn.utils.clip_grad_norm_([logits], 1.0)
        opt.step()
    return logits.detach().softmax(-1)


def model_table(land: Landscape, folder: str) -> torch.Tensor:
    """A trained model's move probabilities on every local view, read as the RL-alone recipe prompts
    it (``bench/frozenlake_sim.py``'s :class:`ModelPolicy`: the run's system prompt, the view,
    ``<answer>`` prefilled; the four moves' first tokens, renormalised over the four)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from frozenlake_sim import ModelPolicy

    policy = ModelPolicy(folder, seed=0).eval()
    texts = [f"Row {r + 1}, column {c + 1}.\n" + " ".join(f"{move}: {tile}." for move, tile in zip(MOVES, seen)) for r, c, *seen in land.views]
    with torch.no_grad():
        return policy.move_logits(policy(texts)).double().softmax(-1)


def scores(land: Landscape, probs: torch.Tensor) -> dict[str, Any]:
    """A policy's exact success, sampled and greedy; its first move; and its greedy policy's best single switch."""
    greedy = land.greedy(probs)
    gain, which = land.best_switch(greedy)
    first = probs[int(land.view_of[0, 0])]
    return {
        "sampled": float(land.success(probs)), "greedy": float(land.success(greedy)),
        "first_move_probabilities": dict(zip(MOVES, map(float, first))), "first_move_entropy": float(-(first * first.clamp_min(1e-30).log()).sum()),
        "greedy_best_switch_gain": gain, "greedy_best_switch": which,
    }


def check_against_env(land: Landscape, probs: torch.Tensor, seeds: range) -> tuple[int, float]:
    """Play the deterministic ``probs`` through the env on ``seeds`` and compare each map's outcome with
    the exact computation's: (maps that agree, the env's success)."""
    import envhub

    planner_maps = {tuple(h.reshape(-1).tolist()): m for m, h in enumerate(land.hole)}
    exact = land.success(probs, per_map=True)
    views = {view: v for v, view in enumerate(land.views)}
    env = envhub.make("frozenlake/FrozenLakeNotSlippery-v0", view="local", max_turns=land.turns)
    agree = wins = 0
    for seed in seeds:
        observation, info = env.reset(seed=seed)
        done = False
        while not done:
            head, around = observation.splitlines()[-2:]
            row, col = (int(part.split()[-1].rstrip(",.")) - 1 for part in head.split(", "))
            seen = tuple(clause.split(": ")[1].rstrip(".") for clause in around.split(". "))
            move = MOVES[int(probs[views[(row, col, *seen)]].argmax())]
            observation, _, terminated, truncated, info = env.step(move)
            done = terminated or truncated
        m = planner_maps[tuple(c == "H" for row_ in env.desc for c in row_)]
        agree += bool(info["success"]) == bool(exact[m] > 0.5)
        wins += bool(info["success"])
    env.close()
    return agree, wins / len(seeds)


def rule(land: Landscape, order: tuple[str, ...]) -> torch.Tensor:
    """'The first of ``order`` whose tile is ice or the goal' (the first of ``order`` when none is)."""
    probs = torch.zeros(len(land.views), 4, dtype=torch.float64)
    for v, (_, _, *seen) in enumerate(land.views):
        move = next((m for m in order if seen[MOVES.index(m)] in ("ice", "goal")), order[0])
        probs[v, MOVES.index(move)] = 1.0
    return probs


def climb(land: Landscape, logits: torch.Tensor, steps: int, lr: float, entropy: float = 0.0) -> tuple[torch.Tensor, list[float]]:
    """Exact softmax policy gradient with Adam; returns the final probabilities and the success every 100 steps."""
    logits = logits.clone().requires_grad_(True)
    opt = torch.optim.Adam([logits], lr=lr)
    curve = []
    for step in range(steps):
        probs = logits.softmax(-1)
        value = land.success(probs)
        loss = -value
        if entropy:
            loss = loss - entropy * -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            curve.append(round(float(value.detach()), 4))
    return logits.detach().softmax(-1), curve


def write(name: str, figures: dict[str, Any]) -> None:
    out = Path(__file__).parent / "results" / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="Only score this trained model (a folder) exactly: its greedy and sampled success, first move, best switch.")
    parser.add_argument("--p", type=float, default=0.8)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--groups", type=int, default=16, help="Maps a batch, for the estimators' alignment (the recipe's groups_per_step).")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--sampled-seeds", type=int, default=6, help="Seeds of the sampled GiGPO climb on the table.")
    parser.add_argument("--sampled-steps", type=int, default=300)
    parser.add_argument("--random-tables", type=int, default=8, help="Random deterministic tables coordinate ascent starts from.")
    parser.add_argument("--inits", type=int, default=4, help="Random logit tables (N(0, --init-scale)) climbed besides the uniform one.")
    parser.add_argument("--init-scale", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--entropy", type=float, default=0.0, help="An entropy bonus on every view's moves (mean over views).")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    land = Landscape(args.p, args.turns)
    if args.model:
        probs = model_table(land, args.model)
        figures = {"model": args.model, **scores(land, probs), "coordinate_ascent_from_greedy": float(land.success(land.coordinate_ascent(land.greedy(probs))))}
        first = ", ".join(f"{m} {p:.2f}" for m, p in figures["first_move_probabilities"].items())
        print(f"{args.model}: exact success {figures['greedy']:.1%} greedy, {figures['sampled']:.1%} sampled; first move {first} "
              f"({figures['first_move_entropy']:.2f} nats); greedy's best single switch +{figures['greedy_best_switch_gain']:.1%} "
              f"({figures['greedy_best_switch']}); coordinate ascent from the greedy policy ends at {figures['coordinate_ascent_from_greedy']:.1%}")
        write("frozenlake_landscape_model", figures)
        return
    uniform = torch.full((len(land.views), 4), 0.25, dtype=torch.float64)
    print(f"{len(land.weight)} maps, {len(land.views)} local views, {args.turns} turns; uniform policy {float(land.success(uniform)):.1%}")

    down_right = rule(land, ("Down", "Right", "Left", "Up"))
    agree, through_env = check_against_env(land, down_right, range(500_000_000, 500_000_300))
    print(f"check: the Down-then-Right rule through the env on 300 validation maps wins {through_env:.1%}; exact and env agree on {agree} of 300 maps")

    rules = {}
    for name, order in {"Down, Right, Left, Up": ("Down", "Right", "Left", "Up"), "Right, Down, Left, Up": ("Right", "Down", "Left", "Up")}.items():
        probs = rule(land, order)
        gain, which = land.best_switch(probs)
        top = land.coordinate_ascent(probs)
        rules[name] = {"success": float(land.success(probs)), "best_switch_gain": gain, "best_switch": which, "coordinate_ascent_to": float(land.success(top))}
        print(f"rule {name}: {rules[name]['success']:.1%}; best single switch +{gain:.1%} ({which}); coordinate ascent ends at {rules[name]['coordinate_ascent_to']:.1%}")

    generator = torch.Generator().manual_seed(0)
    stuck = []
    for _ in range(args.random_tables):
        table = torch.nn.functional.one_hot(torch.randint(0, 4, (len(land.views),), generator=generator), 4).double()
        stuck.append(round(float(land.success(land.coordinate_ascent(table))), 4))
    print(f"coordinate ascent from {args.random_tables} random deterministic tables ends at: {' '.join(f'{v:.1%}' for v in sorted(stuck))}")
    starts = [("uniform", torch.zeros(len(land.views), 4, dtype=torch.float64))]
    starts += [(f"Down-Right rule, logit gap {gap:g}", down_right * gap) for gap in (4.0, 8.0)]
    starts += [(f"random {i}", torch.randn(len(land.views), 4, generator=generator, dtype=torch.float64) * args.init_scale) for i in range(args.inits)]
    runs = []
    for name, logits in starts:
        probs, curve = climb(land, logits, args.steps, args.lr, args.entropy)
        run = {
            "start": name, "start_success": float(land.success(logits.softmax(-1))), "curve": curve,
            "min_max_move_probability": float(probs.max(-1).values.min()), **scores(land, probs),
        }
        runs.append(run)
        print(f"climb from {name}: {run['start_success']:.1%} -> sampled {run['sampled']:.1%}, greedy {run['greedy']:.1%} "
              f"(success every 100 steps: {' '.join(f'{v:.0%}' for v in curve[:6])} ...); greedy's best single switch +{run['greedy_best_switch_gain']:.2%}")

    print(f"\nOne batch of {args.groups} maps x {args.group_size} plays: its step's cosine with the exact gradient (mean over {args.batches} batches), "
          "and the cosine of the mean step (bias), over the table / on the first square's view")
    aligned = {}
    for name, logits in [("uniform", starts[0][1]), *[(f"Down-Right rule, logit gap {gap:g}", down_right * gap) for gap in (2.0, 4.0)]]:
        aligned[name] = alignment(land, logits, args.batches, args.groups, args.group_size, seed=0)
        print(f"  at {name} ({float(land.success(logits.softmax(-1))):.1%}):")
        for estimator, row in aligned[name].items():
            print(f"    {estimator:<22} one batch {row['one_batch_cosine']:.2f} / {row['first_view_one_batch_cosine']:.2f}   "
                  f"mean step {row['mean_step_cosine']:.2f} / {row['first_view_mean_step_cosine']:.2f}")
    print(f"\nSampled GiGPO on the table, {args.groups} maps x {args.group_size} plays a step, {args.sampled_steps} steps, lr {args.lr:g} cosine:")
    sampled = []
    for seed in range(args.sampled_seeds):
        row = {"seed": seed, **scores(land, sampled_climb(land, seed, args.sampled_steps, args.groups, args.group_size, args.lr, ESTIMATORS["gigpo"]))}
        sampled.append(row)
        print(f"  seed {seed}: greedy {row['greedy']:.1%}, sampled {row['sampled']:.1%}; first move's entropy {row['first_move_entropy']:.2f} nats; "
              f"greedy's best single switch +{row['greedy_best_switch_gain']:.1%} ({row['greedy_best_switch']})")
    finals = [round(r["greedy"], 3) for r in runs]
    print("greedy success the climbs end at:", dict(sorted(collections.Counter(finals).items())))
    figures = {
        "maps": len(land.weight), "views": len(land.views), "turns": args.turns, "p": args.p,
        "uniform": float(land.success(uniform)), "check_against_env": {"maps": 300, "agree": agree, "env_success": through_env}, "rules": rules, "coordinate_ascent_from_random_tables": stuck,
        "climb": {"steps": args.steps, "lr": args.lr, "entropy": args.entropy, "init_scale": args.init_scale, "runs": runs},
        "sampled_climb": {"steps": args.sampled_steps, "groups": args.groups, "group_size": args.group_size, "lr": args.lr, "estimator": "gigpo", "runs": sampled},
        "alignment": {"groups": args.groups, "group_size": args.group_size, "batches": args.batches, "at": aligned},
        "seconds": time.perf_counter() - started,
    }
    print(f"{figures['seconds']:.0f} s")
    write("frozenlake_landscape", figures)


if __name__ == "__main__":
    main()
