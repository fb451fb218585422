"""Does a policy read its observation? Exact figures for a step-layout policy, and why RL alone stalls.

The parts (issue 40's diagnosis), each on the states of random-walk episodes of the run's config
(FrozenLake 4x4 or Sokoban 6x6, local view, one turn a prompt without history; ``--credit`` is
FrozenLake's alone):

``--probe FOLDER ...``: for each model folder (or ``init``, the untrained tiny model), the exact
distribution over the four moves at the action token of every prompt, then per view the mean
distribution, and the mutual information between the view and the move, ``H(mean pi) - mean H(pi)``
(nats): 0 for a policy that plays the same distribution whatever it sees. The ``diag/`` metrics a
training step logs estimate the same from samples.

Beside the moves, ``--probe`` measures the head's input, the last layer's (normed) hidden state at the
action token: its spread across states (the summed variance over states as a share of its mean squared
norm: near 0 when the head sees the same vector whatever the view) and a linear probe's held-out
accuracy at reading the expert's move from it (standardised), against always playing the commonest
one. A start can keep what the view says (the probe reads it) while squeezing it into a spread too
small for the head's policy gradient to act on.

``--starts SPEC ...``: make format-only warm starts in-process (the config's ``warm_start`` with each
SPEC's ``key=value,...`` changes; ``''`` for none) and measure each: whether its format holds (the
probability of a move at the action token, and of the closing tag after a move it samples) beside
the probe's figures. It screens starts in minutes, before an RL run from one is paid for.

``--oracle``: from one folder (the format-only warm start), 80 steps of gradient on single decisions
with exact labels: the view expert's move for each state (``expert_action`` of the env). Modes:
``sft`` (cross-entropy on the expert's move), ``pg`` (one sampled move per state, advantage +1 for
the expert's, -1/3 otherwise: a perfect per-decision advantage), ``relative`` (the same sample,
advantage ``(r - p) / p`` with ``p`` the policy's probability of the expert's move: the
maximum-likelihood normalisation), ``noisy-std`` and ``noisy-relative`` (8 sampled moves per state,
reward drawn with probability 0.5 for the expert's move and 0.1 for the others, normalised within
the state's 8 as GRPO does, or relative), ``pg-entropy`` (``pg`` plus an entropy bonus on the four
moves' distribution alone, :data:`ENTROPY_COEF`), ``noisy-std-entropy`` (the same on
``noisy-std``). It prints held-out agreement with the expert's move and
the mean probability of it every 10 steps.

``--credit``: where each estimator's credit goes when the policy is blind to its view, as RL's
policies end (Down and Right, one half each, whatever the view: ``--probe`` of the RL runs). On
batches of the run's size (8 groups of 8 episodes, ``--batches`` of them, no model), the mean
advantage of each move in views with a hole below or to the right and in views without one, and
for the hole views the gap between the safe move's and the hole move's advantage with its
t-statistic in one batch: how clearly one batch says "read the hole". GiGPO (``state`` and
``context`` anchors) and GRPO.

    python bench/view_reading.py --config bench/learning/format/frozenlake_not_slippery.yaml --probe init OUT/final
    python bench/view_reading.py --config bench/learning/format/frozenlake_not_slippery.yaml --oracle OUT/final
    python bench/view_reading.py --config bench/learning/format/frozenlake_not_slippery.yaml --credit
    python bench/view_reading.py --config bench/learning/format/sokoban6x6.yaml --starts '' demonstrator=random-mapping

Writes bench/results/view_reading.json (the parts run).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import yaml

from envhub.generation import Completion, Prompt, RandomGenerator, SamplingParams
from envhub.manager import EnvGroupManager
from envhub_trl import pipeline
from envhub_trl.config import EnvGRPOConfig
from envhub_trl.warm_start import relabelled_samples

RESULTS = Path(__file__).parent / "results" / "view_reading.json"
MOVES = ("Left", "Down", "Right", "Up")
ORACLE_MODES = ("sft", "pg", "relative", "noisy-std", "noisy-relative", "pg-entropy", "noisy-std-entropy")
#: ``pg-entropy`` and ``noisy-std-entropy``: ``pg`` and ``noisy-std`` plus this times the entropy of
#: the four moves' distribution (a bonus on the move token alone, so that the marginal cannot saturate).
ENTROPY_COEF = 0.3


def load(folder: str, config: dict[str, Any]) -> tuple[Any, Any]:
    """A model folder's model and tokenizer, or ``init``: the untrained tiny model of ``config``."""
    if folder == "init":
        from envhub_trl.models import load_model_and_tokenizer
        from envhub_trl.tiny import TinySpec

        env_id = config["env_id"]
        model, tokenizer = load_model_and_tokenizer(
            "tiny", [env_id], config.get("seed", 0), kwargs_by_env={env_id: config.get("env_kwargs") or {}},
            tiny=TinySpec.from_mapping(config.get("tiny")),
        )
        return model.eval(), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def run_config(config: dict[str, Any], **overrides: Any) -> EnvGRPOConfig:
    """The run's :class:`EnvGRPOConfig` from its YAML mapping (the run-level keys left out), with ``overrides``."""
    values = {k: v for k, v in config.items() if k not in ("warm_start", "tiny", "model", "targets")}
    return EnvGRPOConfig(**{**values, "output_dir": "/tmp/envhub-view-reading", "report_to": "none", **overrides})


