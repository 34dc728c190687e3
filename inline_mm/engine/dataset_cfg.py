"""Dataset configs as the checks read them: wrappers unwrapped, types resolved.

mmengine builds a dataset only when the Runner starts; the checks of
:mod:`~inline_mm.engine.data_checks` look at the configs before that.  These
helpers find every dataset of the loaders (through ``RepeatDataset``,
``ConcatDataset``, ``MultiImageMixDataset`` and :class:`SkipBadSamples`, in
place or as a wrapper), resolve the class a ``type`` names in the toolkit's
registry, and refuse an in-place ``SkipBadSamples`` left under another
``type`` with one line instead of mmengine's TypeError.
"""
import importlib
import inspect
import os.path as osp
from typing import Any, Iterable, List, Optional, Tuple

from mmengine.config import Config, ConfigDict
from mmengine.registry import DefaultScope

from ..errors import ConfigError
from .bad_samples import SkipBadSamples


def task_of(cfg: Config) -> str:
    """``'mmdet'`` or ``'mmseg'``: the toolkit a config belongs to (its default scope)."""
    scope = cfg.get('default_scope')
    if scope not in ('mmdet', 'mmseg'):
        raise ConfigError(f"config default_scope is {scope!r}: inline-mm tools handle 'mmdet' "
                          f"(detection) and 'mmseg' (segmentation) configs")
    return scope


def dataset_configs(cfg: Config, loaders: Iterable[str]) -> List[Tuple[str, ConfigDict]]:
    """``(loader name, dataset config)`` of every dataset of ``loaders``, wrappers unwrapped."""
    return [(name, ds) for name, _, ds in dataset_leaves(cfg, loaders)]


def dataset_leaves(cfg: Config, loaders: Iterable[str]) -> List[Tuple[str, str, ConfigDict]]:
    """``(loader name, key path, dataset config)`` of every dataset of ``loaders``."""
    found = []
    for name in loaders:
        loader = cfg.get(name)
        if not loader:
            continue
        stack = [(f'{name}.dataset', loader['dataset'])]
        while stack:  # unwrap RepeatDataset / ConcatDataset / MultiImageMixDataset ...
            path, ds = stack.pop()
            if 'dataset' in ds:
                stack.append((f'{path}.dataset', ds['dataset']))
            elif 'datasets' in ds:
                stack.extend((f'{path}.datasets.{i}', d) for i, d in enumerate(ds['datasets']))
            else:
                found.append((name, path, ds))
    return found


def join_root(root: str, path: str) -> str:
    return osp.normpath(path if osp.isabs(path) or not root else osp.join(root, path))


def dataset_class(task: str, ds: ConfigDict) -> Optional[type]:
    """The dataset class a dataset config builds (None when it cannot be resolved)."""
    # a wrapper that builds its dataset in place names the dataset's type apart
    return _registered(task, ds.get('dataset_type') or ds.get('type'))


def _registered(task: str, ds_type: Any) -> Optional[type]:
    """The class a dataset ``type`` names in the task's registry (None when unknown)."""
    if not isinstance(ds_type, str):
        return ds_type if isinstance(ds_type, type) else None
    registry = importlib.import_module(f'{task}.registry').DATASETS
    importlib.import_module(f'{task}.datasets')  # registers the toolkit's datasets
    with DefaultScope.overwrite_default_scope(task):
        return registry.get(ds_type)


def builds_in_place(ds: ConfigDict) -> bool:
    """Whether a dataset config is :class:`SkipBadSamples` building its dataset in place."""
    return ds.get('type') == 'SkipBadSamples' and 'dataset_type' in ds


def check_dataset_type(task: str, path: str, ds: ConfigDict) -> None:
    """Refuse the keys of an in-place ``SkipBadSamples`` left under another ``type``.

    A recipe writes its training set as ``dict(type='SkipBadSamples',
    dataset_type='CocoDataset', ...)``; a config that sets ``type='CocoDataset'``
    over it keeps ``dataset_type`` (and the wrapper's limits), which the dataset's
    constructor would refuse with a TypeError deep in mmengine.
    """
    if 'dataset_type' not in ds:
        return
    try:
        cls = _registered(task, ds.get('type'))
    except Exception:  # an unknown scope or type fails in the build with mmengine's message
        return
    if not isinstance(cls, type) or issubclass(cls, SkipBadSamples) or \
            'dataset_type' in inspect.signature(cls.__init__).parameters:
        return
    own = ['dataset_type'] + [k for k in inspect.signature(SkipBadSamples.__init__).parameters
                              if k in ds and k not in ('dataset', 'lazy_init', 'dataset_type')]
    name = ds['type'] if isinstance(ds['type'], str) else cls.__name__
    raise ConfigError(
        f'{path} has type={name!r} but also '
        f'{", ".join(f"{k}={ds[k]!r}" for k in own)} from the in-place SkipBadSamples of '
        f'the base config, which {cls.__name__} does not take: write '
        f'dataset_type={name!r} instead of type={name!r} (bad samples stay skipped), or '
        f'add _delete_=True to {path} to replace the base config\'s dataset whole')


def skips_bad_samples(cfg: Config, loader: str) -> bool:
    """Whether the loader's dataset is :class:`SkipBadSamples` (wrapper or in place)."""
    top = (cfg.get(loader) or {}).get('dataset') or {}
    return top.get('type') == 'SkipBadSamples'


def is_coco_dataset(ds: ConfigDict) -> bool:
    """Whether a dataset config builds mmdet's ``CocoDataset`` (or a subclass)."""
    from mmdet.datasets import CocoDataset
    cls = dataset_class('mmdet', ds)
    return isinstance(cls, type) and issubclass(cls, CocoDataset)
