"""Checkpoints that are never torn, and ``--resume`` from the newest readable one.

mmengine's ``CheckpointHook`` writes in place: a run killed mid-write leaves a
torn file that ``last_checkpoint`` names, and with ``max_keep_ckpts`` the old
checkpoint is deleted before the new one exists.  :class:`AtomicCheckpointHook`
writes every file and the pointer atomically, deletes old checkpoints only
after the new one is in place, stops with a one-line error when a write fails,
makes ``--resume`` take the newest *readable* checkpoint, and keeps the previous
``save_best`` checkpoint until its replacement is written.
:func:`save_checkpoint_now` writes the checkpoint of the current iteration
through any ``CheckpointHook`` (what :class:`PreemptionHook` saves with).
"""
import os
import os.path as osp
from typing import Callable, List, Optional

import torch
from mmengine.dist import all_reduce, broadcast_object_list, get_world_size, is_main_process
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS
from mmengine.runner import FlexibleRunner

from ..atomic_io import ATOMIC_BACKEND, remove_stale_temp_files
from ..checkpoint_files import (CheckpointWriteError, hold_best_checkpoints,
                                newest_readable_checkpoint, point_to, read_pointer,
                                recover_held_best, settle_held_best)
from .rng_state import RNGStateHook
from .runner_access import check_rank0_saves, save_through_strategy, scope_load_or_resume

#: file name start of the mid-epoch checkpoints written on preemption
PREEMPT_PREFIX = 'preempt_iter_'


def agree(flag: bool) -> bool:
    """True on every process when ``flag`` is True on any (one all-reduce)."""
    if get_world_size() == 1:
        return flag
    # its own read (not nonfinite.agree_on_flags): the host-sync accounting of
    # tests/test_host_syncs.py tells the step's verdict and this agreement apart by site
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    all_reduce(value, op='max')  # mmengine.dist moves it to the backend's device
    return bool(value.item())


def _stop_on_every_rank(error: Optional[Exception], message: Callable[[str], str]) -> None:
    """After rank 0 wrote (or failed to): raise on every process when it failed.

    An ``OSError`` (a full disk, a read-only folder) becomes a
    :class:`CheckpointWriteError` with ``message(reason)``; any other error keeps
    its own traceback.  The other processes raise a ``CheckpointWriteError``
    too, instead of waiting in their next collective until the process group
    times out.  One all-reduce, on every process.
    """
    if not agree(error is not None):
        return
    if error is not None and not isinstance(error, OSError):
        raise error
    reason = (error.strerror or str(error)) if error is not None else \
        'the process of rank 0 could not write it (its log says why)'
    raise CheckpointWriteError(message(reason)) from error


def _best_records(runner) -> dict:
    """The ``best_*`` entries of mmengine's message hub (score and path per metric).

    They change exactly when ``save_best`` saves a new best checkpoint.
    """
    return {k: v for k, v in runner.message_hub.runtime_info.items() if k.startswith('best_')}


