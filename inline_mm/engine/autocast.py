"""Autocast of chosen submodules only, with fp32 at their boundaries.

mmcv's CPU kernels of RoIAlign and NMS take fp32 only, so a detector cannot
run its whole forward pass under ``torch.autocast('cpu', dtype=torch.bfloat16)``.
:func:`autocast_parts` confines autocast to named submodules (by default the
backbone and the neck, where nearly all of a detector's FLOPs are) and casts
their floating-point outputs back to fp32, so the heads and mmcv's ops see
fp32 tensors.  It works with forward hooks on the submodules: nothing of the
model's own code changes, and :meth:`AutocastHandle.remove` restores it.
"""
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model import is_model_wrapper
from mmengine.structures import BaseDataElement
from torch.utils.hooks import RemovableHandle

#: attribute under which a hooked submodule keeps its handle (makes re-installing idempotent)
_ATTR = '_inline_mm_autocast'

DtypeLike = Union[str, torch.dtype]


def to_dtype(dtype: DtypeLike) -> torch.dtype:
    """``'bfloat16' | 'bf16' | 'float16' | 'fp16'`` or a ``torch.dtype`` -> ``torch.dtype``."""
    if isinstance(dtype, torch.dtype):
        result = dtype
    else:
        result = {'bfloat16': torch.bfloat16, 'bf16': torch.bfloat16,
                  'float16': torch.float16, 'fp16': torch.float16,
                  'half': torch.float16}.get(str(dtype))
    if result not in (torch.bfloat16, torch.float16):
        raise ValueError(f"autocast dtype is 'bfloat16' or 'float16', got {dtype!r}")
    return result


def cast_to_fp32(obj: Any) -> Any:
    """Cast the fp16 / bf16 tensors in ``obj`` to fp32.

    Recurses into tuples (named tuples included), lists, dicts and mmengine
    data elements (the data samples a whole model returns); integer tensors
    and fp32 / fp64 tensors are returned unchanged.
    """
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.dtype in (torch.bfloat16, torch.float16) else obj
    if isinstance(obj, tuple):
        items = [cast_to_fp32(o) for o in obj]
        return type(obj)(*items) if hasattr(obj, '_fields') else type(obj)(items)
    if isinstance(obj, list):
        return [cast_to_fp32(o) for o in obj]
    if isinstance(obj, dict):
        return type(obj)((k, cast_to_fp32(v)) for k, v in obj.items())
    if isinstance(obj, BaseDataElement):
        for key, value in list(obj.items()):
            setattr(obj, key, cast_to_fp32(value))
        return obj
    return obj


def _device_type(module: nn.Module, args: Tuple) -> str:
    """The device the forward runs on: its first tensor input's, else its parameters'."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device.type
        if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], torch.Tensor):
            return arg[0].device.type
    param = next(module.parameters(), None)
    return param.device.type if param is not None else 'cpu'


class AutocastHandle:
    """Hooks of :func:`autocast_parts` on a set of submodules.

    Attributes:
        dtype: the autocast dtype.
        parts: names of the hooked submodules (``''`` is the model itself).
        enabled: when False the hooks do nothing (the parts run as without
            them); :class:`~inline_mm.engine.CPUAutocastOptimWrapper` turns
            them on only inside its ``optim_context``, so validation stays fp32.
    """

    def __init__(self, model: nn.Module, parts: Sequence[str], dtype: torch.dtype,
                 enabled: bool = True) -> None:
        self.dtype = dtype
        self.parts = tuple(parts)
        self.enabled = enabled
        self._model = model
        self._hooks: List[RemovableHandle] = []
        # one stack per submodule: a part may be called again inside itself
        self._active: Dict[int, List[Optional[torch.autocast]]] = {}
        for name in self.parts:
            module = model.get_submodule(name) if name else model
            self._active[id(module)] = []
            self._hooks.append(module.register_forward_pre_hook(self._enter))
            # always_call: leave autocast even when the forward raises
            self._hooks.append(module.register_forward_hook(self._exit, always_call=True))
            setattr(module, _ATTR, self)

    @property
    def installed(self) -> bool:
        return bool(self._hooks)

    def _enter(self, module: nn.Module, args: Tuple) -> None:
        ctx = None
        if self.enabled:
            ctx = torch.autocast(_device_type(module, args), dtype=self.dtype)
            ctx.__enter__()
        self._active[id(module)].append(ctx)

    def _exit(self, module: nn.Module, args: Tuple, output: Any) -> Any:
        stack = self._active[id(module)]
        ctx = stack.pop() if stack else None
        if ctx is None:
            return None  # this call ran without autocast: output as it is
        ctx.__exit__(None, None, None)
        return cast_to_fp32(output)

    def remove(self) -> None:
        """Remove the hooks; the parts run as before :func:`autocast_parts`."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for name in self.parts:
            module = self._model.get_submodule(name) if name else self._model
            if getattr(module, _ATTR, None) is self:
                delattr(module, _ATTR)

    @contextmanager
    def enable(self, enabled: bool = True) -> Iterator['AutocastHandle']:
        """Context in which the hooks are on (or off, ``enabled=False``)."""
        before, self.enabled = self.enabled, enabled
        try:
            yield self
        finally:
            self.enabled = before

    def __repr__(self) -> str:
        return (f'AutocastHandle(parts={list(self.parts)}, dtype={self.dtype}, '
                f'enabled={self.enabled}, installed={self.installed})')


