"""Test-only mmengine hook: a SIGTERM to this process at a given training iteration.

Loaded by the tests through ``custom_imports`` (``PYTHONPATH=tests/plugins``), so
that a preemption lands at an exact iteration; the shipped package holds no such hook.
"""
import os
import signal

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class SignalAtIterationHook(Hook):
    """Send ``signal_name`` to this process before the 0-based iteration ``iteration``."""

    priority = 'HIGHEST'

    def __init__(self, iteration: int, signal_name: str = 'SIGTERM') -> None:
        self.iteration = iteration
        self.signal = getattr(signal, signal_name)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if runner.iter == self.iteration:
            os.kill(os.getpid(), self.signal)
