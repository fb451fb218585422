"""RL on FrozenLake without the trainer: the run's model, prompts, envs and estimators, and a
plain policy-gradient step, to find where the trainer's RL alone stalls (issue 40).

Each step plays ``groups_per_step`` groups of ``group_size`` episodes through the real
:class:`~envhub.manager.EnvGroupManager` and :mod:`envhub_trl.pipeline` (play, gather, estimate:
GRPO's or GiGPO's advantages exactly as the trainer computes them), then takes one AdamW step
(no KL, no ratio: one update per batch, which is what the trainer's ratio reduces to) on
``-sum(advantage * log p(token)) / reply tokens``, the loss TRL's ``dapo`` aggregation takes.

Two ways to reply:
- default (*move token*): the policy samples only the move, the token after ``<answer>``, from the
  model's own distribution over the whole vocabulary; ``<answer>`` and ``</answer>`` are written
  for it. Only that token is trained.
- ``--full-reply``: the policy samples the whole reply with transformers (up to the run's
  ``max_turn_tokens``), as the trainer's generators do, and every reply token is trained, as the
  trainer trains them (``--top-entropy Q``: only the batch's top-Q share of tokens by entropy, as
  TRL's ``top_entropy_quantile``).

Every ``--eval-every`` steps: held-out greedy success (the move token's argmax on 256 held-out
maps, the format written for it), and on 100 random-walk states the exact information between
view and move and the agreement with the view expert (``view_reading.py --probe``'s figures).

    python bench/sim_rl.py --config bench/learning/format/frozenlake_not_slippery.yaml --start START/final --name move
    python bench/sim_rl.py --config bench/learning/format/frozenlake_not_slippery.yaml --start START/final --name full --full-reply
    python bench/sim_rl.py --config bench/learning/format/frozenlake_not_slippery.yaml --start START/final --check RL_RUN/final

``--check``: what the trainer adds around such a loop, on real data (vLLM's log-probabilities after
a weight sync; the advantages' rows after ``to_rows`` and ``spread``).

``START``: the format-only warm start (docs/results-rl-alone.md says how it is made). Writes
bench/results/sim_rl/NAME.json (the curve and the arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from view_reading import entropy, load, log_probs, run_config, states  # noqa: E402

from envhub.generation import Completion, Prompt, SamplingParams  # noqa: E402
from envhub.manager import EnvGroupManager  # noqa: E402
from envhub_trl import pipeline  # noqa: E402
from envhub_trl.config import EnvGRPOConfig  # noqa: E402


class ReplyPolicy:
    """Samples the whole reply (up to ``max_new`` tokens) with transformers, as the trainer's replies are."""

    def __init__(self, model: Any, tokenizer: Any, max_new: int, temperature: float = 1.0):
        self.model, self.tokenizer, self.max_new, self.temperature = model, tokenizer, max_new, temperature

    def generate(self, prompts: list[Prompt], sampling: SamplingParams) -> list[Completion]:
        rows = [list(p.token_ids) for p in prompts]
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=self.temperature, top_k=0, top_p=1.0,
                                      max_new_tokens=self.max_new, eos_token_id=self.tokenizer.eos_token_id, pad_token_id=pad)
        result = []
        for row in out[:, width:].tolist():
            tokens = []
            for t in row:
                tokens.append(t)
                if t == self.tokenizer.eos_token_id:
                    break
            finish = "stop" if tokens and tokens[-1] == self.tokenizer.eos_token_id else "length"
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            result.append(Completion(tokens, [0.0] * len(tokens), text, finish))
        return result


