# Fault tolerance shared by the full recipes (docs/reliability.md); listed after the
# toolkit's base: _base_ = ['mmdet::...', '../_base_/runtime/inline_mm_runtime.py'].
# mmengine refuses a key that two bases both define, so this holds only what the
# toolkits' bases leave unset; each recipe adds, because its own keys win over bases:
#   custom_imports = dict(imports=['inline_mm', 'inline_mm.engine'], ...)
#   default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
# Losses logged as the mean over all processes; every process's random states saved for
# exact resume; SIGTERM / SIGUSR1 -> checkpoint, exit status 75; NaN / Inf steps skipped,
# five in a row stop the run.
custom_hooks = [
    dict(type='MeanLossLoggerHook'),
    dict(type='RNGStateHook'),
    dict(type='PreemptionHook'),
    dict(type='NonFiniteLossHook', max_consecutive=5),
]
