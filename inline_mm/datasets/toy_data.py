"""Deterministic synthetic datasets in the real COCO and ADE20K on-disk formats.

The toy sets let the detection / segmentation pipelines (dataset classes,
loading transforms, evaluators) run end to end without downloading COCO or
ADE20K, and are easy enough for a small Mask R-CNN / UperNet to learn within a
few hundred iterations:

* :func:`make_coco_toy` writes an instance-segmentation set that mmdet's
  ``CocoDataset`` reads with ``data_root=root``,
  ``ann_file='annotations/instances_train.json'`` and
  ``data_prefix=dict(img='train/')`` (``val`` likewise).
* :func:`make_ade_toy` writes a semantic-segmentation set in the
  ``ADEChallengeData2016`` layout that mmseg's ``ADE20KDataset`` reads with
  ``reduce_zero_label=True``.

Every image shows 1-4 crisp geometric shapes (12%-45% of the image side, random
colours chosen to contrast with what they cover, some striped, rectangles /
triangles rotated) on a smooth colour-gradient background with blurred noise
texture.  Later shapes occlude earlier ones; the placement keeps at least 40%
of every shape visible and never cuts a hole into one, so each annotation stays
recognisable and representable by COCO polygons (which have no holes).

Generation is deterministic: every image draws from its own
``numpy.random.Generator`` seeded with ``(seed, dataset, split, index)``, images
are written with a fixed JPEG quality and the JSON with a fixed layout, so the
same arguments give byte-identical files.  A dataset is written into a
temporary sibling folder and renamed into place once complete; a marker file
(``.toy_complete``) holding the generation arguments makes a second call with
the same arguments return immediately.
"""
import json
import os
import os.path as osp
from typing import Callable, List, Optional, Tuple, Union

import cv2
import numpy as np

from .toy_folder import MARKER_FILE, ProgressArg, write_once
from .toy_scenes import MIN_VISIBLE_AREA, clean_mask, mask_to_polygons, render_scene

__all__ = [
    'COCO_TOY_CLASSES', 'COCO_TOY_ALL_CLASSES', 'COCO_TOY_PALETTE',
    'ADE_TOY_CLASSES', 'ADE_TOY_PALETTE', 'coco_toy_classes', 'make_coco_toy',
    'make_ade_toy', 'MARKER_FILE'
]

#: Every shape class the generator can draw, in category-id order.
COCO_TOY_ALL_CLASSES: Tuple[str, ...] = ('circle', 'rectangle', 'triangle', 'ellipse',
                                         'star')
#: Class names of the default COCO toy set (``num_classes=3``).
COCO_TOY_CLASSES: Tuple[str, ...] = COCO_TOY_ALL_CLASSES[:3]
#: One RGB colour per entry of :data:`COCO_TOY_ALL_CLASSES` (for visualisers).
COCO_TOY_PALETTE: List[Tuple[int, int, int]] = [(220, 20, 60), (0, 130, 200), (60, 180, 75),
                                                (245, 130, 48), (145, 30, 180)]

#: Class names of the ADE toy set.  Label PNG value ``k + 1`` is class ``k``
#: (``reduce_zero_label=True`` maps it back); value 0 is never written.
ADE_TOY_CLASSES: Tuple[str, ...] = ('background', ) + COCO_TOY_CLASSES
#: One RGB colour per entry of :data:`ADE_TOY_CLASSES`.
ADE_TOY_PALETTE: List[List[int]] = [[120, 120, 120]] + [list(c) for c in COCO_TOY_PALETTE[:3]]

# Bumped whenever the generator's output changes, so that an old folder with
# the same arguments is regenerated instead of being reused.
_GENERATOR_VERSION = 1
_JPEG_QUALITY = 95
_MIN_SIZE = 32

def coco_toy_classes(num_classes: int = 3) -> Tuple[str, ...]:
    """Class names of a COCO toy set made with ``num_classes`` classes.

    Args:
        num_classes (int): Number of shape classes, 3 to 5.

    Returns:
        tuple[str]: The first ``num_classes`` entries of
        :data:`COCO_TOY_ALL_CLASSES` (category ids ``1..num_classes``).
    """
    _check_int('num_classes', num_classes, 3, len(COCO_TOY_ALL_CLASSES))
    return COCO_TOY_ALL_CLASSES[:num_classes]


def _check_int(name: str, value, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f'{name} must be an integer, got {value!r}')
    if value < low or (high is not None and value > high):
        bound = f'>= {low}' if high is None else f'in [{low}, {high}]'
        raise ValueError(f'{name} must be {bound}, got {value}')
    return int(value)


