"""One forward pass per distinct prompt: the loss's log-probs when many rows share a prompt.

In the step layout with little or no history (``sample_layout: step``, ``history_turns: 0``)
a row is one turn: a prompt of tens of tokens and a reply of a few. The same prompt comes back
in many rows (FrozenLake's local view has 81 spellings: on the RL-alone recipe's batches each
prompt came back in 18 rows), and TRL's scoring runs the whole prompt once per row, so the
trainer's step went mostly to re-reading prompts it had read already.

:func:`shared_prompt_logps` runs each distinct prompt once, keeps its key/value cache, hands every
row the cache of its prompt (an ``index_select``, which autograd follows back, so each prompt's
gradient is the sum of its rows') and runs only the replies on top. The arithmetic is the same as
one forward per row: the same tokens at the same positions under the same mask. Only the order of
the gradient's floating-point sums differs (``bench/shared_prompts.py`` found the log-probs equal).

The row's last prompt token goes with the reply (the cache holds the prompt less that token), so
its hidden state, which predicts the reply's first token, is computed in the second pass, and the
scores come back in TRL's layout, one per completion position, through TRL's fused head
(``shift_labels``: the labels are the completion tokens themselves).
"""

from __future__ import annotations

from typing import Any

import torch


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, inverse)``: the index of one row of each distinct (ids under mask) row of ``ids``, and for
    every row, the index in ``first`` of its own; padding (``mask`` 0) is ignored, whatever its ids."""
    keys = ids.masked_fill(mask == 0, -1)
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1 if inverse.numel() else 0,), -1, dtype=torch.long, device=ids.device)
    order = torch.arange(len(inverse), device=ids.device)
    first = first.scatter_reduce(0, inverse, order, reduce="amin", include_self=False)
    return first, inverse


def shared_prompt_logps(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, compute_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` positions of each row, as
    TRL's ``_get_per_token_logps_and_entropies`` computes them for one chunk of rows, with the
    prompts (the positions before those) run once each.

    ``model`` carries TRL's fused head (``fused_lm_head=True`` returns per-token scores, entropies
    when TRL asked for them); prompts are left-padded, as TRL lays them out. Returns the log-probs
    ``(rows, logits_to_keep)``, the entropies (None unless asked) and the number of distinct prompts.
    """
    width = input_ids.shape[1] - logits_to_keep
    prefix, prefix_mask = input_ids[:, : width - 1], attention_mask[:, : width - 1]
    first, inverse = distinct_rows(prefix, prefix_mask)
    cache = model(input_ids=prefix[first], attention_mask=prefix_mask[first], use_cache=True, logits_to_keep=1).past_key_values
    cache.reorder_cache(inverse)  # every row its prompt's keys and values; gradients flow back through the index
    labels = input_ids[:, width:].masked_fill(attention_mask[:, width:] == 0, -100)
    outputs = model(
        input_ids=input_ids[:, width - 1 : -1], attention_mask=attention_mask[:, :-1], past_key_values=cache,
        shift_labels=labels, fused_lm_head=True,
    )
    entropies = outputs.entropy if compute_entropy else None
    return outputs.log_probs, entropies, len(first)
