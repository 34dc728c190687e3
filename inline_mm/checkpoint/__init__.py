"""Checkpoint safety and loading, one concern per module.

* :mod:`.safe_load`: ``weights_only`` reading of the authors' files and of
  mmengine's runner checkpoints (:func:`load_checkpoint_file`,
  :func:`mmengine_checkpoint_globals`, :func:`allow_mmengine_checkpoints`);
* :mod:`.pretrained`: backbone weights out of any layout, refused when of
  another arch (:func:`load_pretrained`, :func:`looks_like`);
* :mod:`.model_fit`: whole-model checkpoints and ``init_cfg`` files checked
  before a run (:func:`check_checkpoint_fits`, :func:`check_pretrained_files`).
"""
from .model_fit import check_checkpoint_fits, check_pretrained_files, describe_model_state
from .pretrained import (StateDict, adapt_to_model, extract_state_dict, load_pretrained,
                         looks_like, preset_structures, structure_problems)
from .safe_load import (AUTHOR_CHECKPOINT_GLOBALS, allow_mmengine_checkpoints,
                        load_checkpoint_file, mmengine_checkpoint_globals)

__all__ = ['AUTHOR_CHECKPOINT_GLOBALS', 'StateDict', 'adapt_to_model', 'allow_mmengine_checkpoints',
           'check_checkpoint_fits', 'check_pretrained_files', 'describe_model_state',
           'extract_state_dict', 'load_checkpoint_file', 'load_pretrained', 'looks_like',
           'mmengine_checkpoint_globals', 'preset_structures', 'structure_problems']
