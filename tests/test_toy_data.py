"""The synthetic COCO / ADE20K toy datasets: format, consistency, determinism.

The sets are read back with the real loaders (pycocotools, mmdet's
``CocoDataset``, mmseg's ``ADE20KDataset``) so a format mistake fails here
rather than in a training run.
"""
import json
import os
import os.path as osp
import subprocess
import sys

import cv2
import numpy as np
import pytest

from inline_mm.datasets import (ADE_TOY_CLASSES, ADE_TOY_PALETTE, COCO_TOY_CLASSES,
                                MARKER_FILE, coco_toy_classes, make_ade_toy,
                                make_coco_toy)

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SMALL = dict(num_train=8, num_val=3, image_size=96, seed=0)
SPLITS = ('train', 'val')


@pytest.fixture(scope='module')
def coco_root(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp('toy') / 'coco_toy')
    summary = make_coco_toy(root, **SMALL)
    assert summary['generated'] and summary['root'] == root
    return root


@pytest.fixture(scope='module')
def ade_root(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp('toy') / 'ade_toy')
    make_ade_toy(root, **SMALL)
    return root


def _load(root: str, split: str) -> dict:
    with open(osp.join(root, 'annotations', f'instances_{split}.json')) as f:
        return json.load(f)


def _read(path: str) -> np.ndarray:
    img = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    assert img is not None, path
    return img


# ----------------------------------------------------------------------------
# COCO toy set
# ----------------------------------------------------------------------------
def test_coco_layout(coco_root):
    assert osp.isfile(osp.join(coco_root, MARKER_FILE))
    for split, n in (('train', SMALL['num_train']), ('val', SMALL['num_val'])):
        coco = _load(coco_root, split)
        names = sorted(os.listdir(osp.join(coco_root, split)))
        assert names == sorted(img['file_name'] for img in coco['images'])
        assert len(names) == n
        for img in coco['images']:
            assert _read(osp.join(coco_root, split, img['file_name'])).shape == (96, 96, 3)
            assert (img['height'], img['width']) == (96, 96)
        assert [c['id'] for c in coco['categories']] == [1, 2, 3]
        assert tuple(c['name'] for c in coco['categories']) == COCO_TOY_CLASSES
        assert all(c['supercategory'] for c in coco['categories'])
    # Nothing but the dataset next to it (the temporary folder was renamed).
    assert os.listdir(osp.dirname(coco_root)) == ['coco_toy']


def test_coco_annotations_match_masks(coco_root):
    from pycocotools.coco import COCO
    used, max_per_image = set(), 0
    for split in SPLITS:
        coco = COCO(osp.join(coco_root, 'annotations', f'instances_{split}.json'))
        ann_ids = coco.getAnnIds()
        assert len(set(ann_ids)) == len(ann_ids)
        for img_id in coco.getImgIds():
            anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
            assert anns, f'{split} image {img_id} has no annotation'
            max_per_image = max(max_per_image, len(anns))
            for ann in anns:
                used.add(ann['category_id'])
                assert ann['iscrowd'] == 0
                assert ann['area'] >= 0.01 * 96 * 96
                assert all(len(p) >= 6 and len(p) % 2 == 0 for p in ann['segmentation'])
                mask = coco.annToMask(ann)
                # The polygons rasterise back to the visible mask they came from.
                assert abs(int(mask.sum()) - ann['area']) <= max(3, 0.02 * ann['area'])
                ys, xs = np.nonzero(mask)
                x, y, w, h = ann['bbox']
                box = [int(xs.min()), int(ys.min()), int(xs.max() + 1 - xs.min()),
                       int(ys.max() + 1 - ys.min())]
                # [x, y, w, h] of the visible pixels: exactly the tight box, w = x_max + 1 - x
                assert box == [x, y, w, h], (box, ann['bbox'])
                assert 0 <= x and 0 <= y and x + w <= 96 and y + h <= 96
    assert used == {1, 2, 3}
    assert max_per_image >= 2


def test_coco_overlaps_are_annotated_as_visible_parts(coco_root):
    """Objects do occlude each other, and an occluded object is annotated with
    what is left of it: no pixel belongs to two annotations of one image."""
    from pycocotools.coco import COCO
    coco = COCO(osp.join(coco_root, 'annotations', 'instances_train.json'))
    touching = 0
    for img_id in coco.getImgIds():
        masks = [coco.annToMask(a) for a in coco.loadAnns(coco.getAnnIds(imgIds=img_id))]
        assert (np.sum(masks, axis=0) > 1).sum() <= 0.01 * sum(m.sum() for m in masks)
        grown = [cv2.dilate(m, np.ones((3, 3), np.uint8)) for m in masks]
        touching += any((grown[i] & masks[j]).any()
                        for i in range(len(masks)) for j in range(len(masks)) if i != j)
    assert touching >= 1


