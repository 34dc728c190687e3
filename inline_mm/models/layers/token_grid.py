"""The token grid: ``(B, h*w, C)`` tokens as maps for convolutions, and back.

The backbones keep their activations as channels-last tokens; convolutions (the next
stage's patch embedding, CSwin's merging convolution, InLine's per-sample local branch)
and the necks want ``(B, C, h, w)`` maps.  These helpers give convolutions a
channels-last view without a copy (eager and compiled), copy a stage's output to the
contiguous NCHW map that necks and mmcv's RoIAlign expect by the fastest path, and run
the local branch's per-sample 3x3 depthwise convolution as one grouped convolution.
"""
from typing import Optional, Tuple

import torch.nn.functional as F
from torch import Tensor

from . import symbolic


def _grid_view(x: Tensor, hw: Tuple[int, int]) -> Tensor:
    b, _, c = x.shape
    return x.reshape(b, hw[0], hw[1], c).permute(0, 3, 1, 2)


def channels_last_conv_input(grid: Tensor) -> Tensor:
    """A channels-last ``(1, C, h, w)`` map as a compiled convolution should see it.

    In a compiled graph inductor gives a dimension of size 1 the stride 0, and the
    CPU convolution's layout test (c10's channels-last stride check) fails on a zero
    batch stride: oneDNN copies the map to NCHW and convolves there (compiled
    InLine-CSwin-T at 1333x800: convolutions 206 ms against 72 with this function, on a
    2-core Intel Xeon with AVX512-BF16 and AMX, 2026-12-07).  So under
    ``torch.compile`` a one-sample map is made dense channels-last (no copy when it is
    already) and given its real batch stride; other maps, and every map outside a
    compiled graph, are returned as they are.  A batch that is a symbolic size is more
    than one sample (dynamo specialises a size of 1), so the test adds no guard, and
    such a map has a real batch stride already.
    """
    if not symbolic.is_compiling() or grid.shape[0] != 1:
        return grid
    _, c, h, w = grid.shape
    dense = grid.permute(0, 2, 3, 1).contiguous()
    return dense.as_strided(grid.shape, (h * w * c, 1, w * c, c))


def tokens_to_grid(x: Tensor, hw: Tuple[int, int]) -> Tensor:
    """``(B, h*w, C)`` -> ``(B, C, h, w)``, a channels-last view of the tokens for a
    convolution.

    Convolutions take channels-last input directly (oneDNN / cuDNN), so no
    NCHW copy is made on the way in, and :func:`grid_to_tokens` turns their
    output back without a copy either (under ``torch.compile``, see
    :func:`channels_last_conv_input`).
    """
    return channels_last_conv_input(_grid_view(x, hw))


#: Maps of at least this many values leave :func:`tokens_to_nchw` through ATen's blocked 2-D
#: transpose; below it the strided 4-D copy, threaded and cache-resident, is as fast or faster
#: (2-core Intel Xeon with AMX, 2026-12-06: 3.3x faster for InLine-PVT-T's first stage at
#: 1333x800, 1.3x slower for its third).
BLOCKED_TRANSPOSE_MIN_VALUES = 1 << 20


def tokens_to_nchw(x: Tensor, hw: Tuple[int, int]) -> Tensor:
    """``(B, h*w, C)`` tokens -> a contiguous ``(B, C, h, w)`` map (a copy).

    The copy of the channels-last view (:func:`tokens_to_grid`) reads with a stride of C
    values, which runs at a few GB/s once the map no longer fits the CPU's cache (14 ms
    for a 64 x 200 x 334 fp32 map on a 2-core Xeon).  Copied as one transposed
    ``(h*w, C)`` matrix per sample, it takes ATen's blocked transpose path instead (4 ms
    there).  Only eager CPU tensors take that loop over the samples; recorded graphs and
    other devices copy the view.
    """
    b, n, c = x.shape
    # the graph test first: in a recorded graph a test of the size would guard on it
    if not symbolic.eager_on_cpu(x) or n * c < BLOCKED_TRANSPOSE_MIN_VALUES:
        return _grid_view(x, hw).contiguous()
    out = x.new_empty(b, c, hw[0], hw[1])
    planes = out.view(b, c, n)
    for i in range(b):
        planes[i].copy_(x[i].t())  # dense (n, c) rows transposed: the blocked path
    return out


def grid_to_tokens(x: Tensor) -> Tensor:
    """``(B, C, h, w)`` -> ``(B, h*w, C)`` (a view for channels-last input)."""
    return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1, x.shape[1])


def depthwise_conv3x3_per_sample(x: Tensor, hw: Tuple[int, int], weight: Tensor,
                                 bias: Optional[Tensor] = None) -> Tensor:
    """3x3 depthwise convolution (zero padding 1) of ``(B, h*w, C)`` tokens on their grid,
    with ``weight`` ``(B * C, 1, 3, 3)``: a kernel per sample and channel.

    One grouped convolution over all samples: the grid is laid out as ``(h, w, B, C)``,
    so that the ``B * C`` groups are the channels of one channels-last map (a view of
    the tokens when B == 1); the batch of the convolution is 1 whatever B is (under
    ``torch.compile`` a convolution's CPU backend, and dynamo's guards, would follow
    B, the number of windows).  ``bias``: ``(B * C,)`` or None.  Returns ``(B, h*w, C)``.
    """
    b, _, c = x.shape
    h, w = hw
    grid = x.reshape(b, h, w, c).permute(1, 2, 0, 3).reshape(1, h, w, b * c).permute(0, 3, 1, 2)
    grid = channels_last_conv_input(grid)
    weight = weight.to(grid.dtype)
    bias = None if bias is None else bias.to(grid.dtype)
    if symbolic.is_onnx_export():  # ONNX Conv needs a kernel of static shape
        out = symbolic.depthwise_conv3x3(grid, weight)
        out = out if bias is None else out + bias.view(1, -1, 1, 1)
    else:  # the bias inside the convolution, one rounding as in nn.Conv2d (bf16)
        out = F.conv2d(grid, weight, bias, padding=1, groups=b * c)
    return out.permute(0, 2, 3, 1).reshape(h, w, b, c).permute(2, 0, 1, 3).reshape(b, h * w, c)
