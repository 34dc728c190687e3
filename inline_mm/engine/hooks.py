"""mmengine hooks for multi-process logging and exact resumption.

* :class:`MeanLossLoggerHook`: with several processes, mmengine logs the losses
  of rank 0's part of the batch only.  This hook replaces the logged
  ``train/*loss*`` values by their mean over all processes (what mmdet 2.x
  logged), so a run on N processes logs the loss of the whole batch.
* :class:`RNGStateHook`: stores the torch / numpy / python random states in each
  checkpoint and restores them when a run resumes, so a resumed run draws the
  same samples (RPN / RoI sampling, drop path) as an uninterrupted one.
"""
import random
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class MeanLossLoggerHook(Hook):
    """Average the logged losses of this iteration over all processes."""

    # after RuntimeInfoHook (VERY_HIGH) wrote the losses, before LoggerHook (BELOW_NORMAL)
    priority = 'NORMAL'

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if not (dist.is_available() and dist.is_initialized()) or not outputs:
            return
        keys = sorted(k for k in outputs if 'loss' in k)
        if not keys:
            return
        values = torch.tensor([float(outputs[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(values)
        values /= dist.get_world_size()
        hub = runner.message_hub
        for key, value in zip(keys, values.tolist()):
            buffer = hub.log_scalars.get(f'train/{key}')
            if buffer is not None and len(buffer._log_history):
                buffer._log_history[-1] = value


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Save the random states in checkpoints and restore them on resume.

    The states are restored before the first training iteration after the
    checkpoint is loaded.  Random data augmentation of the first resumed batch
    runs before that point, so exact equality with an uninterrupted run needs a
    pipeline without random transforms (or ``num_workers > 0`` workers, which
    seed themselves per iteration).
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._pending: Optional[dict] = None

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        state = dict(torch=torch.get_rng_state(), python=list(random.getstate()[1]),
                     python_version=random.getstate()[0],
                     python_gauss=random.getstate()[2] or 0.0)
        np_state = np.random.get_state()
        state.update(numpy_keys=torch.from_numpy(np_state[1].astype(np.int64)),
                     numpy_pos=int(np_state[2]), numpy_has_gauss=int(np_state[3]),
                     numpy_gauss=float(np_state[4]))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state['cuda'] = torch.cuda.get_rng_state_all()
        checkpoint['rng_state'] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        self._pending = checkpoint.get('rng_state')

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        state, self._pending = self._pending, None
        if state is None:
            return
        torch.set_rng_state(state['torch'])
        random.setstate((state['python_version'], tuple(state['python']),
                         state['python_gauss'] or None))
        np.random.set_state(('MT19937', state['numpy_keys'].numpy().astype(np.uint32),
                             state['numpy_pos'], state['numpy_has_gauss'],
                             state['numpy_gauss']))
        if 'cuda' in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state['cuda'])
