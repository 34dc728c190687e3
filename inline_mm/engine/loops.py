"""An epoch-based training loop that resumes exactly from a mid-epoch checkpoint.

mmengine's ``EpochBasedTrainLoop`` restarts the resumed epoch from its first
batch while keeping the iteration count of the checkpoint: after a preemption
in the middle of an epoch (:class:`~inline_mm.engine.hooks.PreemptionHook`
writes ``preempt_iter_N.pth``) the batches before the stop are trained twice,
the run ends past ``max_iters`` and the ETA turns negative.
:class:`ResumableEpochBasedTrainLoop` replays those batches without training on
them (the sampler's order and, with ``num_workers=0``, the random draws of the
pipeline stay those of an uninterrupted run, as mmengine's
``IterBasedTrainLoop`` does on resume) and trains from the first batch after the
stop.  Replaying loads the data of the skipped batches: a stop late in a long
epoch costs that epoch's data loading time once.  It overrides the public
``run_epoch`` / ``run_iter`` of mmengine's loop (``tests/test_mmengine_contract.py``
checks their signatures) and reads its public ``iter`` / ``epoch``.

Persistent data-loader workers (``persistent_workers=True``, mmdet's dataset
bases) keep their random state from one epoch to the next, and no checkpoint
holds it: a run resumed at epoch ``k`` starts fresh workers whose draws differ
from those an uninterrupted run makes in epoch ``k``.  The loop therefore builds
its dataloader without persistent workers (workers start afresh every epoch, as
in the resumed run), saying so in the log, and seeds each epoch's workers from
their usual seed and the epoch (:class:`EpochWorkerSeeds`; mmengine seeds them
alike in every epoch, which would repeat one epoch's random draws in the next);
``exact_resume=False`` keeps mmengine's behaviour.
"""
import logging
import random
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmengine.logging import print_log
from mmengine.registry import LOOPS
from mmengine.runner import EpochBasedTrainLoop
from torch.utils.data import DataLoader


class EpochWorkerSeeds:
    """A data-loader ``worker_init_fn`` that seeds each epoch's workers apart.

    Calls the loader's own ``worker_init_fn`` (mmengine's seeds a worker from
    the run's seed, its rank and worker id), then reseeds python, numpy and torch
    from the seed the worker got and :attr:`epoch`, which the loop sets before
    the epoch's workers start.  Picklable (``spawn`` start method).
    """

    def __init__(self, inner: Optional[Callable[[int], Any]] = None) -> None:
        self.inner = inner
        self.epoch = 0

    def __call__(self, worker_id: int) -> None:
        if self.inner is not None:
            self.inner(worker_id)
        seed = int(np.random.SeedSequence([torch.initial_seed(), self.epoch]).generate_state(1)[0])
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)


@LOOPS.register_module()
class ResumableEpochBasedTrainLoop(EpochBasedTrainLoop):
    """``EpochBasedTrainLoop`` that does not repeat the batches of a mid-epoch checkpoint.

    Arguments are those of mmengine's ``EpochBasedTrainLoop``.  Configs select
    it with ``train_cfg = dict(type='ResumableEpochBasedTrainLoop')`` (the
    recipes of ``configs/det`` do).
    """

    def __init__(self, runner, dataloader: Union[DataLoader, Dict], max_epochs: int,
                 val_begin: int = 1, val_interval: int = 1,
                 dynamic_intervals: Optional[List[Tuple[int, int]]] = None,
                 exact_resume: bool = True) -> None:
        """mmengine's arguments, and ``exact_resume``: no persistent workers (see above)."""
        if exact_resume and isinstance(dataloader, dict) and \
                dataloader.get('persistent_workers') and int(dataloader.get('num_workers', 0)) > 0:
            dataloader = {**dataloader, 'persistent_workers': False}
            print_log('train_dataloader: persistent_workers turned off so that a resumed run '
                      'draws the same random augmentations as an uninterrupted one '
                      '(persistent workers carry their random state across epochs, which no '
                      'checkpoint holds); train_cfg.exact_resume=False keeps them',
                      logger='current')
        elif exact_resume and getattr(dataloader, 'persistent_workers', False):
            print_log('train_dataloader was built with persistent workers: a run resumed at '
                      'an epoch boundary will draw other random augmentations than an '
                      'uninterrupted one (pass the dataloader as a config dict to have them '
                      'turned off)', logger='current', level=logging.WARNING)
        super().__init__(runner, dataloader, max_epochs, val_begin, val_interval,
                         dynamic_intervals)
        self._worker_seeds: Optional[EpochWorkerSeeds] = None
        if exact_resume and self.dataloader.num_workers > 0 and \
                not self.dataloader.persistent_workers:
            self._worker_seeds = EpochWorkerSeeds(self.dataloader.worker_init_fn)
            self.dataloader.worker_init_fn = self._worker_seeds

    #: called once, after the replay and before the first new batch is fetched
    #: (:class:`~inline_mm.engine.hooks.RNGStateHook` restores the random states there)
    before_first_new_batch: Optional[Callable[[], None]] = None

    #: batches of the running epoch replayed without training (set at its start)
    replayed_batches: int = 0

    @property
    def batches_done_in_epoch(self) -> int:
        """Batches of the current epoch trained before the checkpoint resumed from."""
        return max(0, self.iter - self.epoch * len(self.dataloader))

    def run_epoch(self) -> None:
        """Iterate one epoch, first replaying the batches trained before a mid-epoch stop.

        mmengine's ``run_epoch`` fetches every batch and hands it to
        :meth:`run_iter` with its index; the batches already trained are passed
        over there, so the indices, the hooks of the epoch and the epoch count
        stay mmengine's.
        """
        if self._worker_seeds is not None:  # before the epoch's workers start
            self._worker_seeds.epoch = self.epoch
        self.replayed_batches = self.batches_done_in_epoch
        if self.replayed_batches:
            self.runner.logger.info(
                f'resuming epoch {self.epoch + 1} after its batch {self.replayed_batches}: '
                f'replaying the first {self.replayed_batches} batches without training on '
                f'them')
        else:
            self._first_new_batch_next()
        try:
            super().run_epoch()
        finally:
            self.replayed_batches = 0

    def run_iter(self, idx: int, data_batch: Sequence[dict]) -> None:
        """Train on one batch; the batches of a resumed epoch before the stop are skipped."""
        if idx < self.replayed_batches:
            if idx == self.replayed_batches - 1:  # the next fetch is the first new batch
                self._first_new_batch_next()
            return
        super().run_iter(idx, data_batch)

    def _first_new_batch_next(self) -> None:
        callback, self.before_first_new_batch = self.before_first_new_batch, None
        if callback is not None:
            callback()