def test_coco_deterministic(tmp_path, coco_root):
    other = str(tmp_path / 'again')
    make_coco_toy(other, **SMALL)
    for split in SPLITS:
        rel = osp.join('annotations', f'instances_{split}.json')
        with open(osp.join(coco_root, rel), 'rb') as a, open(osp.join(other, rel), 'rb') as b:
            assert a.read() == b.read()
        for name in os.listdir(osp.join(coco_root, split)):
            np.testing.assert_array_equal(_read(osp.join(coco_root, split, name)),
                                          _read(osp.join(other, split, name)))
    # Another seed gives other images.
    reseeded = str(tmp_path / 'seed1')
    make_coco_toy(reseeded, **dict(SMALL, seed=1, num_train=1, num_val=1))
    assert not np.array_equal(_read(osp.join(coco_root, 'train', '000001.jpg')),
                              _read(osp.join(reseeded, 'train', '000001.jpg')))


def test_coco_more_classes(tmp_path):
    assert coco_toy_classes(5) == ('circle', 'rectangle', 'triangle', 'ellipse', 'star')
    root = str(tmp_path / 'five')
    summary = make_coco_toy(root, num_train=4, num_val=1, image_size=64, num_classes=5)
    assert summary['classes'] == list(coco_toy_classes(5))
    assert [c['id'] for c in _load(root, 'train')['categories']] == [1, 2, 3, 4, 5]


def test_idempotent_and_safe(tmp_path):
    root = str(tmp_path / 'coco_toy')
    args = dict(num_train=2, num_val=1, image_size=48)
    assert make_coco_toy(root, **args)['generated']
    ann = osp.join(root, 'annotations', 'instances_train.json')
    stamp = os.stat(ann).st_mtime_ns
    # Same arguments: reused as is.
    again = make_coco_toy(root, **args)
    assert not again['generated'] and os.stat(ann).st_mtime_ns == stamp
    assert again['num_images'] == {'train': 2, 'val': 1}
    # A missing file makes the set incomplete: regenerated.
    os.remove(osp.join(root, 'train', '000002.jpg'))
    assert make_coco_toy(root, **args)['generated']
    assert osp.isfile(osp.join(root, 'train', '000002.jpg'))
    # Other arguments: replaced.
    assert make_coco_toy(root, **dict(args, num_train=3))['num_images']['train'] == 3
    assert len(os.listdir(osp.join(root, 'train'))) == 3
    assert os.listdir(tmp_path) == ['coco_toy']  # no temporary folders left
    # A folder the generator did not write is never overwritten.
    foreign = tmp_path / 'mine'
    foreign.mkdir()
    (foreign / 'keep.txt').write_text('x')
    with pytest.raises(FileExistsError, match='not a toy dataset'):
        make_coco_toy(str(foreign), **args)
    assert (foreign / 'keep.txt').read_text() == 'x'


def test_mmdet_coco_dataset(coco_root):
    from mmdet.datasets import CocoDataset
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    coco = _load(coco_root, 'train')
    dataset = CocoDataset(
        data_root=coco_root,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        metainfo=dict(classes=COCO_TOY_CLASSES),
        pipeline=[],
        test_mode=False)
    assert len(dataset) == SMALL['num_train']
    assert dataset.metainfo['classes'] == COCO_TOY_CLASSES
    # The registered subclass has the toy classes as defaults.
    from mmdet.registry import DATASETS
    toy = DATASETS.build(dict(type='CocoToyDataset', data_root=coco_root,
                              ann_file='annotations/instances_train.json',
                              data_prefix=dict(img='train/'), pipeline=[]))
    assert toy.metainfo['classes'] == COCO_TOY_CLASSES
    assert len(toy) == len(dataset)
    per_image = {}
    for ann in coco['annotations']:
        per_image.setdefault(ann['image_id'], []).append(ann)
    for i in range(len(dataset)):
        info = dataset.get_data_info(i)
        assert osp.isfile(info['img_path'])
        anns = per_image[info['img_id']]
        assert len(info['instances']) == len(anns)
        for inst, ann in zip(info['instances'], anns):
            x, y, w, h = ann['bbox']
            assert inst['bbox'] == [x, y, x + w, y + h]
            assert inst['bbox_label'] == ann['category_id'] - 1
            assert inst['ignore_flag'] == 0
            assert inst['mask'] == ann['segmentation']


# ----------------------------------------------------------------------------
# ADE toy set
# ----------------------------------------------------------------------------
def test_ade_layout_and_labels(ade_root):
    assert osp.isfile(osp.join(ade_root, MARKER_FILE))
    num_values = len(ADE_TOY_CLASSES)
    for split, n in (('training', SMALL['num_train']), ('validation', SMALL['num_val'])):
        images = sorted(os.listdir(osp.join(ade_root, 'images', split)))
        labels = sorted(os.listdir(osp.join(ade_root, 'annotations', split)))
        assert len(images) == n
        assert [osp.splitext(f)[0] for f in images] == [osp.splitext(f)[0] for f in labels]
        assert all(f.endswith('.jpg') for f in images)
        assert all(f.endswith('.png') for f in labels)
        for img_name, label_name in zip(images, labels):
            img = _read(osp.join(ade_root, 'images', split, img_name))
            seg = _read(osp.join(ade_root, 'annotations', split, label_name))
            assert img.shape == (96, 96, 3)
            assert seg.shape == (96, 96) and seg.dtype == np.uint8
            values = set(np.unique(seg).tolist())
            # 0 is ignore under reduce_zero_label; 1 = background; 2.. shapes.
            assert values <= set(range(num_values + 1))
            assert 1 in values and values - {0, 1}, values


