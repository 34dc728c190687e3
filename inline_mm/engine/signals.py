"""Preemption signals: handlers that record a stop request, and the exit status.

mmengine handles no signal: SIGTERM (what Slurm, Kubernetes and torchrun send before
they stop a job) kills the run between two checkpoints.  :class:`PreemptionFlag`
records SIGTERM / SIGUSR1 so that :class:`~inline_mm.engine.hooks.PreemptionHook` can
finish the iteration, write a checkpoint and exit with :data:`PREEMPTED_EXIT_CODE`;
while there is nothing new to save it exits with that status at once.
"""
import os
import signal
import sys
from typing import Any, Dict, Optional, Sequence


#: exit status of a run stopped by SIGTERM / SIGUSR1 after writing its checkpoint
#: (``EX_TEMPFAIL`` of sysexits.h: "temporary failure, retry later");
#: ``tools/slurm_train.sh`` requeues the job on it
PREEMPTED_EXIT_CODE = 75

#: file in the work dir that says its last run stopped for a preemption, with the
#: checkpoint to resume from.  Rank 0 writes it before any process exits: when one
#: task's 75 makes Slurm kill the others (``srun --kill-on-bad-exit``), srun returns
#: 128 + the signal instead, and ``tools/slurm_train.sh`` requeues on this file
PREEMPTED_MARKER = 'preempted'


class PreemptionFlag:
    """Signal handlers that record that a stop was asked for (and exit at once while
    :attr:`exit_at_once` is set).

    Installed in the training process only: a forked data-loader worker that
    inherits them ignores the signal, so it keeps serving batches until the
    training process has written its checkpoint and exits.
    """

    def __init__(self, signals: Sequence[str] = ('SIGTERM', 'SIGUSR1')) -> None:
        self.signals = [getattr(signal, s) if isinstance(s, str) else s for s in signals]
        self.received: Optional[int] = None
        #: set while there is nothing new to save (before a run's first iteration ends):
        #: a signal then exits at once instead of waiting for the iteration to end
        self.exit_at_once: Optional[str] = None
        self._pid = os.getpid()
        self._previous: Dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid or self.received is not None:
            return
        self.received = signum
        if self.exit_at_once is not None:
            # the first iteration can take minutes (resume's replay of the batches already
            # trained, torch.compile, cudnn autotuning): waiting for it would outlast the
            # scheduler's grace period, and a kill is not requeued as status 75 is
            message = (f'preempted (received {self.name}) {self.exit_at_once}: nothing new '
                       f'to save; exiting with status {PREEMPTED_EXIT_CODE} (a training run '
                       'goes on with --resume)\n')
            try:  # not print(): the signal may have interrupted a write to stderr
                os.write(sys.stderr.fileno(), message.encode())
            except (OSError, ValueError):
                pass
            self.uninstall()
            raise SystemExit(PREEMPTED_EXIT_CODE)

    def install(self) -> bool:
        """Install the handlers; False outside the main thread (signals cannot be caught there)."""
        self._pid = os.getpid()
        try:
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handler)
        except ValueError:
            return False
        return True

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            try:
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            except ValueError:
                pass
        self._previous.clear()

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ''
