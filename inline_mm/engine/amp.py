"""Mixed precision without a GPU, and for detectors whose mmcv ops take fp32 only.

What mmengine and torch do not offer:

- mmengine's ``AmpOptimWrapper`` is built on ``torch.cuda.amp`` and refuses
  to start without a GPU; :class:`CPUAutocastOptimWrapper` runs the training
  forward under ``torch.autocast('cpu', dtype=torch.bfloat16)`` (bf16 has
  fp32's exponent range: no loss scale).
- mmcv's CPU kernels of RoIAlign and NMS take fp32 only, so a detector cannot
  run its whole forward under CPU autocast.  :func:`autocast_parts` confines
  autocast to named submodules (the backbone and the neck, nearly all of a
  detector's FLOPs) with forward hooks, and casts their outputs back to fp32.
- What ``--amp`` means for ``tools/train.py``, ``tools/test.py`` and
  ``tools/infer.py``: :func:`configure_amp` rewrites a config's
  ``optim_wrapper`` (``AmpOptimWrapper`` fp16 on a GPU, the CPU wrapper in
  bf16 without one); :func:`enable_inference_autocast` makes a built model
  predict in mixed precision (the same parts).  Both warn on CPUs without
  bf16 units (:func:`cpu_has_fast_bf16`), where bf16 is slower than fp32.
"""
import warnings
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS
from mmengine.structures import BaseDataElement
from torch.utils.hooks import RemovableHandle

from ..errors import ConfigError
from .cpu_info import BF16_UNIT_FLAGS, read_cpuinfo

#: submodules a detector runs under autocast on the CPU (outputs back to fp32 for the heads)
DETECTOR_PARTS: Tuple[str, ...] = ('backbone', 'neck')

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


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside a model wrapper (DDP), or the model itself."""
    return model.module if is_model_wrapper(model) else model


def cpu_has_fast_bf16(cpuinfo: str = '/proc/cpuinfo') -> Optional[bool]:
    """Whether this CPU has bf16 matmul units (AVX512-BF16 or AMX); None if unknown.

    Without them torch's bf16 matmuls and convolutions fall back to scalar
    kernels, many times slower than fp32 (on an AVX2-only CPU a bf16 matmul
    runs at a few percent of the fp32 rate), so bf16 autocast slows training down.
    Read from the CPU's flags (:func:`~inline_mm.engine.cpu_info.read_cpuinfo`);
    None where there are none to read (not Linux).
    """
    flags = read_cpuinfo(cpuinfo)[1]
    if flags is None:
        return None
    return any(f in flags for f in BF16_UNIT_FLAGS)


def _warn_if_slow_bf16(dtype: DtypeLike) -> None:
    if str(dtype) in ('bfloat16', 'torch.bfloat16') and cpu_has_fast_bf16() is False:
        warnings.warn('bf16 autocast on a CPU without AVX512-BF16 / AMX: torch runs bf16 '
                      'matmuls and convolutions with slow fallback kernels here, so mixed '
                      'precision is slower than fp32 on this machine', RuntimeWarning,
                      stacklevel=3)


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
        model: the (unwrapped) model the parts belong to.
        dtype: the autocast dtype.
        parts: names of the hooked submodules (``''`` is the model itself).
        enabled: when False the hooks do nothing (the parts run as without
            them); :class:`CPUAutocastOptimWrapper` turns them on only inside
            its ``optim_context``, so validation stays fp32.
    """

    def __init__(self, model: nn.Module, parts: Sequence[str], dtype: torch.dtype,
                 enabled: bool = True) -> None:
        self.model = model
        self.dtype = dtype
        self.parts = tuple(parts)
        self.enabled = enabled
        self._hooks: List[RemovableHandle] = []
        # one stack per submodule: a part may be called again inside itself
        self._active: Dict[int, List[Optional[torch.autocast]]] = {}
        for module in self._modules():
            self._active[id(module)] = []
            self._hooks.append(module.register_forward_pre_hook(self._enter))
            # always_call: leave autocast even when the forward raises
            self._hooks.append(module.register_forward_hook(self._exit, always_call=True))
            setattr(module, _ATTR, self)

    def _modules(self) -> List[nn.Module]:
        return [self.model.get_submodule(name) if name else self.model for name in self.parts]

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
        for module in self._modules():
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


