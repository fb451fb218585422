"""The loss's forward and backward in chunks of rows: a micro-batch's exact gradient in bounded memory.

A micro-batch's forward and backward hold every row's activations at once. In the step layout
(``sample_layout: step``) a micro-batch is every turn of ``per_device_train_batch_size`` episodes,
so its rows grow with the episodes' length, and its memory with them: on ALFWorld's CPU recipe
(4-layer tiny model, episodes of up to 40 turns) one RL step took 22.2 GB, most of it in the loss;
in passes of 16,384 tokens, 7.4 GB (docs/training.md).

With ``max_forward_tokens`` the loss runs the way GradCache (Gao et al., 2021) runs a contrastive
loss over a batch too large for one pass:

1. Each chunk of rows (at most ``max_forward_tokens`` tokens, rows times padded width) runs forward
   without gradients. Its log-probs, its entropies and, where PPO's critic or the choices' entropy
   bonus read them, its final hidden states become leaf tensors; TRL's loss is computed over the
   whole micro-batch on them and back-propagated down to the leaves, as usual.
2. Each chunk then runs forward again, with gradients, and back-propagates its leaves' gradients.

By the chain rule the parameters receive the whole micro-batch's gradient (up to the order of its
floating-point sums), and the loss, its normalisation, TRL's entropy mask and every logged metric
see the whole micro-batch, as they would in one pass. The cost is one more forward pass per chunk;
the memory is one chunk's activations. verl's ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu``
bounds a micro-batch's tokens too, but splits the loss with it (its normalisation is per chunk,
rescaled); here nothing about the loss changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

# (ids, attention mask) of a chunk of rows -> (per-token log-probs, entropies or None, distinct prompts run)
ChunkForward = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None, int]]


@contextlib.contextmanager
def _final_states(norm: nn.Module | None, states: list[torch.Tensor], leaves: bool) -> Iterator[None]:
    """Within the block, append every output of ``norm`` (the trunk's final hidden states) to
    ``states``; with ``leaves``, each output is first made a leaf that requires gradients, and the
    model (and any hook registered before this one) reads the leaf."""
    if norm is None:
        yield
        return

    def hook(module: nn.Module, inputs: object, output: torch.Tensor) -> torch.Tensor:
        if leaves:
            output = output.detach().requires_grad_()
        states.append(output)
        return output

    handle = norm.register_forward_hook(hook, prepend=True)  # before captured_hidden_states' hook, which then sees the leaf
    try:
        yield
    finally:
        handle.remove()


@dataclass
class _Chunk:
    forward: ChunkForward
    ids: torch.Tensor
    mask: torch.Tensor
    leaves: list[torch.Tensor | None]  # log-probs, entropies, then the final hidden states of each forward pass


class ChunkedLoss:
    """One micro-batch's chunks, from the loss's no-gradient forward passes to their backward.

    ``norm`` is the module whose output is the trunk's final hidden state
    (:func:`envhub_trl.critic.final_norm`), where the loss reads hidden states (PPO's critic, the
    choices' entropies); None where it reads only log-probs and entropies.
    """

    def __init__(self, norm: nn.Module | None = None) -> None:
        self.norm = norm
        self.chunks: list[_Chunk] = []

    def forward(self, forward: ChunkForward, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """Run ``forward`` on a chunk without gradients; return its log-probs and entropies as
        leaves that require gradients (the loss back-propagates into them), and its prompt count."""
        states: list[torch.Tensor] = []
        with torch.no_grad(), _final_states(self.norm, states, leaves=True):
            logps, entropies, distinct = forward(ids, mask)
        logps = logps.detach().requires_grad_()
        entropies = entropies.detach().requires_grad_() if entropies is not None else None
        self.chunks.append(_Chunk(forward, ids, mask, [logps, entropies, *states]))
        return logps, entropies, distinct

    def backward(self) -> int:
        """After the loss's backward: each chunk forward again with gradients, back-propagating what
        the loss sent its leaves. Returns the number of chunks."""
        chunks, self.chunks = self.chunks, []
        for chunk in chunks:
            states: list[torch.Tensor] = []
            with _final_states(self.norm, states, leaves=False):
                logps, entropies, _ = chunk.forward(chunk.ids, chunk.mask)
            if len(states) != len(chunk.leaves) - 2:
                raise RuntimeError(f"a chunk's second forward ran {len(states)} passes, its first {len(chunk.leaves) - 2}")
            pairs = [(new, leaf.grad) for new, leaf in zip([logps, entropies, *states], chunk.leaves) if leaf is not None and leaf.grad is not None]
            if pairs:
                torch.autograd.backward([new for new, _ in pairs], [grad.to(new.dtype) for new, grad in pairs])
        return len(chunks)
