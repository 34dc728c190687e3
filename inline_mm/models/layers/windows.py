"""Windowing, padding and mask helpers shared by every backbone family.

A *window* is a ``(height, width)`` pair of token counts; ``None`` in either
place means "the whole feature map along that axis".  ``(None, None)`` is global
attention, ``(None, s)`` a vertical CSWin stripe of width ``s``.  Windows are
clipped to the feature map, the map is zero-padded at the bottom / right to a
multiple of the window, and the masks that keep padded tokens out of the
attention are built for the actual padded size and cached per size.
"""
from functools import lru_cache
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import symbolic

from ...errors import ConfigError

Window = Tuple[Optional[int], Optional[int]]

# Additive bias between tokens of different regions (the value used by Swin).
MASK_VALUE = -100.0


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

    Returns:
        ((wh, ww), (sh, sw)): the effective window and shift in tokens.
    """
    shifts = (shift, shift) if isinstance(shift, int) else tuple(shift)
    if symbolic.is_tracing():
        return symbolic.clip_window(window, hw, shifts)
    win, out_shift = [], []
    for size, s, extent in zip(window, shifts, hw):
        w = extent if size is None or size >= extent else size
        win.append(w)
        out_shift.append(s if w < extent else 0)
    return (win[0], win[1]), (out_shift[0], out_shift[1])


def pad_to_multiple(x: Tensor, multiple: Tuple[int, int]) -> Tensor:
    """Zero-pad a ``(B, H, W, C)`` map at the bottom / right to multiples of ``multiple``."""
    h, w = x.shape[1:3]
    pad_h, pad_w = (-h) % multiple[0], (-w) % multiple[1]
    if symbolic.is_tracing() or pad_h or pad_w:  # traced: pad by a size tensor, maybe 0
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    return x


def pad_image(x: Tensor, multiple: int) -> Tensor:
    """Zero-pad an NCHW image at the bottom / right to a multiple of ``multiple``."""
    h, w = x.shape[-2:]
    pad_h, pad_w = (-h) % multiple, (-w) % multiple
    if symbolic.is_tracing() or pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return x


def window_partition(x: Tensor, window: Tuple[int, int]) -> Tensor:
    """``(B, H, W, C)`` with H, W multiples of the window -> ``(B * nW, wh * ww, C)``."""
    b, h, w, c = x.shape
    wh, ww = window
    x = x.view(b, h // wh, wh, w // ww, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, wh * ww, c)


def window_reverse(windows: Tensor, window: Tuple[int, int], hw: Tuple[int, int]) -> Tensor:
    """Inverse of :func:`window_partition`: ``(B * nW, wh * ww, C)`` -> ``(B, H, W, C)``."""
    wh, ww = window
    h, w = hw
    c = windows.shape[-1]
    x = windows.view(-1, h // wh, w // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h, w, c)


@lru_cache(maxsize=256)
def _region_labels(hw: Tuple[int, int], window: Tuple[int, int], shift: Tuple[int, int]
                   ) -> Tensor:
    """Region id of every token of the padded, rolled map, in windows: ``(nW, wh * ww)``.

    Labels are laid out as the attention sees them, after the cyclic roll.
    Real tokens get the id of their shifted-window region (Swin's split of the
    rolled map into the last window-sized band and the last shift-sized band);
    padded tokens get -1, so they never share a region with a real token.
    """
    h, w = hw
    wh, ww = window
    hp, wp = h + (-h) % wh, w + (-w) % ww
    labels = torch.zeros(hp, wp, dtype=torch.long)
    for axis, (size, s, extent) in enumerate(((hp, shift[0], wh), (wp, shift[1], ww))):
        if s == 0:
            continue
        band = torch.zeros(size, dtype=torch.long)
        band[size - extent:size - s] = 1
        band[size - s:] = 2
        labels = labels * 3 + (band.view(-1, 1) if axis == 0 else band.view(1, -1))
    padding = torch.ones(hp, wp, dtype=torch.bool)
    padding[:h, :w] = False
    padding = torch.roll(padding, shifts=(-shift[0], -shift[1]), dims=(0, 1))
    labels[padding] = -1
    return window_partition(labels.view(1, hp, wp, 1), window).squeeze(-1)


_MASK_CACHE: dict = {}


def window_masks(hw: Tuple[int, int], window: Tuple[int, int], shift: Tuple[int, int],
                 device: torch.device, need_bias: bool = True
                 ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Masks for windows over an ``hw`` map padded to the window multiple.

    Returns:
        (valid, bias): ``valid`` is ``(nW, N)`` bool, True on real tokens (None
        when nothing is padded); ``bias`` is the ``(nW, N, N)`` additive
        attention bias that separates regions (padding, shifted borders), None
        when there is nothing to separate or ``need_bias`` is False (InLine
        attention needs ``valid`` only: no ``N x N`` tensor is built for it).
        Cached per size and device.  Under tracing, built in the graph instead
        (:func:`symbolic.window_masks`).
    """
    if symbolic.is_tracing():
        return symbolic.window_masks(hw, window, shift, device, need_bias)
    key = (hw, window, shift, str(device), need_bias)
    cached = _MASK_CACHE.get(key)
    if cached is not None:
        return cached
    h, w = hw
    padded = (h % window[0]) != 0 or (w % window[1]) != 0
    if not padded and shift == (0, 0):
        result = (None, None)
    else:
        # Built outside inference mode: a mask cached during inference is reused
        # in training, where inference tensors cannot enter autograd.
        with torch.inference_mode(False):
            labels = _region_labels(hw, window, shift)
            valid = (labels >= 0).to(device) if padded else None
            bias = None
            if need_bias:
                bias = ((labels.unsqueeze(1) != labels.unsqueeze(2)).float()
                        * MASK_VALUE).to(device)
        result = (valid, bias)
    if len(_MASK_CACHE) > 512:
        _MASK_CACHE.clear()
    _MASK_CACHE[key] = result
    return result


