"""Size arithmetic and mask builders that stay in the graph (ONNX export, torch.compile).

In eager mode the windowing code works on Python ints: it branches on sizes
(pad or not, clip a window or not, shift or not) and caches masks, relative
position indices and resized position tables per size.  While the TorchScript
tracer records a graph, ``x.shape`` yields 0-dim tensors whose arithmetic is
recorded, but a Python branch or a cache lookup on them freezes the traced
size into the graph; under ``torch.compile`` a cache lookup makes dynamo guard
on the cache itself, so every new entry recompiles.  The functions here are
branch-free and cache-free: they compute the values from sizes (ints, size
tensors or dynamo's symbolic ints) with ``arange`` arithmetic, in the graph.
The eager code builds its cache entries with the same functions, so each
mask and index has one implementation.
"""
from typing import Optional, Sequence, Tuple, Union

import torch
import torch._dynamo.config as _dynamo_config
import torch.nn.functional as F
from torch import Tensor

from .partition import MASK_VALUE, round_up, window_partition

#: A size that is a Python int (static) or a 0-dim int64 tensor (traced).
Size = Union[int, Tensor]


def is_onnx_export() -> bool:
    """True while ``torch.onnx.export`` records a graph.

    Other tracers (mmengine's FLOP counter traces with ``torch.jit``) keep the
    eager code, so they see the same operations as a real forward.
    """
    return torch.onnx.is_in_onnx_export()


def is_jit_tracing() -> bool:
    """True under any ``torch.jit`` trace: mmengine's FLOP counter and the ONNX export
    (sizes are traced tensors then; caches and token chunking stay off, and the
    softmax attention is written as matmuls the counter can count)."""
    return torch.jit.is_tracing()


_compiler = getattr(torch, 'compiler', None)
if hasattr(_compiler, 'is_compiling'):  # torch >= 2.3
    _is_compiling = _compiler.is_compiling
else:  # torch 2.1 / 2.2 have only dynamo's own flag
    from torch._dynamo import is_compiling as _is_compiling


def is_compiling() -> bool:
    """True while ``torch.compile`` (dynamo) traces the forward."""
    return _is_compiling()


#: torch.export's own flag (``torch.export`` and the dynamo-based ONNX exporter set the
#: compiling flag too); torch versions without it count every trace as a compilation
_is_exporting = getattr(_compiler, 'is_exporting', lambda: False)


def is_exporting() -> bool:
    """True while ``torch.export`` (or ``torch.onnx.export(dynamo=True)``) traces."""
    return _is_exporting()


def in_graph() -> bool:
    """True while a graph is recorded (``torch.compile`` or ONNX export): no caches then."""
    return is_compiling() or is_onnx_export()


def eager_on_cpu(x: Tensor) -> bool:
    """True for a CPU tensor outside every recorded graph (``torch.jit`` tracing, ONNX
    export, ``torch.compile``): where Python control flow over a size (a loop over
    samples) costs nothing, since no graph would freeze it."""
    return x.device.type == 'cpu' and not is_jit_tracing() and not in_graph()


#: whether dynamo can trace a read of its own settings: torch 2.1's cannot (a graph
#: break); 2.4.1 and 2.14.1 were checked, 2.2 / 2.3 were not (so they count as static-
#: unaware: their compiled graphs take the one-pass paths)
_READS_DYNAMO_SETTINGS = torch.__version__ >= '2.4'  # a TorchVersion compares as a version


def compiling_static_sizes() -> bool:
    """True while ``torch.compile`` traces with static sizes only (``dynamic=False``).

    Dynamo shows a symbolic size to the traced code as a plain int, so the mode is read
    from the settings ``torch.compile`` applies for the trace: ``dynamic=False`` turns
    automatic dynamic shapes off and assumes static sizes; ``dynamic=True`` and the
    default (``None``: static first, symbolic on a recompile) do not.  Always False
    before torch 2.4 (see ``_READS_DYNAMO_SETTINGS``).  Strict ``torch.export`` sets the
    same settings, and ``mark_dynamic`` can make a dimension symbolic under them: a
    caller that loops over sizes then pins them (not used by this project).
    """
    if not (_READS_DYNAMO_SETTINGS and is_compiling()):
        return False
    # the settings exist from torch 2.1 on (the api-floor inventory cannot list a config
    # module's settings, hence the mark)
    return (_dynamo_config.assume_static_by_default  # api-floor: guarded
            and not _dynamo_config.automatic_dynamic_shapes)


