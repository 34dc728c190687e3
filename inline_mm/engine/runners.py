"""The Runner a config names, built as mmdet's and mmseg's ``tools/train.py`` build it.

``runner_type`` in a config (mmengine's ``FlexibleRunner``) is honoured, which
the toolkits' tools do and ``Runner.from_cfg`` alone does not; the checkpoint
hooks are prepared for FlexibleRunner's order (it loads the checkpoint before
the ``before_run`` hooks), and a strategy they would hang under is refused
before anything of a training run is built.
"""
from typing import Any

from mmengine.config import Config
from mmengine.registry import HOOKS, RUNNERS, STRATEGIES
from mmengine.runner import Runner

from .hooks.atomic_checkpoint import AtomicCheckpointHook
from .hooks.preemption import PreemptionHook
from .hooks.runner_access import check_rank0_saves, names_flexible_runner, scope_load_or_resume


def _check_flexible_runner_strategy(cfg: Config) -> None:
    """Refuse, before anything is built, a strategy our checkpoint hooks would hang under.

    The hooks check it themselves in ``before_train`` (any training tool), which
    a FlexibleRunner reaches only after preparing the model for the strategy.
    """
    strategy = cfg.get('strategy')
    if not names_flexible_runner(cfg) or not isinstance(strategy, dict):
        return
    kind = strategy.get('type')
    strategy_cls = STRATEGIES.get(kind) if isinstance(kind, str) else kind
    if not isinstance(strategy_cls, type):  # mmengine names what it cannot build
        return
    hooks = [(cfg.get('default_hooks') or {}).get('checkpoint')] + list(cfg.get('custom_hooks')
                                                                         or [])
    for hook in hooks:
        kind = hook.get('type') if isinstance(hook, dict) else None
        hook_cls = HOOKS.get(kind) if isinstance(kind, str) else kind
        if isinstance(hook_cls, type) and issubclass(hook_cls,
                                                     (AtomicCheckpointHook, PreemptionHook)):
            check_rank0_saves(strategy_cls, hook_cls.__name__)


def build_runner(cfg: Config, training: bool = True) -> Any:
    """Build the Runner as mmdet's and mmseg's ``tools/train.py`` do.

    ``Runner.from_cfg`` unless the config names ``runner_type`` (e.g.
    ``'FlexibleRunner'`` with a ``strategy``), which is built from mmengine's
    ``RUNNERS`` registry.  Its ``load_or_resume`` then loads mmengine's runner
    checkpoints on torch >= 2.6 (with ``weights_only`` and the types mmengine
    pickles) and, with an :class:`~inline_mm.engine.AtomicCheckpointHook`,
    ``--resume`` picks the newest readable checkpoint under either runner.
    For ``training``, a strategy the checkpoint hooks would hang under is
    refused first (a test run writes no checkpoints).
    """
    if training:
        _check_flexible_runner_strategy(cfg)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    # every load of the run allows mmengine's checkpoint types (torch >= 2.6); the
    # checkpoint --resume picks is chosen before it (FlexibleRunner loads before the
    # before_run hooks, where AtomicCheckpointHook would otherwise do both)
    scope_load_or_resume(runner)
    for hook in runner.hooks:
        if isinstance(hook, AtomicCheckpointHook):
            hook.prepare_resume(runner)
    return runner
