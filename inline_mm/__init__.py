"""inline-mm: InLine (injective linear attention) backbones for MMDetection and MMSegmentation.

Importing the package registers the backbones into both ``mmdet`` and
``mmseg`` model registries and allow-lists the types of mmengine's own runner
checkpoints for ``weights_only`` loading (so ``--resume`` works on torch >= 2.6).
Configs load it with ``custom_imports = dict(imports=['inline_mm'],
allow_failed_imports=False)``.
"""
from . import datasets  # noqa: F401  (registers the toy datasets)
from . import dist, hooks, optim  # noqa: F401  (CPU DDP / autocast wrappers, hooks)
from .checkpoint import allow_mmengine_checkpoints, load_pretrained
from .models import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin
from .registry import register_model

__version__ = '0.1.0'

allow_mmengine_checkpoints()

__all__ = ['InLinePVT', 'InLineSwin', 'InLineCSWin', 'InLineDeiT', 'register_model',
           'load_pretrained', 'allow_mmengine_checkpoints', '__version__']
