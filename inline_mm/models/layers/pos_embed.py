"""Absolute position embeddings at any grid size.

The authors resize each absolute position table to the actual token grid by
bilinear interpolation with ``align_corners=False`` (no antialiasing); timm's
``resample_abs_pos_embed`` does exactly that when asked for ``bilinear``.
Resized tables are cached per grid while the weights are not being trained
(inference, frozen tables), and recomputed (with gradients) otherwise.
"""
import math
from typing import Dict, Tuple

import torch
from timm.layers import resample_abs_pos_embed
from torch import Tensor, nn

from . import symbolic


def resize_pos_embed(pos_embed: Tensor, new_grid: Tuple[int, int], old_grid: Tuple[int, int],
                     num_prefix_tokens: int = 0) -> Tensor:
    """Bilinearly resample a ``(1, prefix + Ho * Wo, C)`` table to ``new_grid``."""
    if tuple(new_grid) == tuple(old_grid):
        return pos_embed
    return resample_abs_pos_embed(pos_embed, list(new_grid), list(old_grid),
                                  num_prefix_tokens=num_prefix_tokens,
                                  interpolation='bilinear', antialias=False)


def square_grid(num_tokens: int) -> Tuple[int, int]:
    """The square grid of a checkpoint's position table (all official ones are square)."""
    side = math.isqrt(num_tokens)
    if side * side != num_tokens:
        raise ValueError(f'a position table of {num_tokens} tokens is not a square grid')
    return side, side


class PosEmbedResizer:
    """Resize position tables to the input's grid, caching while they are frozen."""

    def __init__(self) -> None:
        self._cache: Dict[tuple, Tensor] = {}

    def __call__(self, pos_embed: nn.Parameter, new_grid: Tuple[int, int],
                 old_grid: Tuple[int, int], num_prefix_tokens: int = 0) -> Tensor:
        if symbolic.in_graph():  # the grid is symbolic (compile, ONNX): resize in the graph
            return symbolic.resize_pos_embed(pos_embed, new_grid, old_grid, num_prefix_tokens)
        if tuple(new_grid) == tuple(old_grid):
            return pos_embed
        if torch.is_grad_enabled() and pos_embed.requires_grad:
            return resize_pos_embed(pos_embed, new_grid, old_grid, num_prefix_tokens)
        # ``_version`` changes whenever the table is updated in place (optimizer
        # step, load_state_dict), which invalidates the cached copy.
        key = (id(pos_embed), tuple(new_grid), pos_embed._version, pos_embed.device,
               pos_embed.dtype)
        cached = self._cache.get(key)
        if cached is None:
            if len(self._cache) > 64:
                self._cache.clear()
            # outside inference mode, so the cached table can enter autograd later
            # (a frozen table in training after an inference pass)
            with torch.inference_mode(False), torch.no_grad():
                cached = resize_pos_embed(pos_embed, new_grid, old_grid, num_prefix_tokens)
            self._cache[key] = cached
        return cached
