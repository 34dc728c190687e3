"""The config's classes against the annotation files, the label maps and the heads.

mmdet drops the images of categories the config does not name, and mmseg
trains on label values past the number of classes until a CUDA assert or a
wrong loss; neither says why.  :func:`check_coco_classes` and
:func:`check_seg_labels` compare the classes a dataset config trains on
(its ``metainfo`` or the dataset class's defaults) with a COCO file's
categories or a sample of the label maps, and the heads' ``num_classes``
with their number, and raise one line naming both sides and the fix.
"""
import difflib
import importlib
import inspect
import os
import os.path as osp
from typing import Any, List, Optional, Sequence, Tuple

from mmengine.config import Config, ConfigDict

from ..errors import DataError
from .bad_samples import file_problem
from .coco_summary import CocoSummary
from .dataset_cfg import builds_in_place, skips_bad_samples, dataset_class

#: how many label maps :func:`check_datasets` reads to check label values
LABEL_MAPS_CHECKED = 20


def _config_classes(task: str, ds: ConfigDict) -> Tuple[Optional[Sequence[str]], str]:
    """The class names a dataset config trains on, and where they come from."""
    metainfo = ds.get('metainfo') or {}
    if metainfo.get('classes'):
        return tuple(metainfo['classes']), 'metainfo.classes of the dataset config'
    cls = dataset_class(task, ds)
    classes = getattr(cls, 'METAINFO', {}).get('classes') if cls else None
    name = cls.__name__ if cls else ds.get('type')
    return (tuple(classes) if classes else None), f'the default classes of {name}'


def _head_num_classes(model: Any, path: str = 'model') -> List[Tuple[str, int]]:
    """``(key path, num_classes)`` of every head of a model config (RPN heads excepted)."""
    found = []
    if isinstance(model, dict):
        for key, value in model.items():
            sub = f'{path}.{key}'
            if key == 'num_classes' and isinstance(value, int) and 'rpn_head' not in path:
                found.append((sub, value))
            elif isinstance(value, (dict, list, tuple)) and key != 'train_cfg':
                found += _head_num_classes(value, sub)
    elif isinstance(model, (list, tuple)):
        for i, value in enumerate(model):
            found += _head_num_classes(value, f'{path}.{i}')
    return found


def _short(names: Sequence[str], limit: int = 12) -> str:
    shown = ', '.join(repr(n) for n in list(names)[:limit])
    return f'({shown}{", ..." if len(names) > limit else ""}; {len(names)} classes)'


def _fix_line(names: Sequence[str], heads: List[Tuple[str, int]]) -> str:
    heads_text = ', '.join(f'{p}={len(names)}' for p, _ in heads) or \
        f'the heads\' num_classes={len(names)}'
    return (f'metainfo=dict(classes={tuple(names)!r}) in the dataset config (train, val and '
            f'test dataloaders) and {heads_text}; see "Train on your own data" in the README')


def _with_close_match(name: str, names: Sequence[str]) -> str:
    """``'crates'`` -> ``"'crates' (the file has 'crate')"`` when a file name is close."""
    close = difflib.get_close_matches(str(name), [str(n) for n in names], n=1, cutoff=0.6)
    return f'{name!r} (the file has {close[0]!r})' if close else repr(name)


def check_coco_classes(cfg: Config, loader: str, ds: ConfigDict, ann_path: str,
                        coco: CocoSummary) -> None:
    file_classes = [c.get('name') for c in coco.categories]
    classes, source = _config_classes('mmdet', ds)
    heads = _head_num_classes(cfg.get('model', {}))
    if not coco.num_images:
        raise DataError(f'annotation file {ann_path} lists no images: the dataset would be '
                        f'empty')
    if classes is None or not file_classes:
        return
    absent = [c for c in classes if c not in file_classes]
    if absent:
        if len(absent) == len(classes):
            what = 'none of the config\'s classes is in the file'
        else:
            what = (f'{len(absent)} of the config\'s {len(classes)} classes '
                    f'{"is" if len(absent) == 1 else "are"} not in the file: '
                    + ', '.join(_with_close_match(c, file_classes) for c in absent))
        raise DataError(
            f'the categories of {ann_path} {_short(file_classes)} do not match the classes the '
            f'config trains on, {source} {_short(classes)}: {what}, so mmdet would drop their '
            f'images. To train on the file\'s categories set {_fix_line(file_classes, heads)}')
    wrong_heads = [(p, n) for p, n in heads if n != len(classes)]
    if wrong_heads:
        raise DataError(
            f'{", ".join(f"{p}={n}" for p, n in wrong_heads)} but the dataset has '
            f'{len(classes)} classes {_short(classes)}: set {_fix_line(classes, heads)}')
    if loader == 'train_dataloader' and (ds.get('filter_cfg') or {}).get('filter_empty_gt',
                                                                          False):
        ids = {c.get('id') for c in coco.categories if c.get('name') in classes}
        if not ids & coco.annotated:
            raise DataError(f'no image of {ann_path} has an annotation of the config\'s classes '
                            f'{_short(classes)}: the training set would be empty')


