"""The tools' checks of the datasets against the config, run once per job.

Before anything is built or written, ``tools/train.py`` / ``tools/test.py``
check every dataset of the loaders they use (:func:`check_datasets`): the data
folders and annotation files exist, an annotation file is valid JSON, the
config's classes are the COCO file's categories (or cover the label values of
a segmentation set), the heads' ``num_classes`` equals the number of classes,
and the training set is not empty after mmdet filters it.

At COCO size (COCO train2017: 118,287 images, 860,001 polygon instances, a
448 MB file) parsing an annotation file costs seconds and gigabytes, and mmdet
parses it again when it builds the dataset.  So the checks read each file
once (:func:`read_coco_summary`) and keep only what they need (the
categories, the number of images, the categories that have an annotation),
without decoding the polygons; and in a multi-process job only process 0
checks, the others receive its verdict (:func:`check_datasets_once`), so that
every process stops with the same one-line error.
"""
import difflib
import importlib
import inspect
import json
import logging
import os
import os.path as osp
import re
from typing import Any, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from mmengine.config import Config, ConfigDict
from mmengine.logging import print_log
from mmengine.registry import DefaultScope

from ..errors import ConfigError, DataError, MissingFileError, UserInputError
from .bad_samples import SkipBadSamples, file_problem

#: expected layouts, quoted in errors about a missing data folder
LAYOUTS = {
    'mmdet': 'COCO layout: {ann} and the image folder {img}. For the bundled toy set run: '
             'python tools/make_toy_data.py --task det',
    'mmseg': 'ADE20K layout: images in {img} (*.jpg) and label maps in {seg} (*.png). For '
             'the bundled toy set run: python tools/make_toy_data.py --task seg',
}

#: how many label maps :func:`check_datasets` reads to check label values
LABEL_MAPS_CHECKED = 20


def task_of(cfg: Config) -> str:
    """``'mmdet'`` or ``'mmseg'``: the toolkit a config belongs to (its default scope)."""
    scope = cfg.get('default_scope')
    if scope not in ('mmdet', 'mmseg'):
        raise ConfigError(f"config default_scope is {scope!r}: inline-mm tools handle 'mmdet' "
                          f"(detection) and 'mmseg' (segmentation) configs")
    return scope


def dataset_configs(cfg: Config, loaders: Iterable[str]) -> List[Tuple[str, ConfigDict]]:
    """``(loader name, dataset config)`` of every dataset of ``loaders``, wrappers unwrapped."""
    return [(name, ds) for name, _, ds in _dataset_leaves(cfg, loaders)]


def _dataset_leaves(cfg: Config, loaders: Iterable[str]) -> List[Tuple[str, str, ConfigDict]]:
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


def _join(root: str, path: str) -> str:
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


def _builds_in_place(ds: ConfigDict) -> bool:
    """Whether a dataset config is :class:`SkipBadSamples` building its dataset in place."""
    return ds.get('type') == 'SkipBadSamples' and 'dataset_type' in ds


def _check_dataset_type(task: str, path: str, ds: ConfigDict) -> None:
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


#: a polygon list, ``"segmentation": [[x0, y0, x1, ...], ...]``, or a box, ``"bbox": [x, y, w, h]``:
#: most of a COCO file's bytes. Only numbers, commas and white space between the brackets, so
#: a match is always a whole JSON array outside any string (``"`` cannot occur in it), and
#: replacing it by ``0`` keeps a valid file valid and an invalid one invalid (but for
#: malformed numbers in such an array).
_NUMBER_ARRAYS = re.compile(rb'"(segmentation|bbox)"\s*:\s*(?:'
                            rb'\[\s*\[[-+.0-9eE,\s]*\](?:\s*,\s*\[[-+.0-9eE,\s]*\])*\s*\]'
                            rb'|\[[-+.0-9eE,\s]*\])')


class CocoSummary(NamedTuple):
    """What the checks need of a COCO-format annotation file."""

    #: the file's ``categories`` entries
    categories: List[dict]
    #: how many entries ``images`` has
    num_images: int
    #: the ``category_id`` of every non-crowd annotation (once each)
    annotated: FrozenSet[Any]
    #: the ``file_name`` of up to :data:`IMAGES_CHECKED` images, spread over the file
    image_files: Tuple[str, ...] = ()


#: how many image files of an annotation file the checks look for on disk
IMAGES_CHECKED = 2000


