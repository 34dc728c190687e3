"""Ops the ONNX export needs in place of PyTorch's where input sizes are traced.

Only :mod:`.onnx_export` uses them (during an export, in place of the toolkits'
layers); the backbones' own traced arithmetic is in
:mod:`inline_mm.models.layers.symbolic`.
"""
from typing import Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models.layers.symbolic import Size


def adaptive_avg_pool2d(x: Tensor, output_size: Union[int, Tuple[int, int]]) -> Tensor:
    """``F.adaptive_avg_pool2d`` for an input whose height and width are traced.

    The ONNX exporter supports adaptive average pooling only to 1x1 or on
    static input sizes (UperNet's pyramid pooling pools to 2x2, 3x3, 6x6).  Bin
    ``i`` of ``n`` over an axis of length ``L`` covers ``[floor(i L / n),
    ceil((i + 1) L / n))``, as in PyTorch; its sum is read from the integral
    image (cumulative sums with a leading zero row / column) at the bin's
    corners and divided by the bin's area.
    """
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    integral = F.pad(x.float().cumsum(2).cumsum(3), (1, 0, 1, 0))

    def bins(length: Size, n: int) -> Tuple[Tensor, Tensor]:
        i = torch.arange(n, device=x.device)
        start = torch.div(i * length, n, rounding_mode='floor')
        end = torch.div((i + 1) * length + n - 1, n, rounding_mode='floor')
        return start, end

    (h0, h1), (w0, w1) = bins(x.shape[2], oh), bins(x.shape[3], ow)
    rows = integral.index_select(2, h1) - integral.index_select(2, h0)
    sums = rows.index_select(3, w1) - rows.index_select(3, w0)
    area = ((h1 - h0)[:, None] * (w1 - w0)[None, :]).to(sums.dtype)
    return (sums / area).to(x.dtype)