def autocast_parts(model: nn.Module, parts: Optional[Sequence[str]] = DETECTOR_PARTS,
                   dtype: DtypeLike = torch.bfloat16, enabled: bool = True,
                   strict: bool = False) -> AutocastHandle:
    """Run the named submodules of ``model`` under autocast, fp32 outside them.

    A forward pre-hook on each part enters ``torch.autocast`` (on the device of
    the part's input) and a forward hook leaves it and casts the part's
    floating-point outputs (tensors, tuples / lists / dicts of them, data
    samples) to fp32.  Inside a part, autocast's usual rules apply: matmuls and
    convolutions run in ``dtype``, ops on autocast's fp32 list and code that
    disables autocast (InLine's token reductions) stay fp32.  Nothing of the
    model's own code changes, and :meth:`AutocastHandle.remove` restores it.

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

    Raises:
        ValueError: no named part exists, a part is missing with ``strict``,
            or ``dtype`` is not a 16-bit float type.
    """
    dtype = to_dtype(dtype)
    model = _unwrap(model)
    found, missing = [], []
    for name in [''] if not parts else list(parts):
        try:
            found.append((name, model.get_submodule(name) if name else model))
        except AttributeError:
            missing.append(name)
    if missing and (strict or not found):
        raise ValueError(f'{type(model).__name__} has no submodule(s) {missing} to autocast')
    handles = {getattr(m, _ATTR, None) for _, m in found}
    if len(handles) == 1:
        old = next(iter(handles))
        if old is not None and old.dtype == dtype and old.model is model and \
                set(old.parts) == {n for n, _ in found}:
            old.enabled = enabled
            return old
    for old in handles:
        if old is not None:
            old.remove()
    return AutocastHandle(model, [n for n, _ in found], dtype, enabled)


def remove_autocast_parts(model: nn.Module) -> None:
    """Remove every :func:`autocast_parts` hook from ``model`` and its submodules."""
    for module in _unwrap(model).modules():
        handle = getattr(module, _ATTR, None)
        if handle is not None:
            handle.remove()


