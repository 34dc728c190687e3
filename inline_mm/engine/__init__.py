"""Training-side extensions for mmengine's Runner.

Importing this package registers the plugin's hooks, optimiser wrappers,
model wrappers, metrics and visualisation hooks into mmengine's (and the
installed toolkits') registries.  Configs that use them name it in
``custom_imports`` (``imports=['inline_mm', 'inline_mm.engine']``); a plain
``import inline_mm`` does not import it.
"""
from . import metrics, visualization  # noqa: F401  (registration)
from .amp import configure_amp, cpu_has_fast_bf16, enable_inference_autocast
from .autocast import AutocastHandle, autocast_parts
from .dist import AnyDeviceDistributedDataParallel
from .fault_tolerance import (PREEMPTED_EXIT_CODE, AtomicLocalBackend, BadSampleLimitError,
                              CheckpointWriteError, SkipBadSamples)
from .hooks import AtomicCheckpointHook, MeanLossLoggerHook, PreemptionHook, RNGStateHook
from .loops import ResumableEpochBasedTrainLoop
from .nonfinite import NonFiniteLossError, NonFiniteLossHook
from .optim_wrappers import CPUAutocastOptimWrapper

__all__ = ['configure_amp', 'cpu_has_fast_bf16', 'enable_inference_autocast', 'AutocastHandle',
           'autocast_parts', 'AnyDeviceDistributedDataParallel', 'MeanLossLoggerHook',
           'RNGStateHook',
           'CPUAutocastOptimWrapper', 'AtomicCheckpointHook', 'PreemptionHook',
           'NonFiniteLossHook', 'NonFiniteLossError', 'ResumableEpochBasedTrainLoop',
           'SkipBadSamples', 'AtomicLocalBackend',
           'BadSampleLimitError', 'CheckpointWriteError', 'PREEMPTED_EXIT_CODE']
