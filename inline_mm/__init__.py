"""inline-mm: InLine (injective linear attention) backbones for MMDetection and MMSegmentation.

Importing the package registers the four backbone families into the model
registry of every installed toolkit (``mmdet``, ``mmseg``, or both) and changes
nothing else in the process (torch's ``weights_only`` allow-list included: the
types of mmengine's runner checkpoints are allowed only inside the plugin's own
loads and the resume of runs with ``AtomicCheckpointHook``;
:func:`allow_mmengine_checkpoints` is the explicit, process-wide opt-in).  Configs
load it with ``custom_imports = dict(imports=['inline_mm'], allow_failed_imports=False)``.

Nothing else is imported: the toy datasets (``inline_mm.datasets``) and the
training extensions (hooks, optimiser wrappers: ``inline_mm.engine``) come in
through the ``custom_imports`` of the configs that use them.
"""
from .stack import check_stack

# before any toolkit import: a wrong or mixed mmengine / mmcv / mmdet / mmseg stops here
# with one message (versions, ranges, the pip fix) instead of a traceback inside a toolkit
check_stack()

from .checkpoint import allow_mmengine_checkpoints  # noqa: E402
from .models import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin  # noqa: E402
from .models.pretrained import load_pretrained  # noqa: E402
from .registry import available_toolkits, register_model  # noqa: E402

__version__ = '0.1.0'

__all__ = ['InLinePVT', 'InLineSwin', 'InLineCSWin', 'InLineDeiT', 'register_model',
           'available_toolkits', 'load_pretrained', 'allow_mmengine_checkpoints',
           '__version__']
