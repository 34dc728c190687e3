"""InLine-DeiT: a plain ViT with InLine attention, as a multi-output backbone."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from timm.layers import trunc_normal_
from torch import Tensor

from ...registry import register_model
from ..converters import convert_deit
from ..layers.blocks import PatchEmbed, TransformerBlock
from ..layers.pos_embed import PosEmbedResizer
from .arch import resolve_arch
from .base import InLineBackbone


@register_model
class InLineDeiT(InLineBackbone):
    """InLine-DeiT backbone: stride-16 feature maps taken after chosen blocks.

    A plain ViT has one stride; as in MMSegmentation's ViT, the backbone
    returns the patch tokens after the blocks in ``out_indices`` (each a
    stride-16 NCHW map, the last one through the final ``norm`` when
    ``final_norm``), and the configs add MMSegmentation's ``MultiLevelNeck``
    (scales 4 / 2 / 1 / 0.5) to build the pyramid for UperNet / FPN.  InLine
    attention is global (linear in the tokens) and includes the cls token, as
    in the reference; the position table is resized to the actual grid.

    Args:
        arch: ``tiny | small | base`` or a dict of the arguments below.
        in_channels: image channels.
        embed_dims, depth, num_heads, mlp_ratio: ViT structure.
        patch_size: patch size (16).
        pretrain_img_size: size the position table was trained for (224 / 288
            / 448 for T / S / B).
        kernel_func, qkv_bias, drop_rate, drop_path_rate: block settings.
        attn_drop_rate: accepted for the common signature; InLine has no
            attention weights to drop.
        final_norm: apply ``norm`` to the output of the last block.
        out_indices: blocks whose outputs are returned.
        frozen_stages: -1 none, 0 the patch embedding / cls / position table,
            k also the first k blocks.
        with_cp, init_cfg: see :class:`InLineBackbone`.
    """

    family = 'deit'
    arch_settings: Dict[str, dict] = {
        'tiny': dict(embed_dims=192, depth=12, num_heads=6, pretrain_img_size=224),
        'small': dict(embed_dims=320, depth=12, num_heads=10, pretrain_img_size=288),
        'base': dict(embed_dims=384, depth=12, num_heads=12, pretrain_img_size=448),
    }
    num_prefix_tokens = 1

    def __init__(self, arch: Union[str, dict] = 'tiny', in_channels: int = 3,
                 embed_dims: Optional[int] = None, depth: Optional[int] = None,
                 num_heads: Optional[int] = None, mlp_ratio: float = 4., patch_size: int = 16,
                 pretrain_img_size: Optional[int] = None, kernel_func: str = 'identity',
                 qkv_bias: bool = True, drop_rate: float = 0., attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.1,
                 final_norm: bool = True, out_indices: Sequence[int] = (2, 5, 8, 11),
                 frozen_stages: int = -1, with_cp: bool = False,
                 compile: Union[bool, dict] = False,
                 init_cfg: Optional[dict] = None) -> None:
        cfg = resolve_arch('InLineDeiT', arch, self.arch_settings, dict(
            embed_dims=embed_dims, depth=depth, num_heads=num_heads,
            pretrain_img_size=pretrain_img_size))
        super().__init__(out_indices, frozen_stages, with_cp, init_cfg, cfg['depth'],
                         compile)
        dim = cfg['embed_dims']
        self.embed_dims = dim
        self.final_norm = final_norm
        side = cfg['pretrain_img_size'] // patch_size
        self.pos_grid = (side, side)
        self._pos_resizer = PosEmbedResizer()
        self.patch_embed = PatchEmbed(in_channels, dim, patch_size, norm_eps=None)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + side * side, dim))
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = torch.linspace(0, drop_path_rate, cfg['depth']).tolist()
        self.blocks = nn.ModuleList([
            TransformerBlock(dim, cfg['num_heads'], mlp_ratio, attn_type='I', qkv_bias=qkv_bias,
                             kernel_func=kernel_func, num_prefix_tokens=1, drop=drop_rate,
                             attn_drop=attn_drop_rate, drop_path=dpr[i], norm_eps=1e-6)
            for i in range(cfg['depth'])])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self._finish_init()
        trunc_normal_(self.pos_embed, std=.02)
        trunc_normal_(self.cls_token, std=.02)

    convert_checkpoint = staticmethod(convert_deit)

    def _stage_stride(self, i: int) -> int:
        return self.patch_embed.patch_size  # every block works on the patch grid

    def _stage_parts(self, i: int) -> List[Union[nn.Module, nn.Parameter]]:
        if i == 0:
            return [self.patch_embed, self.cls_token, self.pos_embed]
        parts: List[Union[nn.Module, nn.Parameter]] = [self.blocks[i - 1]]
        if i == self.num_stages:
            parts.append(self.norm)
        return parts

    def forward_stages(self, x: Tensor) -> Tuple[Tensor, ...]:
        x, hw = self.patch_embed(x)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        pos = self._pos_resizer(self.pos_embed, hw, self.pos_grid, num_prefix_tokens=1)
        x = self.pos_drop(torch.cat([cls, x], dim=1) + pos)
        outs = []
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = self.run_block(block, x, hw)
            if i in self.out_indices:
                out = self.norm(x) if (i == last and self.final_norm) else x
                outs.append(self.to_nchw(out[:, 1:], hw))
        return tuple(outs)
