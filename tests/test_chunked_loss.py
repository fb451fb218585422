"""max_forward_tokens: the loss's forward passes in chunks, without gradients, then one backward per
chunk (GradCache), give the gradient of one pass over the whole micro-batch."""

from __future__ import annotations

import pytest
import torch

from envhub_trl.chunked_loss import ChunkedLoss
from envhub_trl.critic import captured_hidden_states, final_norm

from test_shared_prompts import _model, _rows, _trl


def _loss(logps, entropies, hidden, tokens, head):
    """A loss that mixes what a micro-batch's loss reads and normalises over the whole micro-batch:
    a token-mean of the log-probs, an entropy bonus, and a value read off the hidden states."""
    values = head(hidden).squeeze(-1)[:, -tokens.shape[1] :]
    return -(logps * tokens).sum() / tokens.sum() - 0.1 * (entropies * tokens).sum() / tokens.sum() + ((values * tokens) ** 2).mean()


@pytest.mark.parametrize("rows_per_chunk", [1, 5, 24])
def test_chunks_give_the_gradient_of_one_pass(rows_per_chunk):
    model = _model()
    head = torch.nn.Linear(32, 1)
    ids, mask = _rows()
    width = 6
    tokens = mask[:, -width:].float()

    with captured_hidden_states(model) as hidden:
        logps, entropies = _trl(model, ids, mask, width)
    _loss(logps, entropies, hidden[0], tokens, head).backward()
    expected = {name: p.grad.clone() for name, p in [*model.named_parameters(), *head.named_parameters()]}
    model.zero_grad()
    head.zero_grad()

    chunked = ChunkedLoss(final_norm(model))
    parts = []
    with captured_hidden_states(model) as hidden:
        for start in range(0, len(ids), rows_per_chunk):
            logps, entropies, _ = chunked.forward(lambda i, m: (*_trl(model, i, m, width), 0), ids[start : start + rows_per_chunk], mask[start : start + rows_per_chunk])
            parts.append((logps, entropies))
    assert not any(p.grad is not None for p in model.parameters())  # the loss's pass left the model alone
    logps, entropies = (torch.cat(column) for column in zip(*parts))
    _loss(logps, entropies, torch.cat(hidden), tokens, head).backward()
    assert chunked.backward() == -(-len(ids) // rows_per_chunk)
    for name, p in [*model.named_parameters(), *head.named_parameters()]:
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)


def test_chunks_without_hidden_states_keep_none_of_them():
    model = _model()
    ids, mask = _rows()
    chunked = ChunkedLoss()
    with captured_hidden_states(model) as hidden:
        logps, entropies, _ = chunked.forward(lambda i, m: (*_trl(model, i, m, 6), 0), ids, mask)
    assert logps.requires_grad and entropies.requires_grad and not hidden[0].requires_grad
    assert chunked.backward() == 1  # nothing reached the leaves: no backward, no error
    assert all(p.grad is None for p in model.parameters())
