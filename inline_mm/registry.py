"""One helper that registers a module into every installed OpenMMLab model registry.

MMDetection and MMSegmentation keep separate ``MODELS`` registries (children of
mmengine's root registry).  A backbone must be buildable from a detection
config (``default_scope='mmdet'``) and from a segmentation config
(``default_scope='mmseg'``), so every public module of the plugin is registered
into each of them that is installed: a detection-only environment (no
mmsegmentation) or a segmentation-only one works as well as one with both.
"""
import importlib
from typing import Callable, List, Optional, Tuple, TypeVar

from mmengine.registry import Registry

T = TypeVar('T', bound=type)

#: the toolkits whose ``MODELS`` registry receives the plugin's modules
TOOLKITS: Tuple[str, ...] = ('mmdet', 'mmseg')


def _available_registries() -> List[Registry]:
    registries = []
    for toolkit in TOOLKITS:
        try:
            module = importlib.import_module(f'{toolkit}.registry')
        except ImportError:
            continue  # toolkit not installed: register into the others
        registries.append(module.MODELS)
    if not registries:
        raise ImportError('inline-mm needs MMDetection 3.x (mmdet) or MMSegmentation 1.x '
                          '(mmsegmentation) installed to register its backbones: '
                          'pip install "inline-mm[mmdet]" or "inline-mm[mmseg]"')
    return registries


REGISTRIES: Tuple[Registry, ...] = tuple(_available_registries())


def available_toolkits() -> Tuple[str, ...]:
    """Names (``'mmdet'``, ``'mmseg'``) of the toolkits the plugin registered into."""
    return tuple(r.scope for r in REGISTRIES)


def register_model(module: Optional[T] = None, *, name: Optional[str] = None
                   ) -> Callable[[T], T] | T:
    """Register ``module`` into the ``MODELS`` registry of every installed toolkit.

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
