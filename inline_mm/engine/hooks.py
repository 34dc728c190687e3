"""mmengine hooks for multi-process logging, exact resumption and fault tolerance.

* :class:`MeanLossLoggerHook`: with several processes, mmengine logs the losses
  of rank 0's part of the batch only.  This hook replaces the logged
  ``*loss*`` values by their mean over all processes (what mmdet 2.x logged),
  so a run on N processes logs the loss of the whole batch.
* :class:`RNGStateHook`: stores every process's torch / numpy / python random
  states in each checkpoint and restores them on resume right before the first
  batch after the checkpoint is drawn, so a resumed run draws the same
  augmentations and samples as an uninterrupted one.
* :class:`AtomicCheckpointHook`: ``CheckpointHook`` whose files and
  ``last_checkpoint`` pointer are written atomically, which deletes old
  checkpoints only after the new one is in place, and which makes ``--resume``
  take the newest *readable* checkpoint.
* :class:`PreemptionHook`: SIGTERM / SIGUSR1 stop every process after the
  current iteration, with a checkpoint, and exit status
  :data:`~inline_mm.engine.signals.PREEMPTED_EXIT_CODE` (75).

:class:`~inline_mm.engine.nonfinite.NonFiniteLossHook` (a NaN / Inf loss or
gradient skips the optimizer step) lives in its own module; it carries the
preemption flag of :class:`PreemptionHook` in its one per-step host sync.
"""
import functools
import os
import os.path as osp
import random
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from mmengine.dist import all_gather_object, all_reduce, broadcast_object_list, \
    get_rank, get_world_size, is_main_process
from mmengine.hooks import CheckpointHook, Hook
from mmengine.registry import HOOKS

from .atomic_io import ATOMIC_BACKEND, atomic_write, remove_stale_temp_files
from .checkpoint_files import CheckpointWriteError, newest_readable_checkpoint
from ..checkpoint import mmengine_checkpoint_globals
from .loops import ResumableEpochBasedTrainLoop
from .signals import PREEMPTED_EXIT_CODE, PreemptionFlag


#: file name start of the mid-epoch checkpoints written on preemption
PREEMPT_PREFIX = 'preempt_iter_'


def _agree(flag: bool) -> bool:
    """True on every process when ``flag`` is True on any (one all-reduce)."""
    if get_world_size() == 1:
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    all_reduce(value, op='max')  # mmengine.dist moves it to the backend's device
    return bool(value.item())


@HOOKS.register_module()
class MeanLossLoggerHook(Hook):
    """Average the logged losses of this iteration over all processes.

    Runs before mmengine's ``RuntimeInfoHook`` and replaces the loss values of
    the iteration's outputs by their mean, so the message hub (and every
    logger reading it) gets the averages through its public API.
    """

    # before RuntimeInfoHook (VERY_HIGH) writes the outputs into the message hub
    priority = 'HIGHEST'

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if get_world_size() == 1 or not outputs:
            return
        keys = sorted(k for k in outputs if 'loss' in k)
        if not keys:
            return
        # stacked and reduced on the device of the losses: no host read here (mmengine's
        # RuntimeInfoHook reads the values it logs anyway)
        device = next((outputs[k].device for k in keys if isinstance(outputs[k], torch.Tensor)),
                      torch.device('cpu'))
        values = torch.stack([torch.as_tensor(outputs[k], device=device).detach().to(
            torch.float64).reshape(()) for k in keys])
        all_reduce(values, op='mean')
        for i, key in enumerate(keys):
            outputs[key] = values[i]


def _capture_rng() -> Dict[str, Any]:
    """This process's random states, as tensors and numbers (``weights_only`` loadable)."""
    py = random.getstate()
    np_state = np.random.get_state()
    state: Dict[str, Any] = dict(
        torch=torch.get_rng_state(), python=list(py[1]), python_version=py[0],
        python_gauss=py[2] or 0.0,
        numpy_keys=torch.from_numpy(np_state[1].astype(np.int64)),
        numpy_pos=int(np_state[2]), numpy_has_gauss=int(np_state[3]),
        numpy_gauss=float(np_state[4]))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state['torch'])
    random.setstate((state['python_version'], tuple(state['python']),
                     state['python_gauss'] or None))
    np.random.set_state(('MT19937', state['numpy_keys'].numpy().astype(np.uint32),
                         state['numpy_pos'], state['numpy_has_gauss'], state['numpy_gauss']))
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