class MovePolicy:
    """Samples the move token at the end of ``prompt + <answer>``; records (prompt ids, token)."""

    def __init__(self, model: Any, tokenizer: Any, greedy: bool = False, temperature: float = 1.0):
        self.model, self.tokenizer, self.greedy, self.temperature = model, tokenizer, greedy, temperature
        self.prefix = tokenizer.encode("<answer>", add_special_tokens=False)
        self.suffix = tokenizer.encode("</answer>", add_special_tokens=False)

    def generate(self, prompts: list[Prompt], sampling: SamplingParams) -> list[Completion]:
        with torch.no_grad():
            logp = log_probs(self.model, [list(p.token_ids) + self.prefix for p in prompts]) / self.temperature
        logp = logp.log_softmax(-1)
        tokens = logp.argmax(-1) if self.greedy else torch.distributions.Categorical(logits=logp).sample()
        out = []
        for token, row in zip(tokens.tolist(), logp):
            ids = self.prefix + [token] + self.suffix
            text = "<answer>" + self.tokenizer.decode([token]).strip() + "</answer>"
            out.append(Completion(ids, [0.0] * len(self.prefix) + [float(row[token])] + [0.0] * len(self.suffix), text))
        return out


def _right_padded(turns: list[Any]) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """Each turn's prompt + reply as a row, right-padded: (rows, ids, attention mask)."""
    rows = [list(t.input_ids) + list(t.completion_ids) for t in turns]
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
        mask[r, : len(row)] = 1
    return rows, ids, mask


def reply_loss(
    model: Any, turns: list[Any], adv: torch.Tensor, move_only: set[int] | None = None, top_entropy: float = 1.0, from_move: list[int] | None = None
) -> torch.Tensor:
    """-sum(advantage * log p(token)) over every reply token / the reply tokens (TRL's 'dapo' sum);
    with ``top_entropy`` < 1 only the tokens whose entropy is in that top share of the batch's (TRL's
    ``top_entropy_quantile``)."""
    total, count = 0.0, sum(len(t.completion_ids) for t in turns)
    threshold = None
    if top_entropy < 1.0:
        with torch.no_grad():
            ents = []
            for start in range(0, len(turns), 128):
                chunk = turns[start : start + 128]
                rows, ids, mask = _right_padded(chunk)
                lp = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float().log_softmax(-1)
                e = -(lp.exp() * lp).sum(-1)
                for r, t in enumerate(chunk):
                    ents.append(e[r, len(t.input_ids) - 1 : len(rows[r]) - 1])
            threshold = torch.quantile(torch.cat(ents), 1 - top_entropy)
    for start in range(0, len(turns), 128):
        chunk = turns[start : start + 128]
        rows, ids, mask = _right_padded(chunk)
        weight = torch.zeros(ids.shape)
        for r, (t, row) in enumerate(zip(chunk, rows)):
            if from_move is not None:  # from the move on, or from where the reply leaves the <answer> prefix
                reply = list(t.completion_ids)
                first = next((j for j, tok in enumerate(from_move) if j >= len(reply) or reply[j] != tok), len(from_move))
                weight[r, len(t.input_ids) + first : len(row)] = adv[start + r]
            elif move_only is None:
                weight[r, len(t.input_ids) : len(row)] = adv[start + r]
            else:  # the move token alone; a reply without one is not trained
                moves = [j for j, tok in enumerate(t.completion_ids) if tok in move_only]
                if moves:
                    weight[r, len(t.input_ids) + moves[0]] = adv[start + r]
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        full = logits.log_softmax(-1)
        logp = full.gather(-1, ids[:, 1:, None])[..., 0]
        if threshold is not None:
            weight[:, 1:] = weight[:, 1:] * (-(full.exp() * full).sum(-1).detach() >= threshold)
        total = total - (weight[:, 1:] * logp).sum()
    return total / max(count, 1)


def evaluate(model: Any, tokenizer: Any, args: EnvGRPOConfig, seeds: list[int], greedy: bool) -> float:
    wins = []
    for start in range(0, len(seeds), 64):
        chunk = seeds[start : start + 64]
        with EnvGroupManager.from_settings(args.env_settings(), len(chunk), 1, tokenizer=tokenizer) as manager:
            local, _ = pipeline.play(manager, MovePolicy(model.eval(), tokenizer, greedy=greedy), SamplingParams(), seeds=chunk)
        wins += [bool(t.success) for t in local]
    return float(np.mean(wins))