def _check_args(root, num_train, num_val, image_size, seed) -> Tuple:
    """``(root, num_train, num_val, height, width, seed)``, checked in this order."""
    if not isinstance(root, (str, os.PathLike)) or not str(root):
        raise ValueError(f'root must be a non-empty path, got {root!r}')
    root = osp.abspath(os.fspath(root))
    num_train = _check_int('num_train', num_train, 1)
    num_val = _check_int('num_val', num_val, 1)
    if isinstance(image_size, (list, tuple)):
        if len(image_size) != 2:
            raise ValueError(
                f'image_size must be an int or a (height, width) pair, got {image_size!r}')
        h = _check_int('image_size height', image_size[0], _MIN_SIZE)
        w = _check_int('image_size width', image_size[1], _MIN_SIZE)
    else:
        h = w = _check_int('image_size', image_size, _MIN_SIZE)
    return root, num_train, num_val, h, w, _check_int('seed', seed, 0)


def _write_jpg(path: str, image_rgb: np.ndarray) -> None:
    if not cv2.imwrite(path, np.ascontiguousarray(image_rgb[..., ::-1]),
                       [cv2.IMWRITE_JPEG_QUALITY, _JPEG_QUALITY]):
        raise OSError(f'could not write {path}')


# seeds (seed, task, split, index): the two sets never draw the same images
_TASK_COCO, _TASK_ADE = 0, 1


def make_coco_toy(root: str,
                  num_train: int = 400,
                  num_val: int = 50,
                  image_size: Union[int, Tuple[int, int]] = 256,
                  seed: int = 0,
                  num_classes: int = 3,
                  progress: ProgressArg = False,
                  force: bool = False) -> dict:
    """Write a COCO-format instance-segmentation toy dataset.

    Layout (what mmdet's ``CocoDataset`` expects with ``data_root=root``)::

        root/train/000001.jpg ...
        root/val/000001.jpg ...
        root/annotations/instances_train.json
        root/annotations/instances_val.json
        root/.toy_complete

    Each annotation is the *visible* part of one shape (later shapes occlude
    earlier ones) as polygons, with ``bbox`` ``[x, y, w, h]`` and ``area``
    (pixel count) of that visible mask.  Shapes with less than 1% of the
    image visible are not annotated; every image has at least one annotation.
    Category ids are ``1..num_classes`` in :func:`coco_toy_classes` order.

    Args:
        root (str): Output folder (created; its parent too).
        num_train (int): Training images, >= 1. Defaults to 400.
        num_val (int): Validation images, >= 1. Defaults to 50.
        image_size (int | tuple[int, int]): Side, or ``(height, width)``,
            each >= 32. Defaults to 256.
        seed (int): Non-negative base seed. Defaults to 0.
        num_classes (int): Shape classes, 3 to 5 (circle, rectangle,
            triangle, ellipse, star). Defaults to 3.
        progress (bool | callable): ``True`` shows an mmengine
            ``ProgressBar``; a callable is called as ``progress(done, total)``
            after every image. Defaults to False (silent).
        force (bool): Regenerate even if ``root`` already holds a complete
            set made with the same arguments. Defaults to False.

    Returns:
        dict: Summary with ``root``, ``classes``, ``num_images`` and
        ``num_annotations`` per split, ``args`` and ``generated`` (False when
        an existing complete dataset was reused).

    Raises:
        ValueError: For invalid arguments.
        FileExistsError: If ``root`` is a non-empty folder not written by
            this generator.
    """
    root, num_train, num_val, h, w, seed = _check_args(root, num_train, num_val, image_size,
                                                        seed)
    classes = coco_toy_classes(num_classes)
    counts = dict(train=num_train, val=num_val)
    args = dict(kind='coco_toy', version=_GENERATOR_VERSION, num_train=num_train,
                num_val=num_val, height=h, width=w, seed=seed, num_classes=num_classes)
    categories = [dict(id=i + 1, name=name, supercategory='shape')
                  for i, name in enumerate(classes)]

    def write(out: str, step: Callable[[], None]) -> dict:
        os.makedirs(osp.join(out, 'annotations'))
        summary = dict(classes=list(classes), num_images={}, num_annotations={})
        for split, split_code in (('train', 0), ('val', 1)):
            os.makedirs(osp.join(out, split))
            images, annotations = [], []
            for index in range(counts[split]):
                rng = np.random.default_rng([seed, _TASK_COCO, split_code, index])
                image, inst, labels = render_scene(rng, h, w, classes)
                image_id = index + 1
                file_name = f'{image_id:06d}.jpg'
                _write_jpg(osp.join(out, split, file_name), image)
                images.append(dict(id=image_id, file_name=file_name, height=h, width=w))
                for obj, label in enumerate(labels):
                    mask = clean_mask(inst == obj + 1)
                    area = int(mask.sum())
                    if area < MIN_VISIBLE_AREA * h * w:
                        continue
                    polygons = mask_to_polygons(mask)
                    if not polygons:
                        continue
                    ys, xs = np.nonzero(mask)
                    bbox = [int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1),
                            int(ys.max() - ys.min() + 1)]
                    annotations.append(
                        dict(id=len(annotations) + 1, image_id=image_id,
                             category_id=label + 1, segmentation=polygons, area=area,
                             bbox=bbox, iscrowd=0))
                step()
            coco = dict(
                info=dict(description=f'inline-mm synthetic shapes ({split})',
                          version=str(_GENERATOR_VERSION), year=2024),
                licenses=[], images=images, annotations=annotations,
                categories=categories)
            with open(osp.join(out, 'annotations', f'instances_{split}.json'), 'w') as f:
                # Fixed key order and separators: byte-identical reruns.
                json.dump(coco, f, separators=(',', ':'))
            summary['num_images'][split] = len(images)
            summary['num_annotations'][split] = len(annotations)
        return summary

    expected = {
        'train': (num_train, '.jpg'),
        'val': (num_val, '.jpg'),
        'annotations': (2, '.json'),
    }
    return write_once(root, args, expected, write, num_train + num_val, progress, force)


