"""Losses logged as their mean over all processes, not rank 0's share of the batch.

With several processes, mmengine logs the losses of rank 0's part of the batch
only.  :class:`MeanLossLoggerHook` replaces the logged ``*loss*`` values by their
mean over all processes (what mmdet 2.x logged), so a run on N processes logs
the loss of the whole batch.
"""
import torch
from mmengine.dist import all_reduce, get_world_size
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


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
