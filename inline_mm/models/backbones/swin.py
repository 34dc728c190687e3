"""InLine-Swin: Swin Transformer with InLine blocks ('I') and window softmax ('S')."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from torch import Tensor

from ...errors import ConfigError
from ...registry import register_model
from ..converters import convert_swin
from ..layers.blocks import ATTENTION_KINDS, PatchEmbed, PatchMerging, TransformerBlock
from .arch import (WindowSpec, check_stage_lists, parse_attn_type, per_stage_windows,
                   resolve_arch)
from .base import InLineBackbone


class SwinStage(nn.Module):
    """Blocks of one stage and the patch merging that follows it (reference keys)."""

    def __init__(self, blocks: List[TransformerBlock], downsample: Optional[PatchMerging]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample


@register_model
class InLineSwin(InLineBackbone):
    """InLine-Swin backbone (strides 4 / 8 / 16 / 32, LayerNorm on each output).

    InLine blocks attend within ``inline_window`` (default ``'auto'``: the
    whole 224x224 image the checkpoints were trained on, i.e. 56 / 28 / 14 / 7
    tokens per stage, so the receptive field does not change with the input
    size; ``'global'`` for linear cost over the whole image).  InLine windows
    are not shifted.  Softmax blocks keep Swin's ``window_size`` windows
    (``max(7, 56 // 8) = 7`` in the reference) with a relative position bias,
    shifted by half a window every second block.  Windows clip to the feature
    map; padding to window multiples is masked out.  A non-square window
    ``(wh, ww)`` shifts by ``(wh // 2, ww // 2)``.

    Args:
        arch: ``tiny | small | base`` or a dict of the arguments below.
        in_channels: image channels.
        embed_dims: stage-1 width (doubles every stage).
        depths, num_heads: per-stage structure.
        attn_type: one letter per stage (``I``, ``S``, ``M`` + count, e.g. ``'IIMS2'``).
        window_size: softmax window (tokens, int or (h, w)).
        inline_window: InLine windows (see :func:`per_stage_windows`).
        kernel_func: InLine kernel phi.
        mlp_ratio, qkv_bias, drop_rate, drop_path_rate: as in Swin (drop path
            0.2 / 0.3 / 0.5 for T / S / B in the authors' ImageNet training).
        attn_drop_rate: dropout on the attention weights of the softmax blocks.
        pretrain_img_size: the size the InLine windows of ``'auto'`` cover.
        out_indices, frozen_stages, with_cp, init_cfg: see :class:`InLineBackbone`.
    """

    family = 'swin'
    arch_settings: Dict[str, dict] = {
        'tiny': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24),
                     attn_type='IIIS'),
        'small': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24),
                      attn_type='IISS'),
        'base': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32),
                     attn_type='IIMS2'),
    }

    def __init__(self, arch: Union[str, dict] = 'tiny', in_channels: int = 3,
                 embed_dims: Optional[int] = None, depths: Optional[Sequence[int]] = None,
                 num_heads: Optional[Sequence[int]] = None, attn_type: Optional[str] = None,
                 window_size: Union[int, Tuple[int, int]] = 7,
                 inline_window: WindowSpec = 'auto', kernel_func: str = 'identity',
                 mlp_ratio: float = 4., qkv_bias: bool = True, drop_rate: float = 0.,
                 attn_drop_rate: float = 0., drop_path_rate: float = 0.2,
                 pretrain_img_size: int = 224,
                 out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1,
                 with_cp: bool = False, compile: Union[bool, dict] = False,
                 init_cfg: Optional[dict] = None) -> None:
        cfg = resolve_arch('InLineSwin', arch, self.arch_settings, dict(
            embed_dims=embed_dims, depths=depths, num_heads=num_heads, attn_type=attn_type))
        num_stages = check_stage_lists('InLineSwin', cfg, ('num_heads',))
        super().__init__(out_indices, frozen_stages, with_cp, init_cfg, num_stages,
                         compile)
        self.depths = list(cfg['depths'])
        dims = [cfg['embed_dims'] * 2 ** i for i in range(self.num_stages)]
        self.embed_dims = dims
        # every kind of the block table, and 'M' (InLine, then softmax, in one stage)
        block_types = parse_attn_type(cfg['attn_type'], self.depths,
                                      ''.join(ATTENTION_KINDS) + 'M', 'InLineSwin')
        for letter in sorted({k for stage in block_types for k in stage}):
            if ATTENTION_KINDS[letter].wide_windows and ATTENTION_KINDS[letter].shifted_windows:
                raise ConfigError(f"attention kind {letter!r} asks for wide windows and a shift: "
                                  f"InLine-Swin shifts by half its softmax window only")
        softmax_window = (window_size, window_size) if isinstance(window_size, int) \
            else tuple(window_size)
        # half a window along each axis (Swin's shift, per axis for a non-square window)
        shift = (softmax_window[0] // 2, softmax_window[1] // 2)
        auto = [(pretrain_img_size // (4 * 2 ** i),) * 2 for i in range(self.num_stages)]
        inline_windows = per_stage_windows(inline_window, auto, 'inline_window')
        self.patch_embed = PatchEmbed(in_channels, dims[0], 4, norm_eps=1e-5)
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = torch.linspace(0, drop_path_rate, sum(self.depths)).tolist()
        self.layers = nn.ModuleList()
        cur = 0
        for i, depth in enumerate(self.depths):
            blocks = []
            for j in range(depth):
                kind = block_types[i][j]
                blocks.append(TransformerBlock(
                    dims[i], cfg['num_heads'][i], mlp_ratio, attn_type=kind,
                    window=inline_windows[i] if ATTENTION_KINDS[kind].wide_windows
                    else softmax_window,
                    shift=(0, 0) if j % 2 == 0 else shift,
                    table_window=softmax_window, qkv_bias=qkv_bias, kernel_func=kernel_func,
                    drop=drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[cur + j],
                    norm_eps=1e-5))
            cur += depth
            downsample = PatchMerging(dims[i]) if i < self.num_stages - 1 else None
            self.layers.append(SwinStage(blocks, downsample))
        for i in self.out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(dims[i]))
        self._finish_init()

    convert_checkpoint = staticmethod(convert_swin)
    has_output_norms = True

    def _stage_parts(self, i: int) -> List[Union[nn.Module, nn.Parameter]]:
        if i == 0:
            return [self.patch_embed]
        parts: List[Union[nn.Module, nn.Parameter]] = [self.layers[i - 1]]
        if hasattr(self, f'norm{i - 1}'):
            parts.append(getattr(self, f'norm{i - 1}'))
        return parts

    def forward_stages(self, x: Tensor) -> Tuple[Tensor, ...]:
        x, hw = self.patch_embed(x)
        x = self.pos_drop(x)
        outs = []
        for i, layer in enumerate(self.layers):
            for block in layer.blocks:
                x = self.run_block(block, x, hw)
            if i in self.out_indices:
                outs.append(self.to_nchw(getattr(self, f'norm{i}')(x), hw))
            if layer.downsample is not None:
                x, hw = layer.downsample(x, hw)
        return tuple(outs)