def prompt_template(tokenizer: Any, config: dict[str, Any]) -> tuple[str, str]:
    """The run's prompt around an observation (``head + observation + tail``), taken from real
    prompts of the run's manager and checked token for token against them."""
    samples, _ = relabelled_samples(RandomGenerator(seed=1, tokenizer=tokenizer), tokenizer, run_config(config).env_settings(), range(4))
    shown = lambda text: text.rsplit("user\n", 1)[1].split("<|im_end|>", 1)[0]  # noqa: E731
    text = tokenizer.decode(samples[0].prompt_ids)
    head, tail = text.rsplit(shown(text), 1)
    for sample in samples:
        if tokenizer.decode(sample.prompt_ids).count("user\n") > 1:
            continue  # a later turn with history_turns >= 1: history_joints checks those
        if tokenizer.encode(head + shown(tokenizer.decode(sample.prompt_ids)) + tail, add_special_tokens=False) != list(sample.prompt_ids):
            raise SystemExit("the prompt template does not give the env's prompt token for token")
    return head, tail


def history_joints(tokenizer: Any, config: dict[str, Any], head: str, tail: str) -> tuple[str, str]:
    """With ``history_turns: 1``, the text around the previous turn's reply: a later turn's prompt is
    ``head + previous observation + before + reply + after + observation + tail``. Taken from real
    prompts of the run's manager and checked token for token against every later turn's."""
    samples, _ = relabelled_samples(RandomGenerator(seed=1, tokenizer=tokenizer), tokenizer, run_config(config).env_settings(), range(4))
    prefix, stop = config.get("reply_prefix"), (config.get("stop_strings") or ["</answer>"])[0]
    if not prefix:
        raise SystemExit("history_joints needs the run's reply_prefix (where a reply starts)")
    joints, checked = None, 0
    for sample in samples:
        text = tokenizer.decode(sample.prompt_ids)
        if not (text.startswith(head) and text.endswith(tail)) or text.count("user\n") < 2:
            continue  # a first turn: no history
        previous = text[len(head) :].split("<|im_end|>", 1)[0]
        current = text.rsplit("user\n", 1)[1].split("<|im_end|>", 1)[0]
        middle = text[len(head) + len(previous) : len(text) - len(current) - len(tail)]
        at = middle.index(prefix)
        reply = prefix + middle[at + len(prefix) :].split(stop, 1)[0] + stop
        found = (middle[:at], middle[at + len(reply) :])
        if joints not in (None, found) or tokenizer.encode(head + previous + found[0] + reply + found[1] + current + tail, add_special_tokens=False) != list(sample.prompt_ids):
            raise SystemExit("the history template does not give the env's prompt token for token")
        joints, checked = found, checked + 1
    if not checked:
        raise SystemExit("no prompt with history among the samples: is history_turns 1?")
    return joints


