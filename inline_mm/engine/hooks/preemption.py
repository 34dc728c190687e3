"""SIGTERM / SIGUSR1: every process stops after the same iteration, with a checkpoint.

mmengine has no preemption handling: a signal kills the run wherever it is.
:class:`PreemptionHook` stops every process after the current iteration (or
validation batch), writes the checkpoint of the training state (atomically,
through :class:`AtomicCheckpointHook`) and exits with status
:data:`~inline_mm.engine.signals.PREEMPTED_EXIT_CODE` (75).  A validation the
stop interrupts (or comes right before) runs when the run resumes.
"""
import os
import os.path as osp
from typing import Optional

import torch
from mmengine.dist import all_reduce, get_world_size, is_main_process
from mmengine.hooks import CheckpointHook, EMAHook, Hook
from mmengine.registry import HOOKS
from mmengine.runner import FlexibleRunner, IterBasedTrainLoop

from ..atomic_io import atomic_write
from ..signals import PREEMPTED_EXIT_CODE, PREEMPTED_MARKER, PreemptionFlag
from .atomic_checkpoint import agree, save_checkpoint_now
from .rng_state import RNGStateHook
from .runner_access import check_rank0_saves

#: message-hub key (saved in checkpoints): the iteration count of a validation that a
#: preemption interrupted or came right before, which the resumed run runs first
PENDING_VALIDATION = 'preemption_pending_validation'


def _checkpoint_hook(runner) -> Optional[CheckpointHook]:
    for hook in runner.hooks:
        if isinstance(hook, CheckpointHook):
            return hook
    return None


def _validation_due(runner) -> bool:
    """Whether mmengine's ``IterBasedTrainLoop`` validates after the iteration ending.

    Its rule (interval, ``val_begin``, and in later versions the last iteration)
    with the interval as it stands; a dynamic interval that changes at this
    iteration can make the answer wrong, which costs a second checkpoint write or
    a later one, never a wrong checkpoint.
    """
    loop = runner.train_loop
    done = runner.iter + 1  # the loop counts the iteration after its hooks
    return runner.val_loop is not None and done >= loop.val_begin and (
        done % loop.val_interval == 0 or done == loop.max_iters)