def _is_local(path) -> bool:
    """Whether ``path`` is on the local file system (not a ``scheme://`` storage)."""
    return '://' not in str(path)


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
      during that load only;
    * with ``save_best``, mmengine deletes the previous best checkpoint before
      it writes the new one: a hard link keeps the previous one until the new
      one is in place, a failed write puts it back and stops the run with a
      :class:`~inline_mm.engine.checkpoint_files.CheckpointWriteError`, and
      the next run puts it back where a run died in between;
    * after a new best, mmengine writes the periodic checkpoint again (deleting
      the oldest kept one before it writes); here that write is :meth:`save_step`;
    * a write that fails on rank 0 for any reason stops every process with an
      error at once (not after the process group's timeout).

    Arguments are those of mmengine's ``CheckpointHook``.  Saves go through
    the atomic local backend unless ``backend_args`` / ``file_client_args``
    name another storage.  The periodic saves (``after_train_iter`` /
    ``after_train_epoch``, the public hook methods) are this class's own; a
    ``save_best`` checkpoint is written by mmengine's ``after_val_epoch``,
    around which this class holds the previous one (with ``last_ckpt`` unset,
    so that mmengine leaves the re-save of the periodic checkpoint to it).
    """

    def before_run(self, runner) -> None:
        if isinstance(runner, FlexibleRunner) and runner.cfg.get('resume', False) and \
                getattr(runner.load_or_resume, 'inline_mm_before', None) is None:
            # FlexibleRunner loads before the before_run hooks: too late here
            runner.logger.warning(
                'FlexibleRunner built outside inline-mm\'s tools: --resume took what '
                'last_checkpoint names without the integrity check and on torch >= 2.6 '
                'fails on the types mmengine pickles; train with inline-mm\'s tools/train.py')
        self.prepare_resume(runner)

    def prepare_resume(self, runner) -> None:
        """Make the runner's ``load_or_resume`` pick the checkpoint and allow mmengine's types.

        mmengine's ``Runner`` loads right after the ``before_run`` hooks, which
        call this; ``FlexibleRunner`` loads before them, so inline-mm's tools
        call it as soon as the runner is built
        (:func:`~inline_mm.engine.runners.build_runner`).
        """
        before = scope_load_or_resume(runner)
        if self._pick_resume_checkpoint not in before:
            before.append(self._pick_resume_checkpoint)

    def _pick_resume_checkpoint(self, runner) -> None:
        """``--resume`` without a file: point ``last_checkpoint`` at the newest readable one."""
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
            point_to(runner.work_dir, choice[0], runner.logger)
        if get_world_size() > 1:  # after rank 0 wrote the pointer
            broadcast_object_list(choice)
            if not is_main_process():  # a work dir of this node's own
                point_to(runner.work_dir, choice[0], runner.logger)

    def before_train(self, runner) -> None:
        if isinstance(runner, FlexibleRunner):  # saves come in training only
            check_rank0_saves(type(runner.strategy), type(self).__name__)
        if self.backend_args is None and self.file_client_args is None:
            out_dir = self.out_dir if self.out_dir is not None else runner.work_dir
            if _is_local(out_dir):
                self.backend_args = dict(backend=ATOMIC_BACKEND)
        super().before_train(runner)  # resolves out_dir
        if self.save_best and is_main_process() and _is_local(self.out_dir):
            try:
                recover_held_best(str(self.out_dir), self.filename_tmpl, runner.logger)
            except OSError as err:
                runner.logger.warning(f'could not settle the held best checkpoints of '
                                      f'{self.out_dir} ({err}); the .held links stay')

    def after_val_epoch(self, runner, metrics) -> None:
        """mmengine's ``save_best``, the previous best kept until the new one is written.

        After a new best, mmengine writes the periodic checkpoint of this step
        again (so that it records the new best, which a resumed run then knows
        to replace); that write goes through :meth:`save_step` here, atomic and
        deleting an old checkpoint only after it.
        """
        if not self.save_best:
            return super().after_val_epoch(runner, metrics)
        folder = str(self.out_dir)
        hold = is_main_process() and _is_local(folder)
        before = _best_records(runner)
        # mmengine re-saves the periodic checkpoint itself when ``last_ckpt`` is set
        last_ckpt, self.last_ckpt = self.last_ckpt, None
        error: Optional[Exception] = None
        kept: List[str] = []  # previous best checkpoints put back after a failed write
        try:
            try:
                if hold:
                    hold_best_checkpoints(folder, self.filename_tmpl)
                super().after_val_epoch(runner, metrics)  # rank 0 writes
            finally:
                self.last_ckpt = last_ckpt
                if hold:  # also on a KeyboardInterrupt
                    kept = self._settle(runner, folder)
        except Exception as err:  # every rank learns of it below
            error = err
        still = f'The previous best checkpoint {", ".join(kept)} is kept. ' if kept else ''
        _stop_on_every_rank(error, lambda reason: (
            f'cannot write the best checkpoint in {folder}: {reason}. {still}'
            f'Free space or make the work dir writable, then resume with --resume'))
        if last_ckpt is not None and _best_records(runner) != before:
            step = runner.epoch if self.by_epoch else runner.iter
            self.save_step(runner, step, dict(epoch=runner.epoch, iter=runner.iter))

    def _settle(self, runner, folder: str) -> List[str]:
        """:func:`settle_held_best`; a failure there is logged, not raised (the write's own
        outcome decides; the next run settles what is left)."""
        try:
            return settle_held_best(folder, self.filename_tmpl)
        except OSError as err:
            runner.logger.warning(f'could not settle the held best checkpoints of {folder} '
                                  f'({err}); the next run in this work dir tries again')
            return []

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


def save_checkpoint_now(hook: CheckpointHook, runner, during_validation: bool = False,
                        counted: bool = False) -> str:
    """Save the checkpoint of the training state now through ``hook``.

    Works with any ``CheckpointHook`` (its public settings: ``out_dir``,
    ``filename_tmpl``, ``by_epoch``, ``file_backend`` ...).  Called on every
    process (ranks > 0 take part in gathering the random states).  Returns the
    path of the checkpoint.

    Args:
        hook: the run's checkpoint hook.
        runner: the runner.
        during_validation: False: called in ``after_train_iter``, the checkpoint
            of the iteration ending, skipped where ``hook`` has just written it;
            epoch-based runs write ``preempt_iter_<n>.pth`` (mid-epoch: the epoch
            is not finished).  True: called in a validation inside training, the
            checkpoint of the iterations (epochs) the loop has counted before it,
            under the name ``hook`` gives that step; written even where ``hook``
            wrote it already (the message hub it holds has changed since).
        counted: with ``during_validation=False``, the loop has counted the
            iteration ending already (``runner.iter`` is its number: a hook after
            ``after_train_iter``, e.g. ``after_train_epoch``).
    """
    if during_validation:
        step = runner.epoch if hook.by_epoch else runner.iter
        return _save_step(hook, runner, step, dict(epoch=runner.epoch, iter=runner.iter))
    done = runner.iter if counted else runner.iter + 1
    if hook.by_epoch:
        name = f'{PREEMPT_PREFIX}{done}.pth'
        path = hook.file_backend.join_path(hook.out_dir, name)
        if runner.message_hub.get_info('last_ckpt') != path:
            _write_checkpoint(hook, runner, name, dict(epoch=runner.epoch, iter=done),
                              remove=[])
            runner.message_hub.update_info('last_ckpt', path)
        return path
    path = hook.file_backend.join_path(hook.out_dir, hook.filename_tmpl.format(done))
    if runner.message_hub.get_info('last_ckpt') != path:
        _save_step(hook, runner, done, dict(epoch=runner.epoch, iter=done))
    return path


def _save_step(hook: CheckpointHook, runner, step: int, meta: dict) -> str:
    """Write the checkpoint ``hook`` names for ``step``; returns its path."""
    path = hook.file_backend.join_path(hook.out_dir, hook.filename_tmpl.format(step))
    if isinstance(hook, AtomicCheckpointHook):
        hook.save_step(runner, step, meta)
    else:  # mmengine's hook keeps no count we could update: a checkpoint beside them
        hook.last_ckpt = path
        runner.message_hub.update_info('last_ckpt', path)
        _write_checkpoint(hook, runner, hook.filename_tmpl.format(step), meta, remove=[])
    return path


def _write_checkpoint(hook: CheckpointHook, runner, filename: str, meta: dict,
                      remove: List[str]) -> None:
    """Write a checkpoint and the pointer (rank 0), agree on success, then delete ``remove``."""
    for other in runner.hooks:
        if isinstance(other, RNGStateHook):
            other.gather()
    path = hook.file_backend.join_path(hook.out_dir, filename)
    backend_args = hook.backend_args
    if backend_args is None and hook.file_client_args is None and _is_local(hook.out_dir):
        # mmengine's own CheckpointHook writes in place; through it a preemption's
        # rewrite of the checkpoint just written could tear it (a kill after the grace)
        backend_args = dict(backend=ATOMIC_BACKEND)
    error: Optional[Exception] = None
    if is_main_process():
        try:
            if isinstance(runner, FlexibleRunner):
                save_through_strategy(hook, runner, filename, meta, path)
            else:
                runner.save_checkpoint(
                    hook.out_dir, filename, hook.file_client_args,
                    save_optimizer=hook.save_optimizer,
                    save_param_scheduler=hook.save_param_scheduler, meta=meta,
                    by_epoch=hook.by_epoch, backend_args=backend_args, **hook.args)
            point_to(runner.work_dir, path)
        except Exception as err:  # every rank learns of it below
            error = err
    previous = _previous_checkpoints(runner, path) if error is not None else []
    # the path named is the checkpoint the user looks for, not the temp file
    _stop_on_every_rank(error, lambda reason: (
        f'cannot write checkpoint {path}: {reason}. Nothing was overwritten: '
        f'{"the previous checkpoint " + previous[0] + " and " if previous else ""}'
        f'{osp.join(runner.work_dir, "last_checkpoint")} are intact; free space or '
        f'make the work dir writable, then resume with --resume'))
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
    if not _is_local(folder) or not osp.isdir(folder):
        return []
    return [osp.join(folder, name) for name in sorted(os.listdir(folder))
            if name.startswith(PREEMPT_PREFIX) and name.endswith('.pth')]


def _previous_checkpoints(runner, failed: str) -> List[str]:
    named = read_pointer(runner.work_dir)
    if named and named != failed and osp.isfile(named):
        return [named]
    return []