def next_token_log_probs(model: Any, tokenizer: Any, head: str, tail: str, cache: dict[str, list[int]], observations: list[str]) -> torch.Tensor:
    """Log-probabilities over the whole vocabulary after each observation's prompt, in one batch
    (``cache`` keeps each observation's prompt tokens). The tokens every prompt starts with (the
    system message) are run once and their keys and values handed to every row, as the trainer's
    ``share_prompt_forward`` does with whole prompts; the rows' own tokens follow, right-padded, and
    the head runs at each row's last token only. The same arithmetic as one forward per prompt; the
    system message is a third of a Sokoban prompt with one turn of history, half of one without."""
    rows = [cache.setdefault(o, tokenizer.encode(head + o + tail, add_special_tokens=False)) for o in observations]
    shared = min(map(len, rows)) - 1
    for column in range(shared):
        if any(row[column] != rows[0][column] for row in rows):
            shared = column
            break
    if shared == 0:
        ids, mask = left_padded(rows)
        return torch.log_softmax(model(input_ids=ids, attention_mask=mask, logits_to_keep=1).logits[:, -1, :].float(), -1)
    keys = model(input_ids=torch.tensor([rows[0][:shared]]), use_cache=True, logits_to_keep=1).past_key_values
    keys.reorder_cache(torch.zeros(len(rows), dtype=torch.long))  # every row the shared keys; gradients sum back
    ends = torch.tensor([len(row) - shared - 1 for row in rows])
    width = int(ends.max()) + 1
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), shared + width, dtype=torch.long)
    mask[:, :shared] = 1
    for r, row in enumerate(rows):
        ids[r, : len(row) - shared] = torch.tensor(row[shared:])
        mask[r, shared : len(row)] = 1
    hidden = model.model(input_ids=ids, attention_mask=mask, past_key_values=keys).last_hidden_state
    return torch.log_softmax(model.lm_head(hidden[torch.arange(len(rows)), ends]).float(), -1)


def states(tokenizer: Any, config: dict[str, Any], seeds: range) -> tuple[list[list[int]], np.ndarray, list[str], list[int]]:
    """The prompts of random-walk episodes on ``seeds`` (each ending with ``<answer>``), the view
    expert's move in each (an index into :data:`MOVES`), the view shown, and the move tokens."""
    args = run_config(config)
    labelled, _ = relabelled_samples(
        RandomGenerator(seed=1, tokenizer=tokenizer), tokenizer, args.env_settings(), seeds
    )
    prefix = tokenizer.encode("<answer>", add_special_tokens=False)
    move_ids = [tokenizer.encode(m, add_special_tokens=False)[0] for m in MOVES]
    # A run with ``reply_prefix: "<answer>"`` has the tag in its prompt already, and not in its replies.
    prompts = [list(s.prompt_ids) + ([] if list(s.prompt_ids[-len(prefix) :]) == prefix else prefix) for s in labelled]
    expert = np.array([MOVES.index(tokenizer.decode(s.completion_ids).split("<answer>")[-1].split("</answer>")[0].strip()) for s in labelled])
    views = [tokenizer.decode(s.prompt_ids).rsplit("user\n", 1)[1].split("<|im_end|>")[0].split("\n")[-1] for s in labelled]
    return prompts, expert, views, move_ids


def left_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as one left-padded batch: ids and attention mask."""
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, width - len(row) :] = torch.tensor(row)
        mask[r, width - len(row) :] = 1
    return ids, mask


def log_probs(model: Any, prompts: list[list[int]], hidden: bool = False) -> Any:
    """Log-probabilities over the vocabulary at the end of each prompt (left-padded batches); with
    ``hidden``, also the last layer's hidden state there from the same forward pass (after the final
    norm: what the head reads), as a pair."""
    logp, states = [], []
    for i in range(0, len(prompts), 128):
        ids, mask = left_padded(prompts[i : i + 128])
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=hidden)
        logp.append(torch.log_softmax(out.logits[:, -1, :].float(), -1))
        if hidden:
            states.append(out.hidden_states[-1][:, -1].float())
    return (torch.cat(logp), torch.cat(states)) if hidden else torch.cat(logp)


def tail_log_probs(model: Any, rows: list[list[int]], tail: int) -> torch.Tensor:
    """The summed log-probability of each row's last ``tail`` tokens given what precedes them."""
    out = []
    for i in range(0, len(rows), 128):
        ids, mask = left_padded(rows[i : i + 128])
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, -tail - 1 : -1].float(), -1)
        out.append(logp.gather(-1, ids[:, -tail:, None])[..., 0].sum(-1))
    return torch.cat(out)