def _batches_of_every_process(loop) -> int:
    """The number of batches every process runs in ``loop`` (a val / test loop).

    One all-reduce with several processes: a sampler without ``round_up`` gives
    the processes different counts, and the agreement after a batch must be
    made by all of them.
    """
    try:
        count = len(loop.dataloader)
    except TypeError:  # an iterable dataset: no agreement during the loop
        count = 0
    if get_world_size() > 1:
        value = torch.tensor([count], dtype=torch.int64)
        all_reduce(value, op='min')
        count = int(value.item())
    return count


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Stop cleanly on SIGTERM / SIGUSR1: checkpoint, then exit with status 75.

    The signal handlers set a flag.  After each training iteration the
    flag is agreed on by all processes (one all-reduce of an int), so a signal
    received by any process stops every process after the same iteration;
    then a checkpoint of that iteration is written (rank 0, atomically, through
    the run's ``CheckpointHook``) and every process raises
    ``SystemExit(PREEMPTED_EXIT_CODE)``, which works under any training tool.
    Slurm's ``--signal=USR1@120`` leaves two minutes for this.

    A validation inside training is not waited for: the flag is agreed on
    after each of its batches too, and the checkpoint written then records
    that the validation is pending (in mmengine's message hub, which the
    checkpoint holds); a resumed run runs it before it trains on, so no
    validation (nor its ``save_best`` checkpoint) is lost.  In an
    iteration-based loop the processes exit at the loop's next step after the
    checkpoint: the loop's end (``stop_training`` is set, so no further batch is
    loaded), or the validation that follows the iteration, which is then
    recorded as pending too.

    A signal that comes before the run's first training iteration has
    finished (while the checkpoint is loaded, mmengine replays the batches of
    a resumed run or ``torch.compile`` compiles; or in a validation / test
    run) exits at once with the same status in a single-process run: nothing
    has been trained since the last checkpoint.  With several processes it
    waits for the iteration (or batch), as later ones do: a process exiting
    alone could leave the others in a collective.

    Args:
        signals: signal names to handle. Defaults to SIGTERM and SIGUSR1.
        check_interval: with several processes, agree on the flag every this
            many iterations (and validation / test batches); a single process
            checks it after every one. Defaults to 1.
    """

    # after CheckpointHook (VERY_LOW), so a regular save of the same iteration comes first
    priority = 'LOWEST'

    def __init__(self, signals=('SIGTERM', 'SIGUSR1'), check_interval: int = 1) -> None:
        self.flag = PreemptionFlag(signals)
        self.check_interval = check_interval
        self._agreed: tuple = (None, False)  # (iteration, verdict) from NonFiniteLossHook
        self._training = False  # between before_train and after_train
        self._rerunning_validation = False  # the pending validation of a resumed run
        self._eval_batches = 0  # batches of the running val / test loop all processes run
        #: a stop agreed on after an iteration of an iteration-based loop, whose
        #: checkpoint is written: the processes exit at the loop's next step
        self._deferred = False
        self._deferred_path: Optional[str] = None

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

    def before_train(self, runner) -> None:
        """Run the validation a preemption interrupted before the checkpoint resumed from."""
        if isinstance(runner, FlexibleRunner):  # saves come in training only
            check_rank0_saves(type(runner.strategy), type(self).__name__)
        self._training = True
        # the marker of an earlier preemption: this training run decides anew (a test
        # run in the same work dir leaves it alone)
        if is_main_process():
            try:
                os.remove(osp.join(runner.work_dir, PREEMPTED_MARKER))
            except FileNotFoundError:
                pass
        pending = runner.message_hub.get_info(PENDING_VALIDATION)
        if pending is None:
            return
        runner.message_hub.update_info(PENDING_VALIDATION, None)
        if pending != runner.iter or runner.val_loop is None:
            return
        runner.logger.info(f'the validation after iteration {pending} was interrupted by a '
                           'preemption: running it before training goes on')
        # with the random states the interrupted run validated with (RNGStateHook
        # restores them again before the first new batch)
        for hook in runner.hooks:
            if isinstance(hook, RNGStateHook):
                hook.restore_resumed()
        # the checkpoint on disk records it as pending: a stop during it writes nothing
        self._rerunning_validation = True
        try:
            runner.val_loop.run()
        finally:
            self._rerunning_validation = False

    def after_train(self, runner) -> None:
        self._training = False

    def _stop_agreed(self, runner) -> bool:
        """Whether the processes agree to stop after this training iteration."""
        agreed_iter, agreed = self._agreed
        if agreed_iter == runner.iter:  # agreed on during this iteration's optimizer step
            return agreed
        if get_world_size() == 1:
            return self.flag.received is not None
        if (runner.iter + 1) % self.check_interval:  # the same iterations on every process
            return False
        return agree(self.flag.received is not None)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self.flag.exit_at_once = None
        if not self._stop_agreed(runner):
            return
        hook = _checkpoint_hook(runner)
        if isinstance(runner.train_loop, IterBasedTrainLoop):
            # mmengine validates after this iteration or not (its interval, its version's
            # rule for the last iteration): its next step tells, before_val or
            # after_train_epoch.  stop_training (what mmengine's EarlyStoppingHook sets)
            # ends the loop without fetching another batch.  Where a validation is due,
            # the checkpoint is written once, at its start, with the validation pending
            # (a second write of a large checkpoint could overrun the grace period)
            due = _validation_due(runner)
            path = save_checkpoint_now(hook, runner) if hook is not None and not due else None
            self._deferred, self._deferred_path = True, path
            runner.train_loop.stop_training = True
            return
        path = save_checkpoint_now(hook, runner) if hook is not None else None
        self._exit(runner, f'after iteration {runner.iter + 1}: checkpoint {path} written')

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self._deferred:  # a loop that ignores stop_training: no validation came
            self._exit_deferred(runner)

    def after_train_epoch(self, runner) -> None:
        if self._deferred:  # the stopped iteration was the last, or no validation came
            self._exit_deferred(runner)

    def before_val(self, runner) -> None:
        if self._deferred:  # the stopped iteration is followed by a validation
            self._stop_in_validation(runner, started=False)
        self._eval_batches = _batches_of_every_process(runner.val_loop)

    def before_test(self, runner) -> None:
        self._eval_batches = _batches_of_every_process(runner.test_loop)

    def after_val_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._check_after_batch(runner, batch_idx, 'validation')

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._check_after_batch(runner, batch_idx, 'test')

    def _check_after_batch(self, runner, batch_idx: int, stage: str) -> None:
        if get_world_size() == 1:
            stop = self.flag.received is not None
        elif batch_idx >= self._eval_batches or (batch_idx + 1) % self.check_interval:
            return
        else:
            stop = agree(self.flag.received is not None)
        if not stop:
            return
        if self._training and not self._rerunning_validation:
            self._stop_in_validation(runner, started=True, pending=stage == 'validation')
        else:
            self._exit(runner, f'during the {stage}: nothing new to save',
                       resume=self._training)

    def _stop_in_validation(self, runner, started: bool, pending: bool = True) -> None:
        """Checkpoint the training state with the validation pending, then exit.

        ``started``: called after a validation (test) batch, when an ``EMAHook``
        has put the averaged weights into the model (``before_val_epoch``); they
        are swapped back first (its ``after_val_epoch``, which only swaps in
        mmengine's hook), or the checkpoint would hold them as the training
        weights and the training weights as the average.  ``pending``: record
        the validation as pending (not for a test loop run inside training).
        """
        if started:
            for hook in runner.hooks:
                if isinstance(hook, EMAHook):
                    hook.after_val_epoch(runner)
        if pending:
            runner.message_hub.update_info(PENDING_VALIDATION, runner.iter)
        hook = _checkpoint_hook(runner)
        if hook is None:
            self._exit(runner, f'at the validation after iteration {runner.iter}: no '
                       'CheckpointHook, nothing saved')
        path = save_checkpoint_now(hook, runner, during_validation=True)
        then = ', the validation runs when the run resumes' if pending else ''
        self._exit(runner, f'at the validation after iteration {runner.iter}: checkpoint {path} '
                   f'written{then}')

    def _why(self) -> str:
        return f'received {self.flag.name}' if self.flag.received else \
            'another process received a stop signal'

    def _exit_deferred(self, runner) -> None:
        hook = _checkpoint_hook(runner)
        if self._deferred_path is None and hook is not None:  # a validation was due, none came
            self._deferred_path = save_checkpoint_now(hook, runner, counted=True)
        self._exit(runner, f'after iteration {runner.iter}: checkpoint {self._deferred_path} '
                   'written')

    def _exit(self, runner, what: str, resume: bool = True) -> None:
        """Log why and what was saved, then raise ``SystemExit(75)``."""
        then = 'restart with --resume to continue' if resume else 'run it again'
        message = (f'preempted ({self._why()}) {what}; exiting with status '
                   f'{PREEMPTED_EXIT_CODE} ({then})')
        runner.logger.warning(message)
        # a training run's, before any process exits (the others wait for rank 0 at the
        # teardown barrier) and while a second signal is still only recorded
        if resume and self._training and is_main_process():
            marker = osp.join(runner.work_dir, PREEMPTED_MARKER)
            try:
                atomic_write(message + '\n', marker)
            except OSError as err:  # the checkpoint is written; exit with 75 all the same
                runner.logger.warning(f'could not write {marker}: {err}')
        self.flag.uninstall()
        raise SystemExit(PREEMPTED_EXIT_CODE)

    def after_run(self, runner) -> None:
        self.flag.uninstall()
