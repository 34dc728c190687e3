"""Checkpoint files read safely: ``torch.load(weights_only=True)`` of the authors' files
and of mmengine's runner checkpoints, with the types they hold allowed inside these
loads only (:mod:`.safe_load`: :func:`load_checkpoint_file`,
:func:`mmengine_checkpoint_globals`; :func:`allow_mmengine_checkpoints` is the
explicit process-wide opt-in).

What the weights are loaded into lives with its user: backbone weights from any
layout in :mod:`inline_mm.models.pretrained` (:func:`load_pretrained`,
:func:`looks_like`), whole-model checkpoints and ``init_cfg`` files checked before a
run in :mod:`inline_mm.engine.model_fit`.
"""
from .safe_load import (AUTHOR_CHECKPOINT_GLOBALS, allow_mmengine_checkpoints,
                        load_checkpoint_file, mmengine_checkpoint_globals)

__all__ = ['AUTHOR_CHECKPOINT_GLOBALS', 'allow_mmengine_checkpoints', 'load_checkpoint_file',
           'mmengine_checkpoint_globals']
