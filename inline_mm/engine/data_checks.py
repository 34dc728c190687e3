"""The tools' checks of the datasets against the config, run once per job.

mmengine finds a missing folder, a broken annotation file or classes that do
not fit only when it builds the dataset (after the work dir and its log are
written), or never.  Before anything is built or written, ``tools/train.py``
/ ``tools/test.py`` check every dataset of the loaders they use
(:func:`check_datasets`): the data folders and annotation files exist, an
annotation file is valid JSON (read once, :mod:`~inline_mm.engine.coco_summary`),
the images it lists are there, the config's classes are the COCO file's
categories or cover the label values of a segmentation set and the heads'
``num_classes`` equals their number (:mod:`~inline_mm.engine.class_checks`),
and the training set is not empty after mmdet filters it.  In a multi-process
job only process 0 checks, the others receive its verdict
(:func:`check_datasets_once`), so that every process stops with the same
one-line error.
"""
import logging
import os
import os.path as osp
from typing import Dict, Iterable, Optional

from mmengine.config import Config
from mmengine.logging import print_log

from ..errors import DataError, MissingFileError
from .class_checks import check_coco_classes, check_seg_labels
from .coco_summary import CocoSummary, read_coco_summary
from .dataset_cfg import (check_dataset_type, dataset_leaves, is_coco_dataset, join_root,
                          skips_bad_samples)
# imported from here by runner_utils and the tools
from .dataset_cfg import dataset_class, dataset_configs, task_of  # noqa: F401
from .dist import check_on_process_zero

#: expected layouts, quoted in errors about a missing data folder
LAYOUTS = {
    'mmdet': 'COCO layout: {ann} and the image folder {img}',
    'mmseg': 'ADE20K layout: images in {img} (*.jpg) and label maps in {seg} (*.png)',
}
#: what makes the folder: the bundled toy sets (the toy configs read data/*_toy) or the data
MAKE_DATA = {
    'mmdet': ('python tools/make_toy_data.py --task det',
              'COCO 2017 (or your own COCO-format set)'),
    'mmseg': ('python tools/make_toy_data.py --task seg',
              'ADE20K (ADEChallengeData2016, or your own set in its layout)'),
}


def _how_to_make(task: str, root: str) -> str:
    toy, real = MAKE_DATA[task]
    if osp.basename(osp.normpath(root)).endswith('_toy'):
        return f'For the bundled toy set run: {toy}'
    return (f'Put {real} there, or point the config at it with --cfg-options '
            f'<loader>.dataset.data_root=PATH (the toy configs in configs/*/toy read the '
            f'synthetic sets of: {toy})')


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
    ``type`` (:func:`check_dataset_type`).

    Raises:
        ConfigError: ``type=`` written over an in-place ``SkipBadSamples``.
        MissingFileError: a data root, image folder or annotation file is
            missing (the message names it and the layout expected).
        DataError: an annotation file cannot be parsed, a label map cannot be read
            (but in a training set that skips bad samples), or the classes do not
            fit (the message lists both and the lines to add to the config).
    """
    task = task_of(cfg)
    leaves = dataset_leaves(cfg, loaders)
    for _, path, ds in leaves:  # the config itself first, then the files
        check_dataset_type(task, path, ds)
    summaries: Dict[str, Optional[CocoSummary]] = {}
    for loader, _, ds in leaves:
        root = ds.get('data_root', '') or ''
        prefix = ds.get('data_prefix') or {}
        ann = ds.get('ann_file')
        layout = LAYOUTS[task].format(
            ann=join_root(root, ann) if ann else '<ann_file>',
            img=join_root(root, prefix.get('img', prefix.get('img_path', ''))) + os.sep,
            seg=join_root(root, prefix.get('seg_map_path', '')) + os.sep)
        if root and not osp.isdir(root):
            raise MissingFileError(f'dataset folder {osp.normpath(root)!r} not found (from '
                                   f'{os.getcwd()}). Expected the {layout}. '
                                   f'{_how_to_make(task, root)}')
        for folder in prefix.values():
            path = join_root(root, folder)
            if folder and not osp.isdir(path):
                raise MissingFileError(f'dataset folder {path!r} not found. Expected the '
                                       f'{layout}')
        ann_path = join_root(root, ann) if ann else None
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
                check_coco_classes(cfg, loader, ds, ann_path, summaries[ann_path])
            elif is_coco_dataset(ds):  # pycocotools would fail with an AttributeError
                raise DataError(
                    f'annotation file {ann_path} is not a COCO annotation file: it is valid JSON '
                    f"but not an object with 'images', 'annotations' and 'categories' (e.g. "
                    f'a list). Point ann_file at the instances_*.json file of the set')
        elif task == 'mmseg' and prefix.get('seg_map_path'):
            check_seg_labels(cfg, loader, ds, join_root(root, prefix['seg_map_path']))


def _check_image_files(cfg: Config, loader: str, root: str, prefix: dict, ann_path: str,
                       coco: CocoSummary) -> None:
    """Look for (a sample of) the images an annotation file lists.

    None found: the image folder is wrong (error).  Some missing: an error,
    unless the loader's dataset is :class:`~inline_mm.engine.bad_samples.SkipBadSamples`,
    which skips and logs them during training (a warning then).
    """
    folder = join_root(root, prefix.get('img', prefix.get('img_path', '')) or '')
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
    if skips_bad_samples(cfg, loader):
        print_log(f'{text}; SkipBadSamples skips and logs them (up to its limit)',
                  logger='current', level=logging.WARNING)
        return
    raise MissingFileError(f'{text}: the run would stop at the first of them. Restore them, '
                           f"or wrap {loader}.dataset in dict(type='SkipBadSamples', ...) to "
                           f'skip them')


def check_datasets_once(cfg: Config, loaders: Iterable[str] = ('train_dataloader',
                                                               'val_dataloader',
                                                               'test_dataloader'),
                        check_classes: bool = True) -> None:
    """:func:`check_datasets` on process 0 only; every process ends with its verdict.

    See :func:`~inline_mm.engine.dist.check_on_process_zero`; in a single
    process this is :func:`check_datasets`.
    """
    check_on_process_zero(lambda: check_datasets(cfg, loaders, check_classes),
                          'the dataset checks')
