"""InLine-CSwin: CSWin Transformer with InLine blocks and cross-shaped softmax stripes."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from timm.layers import DropPath
from torch import Tensor

from ...errors import ConfigError
from ...registry import register_model
from ..converters import convert_cswin
from ..layers.token_mlp import TokenMlp
from ..layers import symbolic
from ..layers.inline_attention import InLineCore, project_with_mean, zero_padded_tokens
from ..layers.softmax_attention import softmax_attention
from ..layers.token_grid import depthwise_conv3x3_per_sample, grid_to_tokens, tokens_to_grid
from ..layers.windows import Window, pad_image, run_in_windows, window_token_means
from .arch import (WindowSpec, check_stage_lists, parse_attn_type, per_stage_windows,
                   resolve_arch)
from .base import InLineBackbone


def lepe_conv(dim: int) -> nn.Conv2d:
    """Locally-enhanced positional encoding: a 3x3 depthwise conv of V per window."""
    return nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)


def apply_lepe(conv: nn.Conv2d, v: Tensor, window: Tuple[int, int],
               valid: Optional[Tensor]) -> Tensor:
    """LePE of ``(B', N, C)`` window tokens; padded tokens count as zero padding.

    In a recorded graph (``torch.compile``) the windows are folded into the channels
    (:func:`depthwise_conv3x3_per_sample`, the kernel repeated per window): dynamo would
    otherwise guard on the number of windows, on which the CPU convolution picks its
    backend, and compile again for sizes on the other side.
    """
    v = zero_padded_tokens(v, valid)
    if symbolic.is_compiling():
        n = v.shape[0]
        return depthwise_conv3x3_per_sample(v, window, conv.weight.repeat(n, 1, 1, 1),
                                            conv.bias.repeat(n))
    return grid_to_tokens(conv(tokens_to_grid(v, window)))


def _in_windows(qkv: Tensor, hw: Tuple[int, int], window: Window, fn,
                need_bias: bool) -> Tensor:
    """Partition ``(B, N, 3C)`` tokens (q, k and v side by side) into windows, apply
    ``fn(q, k, v, window, valid, bias)`` and return its ``(B, N, C)`` output.

    The projection's output is partitioned as it is, one copy for the three (the
    windows of q, k and v are slices of it); the kernel source of InLine's local branch
    is not partitioned at all (:func:`~..layers.windows.window_token_means`).
    """
    b, _, c3 = qkv.shape
    c = c3 // 3

    def split_and_apply(windows, win, valid, bias):
        return fn(*windows.split(c, dim=-1), win, valid, bias)

    grid = qkv.view(b, hw[0], hw[1], c3)
    return run_in_windows(grid, window, split_and_apply, need_bias=need_bias).reshape(b, -1, c)


class LePEAttention(nn.Module):
    """CSWin softmax attention within stripes (or globally) with LePE.

    Args:
        dim, num_heads: channels and heads of this branch.
        window: ``(None, s)`` vertical stripes, ``(s, None)`` horizontal
            stripes, ``(None, None)`` global (the last stage).
        attn_drop: dropout on the attention weights.
    """

    def __init__(self, dim: int, num_heads: int, window: Window,
                 attn_drop: float = 0.) -> None:
        super().__init__()
        self.attn_drop = nn.Dropout(attn_drop)
        self.get_v = lepe_conv(dim)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.window = window

    def _heads(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def _attend(self, q, k, v, window, valid, bias):
        q, k, v_heads = self._heads(q), self._heads(k), self._heads(v)
        out = softmax_attention(q, k, v_heads, self.scale,
                                mask=None if bias is None else bias(q.dtype),
                                dropout_p=self.attn_drop.p if self.training else 0.)
        b, n, c = v.shape
        return out.transpose(1, 2).reshape(b, n, c) + apply_lepe(self.get_v, v, window, valid)

    def forward(self, qkv: Tensor, hw: Tuple[int, int]) -> Tensor:
        """``(B, N, 3C)``: this branch's q, k and v side by side -> ``(B, N, C)``."""
        return _in_windows(qkv, hw, self.window, self._attend, need_bias=True)


class CSWinInLineAttention(InLineCore):
    """InLine attention of CSwin: one branch over windows (or globally), with LePE.

    The local kernel is predicted from the mean of the raw block input (not the
    normed one) over each window's real tokens, as in the reference.  The block's
    output projection is applied inside the windows (a per-token linear layer, so
    the same numbers), where each window's value mean can go through it apart from
    the per-token terms (:func:`project_with_mean`: the precision of bf16 training).
    """

    def __init__(self, dim: int, num_heads: int, window: Window,
                 kernel_func: str = 'identity') -> None:
        super().__init__(dim, num_heads, kernel_func)
        self.get_v = lepe_conv(dim)
        self.window = window

    def forward(self, qkv: Tensor, x: Tensor, hw: Tuple[int, int], proj: nn.Linear) -> Tensor:
        """The branch's output after the block's projection ``proj``, from ``(B, N, 3C)``
        q, k and v side by side and the block input ``x`` ``(B, N, C)``."""
        x_grid = x.view(x.shape[0], hw[0], hw[1], -1)

        def attend_and_project(q, k, v, window, valid, bias):
            x_mean = window_token_means(x_grid, window, valid)
            out, v_mean = self.attend(q, k, v, x_mean, window, valid)
            out = out + apply_lepe(self.get_v, v, window, valid)
            return project_with_mean(proj, out, v_mean)

        return _in_windows(qkv, hw, self.window, attend_and_project, need_bias=False)


