"""Softmax attention blocks kept from the authors' design.

``WindowAttention``: Swin's (shifted) window attention with a relative position
bias table.  The table is sized for ``table_window`` (the window the weights
were trained with); a window clipped to a small feature map indexes the
centre of the same table, so no value is invented.

Both families' softmax blocks (this one and CSwin's stripes) run
:func:`softmax_attention`: ``F.scaled_dot_product_attention`` with the
position bias and the region bias of the windows in one additive mask.
"""
from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor

from ...errors import ConfigError
from . import symbolic
from .attention_kind import AttentionKind, BlockArgs
from .cache import CACHE


def _explicit_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor],
                        dropout_p: float, scale: float) -> Tensor:
    """``softmax(s q k^T + attn_mask) v`` written out (what a jit trace records)."""
    attn = torch.matmul(q * scale, k.transpose(-2, -1))
    if attn_mask is not None:
        attn = attn + attn_mask
    attn = attn.softmax(dim=-1)
    if dropout_p:
        attn = F.dropout(attn, dropout_p)
    return torch.matmul(attn, v)


#: True inside :func:`explicit_softmax`: the written-out form instead of the fused operator
_EXPLICIT = False


@contextmanager
def explicit_softmax() -> Iterator[None]:
    """Compute the softmax blocks with the written-out matmuls inside this context.

    The numbers are the same (to float rounding); benchmarks use it to time the
    fused ``scaled_dot_product_attention`` against the explicit form
    (``tools/analysis/benchmark.py --models inline_swin_t inline_swin_t+explicit``).
    """
    global _EXPLICIT
    previous, _EXPLICIT = _EXPLICIT, True
    try:
        yield
    finally:
        _EXPLICIT = previous


#: torch 2.1's memory-efficient CUDA kernel returns wrong numbers (fp32) for q / k / v
#: views that are not contiguous when a mask is given (pytorch#112577, fixed in 2.2).
_TORCH_BEFORE_2_2 = torch.__version__ < '2.2'  # a TorchVersion: compares as a version


def needs_contiguous_qkv(device_type: str, has_mask: bool,
                         torch_before_2_2: bool = _TORCH_BEFORE_2_2) -> bool:
    """Whether q / k / v must be made contiguous before the fused operator: on CUDA
    with a mask under torch < 2.2 (our q / k / v are views of the fused qkv output)."""
    return torch_before_2_2 and has_mask and device_type == 'cuda'


def _attend(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor], dropout_p: float,
            scale: float) -> Tensor:
    if _EXPLICIT or symbolic.is_jit_tracing():
        # A jit trace (mmengine's FLOP counter, ONNX export) records the matmuls: the
        # counter has no rule for the fused operator and would count it as 0 FLOPs.
        return _explicit_attention(q, k, v, attn_mask, dropout_p, scale)
    if needs_contiguous_qkv(q.device.type, attn_mask is not None):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, scale=scale)


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, scale: float,
                      bias: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                      dropout_p: float = 0.) -> Tensor:
    """``softmax(s q k^T + bias + mask) v`` for ``(B * nW, heads, N, d)`` windows.

    Runs ``F.scaled_dot_product_attention`` (the explicit matmuls while a jit
    trace records the graph).  ``bias`` is ``(heads, N, N)`` (shared by all
    windows); ``mask`` is the ``(nW, N, N)`` or ``(nW, 1, N)`` region bias of
    :func:`~.windows.region_bias`, the same for every image of the batch.  The
    two are added into one additive mask of ``nW * heads`` rows and the windows
    of an image are folded into the head axis, so that the mask broadcasts over
    the batch only: the 4-D form the fused CPU / CUDA kernels take.  Without
    bias and mask no mask is passed at all, so that CUDA can pick its flash
    kernel.
    """
    if mask is None:
        # contiguous: CUDA's fused kernels take only masks whose last stride is 1, and
        # the position bias is a permuted view (a sum with the region mask is a new tensor)
        attn_mask = None if bias is None else bias.to(q.dtype).contiguous().unsqueeze(0)
        return _attend(q, k, v, attn_mask, dropout_p, scale)
    nw, heads, n = mask.shape[0], q.shape[1], q.shape[2]
    attn_mask = mask.to(q.dtype).unsqueeze(1)  # (nW, 1, N | 1, N)
    if bias is not None:
        attn_mask = attn_mask + bias.to(q.dtype)
    else:
        attn_mask = attn_mask.expand(nw, heads, attn_mask.shape[2], n)
    attn_mask = attn_mask.reshape(1, nw * heads, attn_mask.shape[2], n)

    def fold(t: Tensor) -> Tensor:  # (B * nW, heads, N, d) -> (B, nW * heads, N, d)
        return t.reshape(-1, nw * heads, n, t.shape[-1])

    out = _attend(fold(q), fold(k), fold(v), attn_mask, dropout_p, scale)
    return out.reshape(q.shape[0], heads, n, v.shape[-1])


