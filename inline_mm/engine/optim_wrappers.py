"""Mixed precision on CPU machines.

mmengine's ``AmpOptimWrapper`` is built on ``torch.cuda.amp`` and refuses to
start without a GPU.  On CPUs with bf16 instructions (AVX512-BF16, AMX)
autocasting the forward pass to bfloat16 shortens a training iteration
(matmuls and convolutions run on the bf16 units); bf16 has fp32's exponent
range, so no loss scaling is needed.  ``tools/train.py --amp`` picks this
wrapper when no GPU is present (see :func:`inline_mm.engine.amp.configure_amp`).
"""
from contextlib import contextmanager
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from .autocast import AutocastHandle, autocast_parts


@OPTIM_WRAPPERS.register_module()
class CPUAutocastOptimWrapper(OptimWrapper):
    """``OptimWrapper`` whose training forward passes run under ``torch.autocast('cpu')``.

    Parameters, gradients and the optimiser state stay in fp32; only the
    autocast-eligible operations (matmuls, convolutions) run in ``dtype``.

    With ``parts`` only those submodules run under autocast, and their outputs
    are cast back to fp32 (:func:`~inline_mm.engine.autocast.autocast_parts`):
    detectors use ``parts=('backbone', 'neck')`` because the CPU kernels of
    mmcv's RoIAlign and NMS take fp32 only.  The hooks are on inside
    :meth:`optim_context` only (the training forward), so validation and
    testing stay fp32.

    Args:
        dtype: ``'bfloat16'`` (default) or ``'float16'``.
        parts: names of the submodules to autocast, e.g.
            ``('backbone', 'neck')``; None (default) autocasts the whole
            training forward, losses included.
        only_with_bf16_units: run in fp32 instead on CPUs without bf16 units
            (AVX512-BF16 / AMX), where torch's bf16 kernels are several times
            slower than fp32 (configs that want speed, not bf16 itself, set it).
        **kwargs: as for :class:`mmengine.optim.OptimWrapper`.
    """

    def __init__(self, *args, dtype: Union[str, torch.dtype] = 'bfloat16',
                 parts: Optional[Sequence[str]] = None, only_with_bf16_units: bool = False,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from .amp import cpu_has_fast_bf16
        self.autocast_enabled = not (only_with_bf16_units and cpu_has_fast_bf16() is False)
        if not self.autocast_enabled:
            print_log('CPUAutocastOptimWrapper: this CPU has no bf16 units (AVX512-BF16 / '
                      'AMX), so the forward runs in fp32 (only_with_bf16_units=True)',
                      logger='current')
        if isinstance(dtype, str):
            if dtype not in ('bfloat16', 'float16'):
                raise ValueError(f"dtype of CPUAutocastOptimWrapper is 'bfloat16' or "
                                 f"'float16', got {dtype!r}")
            dtype = getattr(torch, dtype)
        self.cast_dtype = dtype
        if isinstance(parts, str):
            parts = (parts, )
        self.parts = tuple(parts) if parts else None
        self._handle: Optional[AutocastHandle] = None

    def _part_hooks(self, model: nn.Module) -> AutocastHandle:
        """Install the hooks on the first use (the wrapper is built before it sees the model)."""
        module = model.module if is_model_wrapper(model) else model
        if self._handle is None or not self._handle.installed or self._handle._model is not module:
            self._handle = autocast_parts(module, self.parts, self.cast_dtype, enabled=False)
        return self._handle

    @contextmanager
    def optim_context(self, model: nn.Module):
        if not self.autocast_enabled:
            with super().optim_context(model):
                yield
        elif self.parts is None:
            with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
                yield
        else:
            with super().optim_context(model), self._part_hooks(model).enable():
                yield
