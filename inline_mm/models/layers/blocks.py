"""Building blocks shared by the four families: patch embedding, merging, blocks."""
from typing import Dict, Optional, Tuple, Type, Union

import torch
import torch.nn as nn
from timm.layers import DropPath
from torch import Tensor

from .attention_kind import AttentionKind, BlockArgs
from .inline_attention import InLineAttention
from .softmax_attention import WindowAttention
from .token_grid import grid_to_tokens
from .token_mlp import TokenMlp
from .windows import Window, pad_image, pad_to_multiple, run_in_windows
from ...errors import ConfigError


class PatchEmbed(nn.Module):
    """Non-overlapping patch embedding (conv with kernel = stride) + LayerNorm.

    The image is zero-padded at the bottom / right to a multiple of the patch,
    so an ``H x W`` input gives ``ceil(H / p) x ceil(W / p)`` tokens.
    """

    def __init__(self, in_channels: int, embed_dim: int, patch_size: int,
                 norm_eps: Optional[float] = 1e-5) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, embed_dim, patch_size, patch_size)
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps) if norm_eps is not None else None

    def forward(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """``(B, C, H, W)`` -> tokens ``(B, h * w, D)`` and ``(h, w)``."""
        x = self.proj(pad_image(x, self.patch_size))
        hw = (x.shape[2], x.shape[3])
        x = grid_to_tokens(x)  # a view when the input (so the output) is channels-last
        if self.norm is not None:
            x = self.norm(x)
        return x, hw


class PatchMerging(nn.Module):
    """Swin's 2x2 patch merging (the reference's concatenation order), odd sizes padded."""

    def __init__(self, dim: int, norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim, eps=norm_eps)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: Tensor, hw: Tuple[int, int]) -> Tuple[Tensor, Tuple[int, int]]:
        b, _, c = x.shape
        x = pad_to_multiple(x.view(b, hw[0], hw[1], c), (2, 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]],
                      dim=-1)
        out_hw = (x.shape[1], x.shape[2])
        return self.reduction(self.norm(x.view(b, -1, 4 * c))), out_hw


#: the attention kinds of a block, by the letter of ``attn_type`` (the interface:
#: :mod:`.attention_kind`); a new kind goes in here under one capital letter other than
#: 'M' (``attn_type``'s mixed stage).  InLine-Swin accepts every letter of this table;
#: InLine-PVT and InLine-DeiT build InLine blocks only, InLine-CSwin blocks of its own
ATTENTION_KINDS: Dict[str, Type[AttentionKind]] = {'I': InLineAttention, 'S': WindowAttention}


class TransformerBlock(nn.Module):
    """Pre-norm transformer block with InLine (``'I'``) or window softmax (``'S'``).

    Attention runs in windows of the token grid (:func:`run_in_windows`);
    ``window=(None, None)`` is global.  The attention kind comes from
    :data:`ATTENTION_KINDS`; whether its windows are shifted and whether it gets a
    region bias are properties of the kind (InLine windows are never shifted: a
    shifted InLine window would mix wrapped-around borders; softmax windows take
    ``shift``, an int or ``(sh, sw)``, in tokens per axis).

    Args:
        dim, num_heads, mlp_ratio: block width, heads and MLP expansion.
        attn_type: a key of :data:`ATTENTION_KINDS`: ``'I'`` (InLine) or ``'S'``
            (Swin window softmax).
        window: attention window in tokens, see :func:`to_window`.
        shift: cyclic shift of the windows of a kind that shifts.
        table_window: window of the relative position table (softmax only).
        qkv_bias, kernel_func, separate_q, num_prefix_tokens: see
            :class:`InLineAttention`; with prefix tokens the block is global.
        drop, drop_path: dropout and stochastic depth rates.
        attn_drop: dropout on the softmax attention weights (InLine has none).
        norm_eps: LayerNorm epsilon.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4., attn_type: str = 'I',
                 window: Window = (None, None), shift: Union[int, Tuple[int, int]] = 0,
                 table_window: Optional[Tuple[int, int]] = None, qkv_bias: bool = True,
                 kernel_func: str = 'identity', separate_q: bool = False,
                 num_prefix_tokens: int = 0, drop: float = 0., drop_path: float = 0.,
                 attn_drop: float = 0., norm_eps: float = 1e-5) -> None:
        super().__init__()
        kind = ATTENTION_KINDS.get(attn_type)
        if kind is None:
            raise ConfigError(f'attn_type of a block is one of '
                              f"{', '.join(repr(k) for k in ATTENTION_KINDS)}, got {attn_type!r}")
        self.attn_type = attn_type
        self.window = window
        self.shift = shift if kind.shifted_windows else 0
        self.num_prefix_tokens = num_prefix_tokens
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = kind.for_block(BlockArgs(
            dim, num_heads, window=window, table_window=table_window, qkv_bias=qkv_bias,
            kernel_func=kernel_func, separate_q=separate_q, num_prefix_tokens=num_prefix_tokens,
            attn_drop=attn_drop, proj_drop=drop))
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = TokenMlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=drop)

    def forward(self, x: Tensor, hw: Tuple[int, int]) -> Tensor:
        """``x``: ``(B, prefix + h * w, C)`` tokens on the ``hw`` grid."""
        y = self.norm1(x)
        if self.num_prefix_tokens:  # global over the prefix tokens and the grid
            y = self.attn(y, hw)
        else:
            b, n, c = y.shape
            y = run_in_windows(y.view(b, hw[0], hw[1], c), self.window, self.attn, self.shift,
                               need_bias=self.attn.region_bias).reshape(b, n, c)
        x = x + self.drop_path(y)
        return x + self.drop_path(self.mlp(self.norm2(x)))
