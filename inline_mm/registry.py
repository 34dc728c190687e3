"""One helper that registers a module into both OpenMMLab model registries.

MMDetection and MMSegmentation keep separate ``MODELS`` registries (children of
mmengine's root registry).  A backbone must be buildable from a detection
config (``default_scope='mmdet'``) and from a segmentation config
(``default_scope='mmseg'``), so every public module of the plugin is registered
into both through :func:`register_model`.
"""
from typing import Callable, Optional, TypeVar

from mmdet.registry import MODELS as MMDET_MODELS
from mmseg.registry import MODELS as MMSEG_MODELS

T = TypeVar('T', bound=type)

REGISTRIES = (MMDET_MODELS, MMSEG_MODELS)


def register_model(module: Optional[T] = None, *, name: Optional[str] = None
                   ) -> Callable[[T], T] | T:
    """Register ``module`` into the mmdet and mmseg ``MODELS`` registries.

    Usable as ``@register_model``, ``@register_model(name='X')`` or
    ``register_model(SomeClass)``.
    """

    def _register(cls: T) -> T:
        for registry in REGISTRIES:
            registry.register_module(name=name, module=cls)
        return cls

    if module is None:
        return _register
    return _register(module)
