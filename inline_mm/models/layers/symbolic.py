"""Size arithmetic that stays symbolic while a graph is traced (ONNX export).

In eager mode the windowing code works on Python ints: it branches on sizes
(pad or not, clip a window or not, shift or not) and caches masks, relative
position indices and resized position tables per size.  While the TorchScript
tracer records a graph, ``x.shape`` yields 0-dim tensors whose arithmetic is
recorded, but a Python branch or a cache lookup on them freezes the traced
size into the graph.  The functions here are the branch-free, cache-free
versions used under tracing: they compute the same values from size tensors,
in the graph, so one exported graph holds for every input size.  Eager code
never calls them.
"""
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

#: A size that is a Python int (static) or a 0-dim int64 tensor (traced).
Size = Union[int, Tensor]


def is_tracing() -> bool:
    """True while ``torch.onnx.export`` records a graph.

    Other tracers (mmengine's FLOP counter traces with ``torch.jit``) keep the
    eager code, so they see the same operations as a real forward.
    """
    return torch.onnx.is_in_onnx_export()


def clip_window(window: Tuple[Optional[int], Optional[int]], hw: Tuple[Size, Size],
                shifts: Sequence[int]) -> Tuple[Tuple[Size, Size], Tuple[Size, Size]]:
    """Traced :func:`~inline_mm.models.layers.windows.clip_window`.

    The window is ``min(size, extent)``; the shift is kept (as a tensor) only
    where the clipped window is smaller than the map, and is a static 0 where
    it is 0 for every size (no shift configured, or a window spanning the axis).
    """
    win, out_shift = [], []
    for size, s, extent in zip(window, shifts, hw):
        extent = torch.as_tensor(extent)
        w = extent if size is None else extent.clamp(max=size)
        win.append(w)
        out_shift.append(0 if size is None or s == 0 else (w < extent).long() * s)
    return (win[0], win[1]), (out_shift[0], out_shift[1])


def has_shift(shift: Tuple[Size, Size]) -> bool:
    """Whether a (traced) shift may be non-zero; static zeros mean no roll at all."""
    return any(not (isinstance(s, int) and s == 0) for s in shift)


def roll(x: Tensor, shifts: Sequence[Size], dims: Sequence[int]) -> Tensor:
    """``torch.roll`` with shifts that may be size tensors (a gather along each axis).

    ONNX export of ``torch.roll`` needs constant shifts; gathering with the
    index ``(i - s) mod L`` is the same permutation for any traced ``s``.
    """
    for s, dim in zip(shifts, dims):
        if isinstance(s, int) and s == 0:
            continue
        length = x.shape[dim]
        index = torch.remainder(torch.arange(length, device=x.device) - s, length)
        x = x.index_select(dim, index)
    return x


def _axis_bands(size: Size, window: Size, shift: Size, device: torch.device) -> Tensor:
    """Swin's region bands along one padded axis: 0, then 1 on the last window, 2 on
    the last ``shift`` tokens.  With a zero shift only the last window gets 1, which
    separates nothing (regions are compared within a window)."""
    idx = torch.arange(size, device=device)
    return (idx >= size - window).long() + (idx >= size - shift).long()


def window_masks(hw: Tuple[Size, Size], window: Tuple[Size, Size], shift: Tuple[Size, Size],
                 device: torch.device, need_bias: bool = True
                 ) -> Tuple[Tensor, Optional[Tensor]]:
    """Traced :func:`~inline_mm.models.layers.windows.window_masks`, built in the graph.

    ``valid`` is always returned (all True when nothing is padded: InLine then
    averages over every token, as without a mask).  Without a shift the bias
    is ``(nW, 1, N)`` and masks padded keys only: for every real query this is
    the eager ``(nW, N, N)`` region bias, and padded queries are cropped away.
    """
    from .windows import MASK_VALUE, window_partition
    h, w = hw
    wh, ww = window
    hp, wp = h + (-h) % wh, w + (-w) % ww
    rows = torch.arange(hp, device=device)
    cols = torch.arange(wp, device=device)
    # real tokens of the padded map after the cyclic roll by -shift
    real = ((rows + shift[0]) % hp < h)[:, None] & ((cols + shift[1]) % wp < w)[None, :]
    labels = torch.zeros(hp, wp, dtype=torch.long, device=device)
    if has_shift(shift):
        labels = (_axis_bands(hp, wh, shift[0], device)[:, None] * 3
                  + _axis_bands(wp, ww, shift[1], device)[None, :])
    labels = torch.where(real, labels, torch.full_like(labels, -1))
    labels = window_partition(labels.view(1, hp, wp, 1), (wh, ww)).squeeze(-1)
    valid = labels >= 0
    if not need_bias:
        return valid, None
    if has_shift(shift):
        bias = (labels.unsqueeze(1) != labels.unsqueeze(2)).float() * MASK_VALUE
    else:
        bias = (~valid).float().unsqueeze(1) * MASK_VALUE
    return valid, bias


def relative_position_index(window: Tuple[Size, Size], table_window: Tuple[int, int],
                            device: torch.device) -> Tensor:
    """Traced :func:`~inline_mm.models.layers.softmax_attention.relative_position_index`."""
    rows = torch.arange(window[0], device=device)
    cols = torch.arange(window[1], device=device)
    coords = torch.stack(torch.meshgrid(rows, cols, indexing='ij')).flatten(1)
    rel = coords[:, :, None] - coords[:, None, :]
    return ((rel[0] + table_window[0] - 1) * (2 * table_window[1] - 1)
            + rel[1] + table_window[1] - 1)


def resize_pos_embed(pos_embed: Tensor, new_grid: Tuple[Size, Size],
                     old_grid: Tuple[int, int], num_prefix_tokens: int = 0) -> Tensor:
    """Traced position-table resize: bilinear, ``align_corners=False``, no antialias.

    The same interpolation as the eager path (timm's ``resample_abs_pos_embed``),
    written with ``F.interpolate`` on a size that stays symbolic; at the
    table's own grid it is the identity.
    """
    prefix = pos_embed[:, :num_prefix_tokens]
    grid = pos_embed[:, num_prefix_tokens:]
    dim = grid.shape[-1]
    grid = grid.reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)
    grid = F.interpolate(grid.float(), size=(new_grid[0], new_grid[1]), mode='bilinear',
                         align_corners=False).to(pos_embed.dtype)
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, dim)
    return torch.cat([prefix, grid], dim=1) if num_prefix_tokens else grid


def depthwise_conv3x3(grid: Tensor, weight: Tensor) -> Tensor:
    """``F.conv2d(grid, weight, padding=1, groups=C)`` as nine shifted products.

    The local branch's kernel is computed per sample; the ONNX exporter needs
    a convolution kernel whose shape it knows statically, which a computed
    kernel on a dynamic-size graph does not have.  ``grid``: ``(1, C, h, w)``;
    ``weight``: ``(C, 1, 3, 3)``.
    """
    h, w = grid.shape[2:]
    padded = F.pad(grid, (1, 1, 1, 1))
    out = None
    for dy in range(3):
        for dx in range(3):
            term = padded[:, :, dy:dy + h, dx:dx + w] * weight[:, 0, dy, dx].view(1, -1, 1, 1)
            out = term if out is None else out + term
    return out


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