def test_ade_deterministic(tmp_path, ade_root):
    other = str(tmp_path / 'again')
    make_ade_toy(other, **SMALL)
    for sub in ('images/training', 'annotations/validation'):
        for name in os.listdir(osp.join(ade_root, sub)):
            np.testing.assert_array_equal(_read(osp.join(ade_root, sub, name)),
                                          _read(osp.join(other, sub, name)))
    # Another seed gives other images.
    reseeded = str(tmp_path / 'seed1')
    make_ade_toy(reseeded, **dict(SMALL, seed=1, num_train=1, num_val=1))
    name = osp.join('images', 'training', 'toy_000001.jpg')
    assert not np.array_equal(_read(osp.join(ade_root, name)), _read(osp.join(reseeded, name)))


def test_mmseg_ade_dataset(ade_root):
    from mmengine.registry import init_default_scope
    from mmseg.datasets import ADE20KDataset, LoadAnnotations
    from mmseg.registry import DATASETS
    init_default_scope('mmseg')
    assert len(ADE_TOY_PALETTE) == len(ADE_TOY_CLASSES)
    kwargs = dict(
        data_root=ade_root,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=[],
        reduce_zero_label=True)
    # mmseg's own class finds every image / label pair of the layout ...
    plain = ADE20KDataset(**kwargs)
    assert len(plain) == SMALL['num_train']
    # ... but refuses class names outside ADE20K's 150: hence ADEToyDataset.
    with pytest.raises(ValueError, match='not a subset'):
        ADE20KDataset(metainfo=dict(classes=ADE_TOY_CLASSES, palette=ADE_TOY_PALETTE),
                      **kwargs)
    dataset = DATASETS.build(
        dict(type='ADEToyDataset',
             metainfo=dict(classes=ADE_TOY_CLASSES, palette=ADE_TOY_PALETTE), **kwargs))
    assert isinstance(dataset, ADE20KDataset)
    assert len(dataset) == SMALL['num_train']
    assert dataset.metainfo['classes'] == ADE_TOY_CLASSES
    assert dataset.metainfo['palette'] == ADE_TOY_PALETTE
    load = LoadAnnotations(reduce_zero_label=True)
    for i in range(len(dataset)):
        info = dataset.get_data_info(i)
        assert info == plain.get_data_info(i)
        assert osp.isfile(info['img_path']) and osp.isfile(info['seg_map_path'])
        assert (osp.splitext(osp.basename(info['img_path']))[0] == osp.splitext(
            osp.basename(info['seg_map_path']))[0])
        assert info['reduce_zero_label']
        # After the zero-label reduction: 0 background, 1..3 shapes.
        seg = load(dict(info))['gt_seg_map']
        assert set(np.unique(seg).tolist()) <= set(range(len(ADE_TOY_CLASSES)))
        assert 0 in seg and seg.max() >= 1


# ----------------------------------------------------------------------------
# Arguments and command line
# ----------------------------------------------------------------------------
@pytest.mark.parametrize('make', [make_coco_toy, make_ade_toy])
@pytest.mark.parametrize('kwargs, message', [
    (dict(num_train=0), 'num_train must be >= 1'),
    (dict(num_val=0), 'num_val must be >= 1'),
    (dict(num_train=2.5), 'num_train must be an integer'),
    (dict(image_size=31), 'image_size must be >= 32'),
    (dict(image_size=(64, 16)), 'image_size width must be >= 32'),
    (dict(image_size=(64, 64, 3)), r'\(height, width\) pair'),
    (dict(seed=-1), 'seed must be >= 0'),
])
def test_bad_arguments(tmp_path, make, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(str(tmp_path / 'x'), **kwargs)
    assert not osp.exists(tmp_path / 'x')


@pytest.mark.parametrize('num_classes', [2, 6])
def test_bad_num_classes(tmp_path, num_classes):
    with pytest.raises(ValueError, match=r'num_classes must be in \[3, 5\]'):
        make_coco_toy(str(tmp_path / 'x'), num_classes=num_classes)


def test_cli(tmp_path):
    out = tmp_path / 'data'
    cmd = [sys.executable, osp.join(REPO_ROOT, 'tools', 'make_toy_data.py'), '--out', str(out),
           '--num-train', '2', '--num-val', '1', '--size', '48']
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert str(out / 'coco_toy') in result.stdout and str(out / 'ade_toy') in result.stdout
    assert len(os.listdir(out / 'coco_toy' / 'train')) == 2
    assert len(os.listdir(out / 'ade_toy' / 'annotations' / 'validation')) == 1
    bad = subprocess.run(cmd[:2] + ['--out', str(out), '--size', '8'], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and 'image_size must be >= 32' in bad.stderr
