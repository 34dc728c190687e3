"""Windowing, padding and mask helpers shared by every backbone family.

A *window* is a ``(height, width)`` pair of token counts; ``None`` in either
place means "the whole feature map along that axis".  ``(None, None)`` is global
attention, ``(None, s)`` a vertical CSWin stripe of width ``s``.  Windows are
clipped to the feature map, the map is zero-padded at the bottom / right to a
multiple of the window, and the masks that keep padded tokens out of the
attention are built for the actual padded size and kept in the byte-bounded
cache of :mod:`.cache` (per size, device and dtype).
"""
from functools import partial
from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from . import symbolic
from .cache import CACHE
from .partition import MASK_VALUE, round_up, window_partition, window_reverse, window_sums

from ...errors import ConfigError

__all__ = ['MASK_VALUE', 'Window', 'clip_window', 'pad_image', 'pad_to_multiple',
           'region_bias', 'run_in_windows', 'to_window', 'valid_mask', 'window_partition',
           'window_reverse', 'window_token_means']

Window = Tuple[Optional[int], Optional[int]]


def to_window(window: int | Tuple[Optional[int], Optional[int]] | None) -> Window:
    """Normalise ``int`` / ``(h, w)`` / ``None`` (global) to an ``(h, w)`` window."""
    if window is None:
        return (None, None)
    if isinstance(window, int):
        return (window, window)
    if len(window) != 2:
        raise ConfigError(f'a window is an int or a (height, width) pair, got {window!r}')
    return (window[0], window[1])


def clip_window(window: Window, hw: Tuple[int, int], shift: int | Tuple[int, int] = 0
                ) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """Clip a window to the feature map and drop the shift along an axis it covers.

    Under ``torch.compile`` the sizes are symbolic and the comparison below puts a
    guard ``extent >= window`` on each axis: a new size recompiles only when it
    flips (maps smaller than a window), and the size expressions stay simple.
    Under ONNX tracing the sizes are tensors and no branch is possible: the
    window and the shift are computed (:func:`symbolic.clip_window`).

    Returns:
        ((wh, ww), (sh, sw)): the effective window and shift in tokens.
    """
    shifts = (shift, shift) if isinstance(shift, int) else tuple(shift)
    if symbolic.is_onnx_export():
        return symbolic.clip_window(window, hw, shifts)
    win, out_shift = [], []
    for size, s, extent in zip(window, shifts, hw):
        w = extent if _spans_axis(size, extent) else size
        win.append(w)
        out_shift.append(s if w < extent else 0)
    return (win[0], win[1]), (out_shift[0], out_shift[1])


def _spans_axis(size: Optional[int], extent: int) -> bool:
    """Whether a window axis (``None``: the whole axis) covers an extent; under
    ``torch.compile`` an int size puts a guard ``extent <= size`` on the input."""
    return size is None or size >= extent


def spans_map(window: Window, hw: Tuple[int, int]) -> bool:
    """Whether ``window`` covers the whole ``hw`` map: the window :func:`clip_window`
    clips to the map itself (the same test, so the same guards, on each axis)."""
    return all(_spans_axis(size, extent) for size, extent in zip(window, hw))


def pad_to_multiple(x: Tensor, multiple: Tuple[int, int]) -> Tensor:
    """Zero-pad a ``(B, H, W, C)`` map at the bottom / right to multiples of ``multiple``."""
    return _zero_pad_to_multiple(x, multiple)


def _zero_pad_to_multiple(x: Tensor, multiple: Tuple[int, int]) -> Tensor:
    """:func:`pad_to_multiple`'s padding, for code whose sums count on its zeros
    (:func:`window_token_means`; the tests replace ``pad_to_multiple``'s zeros with noise
    to show that masked padding never reaches real tokens)."""
    h, w = x.shape[1:3]
    pad_h, pad_w = round_up(h, multiple[0]) - h, round_up(w, multiple[1]) - w
    if symbolic.in_graph() or pad_h or pad_w:  # in a graph: pad by a symbolic size, maybe 0
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    return x


def pad_image(x: Tensor, multiple: int) -> Tensor:
    """Zero-pad an NCHW image at the bottom / right to a multiple of ``multiple``."""
    h, w = x.shape[-2:]
    pad_h, pad_w = round_up(h, multiple) - h, round_up(w, multiple) - w
    if symbolic.in_graph() or pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return x


def valid_mask(hw: Tuple[int, int], window: Tuple[int, int], shift: Tuple[int, int],
               device: torch.device) -> Optional[Tensor]:
    """``(nW, N)`` bool, True on the real tokens of the windows over the padded, rolled map.

    None when nothing is padded (outside a recorded graph: in a graph, ONNX or
    ``torch.compile``, the sizes are symbolic, so the mask is always built).
    """
    if symbolic.in_graph():
        return symbolic.window_labels(hw, window, shift, device) >= 0
    if hw[0] % window[0] == 0 and hw[1] % window[1] == 0:
        return None
    return CACHE.get(('valid', hw, window, shift, str(device)), lambda: symbolic.window_labels(
        hw, window, shift, device) >= 0)