def autocast_parts(model: nn.Module, parts: Optional[Sequence[str]] = ('backbone', 'neck'),
                   dtype: DtypeLike = torch.bfloat16, enabled: bool = True,
                   strict: bool = False) -> AutocastHandle:
    """Run the named submodules of ``model`` under autocast, fp32 outside them.

    A forward pre-hook on each part enters ``torch.autocast`` (on the device of
    the part's input) and a forward hook leaves it and casts the part's
    floating-point outputs (tensors, tuples / lists / dicts of them, data
    samples) to fp32.  Inside a part, autocast's usual rules apply: matmuls and
    convolutions run in ``dtype``, ops on autocast's fp32 list and code that
    disables autocast (InLine's token reductions) stay fp32.

    Installing twice is idempotent: when the parts already carry hooks of the
    same dtype their handle is returned (with ``enabled`` set as asked);
    otherwise the old hooks are removed first.

    Args:
        model: the model, or a model wrapper (DDP) around it.
        parts: dotted submodule names (``'backbone'``, ``'neck'``,
            ``'backbone.layers.0'``); None or ``('',)`` means the whole model.
            Parts the model lacks (a detector without neck) are skipped unless
            ``strict``.
        dtype: ``torch.bfloat16`` (default, CPUs and recent GPUs) or
            ``torch.float16`` (or their names).
        enabled: initial state of the hooks (see :class:`AutocastHandle`).
        strict: raise on a missing part.

    Returns:
        AutocastHandle: ``.remove()`` takes the hooks away, ``.enabled``
        switches them off and on.

    Raises:
        ValueError: no named part exists, a part is missing with ``strict``,
            or ``dtype`` is not a 16-bit float type.
    """
    dtype = to_dtype(dtype)
    if is_model_wrapper(model):
        model = model.module
    names = [''] if not parts else list(parts)
    found, missing = [], []
    for name in names:
        try:
            found.append((name, model.get_submodule(name) if name else model))
        except AttributeError:
            missing.append(name)
    if missing and (strict or not found):
        raise ValueError(f'{type(model).__name__} has no submodule(s) {missing} to autocast')
    handles = {getattr(m, _ATTR, None) for _, m in found}
    if len(handles) == 1:
        old = handles.pop()
        if old is not None and old.dtype == dtype and \
                set(old.parts) == {n for n, _ in found} and old._model is model:
            old.enabled = enabled
            return old
        handles.add(old)
    for old in handles:
        if old is not None:
            old.remove()
    return AutocastHandle(model, [n for n, _ in found], dtype, enabled)


def remove_autocast_parts(model: nn.Module) -> None:
    """Remove every :func:`autocast_parts` hook from ``model`` and its submodules."""
    if is_model_wrapper(model):
        model = model.module
    for module in model.modules():
        handle = getattr(module, _ATTR, None)
        if handle is not None:
            handle.remove()
