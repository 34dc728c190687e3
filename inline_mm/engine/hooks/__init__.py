"""mmengine hooks for multi-process logging, exact resumption and fault tolerance.

One module per concern; importing the package registers every hook in
mmengine's ``HOOKS`` (configs name them by type):

* :mod:`.mean_loss`: :class:`MeanLossLoggerHook`, losses averaged over all processes;
* :mod:`.rng_state`: :class:`RNGStateHook`, random states saved and restored exactly;
* :mod:`.atomic_checkpoint`: :class:`AtomicCheckpointHook`, atomic checkpoints and
  ``--resume`` from the newest readable one;
* :mod:`.preemption`: :class:`PreemptionHook`, SIGTERM / SIGUSR1 -> checkpoint, exit 75;
* :mod:`.runner_access`: what the checkpoint hooks need of mmengine's Runner or
  FlexibleRunner (loads of mmengine's checkpoint types, process-0 saves).

:class:`~inline_mm.engine.nonfinite.NonFiniteLossHook` (a NaN / Inf loss or
gradient skips the optimizer step) lives in its own module; it carries the
preemption flag of :class:`PreemptionHook` in its one per-step host sync.
"""
from .atomic_checkpoint import AtomicCheckpointHook, save_checkpoint_now
from .mean_loss import MeanLossLoggerHook
from .preemption import PreemptionHook
from .rng_state import RNGStateHook

__all__ = ['AtomicCheckpointHook', 'MeanLossLoggerHook', 'PreemptionHook', 'RNGStateHook',
           'save_checkpoint_now']