class _RestoreBeforeFetch:
    """Iterator proxy: restores random states right before the ``skip + 1``-th batch.

    mmengine's ``IterBasedTrainLoop`` replays the ``skip`` batches trained
    before the checkpoint (which draws random augmentations in the main
    process when ``num_workers=0``) and then fetches the first new batch
    before any hook runs; the states must be back in place exactly between
    the two.
    """

    def __init__(self, iterator: Any, skip: int, restore: Callable[[], None]) -> None:
        self._iterator = iterator
        self._skip = skip
        self._restore: Optional[Callable[[], None]] = restore
        self._count = 0

    def __iter__(self) -> '_RestoreBeforeFetch':
        return self

    def __next__(self) -> Any:
        if self._count == self._skip and self._restore is not None:
            self._restore()
            self._restore = None
        self._count += 1
        return next(self._iterator)

    def __getattr__(self, name: str) -> Any:
        if name.startswith('_'):
            raise AttributeError(name)
        return getattr(self._iterator, name)


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Save every process's random states in checkpoints and restore them on resume.

    With :class:`AtomicCheckpointHook`, the states of all processes are
    gathered before each save (rank ``r`` resumes with its own); with plain
    ``CheckpointHook`` only rank 0's are saved.  On resume the states are
    restored right before the first new batch is drawn (after mmengine's
    replay of the batches already trained), so random augmentation in the
    main process (``num_workers=0``) matches an uninterrupted run; data-loader
    workers are seeded from the run's seed and replay the same batches, so
    their augmentations match as well.
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._pending: Optional[Dict[str, Any]] = None
        self._gathered: Optional[List[Dict[str, Any]]] = None

    def gather(self) -> None:
        """Collect the states of every process; call on all processes before a save."""
        state = _capture_rng()
        self._gathered = all_gather_object(state) if get_world_size() > 1 else [state]

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        states, self._gathered = self._gathered, None
        checkpoint['rng_states'] = states if states is not None else [_capture_rng()]

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        states = checkpoint.get('rng_states')
        if states is None and 'rng_state' in checkpoint:  # written by an older version
            states = [checkpoint['rng_state']]
        if not states:
            return
        rank = get_rank()
        if len(states) != get_world_size():
            runner.logger.warning(
                f'the checkpoint holds the random states of {len(states)} process(es), this '
                f'run has {get_world_size()}: every process restores rank 0\'s states, so '
                f'random draws will not repeat those of the interrupted run exactly')
            rank = 0
        self._pending = states[rank]

    def before_train(self, runner) -> None:
        state, self._pending = self._pending, None
        if state is None:
            return
        loop = runner.train_loop
        if hasattr(loop, 'dataloader_iterator'):  # IterBasedTrainLoop
            loop.dataloader_iterator = _RestoreBeforeFetch(
                loop.dataloader_iterator, loop.iter, lambda: _restore_rng(state))
        elif isinstance(loop, ResumableEpochBasedTrainLoop):  # after its replay
            loop.before_first_new_batch = lambda: _restore_rng(state)
        else:  # mmengine's epoch-based loop restarts its epoch: restore now
            _restore_rng(state)


def _scope_checkpoint_globals(runner) -> None:
    """Make ``runner.load_or_resume`` allow mmengine's runner checkpoint types while it loads.

    torch >= 2.6 loads with ``weights_only=True``, which refuses what mmengine
    pickles into its own checkpoints (the message hub); the Runner calls its
    public ``load_or_resume()`` right after the ``before_run`` hooks.  The
    allow-list applies inside that call only
    (:func:`~inline_mm.checkpoint.mmengine_checkpoint_globals`): torch's
    allow-list is unchanged before and after, also when the load fails.
    """
    load_or_resume = runner.load_or_resume
    if getattr(load_or_resume, 'inline_mm_scoped', False):
        return

    @functools.wraps(load_or_resume)
    def scoped_load_or_resume() -> None:
        with mmengine_checkpoint_globals():
            return load_or_resume()

    scoped_load_or_resume.inline_mm_scoped = True  # type: ignore[attr-defined]
    runner.load_or_resume = scoped_load_or_resume


def _read_pointer(folder: str) -> Optional[str]:
    """What the ``last_checkpoint`` file of ``folder`` names (None: no file)."""
    path = osp.join(folder, 'last_checkpoint')
    if not osp.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip()