def check_seg_labels(cfg: Config, loader: str, ds: ConfigDict, seg_dir: str) -> None:
    classes, source = _config_classes('mmseg', ds)
    heads = _head_num_classes(cfg.get('model', {}))
    if classes is None:
        return
    cls = dataset_class('mmseg', ds)
    ade = importlib.import_module('mmseg.datasets').ADE20KDataset
    if cls is ade and (ds.get('metainfo') or {}).get('classes') and \
            not set(classes) <= set(ade.METAINFO['classes']):
        raise DataError(
            'ADE20KDataset accepts only ADE20K\'s own 150 class names; for an ADE20K-format set '
            f"with classes of your own use {'dataset_type' if builds_in_place(ds) else 'type'}"
            f"='BaseSegDataset' in {loader}.dataset with img_suffix='.jpg', "
            "seg_map_suffix='.png', reduce_zero_label=True and metainfo=dict(classes=..., "
            'palette=...) (see "Train on your own data" in the README)')
    wrong_heads = [(p, n) for p, n in heads if n != len(classes)]
    if wrong_heads:
        raise DataError(
            f'{", ".join(f"{p}={n}" for p, n in wrong_heads)} but the dataset has '
            f'{len(classes)} classes ({source}) {_short(classes)}: set '
            f'{", ".join(f"{p}={len(classes)}" for p, _ in wrong_heads)}')
    # mmseg datasets take these as constructor arguments (with class defaults)
    defaults = inspect.signature(cls.__init__).parameters if cls else {}

    def arg(name: str, fallback: Any) -> Any:
        if name in ds:
            return ds[name]
        param = defaults.get(name)
        return fallback if param is None or param.default is inspect.Parameter.empty \
            else param.default

    suffix = arg('seg_map_suffix', '.png')
    reduce_zero = arg('reduce_zero_label', False)
    try:
        import numpy as np
        from PIL import Image
    except ImportError:  # pragma: no cover - both come with mmcv
        return
    files = sorted(f for f in os.listdir(seg_dir) if f.endswith(suffix))[:LABEL_MAPS_CHECKED]
    ignore = arg('ignore_index', 255)
    for name in files:
        path = osp.join(seg_dir, name)
        try:
            problem = file_problem(path)
            values = None if problem else np.unique(np.asarray(Image.open(path)))
        except OSError as err:  # decoding failed past the checks of file_problem
            problem = f'{type(err).__name__}: {err}'
        if problem:
            if skips_bad_samples(cfg, loader):
                continue  # logged and skipped in training
            raise DataError(f'label map {path} cannot be read ({problem}): the run would stop '
                            f'at it. Restore it, or (training set) write {loader}.dataset as '
                            f"dict(type='SkipBadSamples', dataset_type=..., ...) to skip it")
        if reduce_zero:  # 0 becomes the ignore index, k becomes k - 1
            values = values[values != 0] - 1
        bad = [int(v) for v in values if v != ignore and v >= len(classes)]
        if bad:
            raise DataError(
                f'label map {osp.join(seg_dir, name)} holds the value(s) '
                f'{bad[:5]}{" (after reduce_zero_label)" if reduce_zero else ""}, but the '
                f'config has {len(classes)} classes ({source}): a class index must be < '
                f'{len(classes)} (or {ignore} for pixels to ignore); check reduce_zero_label '
                f'and the classes')