def loops_over_sizes(x: Tensor) -> bool:
    """True for a CPU tensor where a Python loop over its sizes costs nothing: eager
    (:func:`eager_on_cpu`), or a ``torch.compile`` graph of static sizes, which unrolls
    the loop at its size (a new size recompiles such a graph anyway).  False for
    symbolic sizes (the loop would make dynamo specialise the graph on each size),
    under ``torch.jit`` tracing and ONNX export, and on other devices."""
    return eager_on_cpu(x) or (x.device.type == 'cpu' and compiling_static_sizes())


def compiling_in_chunks(x: Tensor) -> bool:
    """True for a CPU tensor in a ``torch.compile`` graph of torch >= 2.4 whose sizes
    may be symbolic (not :func:`compiling_static_sizes`): a fixed number of chunks
    there adds no guard.  Off before torch 2.4 (the same version gate as the static
    case: not measured there, those graphs keep the one-pass MLP) and under
    ``torch.export`` / ONNX export (an exported graph keeps timm's plain MLP)."""
    return (_READS_DYNAMO_SETTINGS and x.device.type == 'cpu' and is_compiling()
            and not is_exporting() and not is_onnx_export() and not compiling_static_sizes())


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


def _unrolled_index(idx: Tensor, shift: Size, size: Size) -> Tensor:
    """Where the tokens at ``idx`` along a padded axis of ``size`` were before the cyclic
    roll by ``-shift``: ``(idx + shift) % size``.  A static zero shift skips the modulo:
    a compiled graph with symbolic sizes inlines this index into every kernel that reads
    the mask, on every element, and a modulo by a symbolic size there costs two integer
    divisions each time."""
    if isinstance(shift, int) and shift == 0:
        return idx
    return (idx + shift) % size


def window_labels(hw: Tuple[Size, Size], window: Tuple[Size, Size],
                  shift: Tuple[Size, Size], device: torch.device) -> Tensor:
    """Region id of every token of the padded, rolled map, in windows: ``(nW, wh * ww)``.

    Labels are laid out as the attention sees them, after the cyclic roll by
    ``-shift``.  Real tokens get the id of their shifted-window region (Swin's
    split of the rolled map into the last window-sized band and the last
    shift-sized band, per axis); padded tokens get -1, so they never share a
    region with a real token.
    """
    h, w = hw
    wh, ww = window
    hp, wp = round_up(h, wh), round_up(w, ww)
    rows = torch.arange(hp, device=device)
    cols = torch.arange(wp, device=device)
    # real tokens of the padded map after the cyclic roll by -shift
    real = _unrolled_index(rows, shift[0], hp)[:, None] < h
    real = real & (_unrolled_index(cols, shift[1], wp)[None, :] < w)
    labels = torch.zeros(hp, wp, dtype=torch.long, device=device)
    if has_shift(shift):
        labels = (_axis_bands(hp, wh, shift[0], device)[:, None] * 3
                  + _axis_bands(wp, ww, shift[1], device)[None, :])
    labels = torch.where(real, labels, torch.full_like(labels, -1))
    return window_partition(labels.view(1, hp, wp, 1), (wh, ww)).squeeze(-1)


def region_bias(labels: Tensor, shifted: bool, dtype: torch.dtype) -> Tensor:
    """The additive attention bias that keeps regions apart, from :func:`window_labels`.

    Shifted windows: ``(nW, N, N)``, ``MASK_VALUE`` between tokens of different
    regions.  Without a shift the only regions are real and padded tokens: the
    bias is ``(nW, 1, N)`` and masks padded keys, which for every real query is
    the full bias (padded queries are cropped away).  Built in ``dtype``, the
    dtype of the scores it is added to.
    """
    if shifted:
        return (labels.unsqueeze(1) != labels.unsqueeze(2)).to(dtype) * MASK_VALUE
    return (labels < 0).to(dtype).unsqueeze(1) * MASK_VALUE


def relative_position_index(window: Tuple[Size, Size], table_window: Tuple[int, int],
                            device: torch.device) -> Tensor:
    """Index of every (query, key) pair of ``window`` into a ``table_window`` bias table.

    Returns:
        ``(wh * ww, wh * ww)`` long tensor into ``(2 Th - 1) * (2 Tw - 1)`` rows.
    """
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