def region_bias(hw: Tuple[int, int], window: Tuple[int, int], shift: Tuple[int, int],
                device: torch.device, dtype: torch.dtype) -> Tensor:
    """The additive bias that keeps regions (padding, shifted borders) apart.

    ``(nW, N, N)`` for shifted windows, ``(nW, 1, N)`` otherwise (padded keys
    only), in ``dtype``: see :func:`symbolic.region_bias`.  Cached per size,
    device and dtype; built in the graph under tracing / ``torch.compile``.
    """
    shifted = symbolic.has_shift(shift)

    def build() -> Tensor:
        return symbolic.region_bias(symbolic.window_labels(hw, window, shift, device),
                                    shifted, dtype)

    return CACHE.get(('bias', hw, window, shift, str(device), dtype), build)


#: ``region_bias`` with everything but the dtype bound: the attention calls it with
#: the dtype of its scores.
RegionBias = Callable[[torch.dtype], Tensor]

WindowFn = Callable[[Tensor, Tuple[int, int], Optional[Tensor], Optional[RegionBias]], Tensor]


def run_in_windows(x: Tensor, window: Window, fn: WindowFn,
                   shift: Union[int, Tuple[int, int]] = 0, need_bias: bool = True) -> Tensor:
    """Apply ``fn`` to every (shifted) window of a ``(B, H, W, C)`` map.

    The map is padded to a multiple of the clipped window, optionally rolled by
    the shift, partitioned, processed, and put back and cropped to ``(H, W)``.  A
    window that spans the map (:func:`spans_map`) is the map itself: ``fn`` gets it
    with ``valid`` and ``bias`` None.

    Args:
        x: ``(B, H, W, C)`` tokens.
        window: see :func:`to_window`.
        fn: called as ``fn(windows, (wh, ww), valid, bias)`` with windows
            ``(B * nW, wh * ww, C)``, ``valid`` ``(B * nW, N)`` or None and
            ``bias`` None (nothing to separate) or a function of a dtype that
            returns the region bias of :func:`region_bias` in that dtype
            (``(nW, N, N)`` or ``(nW, 1, N)``); returns ``(B * nW, wh * ww, C')``.
        shift: cyclic shift (Swin's shifted windows), an int or one per axis
            ``(sh, sw)``; dropped along an axis a window covers.
        need_bias: pass the region bias (softmax attention); InLine attention
            passes False and gets ``bias=None``.
    """
    b, h, w, c = x.shape
    if not symbolic.is_onnx_export() and spans_map(window, (h, w)):  # ONNX: traced sizes
        # one window over the whole map (global attention, or a map no larger than the
        # window): nothing to pad, shift or mask.  The general path below would give
        # the same numbers, but a compiled graph with symbolic sizes cannot see that the
        # padding is empty and computes its mask on every token.
        return fn(x.reshape(b, h * w, c), (h, w), None, None).view(b, h, w, -1)
    win, sft = clip_window(window, (h, w), shift)
    valid = valid_mask((h, w), win, sft, x.device)
    bias = None
    if need_bias and (valid is not None or symbolic.has_shift(sft)):
        bias = partial(region_bias, (h, w), win, sft, x.device)
    x = pad_to_multiple(x, win)
    hp, wp = x.shape[1:3]
    if symbolic.in_graph():
        return _run_traced(x, (h, w), win, sft, valid, bias, fn)
    if sft != (0, 0):
        x = torch.roll(x, shifts=(-sft[0], -sft[1]), dims=(1, 2))
    windows = window_partition(x, win)
    if valid is not None:
        valid = valid.repeat(b, 1)
    out = fn(windows, win, valid, bias)
    out = window_reverse(out, win, (hp, wp), b)
    if sft != (0, 0):
        out = torch.roll(out, shifts=sft, dims=(1, 2))
    if hp != h or wp != w:
        out = out[:, :h, :w]
    return out


def window_token_means(x: Tensor, window: Tuple[int, int], valid: Optional[Tensor]) -> Tensor:
    """The fp32 mean of each window's real tokens of a ``(B, H, W, C)`` map: ``(B * nW, C)``.

    ``window`` is the clipped window and ``valid`` the ``(B * nW, N)`` mask that
    :func:`run_in_windows` hands its ``fn`` (None: nothing padded, the map a whole number
    of windows), in the same order of windows.  Summed from the zero-padded map itself:
    what a mean over partitioned windows gives, without partitioning ``x``.
    """
    if valid is None:  # nothing padded: no pad (in a graph, not even a symbolic zero)
        return window_sums(x.float(), window) / (window[0] * window[1])
    sums = window_sums(_zero_pad_to_multiple(x.float(), window), window)
    return sums / valid.sum(dim=-1, keepdim=True).to(torch.float32).clamp_min(1.0)


def _run_traced(x: Tensor, hw: tuple, win: tuple, sft: tuple, valid: Optional[Tensor],
                bias: Optional[RegionBias], fn: WindowFn) -> Tensor:
    """:func:`run_in_windows` after padding, without size branches (sizes are symbolic)."""
    b, hp, wp = x.shape[:3]
    shifted = symbolic.has_shift(sft)
    if shifted:
        x = symbolic.roll(x, (-sft[0], -sft[1]), (1, 2))
    out = fn(window_partition(x, win), win, valid.repeat(b, 1), bias)
    out = window_reverse(out, win, (hp, wp), b)
    if shifted:
        out = symbolic.roll(out, sft, (1, 2))
    # a contiguous copy of the crop: the caller's reshape then needs no guard on whether
    # anything was padded (a view or a copy), which would recompile for padded sizes
    return out[:, :hw[0], :hw[1]].clone(memory_format=torch.contiguous_format)
