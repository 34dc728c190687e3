"""Test-only mmengine hooks: a SIGTERM to this process at a given training iteration or
validation batch.

Loaded by the tests through ``custom_imports`` (``PYTHONPATH=tests/plugins``), so
that a preemption lands at an exact iteration; the shipped package holds no such hook.
"""
import os
import signal

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


class _SignalHook(Hook):
    """Sends ``signal_name`` to this process (on process ``rank`` only, if given)."""

    priority = 'HIGHEST'

    def __init__(self, rank=None, signal_name: str = 'SIGTERM') -> None:
        self.rank = rank
        self.signal = getattr(signal, signal_name)

    def send(self) -> None:
        if self.rank is None or get_rank() == self.rank:
            os.kill(os.getpid(), self.signal)


@HOOKS.register_module()
class SignalAtIterationHook(_SignalHook):
    """Send ``signal_name`` to this process before the 0-based iteration ``iteration``
    (on process ``rank`` only, if given)."""

    def __init__(self, iteration: int, rank=None, signal_name: str = 'SIGTERM') -> None:
        super().__init__(rank, signal_name)
        self.iteration = iteration

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if runner.iter == self.iteration:
            self.send()


@HOOKS.register_module()
class SignalInValidationHook(_SignalHook):
    """Send ``signal_name`` before validation batch ``val_batch`` of the validation that
    follows ``after_iteration`` training iterations (on process ``rank`` only, if given)."""

    def __init__(self, after_iteration: int, val_batch: int = 0, rank=None,
                 signal_name: str = 'SIGTERM') -> None:
        super().__init__(rank, signal_name)
        self.after_iteration = after_iteration
        self.val_batch = val_batch

    def before_val_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if runner.iter == self.after_iteration and batch_idx == self.val_batch:
            self.send()