@OPTIM_WRAPPERS.register_module()
class CPUAutocastOptimWrapper(OptimWrapper):
    """``OptimWrapper`` whose training forward passes run under ``torch.autocast``.

    Made for the CPU (bf16 there); a model on another device is autocast on it.

    Parameters, gradients and the optimiser state stay in fp32; only the
    autocast-eligible operations (matmuls, convolutions) run in ``dtype``.

    With ``parts`` only those submodules run under autocast, and their outputs
    are cast back to fp32 (:func:`autocast_parts`): detectors use
    ``parts=('backbone', 'neck')`` because the CPU kernels of mmcv's RoIAlign
    and NMS take fp32 only.  The hooks are on inside :meth:`optim_context`
    only (the training forward), so validation and testing stay fp32.

    Args:
        dtype: ``'bfloat16'`` (the default and the only choice: fp16 needs the loss
            scaling of mmengine's ``AmpOptimWrapper``, which refuses the CPU).
        parts: names of the submodules to autocast, e.g.
            ``('backbone', 'neck')``; None (default) autocasts the whole
            training forward, losses included.
        only_with_bf16_units: run in fp32 instead on CPUs without bf16 units
            (AVX512-BF16 / AMX), where torch's bf16 kernels are several times
            slower than fp32, and on a model that is not on the CPU (configs
            that want CPU speed, not bf16 itself, set it: on a GPU they train
            as without the wrapper; ``--amp`` turns on the GPU's own).
        **kwargs: as for :class:`mmengine.optim.OptimWrapper`.
    """

    def __init__(self, *args, dtype: DtypeLike = 'bfloat16',
                 parts: Optional[Sequence[str]] = None, only_with_bf16_units: bool = False,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.only_with_bf16_units = only_with_bf16_units
        self.autocast_enabled = not (only_with_bf16_units and cpu_has_fast_bf16() is False)
        if not self.autocast_enabled:
            print_log('CPUAutocastOptimWrapper: this CPU has no bf16 units (AVX512-BF16 / '
                      'AMX), so the forward runs in fp32 (only_with_bf16_units=True)',
                      logger='current')
        self.cast_dtype = to_dtype(dtype)
        if self.cast_dtype == torch.float16:
            raise ConfigError(
                "CPUAutocastOptimWrapper trains without loss scaling, which fp16 needs (small "
                "gradients flush to zero): use dtype='bfloat16', or mmengine's "
                'AmpOptimWrapper on a GPU (tools/train.py --amp)')
        self.parts = ((parts, ) if isinstance(parts, str) else tuple(parts)) if parts else None
        self._handle: Optional[AutocastHandle] = None

    def _part_hooks(self, model: nn.Module) -> AutocastHandle:
        """Install the hooks on the first use (the wrapper is built before it sees the model)."""
        module = _unwrap(model)
        if self._handle is None or not self._handle.installed or self._handle.model is not module:
            self._handle = autocast_parts(module, self.parts, self.cast_dtype, enabled=False)
        return self._handle

    def _autocasts(self, model: nn.Module) -> bool:
        """Whether this training forward runs under autocast (see ``only_with_bf16_units``)."""
        if not self.autocast_enabled:
            return False
        if not self.only_with_bf16_units:
            return True
        param = next(_unwrap(model).parameters(), None)
        return param is None or param.device.type == 'cpu'

    @contextmanager
    def optim_context(self, model: nn.Module):
        if not self._autocasts(model):
            with super().optim_context(model):
                yield
        elif self.parts is None:
            # the model's device: a GPU model under only_with_bf16_units=False is autocast
            # there (a CPU autocast would leave its CUDA ops in fp32)
            device_type = _device_type(_unwrap(model), ())
            with super().optim_context(model), torch.autocast(device_type,
                                                              dtype=self.cast_dtype):
                yield
        else:
            with super().optim_context(model), self._part_hooks(model).enable():
                yield


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
    - On the CPU: :class:`CPUAutocastOptimWrapper` with ``dtype='bfloat16'``
      (unless set) and no loss scale; detectors get ``parts=('backbone',
      'neck')`` (unless the config names other parts), segmentors autocast
      their whole training forward.  A config's ``only_with_bf16_units`` is
      dropped: ``--amp`` asks for mixed precision on any CPU.  Warns (``RuntimeWarning``) on a CPU
      without bf16 units (:func:`cpu_has_fast_bf16`).

    Args:
        cfg: the full config; its ``optim_wrapper`` is changed.
        task: ``'mmdet'`` or ``'mmseg'`` (``task_of(cfg)``); ``'det'`` / ``'seg'`` too.
        device: ``'cuda'`` or ``'cpu'``; default: ``'cuda'`` when a GPU is visible.
    """
    parts = amp_parts(task)
    if device is None:
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    wrapper = cfg.optim_wrapper
    kind = wrapper.get('type', 'OptimWrapper')
    if device != 'cpu':
        if kind != 'AmpOptimWrapper':
            if kind == 'CPUAutocastOptimWrapper':  # its options mean nothing to mmengine's
                for key in ('parts', 'dtype', 'only_with_bf16_units'):
                    wrapper.pop(key, None)
            wrapper.type = 'AmpOptimWrapper'
            wrapper.setdefault('loss_scale', 'dynamic')
        print_log(f'--amp: fp16 mixed precision on {device} (AmpOptimWrapper, loss scale '
                  f"{wrapper.get('loss_scale', 'dynamic')})", logger='current')
        return
    wrapper.type = 'CPUAutocastOptimWrapper'
    wrapper.pop('loss_scale', None)  # bf16 has fp32's exponent range
    # --amp asks for mixed precision: a config's "bf16 only where it is faster" yields
    # to it (the warning below says when it is slower here)
    wrapper.pop('only_with_bf16_units', None)
    wrapper.pop('use_fsdp', None)
    if wrapper.get('dtype') is None:
        wrapper.dtype = 'bfloat16'
    if parts is None:
        wrapper.setdefault('parts', None)
    elif not wrapper.get('parts'):
        wrapper.parts = list(parts)
    what = ' and '.join(wrapper.parts) if wrapper.get('parts') else 'the whole training forward'
    print_log(f'--amp: {wrapper.dtype} autocast on the CPU for {what} '
              f'(CPUAutocastOptimWrapper; weights, gradients and optimizer state stay fp32)',
              logger='current')
    _warn_if_slow_bf16(wrapper.dtype)


def configure_fp32(cfg: Config) -> None:
    """Set up ``cfg.optim_wrapper`` for fp32 training, in place: a
    :class:`CPUAutocastOptimWrapper` (a toy config's "bf16 where the CPU has bf16
    units") becomes mmengine's plain ``OptimWrapper`` with the same optimiser,
    parameter-wise settings and gradient clipping; any other wrapper is kept."""
    wrapper = cfg.optim_wrapper
    if wrapper.get('type') == 'CPUAutocastOptimWrapper':
        for key in ('dtype', 'parts', 'only_with_bf16_units'):
            wrapper.pop(key, None)
        wrapper.type = 'OptimWrapper'


def enable_inference_autocast(model: nn.Module, task: str,
                              dtype: Optional[torch.dtype] = None) -> AutocastHandle:
    """Make a built model predict in mixed precision (``tools/test.py --amp``, ``infer.py --amp``).

    Installs :func:`autocast_parts` hooks: on the backbone and the neck of a
    detector (their outputs back to fp32, so the heads, RoIAlign and NMS run
    in fp32, which mmcv's CPU kernels need), on the whole forward of a
    segmentor (its predictions cast to fp32).  The data preprocessor stays
    fp32.  Call it after the model is built (after ``Runner.from_cfg`` or
    ``init_detector`` / ``init_model``); loading a checkpoint afterwards is fine.

    ``task`` is ``'mmdet'`` or ``'mmseg'``; ``dtype`` defaults to bf16 on the
    CPU, fp16 on a GPU.  The handle's ``.remove()`` turns mixed precision off.
    """
    module = _unwrap(model)
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
