"""How the checkpoint hooks reach the runner's loads and saves: mmengine's Runner or FlexibleRunner.

* :func:`scope_load_or_resume`: the runner's ``load_or_resume`` accepts the types
  mmengine pickles into its checkpoints (torch >= 2.6 loads with ``weights_only``),
  during that call only, after callbacks that must come before the load (the
  checkpoint ``--resume`` picks).  mmengine's Runner loads after the
  ``before_run`` hooks, FlexibleRunner before them.
* :func:`check_rank0_saves`: the hooks write checkpoints on process 0; the
  FlexibleRunner strategies that save on every process are refused;
* :func:`save_through_strategy`: a FlexibleRunner's save with the hook's epoch /
  iter kept and the file written atomically.
"""
import functools
import os
import os.path as osp
from typing import Any, Callable, List

from mmengine.registry import RUNNERS, STRATEGIES
from mmengine.runner import FlexibleRunner

from ...checkpoint import mmengine_checkpoint_globals
from ...errors import ConfigError
from ..atomic_io import replace_with


def scope_load_or_resume(runner) -> List[Callable[[Any], None]]:
    """Make ``runner.load_or_resume`` allow mmengine's runner checkpoint types while it loads.

    torch >= 2.6 loads with ``weights_only=True``, which refuses what mmengine
    pickles into its own checkpoints (the message hub).  The public
    ``load_or_resume()`` is wrapped on the instance: the allow-list applies
    inside that call only (:func:`~inline_mm.checkpoint.mmengine_checkpoint_globals`),
    torch's allow-list is unchanged before and after, also when the load fails.

    Returns the list of callbacks (called with the runner) the wrapper runs
    before the load; a second call returns the same list.
    """
    current = runner.load_or_resume
    before = getattr(current, 'inline_mm_before', None)
    if before is not None:
        return before
    before = []

    @functools.wraps(current)
    def scoped_load_or_resume() -> None:
        for call in before:
            call(runner)
        with mmengine_checkpoint_globals():
            return current()

    scoped_load_or_resume.inline_mm_before = before  # type: ignore[attr-defined]
    runner.load_or_resume = scoped_load_or_resume
    return before


def names_flexible_runner(cfg) -> bool:
    """Whether the config's ``runner_type`` is mmengine's FlexibleRunner (or a subclass)."""
    runner_type = cfg.get('runner_type')
    runner_cls = RUNNERS.get(runner_type) if isinstance(runner_type, str) else runner_type
    return isinstance(runner_cls, type) and issubclass(runner_cls, FlexibleRunner)


def check_rank0_saves(strategy: type, who: str) -> None:
    """Refuse a ``FlexibleRunner`` strategy whose checkpoints every process must write.

    The checkpoint writes of :class:`AtomicCheckpointHook` and
    :class:`~inline_mm.engine.hooks.preemption.PreemptionHook` (``who``) run on
    rank 0 only (then all processes agree on the outcome), as mmengine's
    ``Runner`` and the single-device / DDP strategies save.  DeepSpeed, FSDP and
    ColossalAI save collectively: rank 0 would wait for the others forever.
    """
    rank0_saves = {STRATEGIES.get(name).save_checkpoint
                   for name in ('SingleDeviceStrategy', 'DDPStrategy')}
    if strategy.save_checkpoint not in rank0_saves:
        raise ConfigError(
            f'{who} writes checkpoints on process 0 only, but the FlexibleRunner strategy '
            f'{strategy.__name__} saves on every process (it would hang). Use '
            f"strategy=dict(type='DDPStrategy') or mmengine's Runner (no runner_type), or "
            f"drop {who} from the config (default_hooks.checkpoint=dict(type='CheckpointHook')"
            f', no PreemptionHook in custom_hooks)')


def save_through_strategy(hook, runner, filename: str, meta: dict,
                          path: str) -> None:
    """A FlexibleRunner's save with ``meta`` kept and the file written atomically.

    ``FlexibleRunner.save_checkpoint`` replaces the epoch / iter of ``meta``
    with its own count (right for a periodic save, not for a preemption's
    mid-epoch or mid-validation checkpoint): ``meta`` is put back when the
    runner calls the ``before_save_checkpoint`` hooks.  Its strategy writes
    through the plain local backend, in place: a local checkpoint goes to a
    temp file beside ``path`` that then replaces it.
    """
    local = '://' not in str(hook.out_dir)
    name = f'.{filename}.{os.getpid()}.tmp' if local else filename
    call_hook, wrapped_before = runner.call_hook, 'call_hook' in vars(runner)

    def keep_meta(fn_name: str, **kwargs) -> None:
        if fn_name == 'before_save_checkpoint':
            kwargs['checkpoint']['meta'].update(meta)
        call_hook(fn_name, **kwargs)

    runner.call_hook = keep_meta
    try:
        runner.save_checkpoint(hook.out_dir, name, hook.file_client_args,
                               save_optimizer=hook.save_optimizer,
                               save_param_scheduler=hook.save_param_scheduler,
                               meta=dict(meta), by_epoch=hook.by_epoch, **hook.args)
        if local:
            replace_with(osp.join(hook.out_dir, name), path)
    finally:
        if wrapped_before:
            runner.call_hook = call_hook
        else:
            del runner.call_hook  # the class's method again
        if local and osp.exists(osp.join(hook.out_dir, name)):
            os.remove(osp.join(hook.out_dir, name))
