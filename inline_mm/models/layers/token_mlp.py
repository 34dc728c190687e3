"""The blocks' MLP, run in token chunks at inference on the CPU (eager and compiled).

Without autograd the ``mlp_ratio``-wide hidden activations are only temporaries, so
the tokens go through ``fc1 -> GELU -> fc2`` in chunks: at detection sizes
(InLine-PVT's first stage: 67k tokens x 512 hidden channels at 1333x800) each chunk's
hidden tensor stays in cache instead of streaming hundreds of MB through memory
twice, and the peak memory of a forward pass drops.  A ``torch.compile`` graph
compiled with ``dynamic=False`` (torch >= 2.4) unrolls the loop at its size (inductor
then fuses each chunk's bias and GELU in cache); every other graph runs the MLP in one
pass: with symbolic sizes the loop would make dynamo specialise the graph on every
size.  Not handled: a dimension marked dynamic (``mark_dynamic``) inside a
``dynamic=False`` compilation, and strict ``torch.export`` with dynamic shapes, where
the loop would pin that size.
"""
from typing import Callable

import torch
from timm.layers import Mlp
from torch import Tensor

from . import symbolic

#: Tokens per chunk: 4096 x 512 fp32 hidden values = 8 MB.
CHUNK_TOKENS = 4096


def run_in_token_chunks(tokens: Tensor, chunk_tokens: int,
                        mlp: Callable[[Tensor], Tensor]) -> Tensor:
    """``mlp`` over the rows of ``(N, C)`` tokens, ``chunk_tokens`` rows at a time, each
    chunk's result copied into one output; one call where ``N <= 2 * chunk_tokens``."""
    num_tokens = tokens.shape[0]
    if num_tokens <= 2 * chunk_tokens:
        return mlp(tokens)
    out = None
    for start in range(0, num_tokens, chunk_tokens):
        chunk = mlp(tokens[start:start + chunk_tokens])
        if out is None:  # dtype from the first chunk: autocast decides it
            out = chunk.new_empty(num_tokens, chunk.shape[-1])
        out[start:start + chunk.shape[0]] = chunk
    return out


class TokenMlp(Mlp):
    """timm's ``Mlp`` (same parameters and keys) that runs inference in token chunks.

    The result is the same per token.  Training (autograd on), tensors on other
    devices than the CPU, compiled graphs other than ``dynamic=False`` ones on torch
    >= 2.4, and ``torch.jit`` / ONNX traces take timm's path
    (:func:`~.symbolic.loops_over_sizes`: the gain was measured on CPUs only, a GPU runs
    one large matmul best, and a symbolic or traced graph would freeze the loop over one
    size).
    """

    #: Tokens per chunk (a class attribute, so a test can shrink it)
    chunk_tokens = CHUNK_TOKENS

    def forward(self, x: Tensor) -> Tensor:
        if self.training or torch.is_grad_enabled() or not symbolic.loops_over_sizes(x):
            return super().forward(x)
        # timm's order; the dropouts are no-ops in eval mode
        out = run_in_token_chunks(x.reshape(-1, x.shape[-1]), self.chunk_tokens,
                                  lambda t: self.fc2(self.norm(self.act(self.fc1(t)))))
        return out.view(*x.shape[:-1], out.shape[-1])
