"""Test-only faults for the fault-tolerance tests: slow or failing checkpoint writes, NaN losses.

Loaded by the tests through ``custom_imports`` (``PYTHONPATH=tests/plugins``), as
``preempt_at`` is; the shipped package holds no fault injection.

* :class:`CheckpointWriteFaultHook` (and :func:`checkpoint_write_faults`, the same in the
  test's own process): from the ``from_write``-th checkpoint file (``*.pth``) the process
  writes on, ``os.fsync`` of that file takes ``slow`` seconds and / or fails with the errno
  ``error`` (e.g. ``'ENOSPC'``: a full disk reports it in ``fsync`` as well as in
  ``write``).  The file's data are written by then, into the temp file of an atomic write,
  or into the checkpoint itself if a writer ever wrote it in place.
* :class:`NaNLossHook`: the loss of the given 0-based iterations is made NaN before the
  optim wrapper (and so ``NonFiniteLossHook``) sees it.
"""
import contextlib
import errno
import os
import re
import time
from typing import Iterator, Optional, Sequence

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

#: a checkpoint file, or the temp file of its atomic write (``.iter_4.pth.XXXX.tmp``)
_CHECKPOINT = re.compile(r'\.pth$|\.pth\.[^/]*\.tmp$')


class _WriteFaults:
    """``os.fsync`` that is slow or fails for checkpoint files, from the N-th one on."""

    def __init__(self, slow: float = 0.0, error: Optional[str] = None,
                 from_write: int = 1) -> None:
        self.slow = float(slow)
        self.errno = getattr(errno, error) if error else None
        self.from_write = int(from_write)
        self.writes = 0
        self._fsync = os.fsync

    def fsync(self, fd: int) -> None:
        try:
            name = os.readlink(f'/proc/self/fd/{fd}')
        except OSError:
            name = ''
        if _CHECKPOINT.search(os.path.basename(name)):
            self.writes += 1
            if self.writes >= self.from_write:
                if self.slow:
                    time.sleep(self.slow)
                if self.errno is not None:
                    raise OSError(self.errno, os.strerror(self.errno))
        self._fsync(fd)

    def install(self) -> None:
        os.fsync = self.fsync

    def uninstall(self) -> None:
        if os.fsync == self.fsync:
            os.fsync = self._fsync


@contextlib.contextmanager
def checkpoint_write_faults(slow: float = 0.0, error: Optional[str] = None,
                            from_write: int = 1) -> Iterator[_WriteFaults]:
    """Checkpoint writes of this process are slow / fail inside the context."""
    faults = _WriteFaults(slow, error, from_write)
    faults.install()
    try:
        yield faults
    finally:
        faults.uninstall()


@HOOKS.register_module()
class CheckpointWriteFaultHook(Hook):
    """Make this process's checkpoint writes slow / fail (see :func:`checkpoint_write_faults`)."""

    def __init__(self, slow: float = 0.0, error: Optional[str] = None,
                 from_write: int = 1) -> None:
        self.faults = _WriteFaults(slow, error, from_write)

    def before_run(self, runner) -> None:
        self.faults.install()

    def after_run(self, runner) -> None:
        self.faults.uninstall()


@HOOKS.register_module()
class NaNLossHook(Hook):
    """The loss of the 0-based iterations ``iterations`` becomes NaN.

    Wraps the optim wrapper's ``update_params`` on the instance after every other
    hook did (lowest priority), so the wrappers of ``NonFiniteLossHook`` get the NaN.
    """

    priority = 'LOWEST'

    def __init__(self, iterations: Sequence[int]) -> None:
        self.iterations = {int(i) for i in iterations}

    def before_train(self, runner) -> None:
        wrapper = runner.optim_wrapper
        update_params = wrapper.update_params

        def nan_update_params(loss, step_kwargs=None, zero_kwargs=None):
            if runner.iter in self.iterations:
                loss = loss * float('nan')
            return update_params(loss, step_kwargs, zero_kwargs)

        wrapper.update_params = nan_update_params