class CSWinBlock(nn.Module):
    """CSWin block (reference keys: qkv, norm1, proj, attns, mlp, norm2).

    Args:
        dim, num_heads, mlp_ratio, qkv_bias: block structure.
        attn_type: ``'I'`` (one InLine branch) or ``'S'`` (softmax stripes).
        split_size: softmax stripe width.
        two_branches: softmax in two half-width branches (vertical and
            horizontal stripes) instead of one global branch (the last stage).
        inline_window: window of an InLine block.
        kernel_func, drop, drop_path, attn_drop: see :class:`TransformerBlock`.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, qkv_bias: bool,
                 attn_type: str, split_size: int, two_branches: bool, inline_window: Window,
                 kernel_func: str = 'identity', drop: float = 0., drop_path: float = 0.,
                 attn_drop: float = 0.) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.norm1 = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(drop)
        # CSWin's blocks are its own (LePE stripes or an InLine branch projected inside),
        # not TransformerBlocks: the kinds of blocks.ATTENTION_KINDS do not apply here
        if attn_type not in ('I', 'S'):
            raise ConfigError(f"attn_type of a CSWin block is 'I' or 'S', got {attn_type!r}")
        if attn_type == 'I':
            attns = [CSWinInLineAttention(dim, num_heads, inline_window, kernel_func)]
        elif two_branches:
            attns = [LePEAttention(dim // 2, num_heads // 2, (None, split_size), attn_drop),
                     LePEAttention(dim // 2, num_heads // 2, (split_size, None), attn_drop)]
        else:
            attns = [LePEAttention(dim, num_heads, (None, None), attn_drop)]
        self.attns = nn.ModuleList(attns)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.mlp = TokenMlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=drop)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: Tensor, hw: Tuple[int, int]) -> Tensor:
        qkv = self.qkv(self.norm1(x))
        parts = len(self.attns)
        if isinstance(self.attns[0], CSWinInLineAttention):  # one branch, projected inside
            y = self.attns[0](qkv, x, hw, self.proj)
        elif parts == 1:
            y = self.proj(self.attns[0](qkv, hw))
        else:  # each branch its slice of q, k and v (3 x C / parts channels side by side)
            b, n, _ = qkv.shape
            branches = qkv.view(b, n, 3, parts, -1)
            y = self.proj(torch.cat([attn(branches[:, :, :, i].reshape(b, n, -1), hw)
                                     for i, attn in enumerate(self.attns)], dim=-1))
        x = x + self.drop_path(self.proj_drop(y))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class MergeBlock(nn.Module):
    """3x3 stride-2 convolution + LayerNorm between stages (ceil(H / 2) outputs)."""

    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(dim, dim_out, 3, 2, 1)
        self.norm = nn.LayerNorm(dim_out)

    def forward(self, x: Tensor, hw: Tuple[int, int]) -> Tuple[Tensor, Tuple[int, int]]:
        x = self.conv(tokens_to_grid(x, hw))
        out_hw = (x.shape[2], x.shape[3])
        return self.norm(grid_to_tokens(x)), out_hw


class ConvStem(nn.Sequential):
    """7x7 stride-4 convolution + LayerNorm (reference keys ``.0`` and ``.2``)."""

    def __init__(self, in_channels: int, dim: int) -> None:
        super().__init__(nn.Conv2d(in_channels, dim, 7, 4, 2), nn.Identity(), nn.LayerNorm(dim))

    def forward(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        # Padding to a multiple of 4 makes the output ceil(H / 4) x ceil(W / 4).
        x = self[0](pad_image(x, 4))
        hw = (x.shape[2], x.shape[3])
        return self[2](x.flatten(2).transpose(1, 2)), hw


@register_model
class InLineCSWin(InLineBackbone):
    """InLine-CSwin backbone (strides 4 / 8 / 16 / 32, LayerNorm on each output).

    InLine blocks are one branch attending within ``inline_window`` (default
    ``'auto'``: the reference's ``la_split_size`` 56-28-14-7, i.e. the whole
    224x224 training image, so the receptive field does not change with the
    input size; ``'global'`` for linear cost over the whole image).  Softmax
    blocks keep CSWin's cross-shaped stripes of width ``split_size`` (two
    half-width branches; the last stage is global), with LePE.  Stripes and
    windows clip to the feature map; padding is masked out.

    Args:
        arch: ``tiny | small | base`` or a dict of the arguments below.
        in_channels: image channels.
        embed_dims: stage-1 width (doubles every stage).
        depths, num_heads: per-stage structure.
        attn_type: one letter per stage (``I``, ``S``, ``M`` + count).
        split_size: softmax stripe width per stage.
        inline_window: InLine windows (see :func:`per_stage_windows`).
        kernel_func, mlp_ratio, qkv_bias, drop_rate, drop_path_rate: block
            settings (drop path 0.2 / 0.4 / 0.5 for T / S / B on ImageNet).
        attn_drop_rate: dropout on the attention weights of the softmax blocks.
        pretrain_img_size: training size; decides one- vs two-branch softmax
            blocks (one where a stripe covered the whole map) and ``'auto'``.
        out_indices, frozen_stages, with_cp, init_cfg: see :class:`InLineBackbone`.
    """

    family = 'cswin'
    arch_settings: Dict[str, dict] = {
        'tiny': dict(embed_dims=64, depths=(2, 4, 18, 1), num_heads=(2, 4, 8, 16),
                     attn_type='IISS'),
        'small': dict(embed_dims=64, depths=(3, 6, 29, 2), num_heads=(2, 4, 8, 16),
                      attn_type='IISS'),
        'base': dict(embed_dims=96, depths=(3, 6, 29, 2), num_heads=(4, 8, 16, 32),
                     attn_type='IISS'),
    }

    def __init__(self, arch: Union[str, dict] = 'tiny', in_channels: int = 3,
                 embed_dims: Optional[int] = None, depths: Optional[Sequence[int]] = None,
                 num_heads: Optional[Sequence[int]] = None, attn_type: Optional[str] = None,
                 split_size: Sequence[int] = (1, 2, 7, 7), inline_window: WindowSpec = 'auto',
                 kernel_func: str = 'identity', mlp_ratio: float = 4., qkv_bias: bool = True,
                 drop_rate: float = 0., attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.2, pretrain_img_size: int = 224,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, with_cp: bool = False,
                 compile: Union[bool, dict] = False,
                 init_cfg: Optional[dict] = None) -> None:
        cfg = resolve_arch('InLineCSWin', arch, self.arch_settings, dict(
            embed_dims=embed_dims, depths=depths, num_heads=num_heads, attn_type=attn_type))
        cfg['split_size'] = split_size
        num_stages = check_stage_lists('InLineCSWin', cfg, ('num_heads', 'split_size'))
        super().__init__(out_indices, frozen_stages, with_cp, init_cfg, num_stages,
                         compile)
        self.depths = list(cfg['depths'])
        dims = [cfg['embed_dims'] * 2 ** i for i in range(self.num_stages)]
        self.embed_dims = dims
        block_types = parse_attn_type(cfg['attn_type'], self.depths, 'ISM', 'InLineCSWin')
        reso = [pretrain_img_size // (4 * 2 ** i) for i in range(self.num_stages)]
        inline_windows = per_stage_windows(inline_window, [(r, r) for r in reso],
                                           'inline_window')
        self.stage1_conv_embed = ConvStem(in_channels, dims[0])
        dpr = torch.linspace(0, drop_path_rate, sum(self.depths)).tolist()
        cur = 0
        for i, depth in enumerate(self.depths):
            if i > 0:
                self.add_module(f'merge{i}', MergeBlock(dims[i - 1], dims[i]))
            two_branches = i < self.num_stages - 1 and split_size[i] < reso[i]
            self.add_module(f'stage{i + 1}', nn.ModuleList([
                CSWinBlock(dims[i], cfg['num_heads'][i], mlp_ratio, qkv_bias,
                           block_types[i][j], split_size[i], two_branches, inline_windows[i],
                           kernel_func, drop_rate, dpr[cur + j], attn_drop_rate)
                for j in range(depth)]))
            cur += depth
        for i in self.out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(dims[i]))
        self._finish_init()

    convert_checkpoint = staticmethod(convert_cswin)
    has_output_norms = True

    def _stage_parts(self, i: int) -> List[Union[nn.Module, nn.Parameter]]:
        if i == 0:
            return [self.stage1_conv_embed]
        parts: List[Union[nn.Module, nn.Parameter]] = [getattr(self, f'stage{i}')]
        if i > 1:
            parts.append(getattr(self, f'merge{i - 1}'))
        if hasattr(self, f'norm{i - 1}'):
            parts.append(getattr(self, f'norm{i - 1}'))
        return parts

    def forward_stages(self, x: Tensor) -> Tuple[Tensor, ...]:
        x, hw = self.stage1_conv_embed(x)
        outs = []
        for i in range(self.num_stages):
            if i > 0:
                x, hw = getattr(self, f'merge{i}')(x, hw)
            for block in getattr(self, f'stage{i + 1}'):
                x = self.run_block(block, x, hw)
            if i in self.out_indices:
                outs.append(self.to_nchw(getattr(self, f'norm{i}')(x), hw))
        return tuple(outs)
