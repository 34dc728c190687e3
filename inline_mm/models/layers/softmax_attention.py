"""Softmax attention blocks kept from the authors' design.

``WindowAttention``: Swin's (shifted) window attention with a relative position
bias table.  The table is sized for ``table_window`` (the window the weights
were trained with); a window clipped to a small feature map indexes the
centre of the same table, so no value is invented.
"""
from functools import lru_cache
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from timm.layers import trunc_normal_
from torch import Tensor

from . import symbolic


@lru_cache(maxsize=128)
def relative_position_index(window: Tuple[int, int], table_window: Tuple[int, int]) -> Tensor:
    """Index of every (query, key) pair of ``window`` into a ``table_window`` table.

    Returns:
        ``(wh * ww, wh * ww)`` long tensor into ``(2 Th - 1) * (2 Tw - 1)`` rows.
    """
    with torch.inference_mode(False):  # cached: must stay usable by autograd later
        coords = torch.stack(torch.meshgrid(torch.arange(window[0]), torch.arange(window[1]),
                                            indexing='ij')).flatten(1)
        rel = coords[:, :, None] - coords[:, None, :]
        rel[0] += table_window[0] - 1
        rel[1] += table_window[1] - 1
        return rel[0] * (2 * table_window[1] - 1) + rel[1]


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, scale: float,
                      bias: Optional[Tensor] = None, mask: Optional[Tensor] = None,
                      attn_drop: Optional[nn.Module] = None) -> Tensor:
    """``softmax(s q k^T + bias + mask) v`` for ``(B', heads, N, d)`` windows.

    ``bias`` is ``(heads, N, N)`` (shared by all windows); ``mask`` is the
    ``(nW, N, N)`` region mask of :func:`window_masks`, repeated over the batch.
    """
    attn = torch.matmul(q * scale, k.transpose(-2, -1))
    if bias is not None:
        attn = attn + bias.unsqueeze(0)
    if mask is not None:
        nw, n = mask.shape[0], attn.shape[-1]
        attn = attn.view(-1, nw, attn.shape[1], n, n) + mask[None, :, None].to(attn.dtype)
        attn = attn.view(-1, attn.shape[2], n, n)
    attn = attn.softmax(dim=-1)
    if attn_drop is not None:
        attn = attn_drop(attn)
    return torch.matmul(attn, v)


class WindowAttention(nn.Module):
    """Swin window attention with a relative position bias (keys as the reference).

    Args:
        dim: channels.
        num_heads: heads.
        table_window: the window the bias table is sized for.
        qkv_bias: bias on the fused qkv projection.
        attn_drop: dropout on the attention weights.
        proj_drop: dropout after the output projection.
    """

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
        self.register_buffer('relative_position_index', relative_position_index(
            self.table_window, self.table_window).clone(), persistent=False)
        self._clipped_index: Dict[tuple, Tensor] = {}
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def _index(self, window: Tuple[int, int]) -> Tensor:
        """The relative position index of ``window``, on the table's device.

        Windows clipped to a small feature map index the centre of the same
        table; their indices are made once per window size and device.
        """
        if window == self.table_window:
            return self.relative_position_index
        device = self.relative_position_index.device
        key = (window, device)
        index = self._clipped_index.get(key)
        if index is None:
            with torch.inference_mode(False):  # cached: must stay usable by autograd
                index = relative_position_index(window, self.table_window).to(device)
            self._clipped_index[key] = index
        return index

    def position_bias(self, window: Tuple[int, int]) -> Tensor:
        if symbolic.is_tracing():  # the window may be a size tensor: index in the graph
            index = symbolic.relative_position_index(
                window, self.table_window, self.relative_position_bias_table.device)
        else:
            index = self._index(tuple(window))
        n = window[0] * window[1]
        bias = self.relative_position_bias_table[index.view(-1)]
        return bias.view(n, n, -1).permute(2, 0, 1)

    def forward(self, x: Tensor, window: Tuple[int, int], mask: Optional[Tensor] = None
                ) -> Tensor:
        """``x``: ``(B * nW, wh * ww, C)`` window tokens; ``mask``: ``(nW, N, N)`` or None."""
        b, n, c = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        attn = softmax_attention(qkv[0], qkv[1], qkv[2], self.scale,
                                 self.position_bias(window), mask, self.attn_drop)
        out = attn.transpose(1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(out))