def head_input(hidden: torch.Tensor, expert: np.ndarray) -> dict[str, float]:
    """How much the head's input varies with the state (its summed variance over states as a share of
    its mean squared norm: 0 when it is the same vector whatever the view), and whether the expert's
    move can be read from it linearly (against always the commonest move)."""
    return {
        "hidden_spread": float(hidden.var(0).sum() / hidden.pow(2).sum(1).mean()),
        "hidden_linear_probe": linear_probe(hidden, expert),
        "commonest_expert_move": float(np.mean(expert == np.bincount(expert).argmax())),
    }


def linear_probe(hidden: torch.Tensor, labels: np.ndarray, steps: int = 2000) -> float:
    """Held-out accuracy of a softmax regression from the standardised hidden states to ``labels``
    (the first 70% of the states train it, the rest measure it)."""
    torch.manual_seed(0)
    cut = int(0.7 * len(labels))
    x = (hidden - hidden[:cut].mean(0)) / (hidden[:cut].std(0) + 1e-6)
    y = torch.as_tensor(labels)
    weight = torch.zeros(x.shape[1], len(MOVES), requires_grad=True)
    bias = torch.zeros(len(MOVES), requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=0.01)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(x[:cut] @ weight + bias, y[:cut]) + 1e-3 * weight.pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return float(((x[cut:] @ weight + bias).argmax(-1) == y[cut:]).float().mean())


def entropy(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1.0)
    return -(p * np.log(p)).sum(-1)


def probe(folder: str, config: dict[str, Any], seeds: range) -> dict[str, Any]:
    """The exact view information of one policy (see the module docstring)."""
    model, tokenizer = load(folder, config)
    prompts, expert, views, move_ids = states(tokenizer, config, seeds)
    with torch.no_grad():
        logp, hidden = log_probs(model, prompts, hidden=True)
        moves = logp[:, move_ids].softmax(-1).numpy()
    marginal = moves.mean(0)
    information = float(entropy(marginal) - entropy(moves).mean())
    by_view: dict[str, list[np.ndarray]] = defaultdict(list)
    for view, p in zip(views, moves):
        by_view[view].append(p)
    common = sorted(by_view.items(), key=lambda kv: -len(kv[1]))[:8]
    return {
        "states": len(prompts),
        "marginal": dict(zip(MOVES, marginal.round(4).tolist())),
        "information_nats": information,
        "agreement_with_expert": float(np.mean(moves.argmax(1) == expert)),
        **head_input(hidden, expert),
        "views": {view: {"count": len(ps), **dict(zip(MOVES, np.mean(ps, 0).round(3).tolist()))} for view, ps in common},
    }


def start_figures(config: dict[str, Any], spec: str, seeds: range) -> dict[str, Any]:
    """Make a format-only warm start in-process (the config's ``warm_start`` with ``spec``'s
    ``key=value,...`` changes, on the untrained tiny model of seed 0) and measure it on the states of
    ``seeds``: whether its format holds (the probability it gives a move at the action token, and
    the closing tag after a move it samples) and what :func:`probe` measures of the head's input."""
    from envhub_trl.warm_start import WarmStart

    values = dict(config["warm_start"])
    for pair in filter(None, spec.split(",")):
        key, value = pair.split("=", 1)
        values[key] = {"true": True, "false": False}.get(value, value)
    torch.manual_seed(0)
    model, tokenizer = load("init", config)
    WarmStart.from_mapping(values).run(model.train(), tokenizer, run_config(config).env_settings(), seed=0)
    model.eval()
    prompts, expert, _, move_ids = states(tokenizer, config, seeds)
    close = tokenizer.encode("</answer>", add_special_tokens=False)
    with torch.no_grad():
        logp, hidden = log_probs(model, prompts, hidden=True)
        moves = logp[:, move_ids].softmax(-1)
        picked = torch.distributions.Categorical(probs=moves).sample().tolist()
        tag = tail_log_probs(model, [prompt + [move_ids[m]] + close for prompt, m in zip(prompts, picked)], len(close))
    marginal = moves.mean(0).numpy()
    return {
        "warm_start": values,
        "p_move": float(logp[:, move_ids].exp().sum(-1).mean()),
        "p_closing_tag_after_move": float(tag.exp().mean()),
        "information_nats": float(entropy(marginal) - entropy(moves.numpy()).mean()),
        **head_input(hidden, expert),
    }


