"""Window partitioning shared by the eager and the in-graph (traced / compiled) code.

Kept apart from :mod:`.windows` so that :mod:`.symbolic` (which builds masks in
the graph) and :mod:`.windows` (which calls those builders) import it without
importing each other.
"""
from typing import Tuple

from torch import Tensor

#: Additive bias between tokens of different regions (the value used by Swin).
MASK_VALUE = -100.0


def round_up(size, multiple):
    """The smallest multiple of ``multiple`` >= ``size``: ints, size tensors or dynamo's
    symbolic sizes.  Written as a floor division (not ``size + (-size) % multiple``): the
    padded size is then visibly a multiple, which keeps dynamo's size expressions short."""
    return (size + multiple - 1) // multiple * multiple


def window_partition(x: Tensor, window: Tuple[int, int]) -> Tensor:
    """``(B, H, W, C)`` with H, W multiples of the window -> ``(B * nW, wh * ww, C)``."""
    b, h, w, c = x.shape
    wh, ww = window
    nh, nw = h // wh, w // ww
    x = x.view(b, nh, wh, nw, ww, c).permute(0, 1, 3, 2, 4, 5)
    # every size spelled out (not -1): dynamo then guards only on whether the map is a
    # single window, not on a divisibility
    return x.reshape(b * nh * nw, wh * ww, c)


def window_sums(x: Tensor, window: Tuple[int, int]) -> Tensor:
    """``(B, H, W, C)`` with H, W multiples of the window -> ``(B * nW, C)``: the sum of
    each window's tokens, in :func:`window_partition`'s order of windows (no partition
    copy: a reduction over the map's own strides)."""
    b, h, w, c = x.shape
    wh, ww = window
    nh, nw = h // wh, w // ww
    return x.view(b, nh, wh, nw, ww, c).sum(dim=(2, 4)).reshape(b * nh * nw, c)


def window_reverse(windows: Tensor, window: Tuple[int, int], hw: Tuple[int, int],
                   batch: int) -> Tensor:
    """Inverse of :func:`window_partition`: ``(B * nW, wh * ww, C)`` -> ``(B, H, W, C)``
    (``batch`` is B)."""
    wh, ww = window
    h, w = hw
    c = windows.shape[-1]
    x = windows.view(batch, h // wh, w // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(batch, h, w, c)