class WindowAttention(nn.Module, AttentionKind):
    """Swin window attention with a relative position bias (keys as the reference).

    Args:
        dim: channels.
        num_heads: heads.
        table_window: the window the bias table is sized for.
        qkv_bias: bias on the fused qkv projection.
        attn_drop: dropout on the attention weights.
        proj_drop: dropout after the output projection.

    As an attention kind of :class:`~inline_mm.models.layers.blocks.TransformerBlock`
    (``'S'``): windows may be shifted, and padding and shifted regions are kept apart
    by the region bias.
    """

    shifted_windows = True
    region_bias = True

    @classmethod
    def for_block(cls, args: BlockArgs) -> 'WindowAttention':
        if args.num_prefix_tokens:
            raise ConfigError('window softmax attention has no prefix tokens (a cls '
                              "token): use attn_type 'I' in such a backbone")
        return cls(args.dim, args.num_heads, args.table_window or args.window,
                   qkv_bias=args.qkv_bias, attn_drop=args.attn_drop, proj_drop=args.proj_drop)

    def __init__(self, dim: int, num_heads: int, table_window: Tuple[int, int],
                 qkv_bias: bool = True, attn_drop: float = 0., proj_drop: float = 0.) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.table_window = tuple(table_window)
        self.relative_position_bias_table = nn.Parameter(torch.zeros(
            (2 * table_window[0] - 1) * (2 * table_window[1] - 1), num_heads))
        trunc_normal_(self.relative_position_bias_table, std=.02)
        # the index of the full window: a buffer, so it lives on the model's device
        # (not saved: checkpoints carry none, the converters drop the authors')
        self.register_buffer('relative_position_index', symbolic.relative_position_index(
            self.table_window, self.table_window, torch.device('cpu')), persistent=False)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def _index(self, window: Tuple[int, int]) -> Tensor:
        """The relative position index of ``window``, on the table's device.

        Windows clipped to a small feature map index the centre of the same
        table; their indices are kept in the shared byte-bounded cache, per
        window, table size and device (built in the graph when one is recorded).
        """
        if not symbolic.in_graph() and tuple(window) == self.table_window:
            return self.relative_position_index
        device = self.relative_position_bias_table.device
        return CACHE.get(('rel_index', tuple(window), self.table_window, str(device)),
                         lambda: symbolic.relative_position_index(window, self.table_window,
                                                                  device))

    def position_bias(self, window: Tuple[int, int]) -> Tensor:
        """The ``(heads, N, N)`` relative position bias of ``window``."""
        n = window[0] * window[1]
        bias = self.relative_position_bias_table[self._index(window).view(-1)]
        return bias.view(n, n, -1).permute(2, 0, 1)

    def forward(self, x: Tensor, window: Tuple[int, int], valid: Optional[Tensor] = None,
                bias: Optional[object] = None) -> Tensor:
        """``x``: ``(B * nW, wh * ww, C)`` window tokens; ``bias``: the region bias
        ``(nW, N, N)`` / ``(nW, 1, N)`` or None, or a function of the scores' dtype
        that returns it (:data:`~.windows.RegionBias`); ``valid`` is the block
        interface's token mask, which the region bias already covers."""
        b, n, c = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        mask = bias(qkv.dtype) if callable(bias) else bias
        attn = softmax_attention(qkv[0], qkv[1], qkv[2], self.scale, self.position_bias(window),
                                 mask, self.attn_drop.p if self.training else 0.)
        out = attn.transpose(1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(out))
