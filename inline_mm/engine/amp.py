"""What ``--amp`` means for the tools, on a GPU and on the CPU.

Two entry points, used by ``tools/train.py``, ``tools/test.py`` and
``tools/infer.py``:

- :func:`configure_amp` rewrites a config's ``optim_wrapper`` for mixed
  precision training: mmengine's ``AmpOptimWrapper`` (fp16, dynamic loss
  scale) on a GPU; :class:`~inline_mm.engine.CPUAutocastOptimWrapper` (bf16)
  without one, restricted to the backbone and the neck for detectors, whose
  RoIAlign / NMS CPU kernels in mmcv take fp32 only.
- :func:`enable_inference_autocast` makes a built model predict in mixed
  precision: the same parts, fp16 on a GPU, bf16 on the CPU.
"""
import warnings
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper

from .autocast import AutocastHandle, autocast_parts

#: submodules a detector runs under autocast on the CPU (outputs back to fp32 for the heads)
DETECTOR_PARTS: Tuple[str, ...] = ('backbone', 'neck')


def cpu_has_fast_bf16() -> Optional[bool]:
    """Whether this CPU has bf16 matmul units torch uses (AVX512-BF16 or AMX); None if unknown.

    Without them torch's bf16 matmuls and convolutions fall back to scalar
    kernels, many times slower than fp32 (on an AVX2-only CPU a bf16 matmul
    runs at a few percent of the fp32 rate), so bf16 autocast slows training down.
    """
    checks = [getattr(torch.cpu, name, None)
              for name in ('_is_avx512_bf16_supported', '_is_amx_tile_supported')]
    checks = [c for c in checks if c is not None]
    if not checks:
        return None
    return any(c() for c in checks)


def _warn_if_slow_bf16(dtype) -> None:
    if str(dtype) in ('bfloat16', 'torch.bfloat16') and cpu_has_fast_bf16() is False:
        warnings.warn('bf16 autocast on a CPU without AVX512-BF16 / AMX: torch runs bf16 '
                      'matmuls and convolutions with slow fallback kernels here, so mixed '
                      'precision is slower than fp32 on this machine', RuntimeWarning,
                      stacklevel=3)


def _toolkit(task: str) -> str:
    """``'mmdet'`` / ``'det'`` -> ``'mmdet'``; ``'mmseg'`` / ``'seg'`` -> ``'mmseg'``."""
    key = {'mmdet': 'mmdet', 'det': 'mmdet', 'mmseg': 'mmseg', 'seg': 'mmseg'}.get(task)
    if key is None:
        raise ValueError(f"task is 'mmdet' or 'mmseg' (as task_of(cfg) returns), got {task!r}")
    return key


def amp_parts(task: str) -> Optional[Tuple[str, ...]]:
    """Submodules to autocast for ``task``: backbone + neck for detectors, None (all) else."""
    return DETECTOR_PARTS if _toolkit(task) == 'mmdet' else None


def configure_amp(cfg: Config, task: str, device: Optional[str] = None) -> None:
    """Set up ``cfg.optim_wrapper`` for mixed-precision training, in place.

    - On a GPU: mmengine's ``AmpOptimWrapper`` with ``loss_scale='dynamic'``
      unless the config sets one (a config already on ``AmpOptimWrapper`` is
      kept as it is).
    - On the CPU: ``CPUAutocastOptimWrapper`` with ``dtype='bfloat16'`` (unless
      set) and no loss scale; detectors get ``parts=('backbone', 'neck')``
      (unless the config names other parts), segmentors autocast their whole
      training forward.  Warns (``RuntimeWarning``) on a CPU without bf16
      units (:func:`cpu_has_fast_bf16`), where bf16 is slower than fp32.

    Args:
        cfg: the full config; its ``optim_wrapper`` is changed.
        task: ``'mmdet'`` or ``'mmseg'`` (``task_of(cfg)``); ``'det'`` / ``'seg'`` too.
        device: ``'cuda'`` or ``'cpu'``; default: ``'cuda'`` when a GPU is visible.
    """
    toolkit = _toolkit(task)
    if device is None:
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    wrapper = cfg.optim_wrapper
    kind = wrapper.get('type', 'OptimWrapper')
    if device != 'cpu':
        if kind != 'AmpOptimWrapper':
            if kind == 'CPUAutocastOptimWrapper':  # its options mean nothing to mmengine's
                wrapper.pop('parts', None)
                wrapper.pop('dtype', None)
            wrapper.type = 'AmpOptimWrapper'
            wrapper.setdefault('loss_scale', 'dynamic')
        print_log(f'--amp: fp16 mixed precision on {device} (AmpOptimWrapper, loss scale '
                  f"{wrapper.get('loss_scale', 'dynamic')})", logger='current')
        return
    wrapper.type = 'CPUAutocastOptimWrapper'
    wrapper.pop('loss_scale', None)  # bf16 has fp32's exponent range
    wrapper.pop('use_fsdp', None)
    if wrapper.get('dtype') is None:
        wrapper.dtype = 'bfloat16'
    if toolkit == 'mmdet':
        if not wrapper.get('parts'):
            wrapper.parts = list(DETECTOR_PARTS)
    else:
        wrapper.setdefault('parts', None)
    what = ' and '.join(wrapper.parts) if wrapper.get('parts') else 'the whole training forward'
    print_log(f'--amp: {wrapper.dtype} autocast on the CPU for {what} '
              f'(CPUAutocastOptimWrapper; weights, gradients and optimizer state stay fp32)',
              logger='current')
    _warn_if_slow_bf16(wrapper.dtype)


def enable_inference_autocast(model: nn.Module, task: str,
                              dtype: Optional[torch.dtype] = None) -> AutocastHandle:
    """Make a built model predict in mixed precision (``tools/test.py --amp``, ``infer.py --amp``).

    Installs :func:`~inline_mm.engine.autocast.autocast_parts` hooks: on the
    backbone and the neck of a detector (their outputs back to fp32, so the
    heads, RoIAlign and NMS run in fp32, which mmcv's CPU kernels need), on the
    whole forward of a segmentor (its predictions cast to fp32).  The data
    preprocessor stays fp32.  Call it after the model is built (after
    ``Runner.from_cfg`` or ``init_detector`` / ``init_model``); loading a
    checkpoint afterwards is fine.

    Args:
        model: the detector / segmentor, or a model wrapper around it.
        task: ``'mmdet'`` or ``'mmseg'``.
        dtype: default bf16 on the CPU, fp16 on a GPU.

    Returns:
        AutocastHandle: ``.remove()`` turns mixed precision off again.
    """
    module = model.module if is_model_wrapper(model) else model
    param = next(module.parameters(), None)
    on_gpu = param is not None and param.device.type == 'cuda'
    if dtype is None:
        dtype = torch.float16 if on_gpu else torch.bfloat16
    parts = amp_parts(task)
    print_log(f"--amp: {str(dtype).replace('torch.', '')} autocast at inference on "
              f"{'the GPU' if on_gpu else 'the CPU'} for "
              f"{' and '.join(parts) if parts else 'the whole model'}", logger='current')
    if not on_gpu:
        _warn_if_slow_bf16(dtype)
    return autocast_parts(module, parts, dtype)