def make_ade_toy(root: str,
                 num_train: int = 1000,
                 num_val: int = 40,
                 image_size: Union[int, Tuple[int, int]] = 256,
                 seed: int = 0,
                 progress: ProgressArg = False,
                 force: bool = False) -> dict:
    """Write an ADE20K-layout semantic-segmentation toy dataset.

    Layout (``ADEChallengeData2016``; image ``x.jpg`` pairs with label
    ``x.png``)::

        root/images/training/toy_000001.jpg ...
        root/images/validation/...
        root/annotations/training/toy_000001.png ...
        root/annotations/validation/...
        root/.toy_complete

    Labels are single-channel uint8 PNGs following ADE20K's convention for
    ``reduce_zero_label=True``: value ``k + 1`` is class ``k`` of
    :data:`ADE_TOY_CLASSES` (1 background, 2 circle, 3 rectangle, 4
    triangle); 0 would be ignored and is not written.  Every image contains
    background and at least one shape.

    Args:
        root (str): Output folder (created; its parent too).
        num_train (int): Training images, >= 1. Defaults to 1000 (with fewer, the
            toy Semantic FPN overfits before it separates the shapes).
        num_val (int): Validation images, >= 1. Defaults to 40.
        image_size (int | tuple[int, int]): Side, or ``(height, width)``,
            each >= 32. Defaults to 256.
        seed (int): Non-negative base seed. Defaults to 0.
        progress (bool | callable): As in :func:`make_coco_toy`.
        force (bool): As in :func:`make_coco_toy`.

    Returns:
        dict: Summary with ``root``, ``classes``, ``num_images`` per split,
        ``args`` and ``generated``.

    Raises:
        ValueError: For invalid arguments.
        FileExistsError: If ``root`` is a non-empty folder not written by
            this generator.
    """
    root, num_train, num_val, h, w, seed = _check_args(root, num_train, num_val, image_size,
                                                        seed)
    shapes = ADE_TOY_CLASSES[1:]
    counts = dict(training=num_train, validation=num_val)
    args = dict(kind='ade_toy', version=_GENERATOR_VERSION, num_train=num_train,
                num_val=num_val, height=h, width=w, seed=seed)

    def write(out: str, step: Callable[[], None]) -> dict:
        summary = dict(classes=list(ADE_TOY_CLASSES), num_images={})
        for split, split_code in (('training', 0), ('validation', 1)):
            img_dir = osp.join(out, 'images', split)
            ann_dir = osp.join(out, 'annotations', split)
            os.makedirs(img_dir)
            os.makedirs(ann_dir)
            for index in range(counts[split]):
                rng = np.random.default_rng([seed, _TASK_ADE, split_code, index])
                image, inst, labels = render_scene(rng, h, w, shapes)
                # inst 0 -> 1 (background); object i -> its class + 2.
                lut = np.array([1] + [label + 2 for label in labels], np.uint8)
                seg = lut[inst]
                stem = f'toy_{index + 1:06d}'
                _write_jpg(osp.join(img_dir, stem + '.jpg'), image)
                if not cv2.imwrite(osp.join(ann_dir, stem + '.png'), seg):
                    raise OSError(f'could not write {stem}.png')
                step()
            summary['num_images'][split] = counts[split]
        return summary

    expected = {
        'images/training': (num_train, '.jpg'),
        'images/validation': (num_val, '.jpg'),
        'annotations/training': (num_train, '.png'),
        'annotations/validation': (num_val, '.png'),
    }
    return write_once(root, args, expected, write, num_train + num_val, progress, force)