def _point_to(runner, choice: Optional[str]) -> None:
    """Make ``last_checkpoint`` name ``choice`` (or remove it for None), where it does not.

    mmengine's ``--resume`` without a file (``resume=True``, no ``load_from``)
    resumes from what this pointer names, and from nothing when it is absent.
    """
    folder = runner.work_dir
    if _read_pointer(folder) == choice:
        return
    pointer = osp.join(folder, 'last_checkpoint')
    if choice is not None:
        atomic_write(choice, pointer)
    elif osp.isfile(pointer):
        runner.logger.warning(f'--resume: removed {pointer}, which names no readable '
                              f'checkpoint')
        os.remove(pointer)


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` that never leaves a torn checkpoint or a dangling pointer.

    * every checkpoint file and the ``last_checkpoint`` pointer are written to
      a temp file in the same folder, fsynced and renamed into place (see
      :func:`~inline_mm.engine.atomic_io.atomic_write`);
    * with ``max_keep_ckpts``, the oldest checkpoint is deleted only after the
      new one and the pointer are in place;
    * a write that fails (read-only folder, full disk) stops the run with a
      :class:`~inline_mm.engine.checkpoint_files.CheckpointWriteError` naming the
      path; the previous checkpoint and the pointer are untouched;
    * with ``resume=True`` and no checkpoint named (``--resume`` alone), it
      picks the newest checkpoint of the work dir that passes an integrity
      check, logging each newer unreadable one, and points ``last_checkpoint``
      at it before the Runner resumes (mmengine resumes from what it names);
    * mmengine's own load of the checkpoint (``Runner.load_or_resume``)
      accepts the types mmengine pickles into runner checkpoints on torch >= 2.6,
      during that load only.

    Arguments are those of mmengine's ``CheckpointHook``.  Saves go through
    the atomic local backend unless ``backend_args`` / ``file_client_args``
    name another storage.  The periodic saves (``after_train_iter`` /
    ``after_train_epoch``, the public hook methods) are this class's own; a
    ``save_best`` checkpoint is written by mmengine's hook as it is.
    """

    def before_run(self, runner) -> None:
        _scope_checkpoint_globals(runner)
        cfg = runner.cfg
        if not (cfg.get('resume', False) and cfg.get('load_from') is None):
            return
        choice: List[Optional[str]] = [None]
        if is_main_process():
            folder = runner.work_dir
            removed = remove_stale_temp_files(folder)
            if removed:
                runner.logger.warning(f'removed temp files of interrupted writes in {folder}: '
                                      f'{", ".join(removed)}')
            choice[0] = newest_readable_checkpoint(folder, self.filename_tmpl, runner.logger)
            if choice[0] is None:
                runner.logger.warning(f'--resume: no readable checkpoint in {folder}; '
                                      f'training starts from the beginning')
            else:
                runner.logger.info(f'--resume: resuming from {choice[0]}')
            _point_to(runner, choice[0])
        if get_world_size() > 1:  # after rank 0 wrote the pointer
            broadcast_object_list(choice)
            if not is_main_process():  # a work dir of this node's own
                _point_to(runner, choice[0])

    def before_train(self, runner) -> None:
        if self.backend_args is None and self.file_client_args is None:
            out_dir = self.out_dir if self.out_dir is not None else runner.work_dir
            if '://' not in str(out_dir):
                self.backend_args = dict(backend=ATOMIC_BACKEND)
        super().before_train(runner)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Save every ``interval`` iterations (from ``save_begin``) and at the last one."""
        if self.by_epoch:
            return
        if self.every_n_train_iters(runner, self.interval, self.save_begin) or \
                (self.save_last and self.is_last_train_iter(runner)):
            runner.logger.info(f'Saving checkpoint at {runner.iter + 1} iterations')
            step = runner.iter + 1
            self.save_step(runner, step, dict(epoch=runner.epoch, iter=step))

    def after_train_epoch(self, runner) -> None:
        """Save every ``interval`` epochs (from ``save_begin``) and after the last one."""
        if not self.by_epoch:
            return
        if self.every_n_epochs(runner, self.interval, self.save_begin) or \
                (self.save_last and self.is_last_train_epoch(runner)):
            runner.logger.info(f'Saving checkpoint at {runner.epoch + 1} epochs')
            step = runner.epoch + 1
            self.save_step(runner, step, dict(epoch=step, iter=runner.iter))

    def save_now(self, runner, meta: Optional[dict] = None) -> str:
        """Save a checkpoint of the current iteration now (unless one was just written).

        Returns the path of the checkpoint of this iteration.  Called on every
        process (ranks > 0 take part in gathering the random states).
        """
        return save_checkpoint_now(self, runner)

    def save_step(self, runner, step: int, meta: dict) -> None:
        """Write the checkpoint of ``step`` (``filename_tmpl``), then drop the oldest kept."""
        remove: List[int] = []
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and
                                            self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                remove.append(self.keep_ckpt_ids.popleft())  # deleted after the save
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))
        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, ckpt_filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        _write_checkpoint(self, runner, ckpt_filename, meta,
                          [self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(s))
                           for s in remove])


def save_checkpoint_now(hook: CheckpointHook, runner) -> str:
    """Save the checkpoint of the current iteration through ``hook`` (unless just written).

    Works with any ``CheckpointHook`` (its public settings: ``out_dir``,
    ``filename_tmpl``, ``by_epoch``, ``file_backend`` ...).  Epoch-based runs
    write ``preempt_iter_<n>.pth`` (mid-epoch: the epoch is not finished).
    Returns the path of the checkpoint of this iteration.  Called on every
    process (ranks > 0 take part in gathering the random states).
    """
    if hook.by_epoch:
        name = f'{PREEMPT_PREFIX}{runner.iter + 1}.pth'
        path = hook.file_backend.join_path(hook.out_dir, name)
        if runner.message_hub.get_info('last_ckpt') != path:
            _write_checkpoint(hook, runner, name, dict(epoch=runner.epoch, iter=runner.iter + 1),
                              remove=[])
            runner.message_hub.update_info('last_ckpt', path)
        return path
    step = runner.iter + 1
    path = hook.file_backend.join_path(hook.out_dir, hook.filename_tmpl.format(step))
    if runner.message_hub.get_info('last_ckpt') != path:
        if isinstance(hook, AtomicCheckpointHook):
            hook.save_step(runner, step, dict(epoch=runner.epoch, iter=step))
        else:  # mmengine's hook keeps no count we could update: a checkpoint beside them
            hook.last_ckpt = path
            runner.message_hub.update_info('last_ckpt', path)
            _write_checkpoint(hook, runner, hook.filename_tmpl.format(step),
                              dict(epoch=runner.epoch, iter=step), remove=[])
    return path


def _write_checkpoint(hook: CheckpointHook, runner, filename: str, meta: dict,
                      remove: List[str]) -> None:
    """Write a checkpoint and the pointer (rank 0), agree on success, then delete ``remove``."""
    for other in runner.hooks:
        if isinstance(other, RNGStateHook):
            other.gather()
    path = hook.file_backend.join_path(hook.out_dir, filename)
    error: Optional[BaseException] = None
    if is_main_process():
        try:
            runner.save_checkpoint(
                hook.out_dir, filename, hook.file_client_args,
                save_optimizer=hook.save_optimizer,
                save_param_scheduler=hook.save_param_scheduler, meta=meta,
                by_epoch=hook.by_epoch, backend_args=hook.backend_args, **hook.args)
            atomic_write(path, osp.join(runner.work_dir, 'last_checkpoint'))
        except OSError as err:
            error = err
    if _agree(error is not None):
        previous = _previous_checkpoints(runner, path)
        where = path  # the checkpoint the user looks for, not the temp file
        reason = getattr(error, 'strerror', None) or str(error) if error else \
            'the process of rank 0 could not write it'
        raise CheckpointWriteError(
            f'cannot write checkpoint {where}: {reason}. Nothing was overwritten: '
            f'{"the previous checkpoint " + previous[0] + " and " if previous else ""}'
            f'{osp.join(runner.work_dir, "last_checkpoint")} are intact; free space or '
            f'make the work dir writable, then resume with --resume') from error
    if is_main_process():
        if not filename.startswith(PREEMPT_PREFIX):  # a later checkpoint replaces them
            remove = remove + _preempt_checkpoints(hook)
        for old in remove:
            if old == path:
                continue
            if hook.file_backend.isfile(old):
                hook.file_backend.remove(old)
            elif hook.file_backend.isdir(old):  # deepspeed checkpoints are folders
                hook.file_backend.rmtree(old)


def _preempt_checkpoints(hook: CheckpointHook) -> List[str]:
    """The mid-epoch checkpoints of preemptions in the hook's output folder."""
    folder = str(hook.out_dir)
    if '://' in folder or not osp.isdir(folder):
        return []
    return [osp.join(folder, name) for name in sorted(os.listdir(folder))
            if name.startswith(PREEMPT_PREFIX) and name.endswith('.pth')]


def _previous_checkpoints(runner, failed: str) -> List[str]:
    named = _read_pointer(runner.work_dir)
    if named and named != failed and osp.isfile(named):
        return [named]
    return []


def _checkpoint_hook(runner) -> Optional[CheckpointHook]:
    for hook in runner.hooks:
        if isinstance(hook, CheckpointHook):
            return hook
    return None


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Stop cleanly on SIGTERM / SIGUSR1: checkpoint, then exit with status 75.

    The signal handlers only set a flag.  After each training iteration the
    flag is agreed on by all processes (one all-reduce of an int), so a signal
    received by any process stops every process after the same iteration;
    then a checkpoint of that iteration is written (rank 0, atomically, through
    :class:`AtomicCheckpointHook`) and every process raises
    ``SystemExit(PREEMPTED_EXIT_CODE)``, which works under any training tool.
    Slurm's ``--signal=USR1@120`` leaves two minutes for this.

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

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        agreed_iter, agreed = self._agreed
        if agreed_iter == runner.iter:  # agreed on during this iteration's optimizer step
            if not agreed:
                return
        elif (runner.iter + 1) % self.check_interval and self.flag.received is None:
            return
        elif not _agree(self.flag.received is not None):
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
