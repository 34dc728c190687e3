"""Skip optimizer steps whose loss or gradients are not finite, with one host sync.

:class:`NonFiniteLossHook` wraps the optim wrapper's ``update_params`` / ``step``
on the instance.  Everything it checks stays on the device until the step: the
loss flag, the gradient norm and the local preemption flag of
:class:`~inline_mm.engine.hooks.PreemptionHook` go into one small tensor, which
is all-reduced once (several processes) and read once (``tolist``).  That read
is the only device-to-host synchronisation the plugin's hooks add to a
training iteration; the preemption hook reuses its verdict instead of syncing
again.
"""
from typing import List, Optional, Sequence

import torch
from mmengine.dist import all_reduce, get_world_size
from mmengine.hooks import Hook
from mmengine.optim import AmpOptimWrapper, OptimWrapper, OptimWrapperDict
from mmengine.registry import HOOKS
from torch import Tensor


class NonFiniteLossError(RuntimeError):
    """Too many consecutive iterations with a non-finite loss or gradient."""


def nonfinite_flag(tensors: Sequence[Tensor], device: torch.device) -> Tensor:
    """A 0-dim bool tensor on ``device``: True when any of ``tensors`` holds NaN / Inf.

    Computed from the fp32 norm of every tensor (one reduction each, no
    ``isfinite`` copy of the gradients), without leaving the device.
    """
    if not tensors:
        return torch.zeros((), dtype=torch.bool, device=device)
    norms = [torch.linalg.vector_norm(t.detach(), dtype=torch.float32).to(device)
             for t in tensors]
    return ~torch.isfinite(torch.stack(norms).sum())


def agree_on_flags(flags: Tensor) -> List[bool]:
    """Every process's flags OR-ed together, read to the host once.

    ``flags`` is a 1-d integer tensor on the device of the training step; with
    several processes it is all-reduced (max) in place on that device first.
    """
    if get_world_size() > 1:
        all_reduce(flags, op='max')
    return [bool(v) for v in flags.tolist()]


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """Skip the optimizer step of an iteration whose loss or gradients are not finite.

    Wraps ``update_params`` / ``step`` of the run's optim wrapper(s) on the
    instance (whatever their class, e.g. ``CPUAutocastOptimWrapper``): when the
    loss or any gradient is NaN / Inf, the step is skipped (the weights and
    the optimizer state stay as they were), the gradients are cleared, and
    the iteration is logged.  ``max_consecutive`` such iterations in a row
    stop the run with :class:`NonFiniteLossError`, before any checkpoint of
    the bad weights could be written.  The flags of all processes are
    combined, so every process takes the same decision.

    With mmengine's ``AmpOptimWrapper`` the ``GradScaler`` already skips steps
    with inf / NaN gradients and lowers the loss scale: fp16 gradients that
    overflow are its normal working (several in a row while the scale settles),
    so the hook counts only non-finite losses there, whose steps the scaler
    skips too, and applies ``max_consecutive`` to those.

    The decision costs one device-to-host read per optimizer step, shared with
    :class:`~inline_mm.engine.hooks.PreemptionHook` when the run has one.

    Args:
        max_consecutive: stop after this many non-finite iterations in a row.
            Defaults to 5.
    """

    priority = 'VERY_HIGH'

    def __init__(self, max_consecutive: int = 5) -> None:
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.total = 0
        self._first_bad: Optional[int] = None
        self._runner = None
        self._preemption: list = []

    def before_train(self, runner) -> None:
        from .hooks import PreemptionHook  # the hook whose flag rides along
        self._runner = runner
        self._preemption = [h for h in runner.hooks if isinstance(h, PreemptionHook)]
        wrappers = runner.optim_wrapper.optim_wrappers.values() \
            if isinstance(runner.optim_wrapper, OptimWrapperDict) else [runner.optim_wrapper]
        for wrapper in wrappers:
            if isinstance(wrapper, OptimWrapper) and not getattr(wrapper, 'inline_mm_guarded',
                                                                 False):
                self._guard(wrapper)

    def _guard(self, wrapper: OptimWrapper) -> None:
        update_params, step = wrapper.update_params, wrapper.step
        amp = isinstance(wrapper, AmpOptimWrapper)
        # device-side OR of the loss flags since the last step (gradient accumulation)
        state: dict = dict(loss_bad=None)

        def guarded_update_params(loss: Tensor, step_kwargs=None, zero_kwargs=None):
            bad = ~torch.isfinite(loss.detach()).all()
            state['loss_bad'] = bad if state['loss_bad'] is None else state['loss_bad'] | bad
            return update_params(loss, step_kwargs, zero_kwargs)

        def guarded_step(**kwargs):
            grads = [p.grad for group in wrapper.optimizer.param_groups
                     for p in group['params'] if p.grad is not None]
            loss_bad, state['loss_bad'] = state['loss_bad'], None
            device = grads[0].device if grads else \
                (loss_bad.device if loss_bad is not None else torch.device('cpu'))
            # AMP: an overflow of the scaled fp16 gradients is the scaler's to skip
            bad = torch.zeros((), dtype=torch.bool, device=device) if amp else \
                nonfinite_flag(grads, device)
            if loss_bad is not None:
                bad = bad | loss_bad.to(device)
            preempt = any(h.flag.received is not None for h in self._preemption)
            flags = torch.stack([bad.to(torch.int32),
                                 torch.full((), int(preempt), dtype=torch.int32, device=device)])
            bad, preempt_agreed = agree_on_flags(flags)
            for hook in self._preemption:
                hook.agreed_at(self._runner.iter if self._runner else -1, preempt_agreed)
            if amp:  # GradScaler skips the steps of a non-finite loss itself: only count
                self._count(bad)
                return step(**kwargs)
            if self._count(bad):
                return None  # skipped; update_params clears the gradients next
            return step(**kwargs)

        wrapper.update_params = guarded_update_params
        wrapper.step = guarded_step
        wrapper.inline_mm_guarded = True  # our mark: guard each wrapper once

    def _count(self, bad: bool) -> bool:
        runner = self._runner
        it = runner.iter + 1 if runner is not None else -1
        if not bad:
            self.consecutive, self._first_bad = 0, None
            return False
        self.consecutive += 1
        self.total += 1
        self._first_bad = self._first_bad or it
        if runner is not None:
            runner.logger.warning(
                f'non-finite loss or gradient at iteration {it}: optimizer step skipped '
                f'({self.consecutive} in a row, {self.total} in all)')
            runner.message_hub.update_info('nonfinite_steps_skipped', self.total)
        if self.consecutive >= self.max_consecutive:
            last = runner.message_hub.get_info('last_ckpt') if runner is not None else None
            raise NonFiniteLossError(
                f'the loss or the gradients were not finite in {self.consecutive} iterations '
                f'in a row ({self._first_bad}-{it}; max_consecutive={self.max_consecutive}): '
                f'training stopped. The weights are those before iteration {self._first_bad} '
                f'and the last checkpoint ({last or "none written"}) is untouched. Lower the '
                f'learning rate, add gradient clipping or check the data, then resume.')
        return True
