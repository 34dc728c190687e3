"""The fault-tolerance parts' former module, kept so that older imports keep working.

They live in modules named by concern: :mod:`~inline_mm.engine.atomic_io` (atomic
checkpoint files), :mod:`~inline_mm.engine.checkpoint_files` (which checkpoint to resume
from), :mod:`~inline_mm.engine.signals` (preemption signals) and
:mod:`~inline_mm.engine.bad_samples` (``SkipBadSamples``); ``inline_mm.engine`` exports
the public names.  New code imports from those modules.
"""
from .atomic_io import (ATOMIC_BACKEND, AtomicLocalBackend, atomic_write, fsync_dir,
                        remove_stale_temp_files)
from .bad_samples import BadSampleLimitError, SkipBadSamples, annotation_problem, file_problem
from .checkpoint_files import CheckpointWriteError, checkpoint_problem, newest_readable_checkpoint
from .signals import PREEMPTED_EXIT_CODE, PreemptionFlag

__all__ = ['ATOMIC_BACKEND', 'AtomicLocalBackend', 'atomic_write', 'fsync_dir',
           'remove_stale_temp_files', 'BadSampleLimitError', 'SkipBadSamples',
           'annotation_problem', 'file_problem', 'CheckpointWriteError', 'checkpoint_problem',
           'newest_readable_checkpoint', 'PREEMPTED_EXIT_CODE', 'PreemptionFlag']