WindowFn = Callable[[Tensor, Tuple[int, int], Optional[Tensor], Optional[Tensor]], Tensor]


def run_in_windows(x: Tensor, window: Window, fn: WindowFn, shift: int = 0,
                   need_bias: bool = True) -> Tensor:
    """Apply ``fn`` to every (shifted) window of a ``(B, H, W, C)`` map.

    The map is padded to a multiple of the clipped window, optionally rolled by
    the shift, partitioned, processed, and put back and cropped to ``(H, W)``.

    Args:
        x: ``(B, H, W, C)`` tokens.
        window: see :func:`to_window`.
        fn: called as ``fn(windows, (wh, ww), valid, bias)`` with windows
            ``(B * nW, wh * ww, C)``, ``valid`` ``(B * nW, N)`` or None and
            ``bias`` ``(nW, N, N)`` or None; returns ``(B * nW, wh * ww, C')``.
        shift: cyclic shift (Swin's shifted windows); dropped along an axis a
            window covers.
        need_bias: build the ``(nW, N, N)`` region bias (softmax attention);
            InLine attention passes False and gets ``bias=None``.
    """
    b, h, w, _ = x.shape
    win, sft = clip_window(window, (h, w), shift)
    valid, bias = window_masks((h, w), win, sft, x.device, need_bias)
    x = pad_to_multiple(x, win)
    hp, wp = x.shape[1:3]
    if symbolic.is_tracing():
        return _run_traced(x, (h, w), win, sft, valid, bias, fn)
    if sft != (0, 0):
        x = torch.roll(x, shifts=(-sft[0], -sft[1]), dims=(1, 2))
    windows = window_partition(x, win)
    if valid is not None:
        valid = valid.repeat(b, 1)
    out = fn(windows, win, valid, bias)
    out = window_reverse(out, win, (hp, wp))
    if sft != (0, 0):
        out = torch.roll(out, shifts=sft, dims=(1, 2))
    if hp != h or wp != w:
        out = out[:, :h, :w]
    return out


def _run_traced(x: Tensor, hw: tuple, win: tuple, sft: tuple, valid: Optional[Tensor],
                bias: Optional[Tensor], fn: WindowFn) -> Tensor:
    """:func:`run_in_windows` after padding, without size branches (sizes are tensors)."""
    b, hp, wp = x.shape[:3]
    shifted = symbolic.has_shift(sft)
    if shifted:
        x = symbolic.roll(x, (-sft[0], -sft[1]), (1, 2))
    out = fn(window_partition(x, win), win, valid.repeat(b, 1), bias)
    out = window_reverse(out, win, (hp, wp))
    if shifted:
        out = symbolic.roll(out, sft, (1, 2))
    return out[:, :hw[0], :hw[1]]
