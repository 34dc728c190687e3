"""What mmengine's Runner lacks for these models: CPU mixed precision, fault tolerance.

bf16 autocast without a GPU (whole model or parts), atomic checkpoints, exact
mid-epoch resume, preemption, non-finite step skipping, bad-sample skipping,
losses averaged over processes, and the tools' one path to a Runner with its
checks of the config and the data.

Importing this package registers the plugin's hooks, optimiser wrappers,
model wrappers, metrics and visualisation hooks into mmengine's (and the
installed toolkits') registries.  Configs that use them name it in
``custom_imports`` (``imports=['inline_mm', 'inline_mm.engine']``); a plain
``import inline_mm`` does not import it.
"""
from . import metrics, visualization  # noqa: F401  (registration)
from .amp import (AutocastHandle, CPUAutocastOptimWrapper, autocast_parts, configure_amp,
                  configure_fp32, cpu_has_fast_bf16, enable_inference_autocast)
from .atomic_io import AtomicLocalBackend
from .bad_samples import BadSampleLimitError, SkipBadSamples
from .checkpoint_files import CheckpointWriteError
from .dist import AnyDeviceDistributedDataParallel
from .hooks import AtomicCheckpointHook, MeanLossLoggerHook, PreemptionHook, RNGStateHook
from .loops import ResumableEpochBasedTrainLoop
from .nonfinite import NonFiniteLossError, NonFiniteLossHook
from .signals import PREEMPTED_EXIT_CODE, PREEMPTED_MARKER

__all__ = ['configure_amp', 'configure_fp32', 'cpu_has_fast_bf16', 'enable_inference_autocast',
           'AutocastHandle', 'autocast_parts', 'AnyDeviceDistributedDataParallel',
           'MeanLossLoggerHook', 'RNGStateHook',
           'CPUAutocastOptimWrapper', 'AtomicCheckpointHook', 'PreemptionHook',
           'NonFiniteLossHook', 'NonFiniteLossError', 'ResumableEpochBasedTrainLoop',
           'SkipBadSamples', 'AtomicLocalBackend',
           'BadSampleLimitError', 'CheckpointWriteError', 'PREEMPTED_EXIT_CODE',
           'PREEMPTED_MARKER']
