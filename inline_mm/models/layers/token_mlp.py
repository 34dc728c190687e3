"""The blocks' MLP, run in token chunks at inference on the CPU (eager and compiled).

Without autograd the ``mlp_ratio``-wide hidden activations are only temporaries, so
the tokens go through ``fc1 -> GELU -> fc2`` in chunks: at detection sizes
(InLine-PVT's first stage: 67k tokens x 512 hidden channels at 1333x800) each chunk's
hidden tensor stays in cache instead of streaming hundreds of MB through memory
twice, and the peak memory of a forward pass drops.

``torch.compile`` graphs on the CPU (torch >= 2.4) chunk too.  One compiled with
``dynamic=False`` unrolls the loop at its size (inductor then fuses each chunk's bias
and GELU in cache).  With symbolic sizes (``dynamic=True``, the backbones' ``compile``
option) a loop over the size would make dynamo specialise the graph on every size, so
the tokens go in a fixed number of chunks instead (:attr:`TokenMlp.graph_chunks`, set
per stage by the backbone from its stride: :func:`graph_chunk_count`), padded to a
multiple of that number: the graph holds the same operations for every size and adds no
guard.  Not handled: a dimension marked dynamic (``mark_dynamic``) inside a
``dynamic=False`` compilation, and strict ``torch.export`` with dynamic shapes, where
the size loop would pin that size.
"""
import math
from typing import Callable

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import Tensor

from . import symbolic

#: Tokens per chunk: 4096 x 512 fp32 hidden values = 8 MB.
CHUNK_TOKENS = 4096
#: (height, width) whose token counts set the chunk count of graphs with symbolic sizes:
#: the test size of the toolkits' detection recipes (1333x800)
GRAPH_REFERENCE_HW = (800, 1333)


def graph_chunk_count(stride: int, chunk_tokens: int = CHUNK_TOKENS) -> int:
    """Chunks of a stage's MLP in graphs with symbolic sizes: as many as one image of
    :data:`GRAPH_REFERENCE_HW` has ``chunk_tokens`` at ``stride`` (1 where eager would
    run one pass at that size).  Stride 4 (a first stage): 17 chunks; 8: 5; 16 and 32: 1.
    A batch of ``B`` images makes each chunk ``B`` times larger (eager chunks by the
    batch's tokens).
    """
    tokens = math.ceil(GRAPH_REFERENCE_HW[0] / stride) * math.ceil(GRAPH_REFERENCE_HW[1] / stride)
    return 1 if tokens <= 2 * chunk_tokens else math.ceil(tokens / chunk_tokens)


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


def run_in_equal_chunks(tokens: Tensor, chunks: int, mlp: Callable[[Tensor], Tensor]) -> Tensor:
    """``mlp`` over the rows of ``(N, C)`` tokens in ``chunks`` chunks of
    ``N // chunks + 1`` rows, the last ones zero-padded: no branch and no loop on ``N``
    (a compiled graph with symbolic sizes holds the same operations for every ``N``).
    The padding is never empty: torch 2.4's dynamo guards on a zero pad amount (a
    second graph for every ``N`` divisible by ``chunks``).  ``N < chunks`` (one-row
    chunks, a size dynamo specialises) may compile again: an image of a few pixels.
    The pad and the concatenation each copy the tokens once (``C`` values a token,
    against the ``mlp_ratio * C`` hidden ones that stay in cache)."""
    num_tokens = tokens.shape[0]
    rows = num_tokens // chunks + 1
    padded = F.pad(tokens, (0, 0, 0, chunks * rows - num_tokens)).view(chunks, rows, -1)
    return torch.cat([mlp(padded[i]) for i in range(chunks)])[:num_tokens]


class TokenMlp(Mlp):
    """timm's ``Mlp`` (same parameters and keys) that runs inference in token chunks.

    The result is the same per token.  Eager and ``dynamic=False`` graphs chunk by
    :attr:`chunk_tokens` (:func:`~.symbolic.loops_over_sizes`); other compiled graphs
    in :attr:`graph_chunks` chunks (:func:`~.symbolic.compiling_in_chunks`).  Training
    (autograd on), tensors on other devices than the CPU, graphs before torch 2.4,
    ``torch.export`` (where torch has ``torch.compiler.is_exporting``) and ``torch.jit``
    / ONNX traces take timm's path: the gain was measured on CPUs only, a GPU runs one
    large matmul best, and a traced or exported graph is not the place for a CPU cache
    tuning.
    """

    #: Tokens per chunk (a class attribute, so a test can shrink it)
    chunk_tokens = CHUNK_TOKENS
    #: Chunks in compiled graphs with symbolic sizes (the backbones set it per stage)
    graph_chunks = 1

    def forward(self, x: Tensor) -> Tensor:
        if self.training or torch.is_grad_enabled():
            return super().forward(x)
        if symbolic.loops_over_sizes(x):
            out = run_in_token_chunks(x.reshape(-1, x.shape[-1]), self.chunk_tokens,
                                      self._hidden_path)
        elif self.graph_chunks > 1 and symbolic.compiling_in_chunks(x):
            out = run_in_equal_chunks(x.reshape(-1, x.shape[-1]), self.graph_chunks,
                                      self._hidden_path)
        else:
            return super().forward(x)
        return out.view(*x.shape[:-1], out.shape[-1])

    def _hidden_path(self, tokens: Tensor) -> Tensor:
        # timm's order; the dropouts are no-ops in eval mode
        return self.fc2(self.norm(self.act(self.fc1(tokens))))
