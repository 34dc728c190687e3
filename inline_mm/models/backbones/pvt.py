"""InLine-PVT: the Pyramid Vision Transformer with InLine attention in every block."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from timm.layers import trunc_normal_
from torch import Tensor

from ...registry import register_model
from ..converters import convert_pvt
from ..layers.blocks import PatchEmbed, TransformerBlock
from ..layers.token_grid import tokens_to_grid
from ..layers.pos_embed import PosEmbedResizer
from .arch import (WindowSpec, check_stage_lists, parse_attn_type, per_stage_windows,
                   resolve_arch)
from .base import InLineBackbone

_PVT_COMMON = dict(embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16),
                   mlp_ratios=(8, 8, 4, 4), attn_type='IIII')


@register_model
class InLinePVT(InLineBackbone):
    """InLine-PVT backbone (strides 4 / 8 / 16 / 32, raw stage features).

    The reference's InLine-PVT: InLine attention with spatial reduction 1 in
    every stage, patch sizes 4 / 2 / 2 / 2, one absolute position table per
    stage sized for ``pretrain_img_size`` and bilinearly resized to the actual
    grid, no final norm (outputs are the raw stage tokens, as the authors'
    classifier uses them).

    Args:
        arch: ``tiny | small | medium | large`` or a dict of the arguments below.
        in_channels: image channels.
        embed_dims, depths, num_heads, mlp_ratios: per-stage structure
            (override the preset).
        attn_type: one letter per stage; InLine-PVT supports ``'I'`` only.
        kernel_func: InLine kernel phi (``identity`` in the reference).
        inline_window: ``'global'`` (default, as the reference at any size: cost
            linear in the tokens), or a window / per-stage windows (see
            :func:`per_stage_windows`).
        pretrain_img_size: size the position tables were trained for.
        qkv_bias: bias on q / kv projections.
        drop_rate: dropout rate.
        attn_drop_rate: accepted for the common signature; InLine has no
            attention weights to drop.
        drop_path_rate: stochastic depth (0.1 for T / S, 0.3 for M / L in the
            authors' ImageNet training).
        out_indices, frozen_stages, with_cp, init_cfg: see :class:`InLineBackbone`.
    """

    family = 'pvt'
    arch_settings: Dict[str, dict] = {
        'tiny': dict(_PVT_COMMON, depths=(2, 2, 2, 2)),
        'small': dict(_PVT_COMMON, depths=(3, 4, 6, 3)),
        'medium': dict(_PVT_COMMON, depths=(3, 4, 18, 3)),
        'large': dict(_PVT_COMMON, depths=(3, 8, 27, 3)),
    }

    def __init__(self, arch: Union[str, dict] = 'tiny', in_channels: int = 3,
                 embed_dims: Optional[Sequence[int]] = None,
                 depths: Optional[Sequence[int]] = None,
                 num_heads: Optional[Sequence[int]] = None,
                 mlp_ratios: Optional[Sequence[float]] = None,
                 attn_type: Optional[str] = None, kernel_func: str = 'identity',
                 inline_window: WindowSpec = 'global', pretrain_img_size: int = 224,
                 qkv_bias: bool = True, drop_rate: float = 0., attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1,
                 with_cp: bool = False, compile: Union[bool, dict] = False,
                 init_cfg: Optional[dict] = None) -> None:
        cfg = resolve_arch('InLinePVT', arch, self.arch_settings, dict(
            embed_dims=embed_dims, depths=depths, num_heads=num_heads, mlp_ratios=mlp_ratios,
            attn_type=attn_type))
        num_stages = check_stage_lists('InLinePVT', cfg, ('embed_dims', 'num_heads',
                                                          'mlp_ratios'))
        super().__init__(out_indices, frozen_stages, with_cp, init_cfg, num_stages,
                         compile)
        self.embed_dims = list(cfg['embed_dims'])
        self.depths = list(cfg['depths'])
        block_types = parse_attn_type(cfg['attn_type'], self.depths, 'I', 'InLinePVT')
        strides = [4 * 2 ** i for i in range(self.num_stages)]
        windows = per_stage_windows(inline_window, [(None, None)] * self.num_stages,
                                    'inline_window')
        self.pos_grids = [(pretrain_img_size // s, pretrain_img_size // s) for s in strides]
        self._pos_resizer = PosEmbedResizer()
        dpr = torch.linspace(0, drop_path_rate, sum(self.depths)).tolist()
        cur = 0
        for i in range(self.num_stages):
            dim = self.embed_dims[i]
            # The reference's patch-embedding LayerNorm keeps the default eps.
            self.add_module(f'patch_embed{i + 1}', PatchEmbed(
                in_channels if i == 0 else self.embed_dims[i - 1], dim,
                4 if i == 0 else 2,
                norm_eps=1e-5))
            grid = self.pos_grids[i]
            pos = nn.Parameter(torch.zeros(1, grid[0] * grid[1], dim))
            self.register_parameter(f'pos_embed{i + 1}', pos)
            self.add_module(f'pos_drop{i + 1}', nn.Dropout(drop_rate))
            self.add_module(f'block{i + 1}', nn.ModuleList([
                TransformerBlock(dim, cfg['num_heads'][i], cfg['mlp_ratios'][i],
                                 attn_type=block_types[i][j], window=windows[i],
                                 qkv_bias=qkv_bias, kernel_func=kernel_func, separate_q=True,
                                 drop=drop_rate, attn_drop=attn_drop_rate,
                                 drop_path=dpr[cur + j], norm_eps=1e-6)
                for j in range(self.depths[i])]))
            cur += self.depths[i]
        self._finish_init()
        for i in range(self.num_stages):
            trunc_normal_(getattr(self, f'pos_embed{i + 1}'), std=.02)

    convert_checkpoint = staticmethod(convert_pvt)

    def _stage_parts(self, i: int) -> List[Union[nn.Module, nn.Parameter]]:
        if i == 0:  # the stem: the first patch embedding and its position table
            return [self.patch_embed1, self.pos_embed1]
        parts = [getattr(self, f'block{i}')]
        if i > 1:
            parts += [getattr(self, f'patch_embed{i}'), getattr(self, f'pos_embed{i}')]
        return parts

    def forward_stages(self, x: Tensor) -> Tuple[Tensor, ...]:
        outs = []
        for i in range(self.num_stages):
            x, hw = getattr(self, f'patch_embed{i + 1}')(x)
            pos = self._pos_resizer(getattr(self, f'pos_embed{i + 1}'), hw, self.pos_grids[i])
            x = getattr(self, f'pos_drop{i + 1}')(x + pos)
            for block in getattr(self, f'block{i + 1}'):
                x = self.run_block(block, x, hw)
            if i in self.out_indices:
                outs.append(self.to_nchw(x, hw))
            # the next patch embedding takes a channels-last view, not the NCHW copy
            x = tokens_to_grid(x, hw)
        return tuple(outs)
