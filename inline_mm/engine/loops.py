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
epoch costs that epoch's data loading time once.
"""
from typing import Callable, Optional

from mmengine.registry import LOOPS
from mmengine.runner import EpochBasedTrainLoop


@LOOPS.register_module()
class ResumableEpochBasedTrainLoop(EpochBasedTrainLoop):
    """``EpochBasedTrainLoop`` that does not repeat the batches of a mid-epoch checkpoint.

    Arguments are those of mmengine's ``EpochBasedTrainLoop``.  Configs select
    it with ``train_cfg = dict(type='ResumableEpochBasedTrainLoop')`` (the
    recipes of ``configs/det`` do).
    """

    #: called once, after the replay and before the first new batch is fetched
    #: (:class:`~inline_mm.engine.hooks.RNGStateHook` restores the random states there)
    before_first_new_batch: Optional[Callable[[], None]] = None

    @property
    def batches_done_in_epoch(self) -> int:
        """Batches of the current epoch trained before the checkpoint resumed from."""
        return max(0, self._iter - self._epoch * len(self.dataloader))

    def run_epoch(self) -> None:
        """Iterate one epoch, first replaying the batches trained before a mid-epoch stop."""
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        done = self.batches_done_in_epoch
        batches = iter(self.dataloader)
        if done:
            self.runner.logger.info(
                f'resuming epoch {self._epoch + 1} after its batch {done}: replaying the '
                f'first {done} batches without training on them')
        for _ in range(done):
            next(batches)
        callback, self.before_first_new_batch = self.before_first_new_batch, None
        if callback is not None:
            callback()
        for idx, data_batch in enumerate(batches, start=done):
            self.run_iter(idx, data_batch)
        self.runner.call_hook('after_train_epoch')
        self._epoch += 1
