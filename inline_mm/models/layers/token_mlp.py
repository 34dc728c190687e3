"""The blocks' MLP, run in token chunks at inference on the CPU (eager and compiled).

Without autograd the ``mlp_ratio``-wide hidden activations are only temporaries, so
the tokens go through ``fc1 -> GELU -> fc2`` in chunks: at detection sizes
(InLine-PVT's first stage: 67k tokens x 512 hidden channels at 1333x800) each chunk's
hidden tensor stays in cache instead of streaming hundreds of MB through memory
twice, and the peak memory of a forward pass drops.  In eager mode the loop is
Python over the module's own layers.  A ``torch.compile`` graph cannot loop over a
symbolic size, so there the MLP is one call of the operator ``inline_mm::gelu_mlp``
(torch >= 2.4's ``torch.library.custom_op``): opaque to the compiler, it runs the
same loop at run time, whatever the size, with no guard on it.
"""
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
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


def _gelu_mlp(tokens: Tensor, fc1_weight: Tensor, fc1_bias: Optional[Tensor],
              fc2_weight: Tensor, fc2_bias: Optional[Tensor], chunk_tokens: int) -> Tensor:
    """``fc2(GELU(fc1(tokens)))`` in token chunks, in the inputs' dtype (the caller casts
    for autocast, so the compiler's shape and dtype rule below holds)."""
    with torch.autocast('cpu', enabled=False):
        return run_in_token_chunks(
            tokens, chunk_tokens,
            lambda t: F.linear(F.gelu(F.linear(t, fc1_weight, fc1_bias)), fc2_weight, fc2_bias))


# torch 2.4's API (a TorchVersion compares as a version; 2.3 had a draft of it)
if torch.__version__ >= '2.4':  # api-floor: guarded
    gelu_mlp_op = torch.library.custom_op('inline_mm::gelu_mlp', _gelu_mlp,
                                          mutates_args=(), device_types='cpu')

    @gelu_mlp_op.register_fake
    def _gelu_mlp_shape(tokens: Tensor, fc1_weight: Tensor, fc1_bias: Optional[Tensor],
                        fc2_weight: Tensor, fc2_bias: Optional[Tensor],
                        chunk_tokens: int) -> Tensor:
        return tokens.new_empty(tokens.shape[0], fc2_weight.shape[0])
else:  # torch 2.1-2.3: compiled graphs run the MLP in one pass
    gelu_mlp_op = None


class TokenMlp(Mlp):
    """timm's ``Mlp`` (same parameters and keys) that runs inference in token chunks.

    The result is the same per token.  Training (autograd on), tensors on other
    devices than the CPU and ``torch.jit`` / ONNX traces take timm's path (the gain was
    measured on CPUs only, a GPU runs one large matmul best, and a traced graph would
    freeze the loop over one size); so do compiled graphs on torch < 2.4 or with a
    layer other than exact GELU between the two linear layers.
    """

    #: Tokens per chunk (a class attribute, so a test can shrink it)
    chunk_tokens = CHUNK_TOKENS

    def forward(self, x: Tensor) -> Tensor:
        if self.training or torch.is_grad_enabled() or x.device.type != 'cpu':
            return super().forward(x)
        tokens = x.reshape(-1, x.shape[-1])
        if symbolic.is_compiling():
            if gelu_mlp_op is None or not self._is_plain_gelu_mlp():
                return super().forward(x)
            out = self._compiled_chunks(tokens)
        elif symbolic.eager_on_cpu(x):
            # timm's order; the dropouts are no-ops in eval mode
            out = run_in_token_chunks(
                tokens, self.chunk_tokens, lambda t: self.fc2(self.norm(self.act(self.fc1(t)))))
        else:  # traced (torch.jit, ONNX export)
            return super().forward(x)
        return out.view(*x.shape[:-1], out.shape[-1])

    def _is_plain_gelu_mlp(self) -> bool:
        """``fc1 -> exact GELU -> fc2`` (what the compiled operator computes)."""
        return (isinstance(self.act, nn.GELU) and self.act.approximate == 'none'
                and isinstance(self.norm, nn.Identity))

    def _compiled_chunks(self, tokens: Tensor) -> Tensor:
        """The operator call, with autocast's casts done here: inside the operator
        the linear layers run in the dtype they are given, as eager autocast runs them."""
        tensors = [tokens, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias]
        # the operator exists from torch 2.4 on, as these per-device queries do
        if torch.is_autocast_enabled('cpu'):  # api-floor: guarded
            dtype = torch.get_autocast_dtype('cpu')  # api-floor: guarded
            tensors = [t if t is None else t.to(dtype) for t in tensors]
        return gelu_mlp_op(*tensors, self.chunk_tokens)