def oracle(folder: str, config: dict[str, Any], mode: str, steps: int, lr: float, entropy_coef: float = ENTROPY_COEF) -> list[dict[str, float]]:
    """Gradient steps on single decisions with exact labels (see the module docstring); the curve."""
    torch.manual_seed(0)
    model, tokenizer = load(folder, config)
    train, train_expert, _, move_ids = states(tokenizer, config, range(0, 400))
    test, test_expert, _, _ = states(tokenizer, config, range(10**6, 10**6 + 100))
    move_ids_t = torch.tensor(move_ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng, curve, started = np.random.default_rng(0), [], time.perf_counter()
    for step in range(steps + 1):
        if step % 10 == 0:
            with torch.no_grad():
                p = log_probs(model.eval(), test)[:, move_ids].softmax(-1).numpy()
            point = {"step": step, "agreement": float(np.mean(p.argmax(1) == test_expert)),
                     "p_expert": float(p[np.arange(len(p)), test_expert].mean())}
            curve.append(point)
            print(f"{mode:>14} step {step:3d}: agreement {point['agreement']:.2f}, p(expert) {point['p_expert']:.2f} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
        if step == steps:
            break
        model.train()
        noisy = mode.startswith("noisy")
        base = mode.removesuffix("-entropy")
        pick = np.repeat(rng.choice(len(train), 32, replace=False), 8) if noisy else rng.choice(len(train), 256, replace=False)
        logp = log_probs(model, [train[i] for i in pick])
        rows = torch.arange(len(pick))
        right = move_ids_t[torch.as_tensor(train_expert[pick])]
        if mode == "sft":
            loss = -logp[rows, right].mean()
        else:
            with torch.no_grad():
                action = torch.distributions.Categorical(logits=logp).sample()
            valid = torch.isin(action, move_ids_t)
            if base == "pg":
                advantage = torch.where(action == right, 1.0, torch.where(valid, -1.0 / 3, -1.0))
            elif base == "relative":
                p_right = logp.detach()[rows, right].exp()
                advantage = ((action == right).float() - p_right) / p_right.clamp_min(0.02)
            else:
                chance = torch.where(action == right, 0.5, torch.where(valid, 0.1, 0.0))
                reward = torch.bernoulli(chance, generator=torch.Generator().manual_seed(step)).view(32, 8)
                mean = reward.mean(1, keepdim=True)
                scale = reward.std(1, keepdim=True) + 1e-6 if base == "noisy-std" else mean.clamp_min(0.1)
                advantage = ((reward - mean) / scale).view(-1)
            loss = -(advantage * logp[rows, action]).mean()
            if mode.endswith("-entropy"):
                moves = logp[:, move_ids].log_softmax(-1)
                loss = loss - entropy_coef * -(moves.exp() * moves).sum(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return curve


class BlindPolicy:
    """Down or Right, one half each, whatever the prompt (seeded): a view-blind policy."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def generate(self, prompts: list[Prompt], sampling: SamplingParams) -> list[Completion]:
        return [Completion([], [], f"<answer>{'Down' if self.rng.random() < 0.5 else 'Right'}</answer>") for _ in prompts]


def credit(config: dict[str, Any], batches: int) -> dict[str, Any]:
    """Each estimator's advantages on a blind policy's batches, by view and move (module docstring)."""
    report = {}
    for name, estimator, anchor in (("gigpo, state anchors", "gigpo", "state"), ("gigpo, context anchors", "gigpo", "context"), ("grpo", "grpo", "state")):
        args = run_config(config, advantage_estimator=estimator, step_anchor=anchor)
        groups, size = args.groups_per_step, args.num_generations
        advantages: dict[tuple[str, str], list[float]] = defaultdict(list)
        for b in range(batches):
            play = args.env_settings()
            play = play.replace(prompt=play.prompt.without_budget())  # text alone, no tokenizer
            with EnvGroupManager.from_settings(play, groups, size) as manager:
                local, _ = pipeline.play(manager, BlindPolicy(b), SamplingParams(), seeds=list(range(b * groups, (b + 1) * groups)))
            batch = pipeline.estimate(pipeline.gather(local, group_size=size), estimator, args.estimator_settings())
            turns = [turn for episode in batch.episodes for turn in episode.turns]
            for turn, advantage in zip(turns, batch.estimate["advantages"]):
                view = turn.observation.split("\n")[-1]
                where = "hole below" if "Down: hole" in view else "hole to the right" if "Right: hole" in view else "no hole"
                advantages[(where, turn.action)].append(float(advantage))
        cells = {f"{where}, {move}": {"n": len(a), "mean": float(np.mean(a)), "sd": float(np.std(a))} for (where, move), a in sorted(advantages.items())}
        gaps = {}
        for where, safe, hole in (("hole below", "Right", "Down"), ("hole to the right", "Down", "Right")):
            good, bad = np.array(advantages[(where, safe)]), np.array(advantages[(where, hole)])
            gap = float(good.mean() - bad.mean())
            error = float(np.sqrt(good.var() / len(good) + bad.var() / len(bad)) * np.sqrt(batches))  # one batch's
            gaps[where] = {"gap": gap, "decisions_a_batch": (len(good) + len(bad)) / batches, "t_a_batch": gap / error}
        report[name] = {"cells": cells, "gaps": gaps}
        print(f"{name}:")
        for cell, figures in cells.items():
            print(f"  {cell:>26}: n={figures['n']:5d}  mean advantage {figures['mean']:+.3f}  sd {figures['sd']:.3f}")
        for where, figures in gaps.items():
            print(f"  {where}: safe move's advantage less the hole move's {figures['gap']:+.3f}; "
                  f"{figures['decisions_a_batch']:.0f} such decisions a batch, t = {figures['t_a_batch']:.1f} in one batch")
    return {"batches": batches, **report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="The run's config (a bench/learning YAML or an envhub train config).")
    parser.add_argument("--probe", nargs="+", metavar="FOLDER", default=[], help="Model folders to probe ('init': the untrained tiny model).")
    parser.add_argument("--starts", nargs="+", metavar="SPEC", default=[], help="Make and measure format-only warm starts: the config's warm_start with key=value,... changes ('' for none).")
    parser.add_argument("--oracle", metavar="FOLDER", help="Run the oracle-gradient modes from this folder.")
    parser.add_argument("--modes", nargs="+", choices=ORACLE_MODES, default=list(ORACLE_MODES))
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--credit", action="store_true", help="Where each estimator's credit goes for a view-blind policy.")
    parser.add_argument("--batches", type=int, default=20, help="--credit: batches of the run's size.")
    parser.add_argument("--entropy-coef", type=float, default=ENTROPY_COEF, help="The *-entropy modes' bonus coefficient.")
    args = parser.parse_args()
    config = yaml.safe_load(args.config.read_text())
    report: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for folder in args.probe:
        figures = probe(folder, config, range(10**6, 10**6 + 300))
        print(f"{folder}: I(view; move) = {figures['information_nats']:.4f} nats, agreement with the view expert "
              f"{figures['agreement_with_expert']:.2f}, marginal {figures['marginal']}; the head's input: spread across states "
              f"{figures['hidden_spread']:.2e} of its squared norm, the expert's move read from it linearly "
              f"{figures['hidden_linear_probe']:.2f} (commonest move {figures['commonest_expert_move']:.2f})")
        for view, cell in figures["views"].items():
            print(f"  {cell['count']:4d}  {view:52s} " + " ".join(f"{m}={cell[m]:.2f}" for m in MOVES))
        report.setdefault("probe", {})[folder] = figures
    for spec in args.starts:
        figures = start_figures(config, spec, range(10**6, 10**6 + 300))
        print(f"warm start {spec or '(as configured)'}: P(a move) {figures['p_move']:.3f}, P(</answer> | its move) "
              f"{figures['p_closing_tag_after_move']:.3f}, I(view; move) {figures['information_nats']:.4f} nats; the head's input: "
              f"spread {figures['hidden_spread']:.2e}, the expert's move read from it linearly {figures['hidden_linear_probe']:.2f}", flush=True)
        report.setdefault("starts", {})[f"{args.config}: {spec}"] = figures
    if args.oracle:
        settings = {"folder": args.oracle, "lr": args.lr, "steps": args.steps, "entropy_coef": args.entropy_coef}
        earlier = report.get("oracle", {})
        curves = earlier.get("curves", {}) if all(earlier.get(k) == v for k, v in settings.items()) else {}
        curves.update({mode: oracle(args.oracle, config, mode, args.steps, args.lr, args.entropy_coef) for mode in args.modes})
        report["oracle"] = {**settings, "curves": curves}  # modes run earlier with the same settings are kept
    if args.credit:
        report["credit"] = credit(config, args.batches)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"\n{RESULTS}")


if __name__ == "__main__":
    main()