def check_trainer_path(config: dict[str, Any], start: str, other: str) -> None:
    """What the trainer adds around this loop, checked on real data: (1) after ``load_weights`` of
    ``other``'s weights, the vLLM generator's sampling log-probabilities equal ``other``'s own;
    (2) ``to_rows`` and ``spread`` put each turn's advantage on its own row's tokens."""
    from transformers import AutoModelForCausalLM

    from envhub_trl.generators.vllm_engine import VLLMGenerator

    model, tokenizer = load(start, config)
    prompts = [p[: -len(tokenizer.encode("<answer>", add_special_tokens=False))] for p in states(tokenizer, config, range(10**6, 10**6 + 20))[0]]
    generator = VLLMGenerator(start, seed=0, dtype="float32", max_model_len=512)
    for name, weights in (("after the sync", other), ("before the sync", start)):
        if name == "after the sync":
            generator.load_weights(AutoModelForCausalLM.from_pretrained(other, dtype=torch.float32))
            replies = generator.generate([Prompt(token_ids=p, messages=[]) for p in prompts], SamplingParams(temperature=1.0, max_new_tokens=10))
        reference = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).eval()
        gaps = []
        for prompt, reply in zip(prompts, replies):
            with torch.no_grad():
                logp = reference(input_ids=torch.tensor([prompt + reply.token_ids])).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
            ours = logp[torch.arange(len(reply.token_ids)), torch.tensor(reply.token_ids)].numpy()
            gaps.append(float(np.abs(ours - np.array(reply.logprobs)).max()))
        print(f"vLLM's sampling log-probabilities against {weights} ({name}): largest difference {max(gaps):.2g} nats over {len(gaps)} replies")
    args = run_config(config)
    with EnvGroupManager.from_settings(args.env_settings(), 8, 8, tokenizer=tokenizer) as manager:
        local, _ = pipeline.play(manager, MovePolicy(model, tokenizer), SamplingParams(), seeds=list(range(8)))
    batch = pipeline.to_rows(pipeline.gather(local, group_size=8), [{"prompt": ""} for _ in local], layout="step", decode=tokenizer.decode, row_multiple=8)
    batch = pipeline.spread(pipeline.estimate(batch, "gigpo", args.estimator_settings()), max(len(s.completion_ids) for s in batch.samples))
    first = np.cumsum([0] + [e.num_turns for e in batch.episodes])
    rows = [(row, sample) for row, sample in enumerate(batch.samples) if sample.trajectory_index >= 0]
    wrong = sum(
        not np.allclose(batch.advantages[row][np.array(sample.env_mask, bool)], batch.estimate["advantages"][first[sample.trajectory_index] + sample.turn_index])
        or list(batch.episodes[sample.trajectory_index].turns[sample.turn_index].completion_ids) != [t for t, m in zip(sample.completion_ids, sample.env_mask) if m]
        for row, sample in rows
    )
    print(f"to_rows + spread: {len(rows)} rows of a real batch, {wrong} with another turn's tokens or advantage")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--start", required=True, help="model folder or 'init'")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--set", nargs="*", default=[], help="config KEY=VALUE (yaml values)")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--name", default="sim")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beta2", type=float, default=0.999, help="AdamW's second-moment decay")
    parser.add_argument("--from-move", action="store_true", help="--full-reply: the loss on the tokens from the move on (a malformed reply's from where it leaves <answer>)")
    parser.add_argument("--top-entropy", type=float, default=1.0, help="--full-reply: TRL's top_entropy_quantile")
    parser.add_argument("--move-token-loss", action="store_true", help="--full-reply: the loss on the sampled move token alone (a reply without one is not trained)")
    parser.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip (the trainer's max_grad_norm)")
    parser.add_argument("--full-reply", action="store_true", help="sample and train the whole reply, not the move token alone")
    parser.add_argument("--check", metavar="OTHER", help="check the trainer's path instead (weight sync to OTHER's weights, row order); no RL")
    a = parser.parse_args()
    config = yaml.safe_load(a.config.read_text())
    if a.check:
        check_trainer_path(config, a.start, a.check)
        return
    for kv in a.set:
        k, v = kv.split("=", 1)
        config[k] = yaml.safe_load(v)
    torch.manual_seed(a.seed)
    model, tokenizer = load(a.start, config)
    args = run_config(config)
    probe_prompts, probe_expert, _, move_ids = states(tokenizer, config, range(10**6, 10**6 + 100))
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0, betas=(0.9, a.beta2))
    groups, size = args.groups_per_step, args.num_generations
    held_out = list(range(10**9, 10**9 + 256))
    curve, started = [], time.perf_counter()
    policy = MovePolicy(model, tokenizer, temperature=args.temperature)
    sampler = ReplyPolicy(model, tokenizer, args.max_turn_tokens, args.temperature) if a.full_reply else policy
    n_prefix = len(policy.prefix)
    for step in range(a.steps + 1):
        if step % a.eval_every == 0:
            with torch.no_grad():
                p = log_probs(model.eval(), probe_prompts)[:, move_ids].softmax(-1).numpy()
            info = float(entropy(p.mean(0)) - entropy(p).mean())
            g = evaluate(model, tokenizer, args, held_out, greedy=True)
            point = {"step": step, "greedy": g, "info": info, "agree": float(np.mean(p.argmax(1) == probe_expert))}
            curve.append(point)
            print(f"[{a.name}] EVAL step {step}: greedy {g:.3f}  I(view;move) {info:.3f}  agree {point['agree']:.2f}  ({time.perf_counter() - started:.0f} s)", flush=True)
        if step == a.steps:
            break
        seeds = list(range(step * groups, (step + 1) * groups))
        model.eval()
        with EnvGroupManager.from_settings(args.env_settings(), groups, size, tokenizer=tokenizer) as manager:
            local, _ = pipeline.play(manager, sampler, SamplingParams(), seeds=seeds)
        batch = pipeline.estimate(pipeline.gather(local, group_size=size), args.advantage_estimator, args.estimator_settings())
        turns = [turn for episode in batch.episodes for turn in episode.turns]
        adv = torch.tensor(np.asarray(batch.estimate["advantages"], dtype=np.float32))
        prompts = [list(t.input_ids) + policy.prefix for t in turns]
        actions = torch.tensor([t.completion_ids[n_prefix] if len(t.completion_ids) > n_prefix else 0 for t in turns])
        success = float(np.mean([bool(e.success) for e in batch.episodes]))
        invalid = float(np.mean([not t.action_is_valid for t in turns]))
        cut = float(np.mean([t.finish_reason == "length" for t in turns]))
        model.train()
        if a.full_reply:
            loss = reply_loss(model, turns, adv, set(move_ids) if a.move_token_loss else None, a.top_entropy, policy.prefix if a.from_move else None)
        else:  # the move token's log-probability, over the reply's tokens as the trainer's loss counts them
            chosen = log_probs(model, prompts)[torch.arange(len(turns)), actions]
            loss = -(adv * chosen).sum() / (len(turns) * (n_prefix + 1 + len(policy.suffix)))
        optimizer.zero_grad()
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        optimizer.step()
        if step % 5 == 0:
            print(f"[{a.name}] step {step}: train success {success:.3f}  invalid {invalid:.3f}  cut {cut:.3f}  turns {len(turns)}  |adv| {adv.abs().mean():.3f}  grad {float(gn):.3g}  ({time.perf_counter() - started:.0f} s)", flush=True)
    out = Path(__file__).parent / "results" / "sim_rl" / f"{a.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(a) | {"config": str(a.config)}, "curve": curve}, default=str, indent=1))
    print(out)


if __name__ == "__main__":
    main()
