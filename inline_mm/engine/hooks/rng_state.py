"""Random states in checkpoints, restored on resume right before the next new batch.

mmengine saves no random state in its checkpoints, so a resumed run draws other
augmentations and samples than an uninterrupted one.  :class:`RNGStateHook`
stores every process's torch / numpy / python random states in each checkpoint
and restores them on resume right before the first batch after the checkpoint
is drawn (after mmengine's replay of the batches already trained).
"""
import random
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..loops import ResumableEpochBasedTrainLoop


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
        # the device this process trains on; all visible devices' states would not load
        # where a resumed job sees fewer of them (one GPU per task)
        state['cuda_device'] = torch.cuda.get_rng_state()
    return state


def _restore_rng(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state['torch'])
    random.setstate((state['python_version'], tuple(state['python']),
                     state['python_gauss'] or None))
    np.random.set_state(('MT19937', state['numpy_keys'].numpy().astype(np.uint32),
                         state['numpy_pos'], state['numpy_has_gauss'], state['numpy_gauss']))
    if not torch.cuda.is_available():
        return
    if 'cuda_device' in state:
        torch.cuda.set_rng_state(state['cuda_device'])
    elif 'cuda' in state:  # checkpoints of earlier versions: every visible device's state
        device = torch.cuda.current_device()
        if device < len(state['cuda']):
            torch.cuda.set_rng_state(state['cuda'][device])


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

    def skip_iter(self, num_iters: int) -> None:
        """OneDL's mmengine replays the trained batches through the iterator's
        ``skip_iter`` (a sampler fast-forward that loads no data) instead of ``skip``
        calls of ``next``: they count as replayed all the same."""
        self._iterator.skip_iter(num_iters)
        self._count += num_iters

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
    their augmentations match as well (in epoch-based loops only where workers
    start afresh each epoch, which
    :class:`~inline_mm.engine.loops.ResumableEpochBasedTrainLoop` sees to).
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._pending: Optional[Dict[str, Any]] = None
        self._gathered: Optional[List[Dict[str, Any]]] = None
        self._before_val: Optional[Dict[str, Any]] = None
        self._resumed: Optional[Dict[str, Any]] = None  # this process's states of the resume

    def gather(self) -> None:
        """Collect the states of every process; call on all processes before a save."""
        state = self._training_rng()
        self._gathered = all_gather_object(state) if get_world_size() > 1 else [state]

    def _training_rng(self) -> Dict[str, Any]:
        """The states training goes on with: during validation (a ``save_best``
        checkpoint), those from before it, which :meth:`after_val` puts back."""
        return self._before_val if self._before_val is not None else _capture_rng()

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        states, self._gathered = self._gathered, None
        checkpoint['rng_states'] = states if states is not None else [self._training_rng()]

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

    def before_val(self, runner) -> None:
        self._before_val = _capture_rng()

    def after_val(self, runner) -> None:
        """Validation leaves the random states as it found them.

        A loader draws its workers' base seed from the main process's torch
        generator whenever it starts an iterator: a resumed run's first
        validation starts one where an uninterrupted run reuses its persistent
        workers, and training after it would draw differently.
        """
        state, self._before_val = self._before_val, None
        if state is not None:
            _restore_rng(state)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._before_val = None  # a validation that raised (caught by a caller) is over

    def restore_resumed(self) -> None:
        """Put back the random states of the checkpoint resumed from (if any), now.

        For work a resumed run does before its first new batch that an
        uninterrupted run did with those states: the validation
        :class:`PreemptionHook` runs again, whose ``save_best`` checkpoint
        stores the states from before it.
        """
        if self._resumed is not None:
            _restore_rng(self._resumed)

    def before_train(self, runner) -> None:
        state, self._pending = self._pending, None
        self._resumed = state
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