def read_coco_summary(path: str) -> Optional[CocoSummary]:
    """Parse an annotation file once; the :class:`CocoSummary` of it (None if not a JSON object).

    The polygons and boxes are not decoded (:data:`_NUMBER_ARRAYS`) and the annotation and
    image entries are dropped as they are parsed, so memory stays a fraction
    of what ``json.load`` of the file takes.

    Raises:
        DataError: the file cannot be read or is not valid JSON.
    """
    annotated = set()
    image_files: List[str] = []

    def keep(obj: dict) -> Optional[dict]:
        if 'image_id' in obj and 'category_id' in obj:  # an annotation
            if not obj.get('iscrowd', 0):
                try:
                    annotated.add(obj['category_id'])
                except TypeError:  # an unhashable id names no category
                    pass
            return None
        if 'file_name' in obj and 'id' in obj:  # an image entry
            if isinstance(obj['file_name'], str):
                image_files.append(obj['file_name'])
            return None
        return obj

    try:
        with open(path, 'rb') as f:
            text = _NUMBER_ARRAYS.sub(rb'"\1": 0', f.read())
        top = json.loads(text, object_hook=keep)
    except (OSError, ValueError) as err:
        raise DataError(f'annotation file {path!r} cannot be read as JSON: '
                        f'{_exact_json_error(path, err)}') from None
    if not isinstance(top, dict):
        return None
    images = top.get('images')
    categories = top.get('categories')
    return CocoSummary(
        categories=[c for c in categories if isinstance(c, dict)]
        if isinstance(categories, list) else [],
        num_images=len(images) if isinstance(images, list) else int(bool(images)),
        annotated=frozenset(annotated),
        image_files=tuple(image_files[::max(1, -(-len(image_files) // IMAGES_CHECKED))]))


def _exact_json_error(path: str, err: Exception) -> Exception:
    """The error of the file as written: positions in ``err`` are those of the reduced text.

    Only a file that cannot be read is parsed a second time.
    """
    if isinstance(err, OSError):
        return err
    try:
        with open(path, 'rb') as f:
            json.loads(f.read())
    except (OSError, ValueError) as exact:
        return exact
    return err


def _with_close_match(name: str, names: Sequence[str]) -> str:
    """``'crates'`` -> ``"'crates' (the file has 'crate')"`` when a file name is close."""
    close = difflib.get_close_matches(str(name), [str(n) for n in names], n=1, cutoff=0.6)
    return f'{name!r} (the file has {close[0]!r})' if close else repr(name)


def _check_coco_classes(cfg: Config, loader: str, ds: ConfigDict, ann_path: str,
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


def _check_seg_labels(cfg: Config, loader: str, ds: ConfigDict, seg_dir: str) -> None:
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
            f"with classes of your own use {'dataset_type' if _builds_in_place(ds) else 'type'}"
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
            if _skips_bad_samples(cfg, loader):
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


def check_datasets(cfg: Config, loaders: Iterable[str] = ('train_dataloader', 'val_dataloader',
                                                          'test_dataloader'),
                   check_classes: bool = True) -> None:
    """Fail before any work starts when a dataset does not fit the config.

    Checks every dataset of ``loaders`` (wrappers unwrapped): the data root,
    image / label folders and annotation file exist and the annotation file
    is valid JSON; with ``check_classes``, that the config's classes (the
    dataset's ``metainfo`` or its class defaults) are the annotation file's
    categories (COCO format) or cover the label values (segmentation maps),
    that the heads' ``num_classes`` equals the number of classes, and that the
    training set is not empty after mmdet filters it.  Each annotation file is
    parsed once, however many loaders name it.  First of all, no dataset config may
    keep the keys of a base config's in-place ``SkipBadSamples`` under another
    ``type`` (:func:`_check_dataset_type`).

    Raises:
        ConfigError: ``type=`` written over an in-place ``SkipBadSamples``.
        MissingFileError: a data root, image folder or annotation file is
            missing (the message names it and the layout expected).
        DataError: an annotation file cannot be parsed, a label map cannot be read
            (but in a training set that skips bad samples), or the classes do not
            fit (the message lists both and the lines to add to the config).
    """
    task = task_of(cfg)
    leaves = _dataset_leaves(cfg, loaders)
    for _, path, ds in leaves:  # the config itself first, then the files
        _check_dataset_type(task, path, ds)
    summaries: Dict[str, Optional[CocoSummary]] = {}
    for loader, _, ds in leaves:
        root = ds.get('data_root', '') or ''
        prefix = ds.get('data_prefix') or {}
        ann = ds.get('ann_file')
        layout = LAYOUTS[task].format(
            ann=_join(root, ann) if ann else '<ann_file>',
            img=_join(root, prefix.get('img', prefix.get('img_path', ''))) + os.sep,
            seg=_join(root, prefix.get('seg_map_path', '')) + os.sep)
        if root and not osp.isdir(root):
            raise MissingFileError(f'dataset folder {osp.normpath(root)!r} not found (from '
                                   f'{os.getcwd()}). Expected the {layout}')
        for folder in prefix.values():
            path = _join(root, folder)
            if folder and not osp.isdir(path):
                raise MissingFileError(f'dataset folder {path!r} not found. Expected the '
                                       f'{layout}')
        ann_path = _join(root, ann) if ann else None
        if ann_path:
            if not osp.isfile(ann_path):
                raise MissingFileError(f'annotation file {ann_path!r} not found. Expected the '
                                       f'{layout}')
            if ann_path.endswith('.json') and ann_path not in summaries:
                summaries[ann_path] = read_coco_summary(ann_path)
        if not check_classes:
            continue
        if task == 'mmdet' and ann_path and ann_path.endswith('.json'):
            if summaries[ann_path] is not None:
                _check_image_files(cfg, loader, root, prefix, ann_path, summaries[ann_path])
                _check_coco_classes(cfg, loader, ds, ann_path, summaries[ann_path])
            elif _is_coco_dataset(ds):  # pycocotools would fail with an AttributeError
                raise DataError(
                    f'annotation file {ann_path} is not a COCO annotation file: it is valid JSON '
                    f"but not an object with 'images', 'annotations' and 'categories' (e.g. "
                    f'a list). Point ann_file at the instances_*.json file of the set')
        elif task == 'mmseg' and prefix.get('seg_map_path'):
            _check_seg_labels(cfg, loader, ds, _join(root, prefix['seg_map_path']))


def _check_image_files(cfg: Config, loader: str, root: str, prefix: dict, ann_path: str,
                       coco: CocoSummary) -> None:
    """Look for (a sample of) the images an annotation file lists.

    None found: the image folder is wrong (error).  Some missing: an error,
    unless the loader's dataset is :class:`~inline_mm.engine.bad_samples.SkipBadSamples`,
    which skips and logs them during training (a warning then).
    """
    folder = _join(root, prefix.get('img', prefix.get('img_path', '')) or '')
    names = coco.image_files
    missing = [n for n in names if not osp.isfile(osp.join(folder, n))]
    if not missing:
        return
    sampled = f'{len(names)} checked' if len(names) < coco.num_images else f'{len(names)}'
    first = ', '.join(repr(n) for n in missing[:5]) + (', ...' if len(missing) > 5 else '')
    if len(missing) == len(names):
        raise MissingFileError(
            f'none of the {sampled} images that {ann_path} lists is in {folder + os.sep} '
            f'(e.g. {first}): check data_prefix.img of {loader}.dataset')
    text = (f'{len(missing)} of the {sampled} images that {ann_path} lists are missing from '
            f'{folder + os.sep}: {first}')
    if _skips_bad_samples(cfg, loader):
        print_log(f'{text}; SkipBadSamples skips and logs them (up to its limit)',
                  logger='current', level=logging.WARNING)
        return
    raise MissingFileError(f'{text}: the run would stop at the first of them. Restore them, '
                           f"or wrap {loader}.dataset in dict(type='SkipBadSamples', ...) to "
                           f'skip them')


def _skips_bad_samples(cfg: Config, loader: str) -> bool:
    """Whether the loader's dataset is :class:`SkipBadSamples` (wrapper or in place)."""
    top = (cfg.get(loader) or {}).get('dataset') or {}
    return top.get('type') == 'SkipBadSamples'


def _is_coco_dataset(ds: ConfigDict) -> bool:
    """Whether a dataset config builds mmdet's ``CocoDataset`` (or a subclass)."""
    from mmdet.datasets import CocoDataset
    cls = dataset_class('mmdet', ds)
    return isinstance(cls, type) and issubclass(cls, CocoDataset)


class _CheckFailed:
    """The verdict process 0 sends when its check failed with a bug (not the user's input)."""


def check_datasets_once(cfg: Config, loaders: Iterable[str] = ('train_dataloader',
                                                               'val_dataloader',
                                                               'test_dataloader'),
                        check_classes: bool = True) -> None:
    """:func:`check_datasets` on process 0 only; every process ends with its verdict.

    In a multi-process job (the process group must exist) process 0 checks
    and sends the outcome to the others (``mmengine.dist.broadcast_object_list``):
    nothing, or the :class:`~inline_mm.errors.UserInputError` it raised, which
    every process then raises, so all stop with the same one-line error.  In a
    single process this is :func:`check_datasets`.
    """
    from mmengine.dist import broadcast_object_list, get_rank, get_world_size, is_distributed
    if not is_distributed() or get_world_size() == 1:
        check_datasets(cfg, loaders, check_classes)
        return
    verdict: List[Any] = [None]
    failure: Optional[BaseException] = None
    if get_rank() == 0:
        try:
            check_datasets(cfg, loaders, check_classes)
        except UserInputError as err:
            verdict = [err]
        except Exception as err:  # a bug: the others must not wait for a verdict forever
            verdict, failure = [_CheckFailed()], err
    broadcast_object_list(verdict)
    if failure is not None:
        raise failure
    if isinstance(verdict[0], _CheckFailed):
        raise RuntimeError('the dataset checks failed on process 0 (its traceback is in its '
                           'output)')
    if verdict[0] is not None:
        raise verdict[0]
