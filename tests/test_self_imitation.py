"""Self-imitation (envhub_trl.self_imitation): what is remembered, how it is drawn, and its loss."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from envhub.trajectory import Trajectory, Turn  # noqa: E402
from envhub_trl import pipeline  # noqa: E402
from envhub_trl.self_imitation import WinMemory, imitation_loss, imitation_rows, padded  # noqa: E402


def played(success: bool, seed: int, turns: int = 2) -> Trajectory:
    steps = [
        Turn(index=k, user=f"u{k}", observation=f"o{k}", reply="r", action="a", reward=float(success and k == turns - 1),
             env_reward=0.0, action_is_valid=True, format_valid=True, state_key=f"s{k}", next_state_key="",
             input_ids=[100 + seed, 100 + k, 7], completion_ids=[10 + k, 11], logprobs=[-0.5, -0.5])
        for k in range(turns)
    ]
    return Trajectory(env_id="test/Env-v0", group_id=0, member=0, seed=seed, index=0, layout="step", turns=steps, success=success)


def rows_of(local, **gather):
    batch = pipeline.gather(local, group_size=2, **gather)
    inputs = [{"prompt": "", "env_seed": t.seed} for t in local]
    # Token 11 spells "L", the replies' closing stop string, which the policy loss leaves out.
    return pipeline.to_rows(batch, inputs, layout="step", decode=lambda ids: "".join(chr(65 + i % 26) for i in ids), untrained_stops=("L",))


def test_only_the_wins_of_groups_not_every_member_won_are_remembered_whole_replies_and_all():
    # Groups of 2: level 1 won once, level 2 won by both, level 3 never.
    local = [played(True, 1), played(False, 1), played(True, 2), played(True, 2), played(False, 3), played(False, 3)]
    batch = rows_of(local)
    assert batch.columns["env_mask"][0] == [1, 0]  # the policy loss: the action alone
    rows = imitation_rows(batch)
    assert rows == [((101, 100, 7), (10, 11), (1, 1)), ((101, 101, 7), (11, 11), (1, 1))]  # the first episode's two turns, closing tag in
    assert imitation_rows(rows_of(local, drop_tied=True)) == rows  # tied groups dropped: none of them held such a win
    dropped = rows_of(local, keep_fraction=0.3)  # keeps one group: level 1's (the only one with spread)
    assert imitation_rows(dropped) == rows


def test_the_memory_keeps_the_latest_rows_and_draws_the_same_for_the_same_seed():
    memory = WinMemory(3)
    memory.add([((1,), (2,), (1,)), ((3,), (4,), (1,))])
    memory.add([((5,), (6,), (1,)), ((7,), (8,), (1,))])
    assert [row[0] for row in memory.rows] == [(3,), (5,), (7,)]
    assert memory.sample(5, [0, 1]) == memory.sample(5, [0, 1]) and len(memory.sample(5, [0, 1])) == 5
    assert memory.sample(64, [0, 2]) != memory.sample(64, [0, 3])
    again = WinMemory(3)
    again.load(memory.state())
    assert again.rows == memory.rows
    assert WinMemory(2).sample(4, [0]) == []
    with pytest.raises(ValueError, match="self_imitation_memory"):
        WinMemory(0)


def test_the_term_is_each_replys_summed_nll_of_its_masked_tokens_averaged_over_rows():
    rows = [((5, 6), (7, 8, 9), (1, 0, 1)), ((4,), (3,), (1,))]
    ids, attention, mask, width = padded(rows, pad_id=0)
    assert width == 2 and ids.tolist() == [[5, 6, 7, 8, 9], [0, 4, 3, 0, 0]]
    assert attention.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]] and mask.tolist() == [[1, 0, 1], [1, 0, 0]]

    class Bigram(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(16, 16))

        def forward(self, input_ids, attention_mask, logits_to_keep=0):
            return type("Out", (), {"logits": self.table[input_ids][:, -logits_to_keep:]})  # transformers' slice

    model = Bigram()
    logp = torch.log_softmax(model.table, -1)
    # A reply's log-likelihood sums its tokens (the masked-out 8 after 7 does not count); rows average.
    expected = -((logp[6, 7] + logp[8, 9]) + logp[4, 3]) / 2
    assert float(imitation_loss(model, rows, pad_id=0).detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    assert float(imitation_loss(model, rows, pad_id=0, temperature=2.0).detach()) != pytest.approx(float(expected.detach()))
    imitation_loss(model, rows, pad_id=0).backward()
    assert model.table.grad[6].abs().sum() > 0 and model.table.grad[7].abs().sum() == 0  # no token follows 7 in the mask


def test_rows_drawn_twice_run_once_and_the_head_scores_only_the_replies():
    """The term on a real causal LM (a two-layer Qwen2) equals the plain one, every drawn row run
    through the whole head, in value and in gradient: a duplicated row weighs its count."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    model = Qwen2ForCausalLM(config).float()
    a, b, c = ((3, 4, 5), (6, 7), (1, 1)), ((8,), (9, 10, 11), (1, 0, 1)), ((3, 4, 5), (12,), (1,))
    rows = [a, b, a, c, a, b]

    def plain() -> torch.Tensor:
        ids, attention, mask, width = padded(rows, pad_id=0)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, width - 1 : -1].float() / 0.7
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, width:, None])[..., 0]
        return -(logp * mask).sum() / len(rows)

    expected = plain()
    expected.backward()
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss = imitation_loss(model, rows, pad_id=0, temperature=0.7)
    loss.backward()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    for got, want in zip((p.grad for p in model.parameters()), reference):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_wins_invalid_replies_are_not_imitated():
    won = played(True, 1, turns=3)
    won = dataclasses.replace(won, turns=[won.turns[0], dataclasses.replace(won.turns[1], action_is_valid=False), won.turns[2]])
    rows = imitation_rows(rows_of([won, played(False, 1, turns=3)]))
    assert [row[0][1] for row in rows] == [100, 102]  # turns 0 and 2: the invalid turn 1 is left out
    # The trajectory layout: one row, the invalid turn's reply masked out with the env's tokens.
    whole = [dataclasses.replace(t, layout="trajectory") for t in (won, played(False, 1, turns=3))]
    (row,) = imitation_rows(pipeline.to_rows(pipeline.gather(whole, group_size=2), [{"prompt": "", "env_seed": 1}] * 2, layout="trajectory"))
    assert row[1] == (10, 11, 101, 101, 7, 11, 11, 101, 102, 7, 12, 11)
    assert row[2] == (1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1)


def test_rows_of_a_set_aside_episode_are_not_remembered():
    failed = dataclasses.replace(played(True, 1), error="ConnectionError")
    local = [failed, played(False, 1)]
    assert imitation_rows(rows_of(local)) == []
    assert np.array_equal(pipeline.gather(local, group_size=2).aside, [True, False])
