"""SIGTERM / SIGUSR1: every process stops after the same iteration, with a checkpoint.

mmengine has no preemption handling: a signal kills the run wherever it is.
:class:`PreemptionHook` stops every process after the current iteration, writes
that iteration's checkpoint (atomically, through :class:`AtomicCheckpointHook`)
and exits with status :data:`~inline_mm.engine.signals.PREEMPTED_EXIT_CODE` (75).
"""
from typing import Optional

from mmengine.dist import get_world_size
from mmengine.hooks import CheckpointHook, Hook
from mmengine.registry import HOOKS

from ..signals import PREEMPTED_EXIT_CODE, PreemptionFlag
from .atomic_checkpoint import agree, save_checkpoint_now


def _checkpoint_hook(runner) -> Optional[CheckpointHook]:
    for hook in runner.hooks:
        if isinstance(hook, CheckpointHook):
            return hook
    return None


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Stop cleanly on SIGTERM / SIGUSR1: checkpoint, then exit with status 75.

    The signal handlers set a flag.  After each training iteration the
    flag is agreed on by all processes (one all-reduce of an int), so a signal
    received by any process stops every process after the same iteration;
    then a checkpoint of that iteration is written (rank 0, atomically, through
    :class:`AtomicCheckpointHook`) and every process raises
    ``SystemExit(PREEMPTED_EXIT_CODE)``, which works under any training tool.
    Slurm's ``--signal=USR1@120`` leaves two minutes for this.  A signal that
    comes before the run's first training iteration has finished (while the
    checkpoint is loaded, mmengine replays the batches of a resumed run or
    ``torch.compile`` compiles; or in a validation / test run) exits at once
    with the same status in a single-process run: nothing has been trained since
    the last checkpoint.  With several processes it waits for the iteration, as
    later ones do (a process exiting alone could leave the others in a collective).

    Args:
        signals: signal names to handle. Defaults to SIGTERM and SIGUSR1.
        check_interval: agree on the flag every this many iterations.
            Defaults to 1.
    """

    # after CheckpointHook (VERY_LOW), so a regular save of the same iteration comes first
    priority = 'LOWEST'

    def __init__(self, signals=('SIGTERM', 'SIGUSR1'), check_interval: int = 1) -> None:
        self.flag = PreemptionFlag(signals)
        self.check_interval = check_interval
        self._agreed: tuple = (None, False)  # (iteration, verdict) from NonFiniteLossHook

    def agreed_at(self, iteration: int, stop: bool) -> None:
        """Take the verdict of the processes' agreement made during ``iteration``'s step.

        :class:`~inline_mm.engine.nonfinite.NonFiniteLossHook` all-reduces this
        hook's flag with its own in the step's one host sync; this iteration then
        needs no agreement of its own.
        """
        self._agreed = (iteration, stop)

    def before_run(self, runner) -> None:
        if not self.flag.install():
            runner.logger.warning('PreemptionHook: not in the main thread, signals are not '
                                  'handled')
        # until the run's first training iteration ends (and in a test run) the last
        # checkpoint holds everything: a signal exits at once (signals.PreemptionFlag).
        # One process only: with several, one exiting alone may leave the others inside
        # a collective of their first iteration
        if get_world_size() == 1:
            self.flag.exit_at_once = 'with no training iteration finished in this run'

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self.flag.exit_at_once = None
        agreed_iter, agreed = self._agreed
        if agreed_iter == runner.iter:  # agreed on during this iteration's optimizer step
            if not agreed:
                return
        elif (runner.iter + 1) % self.check_interval and self.flag.received is None:
            return
        elif not agree(self.flag.received is not None):
            return
        hook = _checkpoint_hook(runner)
        path = save_checkpoint_now(hook, runner) if hook is not None else None
        why = f'received {self.flag.name}' if self.flag.received else \
            'another process received a stop signal'
        runner.logger.warning(
            f'preempted ({why}) after iteration {runner.iter + 1}: checkpoint {path} written; '
            f'exiting with status {PREEMPTED_EXIT_CODE} (restart with --resume to continue)')
        self.flag.uninstall()
        raise SystemExit(PREEMPTED_EXIT_CODE)

    def after_run(self, runner) -> None:
        self.flag.uninstall()
