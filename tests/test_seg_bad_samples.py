"""Bad-sample protection of the full recipes: every training set goes through
``SkipBadSamples`` in place, and on an ADE20K-format set the wrapper skips and logs
(once) a missing image and a truncated label map."""
import glob
import logging
import os

import pytest
from conftest import REPO_ROOT
from mmengine.logging import MMLogger
from mmengine.registry import init_default_scope

from inline_mm.engine.launch import read_config
import inline_mm.engine  # noqa: F401  (registers SkipBadSamples)
from inline_mm.datasets import make_ade_toy
from inline_mm.engine.bad_samples import BadSampleLimitError

SEG_RECIPES = sorted(glob.glob(os.path.join(REPO_ROOT, 'configs', 'seg', '*.py')))
DET_RECIPES = sorted(glob.glob(os.path.join(REPO_ROOT, 'configs', 'det', '*.py')))


@pytest.mark.parametrize('path', SEG_RECIPES + DET_RECIPES, ids=os.path.basename)
def test_every_recipe_trains_through_skip_bad_samples_in_place(path):
    cfg = read_config(path)
    seg = '/seg/' in path
    dataset_type = 'ADE20KDataset' if seg else 'CocoDataset'
    train = cfg.train_dataloader.dataset
    assert train.type == 'SkipBadSamples' and train.dataset_type == dataset_type
    assert train.max_bad_fraction == 0.01
    # in place: the dataset's own key paths are where the toolkit's base puts them
    assert 'dataset' not in train
    assert {'data_root', 'data_prefix', 'pipeline'} <= set(train)
    assert train.pipeline[0].type == 'LoadImageFromFile'
    # validation and test are not wrapped (a bad file there should stop the run)
    assert cfg.val_dataloader.dataset.type == dataset_type
    assert cfg.test_dataloader.dataset.type == dataset_type
    # what --cfg-options writes keeps the wrapper
    cfg.merge_from_dict({'train_dataloader.dataset.data_root': 'elsewhere/',
                         'train_dataloader.dataset.pipeline.2.keep_ratio': False})
    train = cfg.train_dataloader.dataset
    assert (train.type, train.dataset_type, train.data_root) == \
        ('SkipBadSamples', dataset_type, 'elsewhere/')
    assert train.pipeline[2].keep_ratio is False


@pytest.fixture()
def broken_ade(tmp_path):
    """An ADE20K-format set of 6 training images: the 2nd image deleted, the 4th label map
    cut in half. Returns the root and the two label maps that are bad."""
    root = str(tmp_path / 'broken_seg')
    make_ade_toy(root, num_train=6, num_val=1, image_size=64, seed=5)
    names = sorted(os.listdir(os.path.join(root, 'images', 'training')))
    os.remove(os.path.join(root, 'images', 'training', names[1]))
    truncated = os.path.join(root, 'annotations', 'training', names[3][:-4] + '.png')
    with open(truncated, 'rb') as f:
        data = f.read()
    with open(truncated, 'wb') as f:
        f.write(data[:len(data) // 2])
    orphan = os.path.join(root, 'annotations', 'training', names[1][:-4] + '.png')
    good = [os.path.join(root, 'images', 'training', n) for i, n in enumerate(names)
            if i not in (1, 3)]
    return root, orphan, truncated, good


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _build(root, **kwargs):
    init_default_scope('mmseg')
    from mmseg.registry import DATASETS
    return DATASETS.build(dict(
        type='SkipBadSamples', dataset_type='ADE20KDataset', data_root=root,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=[dict(type='LoadImageFromFile'),
                  dict(type='LoadAnnotations', reduce_zero_label=True)], **kwargs))


@pytest.mark.parametrize('lazy_init', [False, True])
def test_missing_image_and_truncated_label_map_are_skipped_and_logged_once(broken_ade,
                                                                          lazy_init):
    root, orphan, truncated, good = broken_ade
    records = _Records()
    logger = MMLogger.get_current_instance()
    logger.addHandler(records)
    try:
        ds = _build(root, max_bad_count=2, lazy_init=lazy_init)
        # two passes: a bad file is logged the first time only
        seen = [ds[i]['img_path'] for _ in range(2) for i in range(len(ds))]
    finally:
        logger.removeHandler(records)
    # mmseg lists the 5 images left; the truncated label map's sample is replaced
    assert len(ds) == 5
    assert set(seen) == set(good)
    assert sorted(p for p, _ in ds.bad_samples.values()) == sorted([orphan, truncated])
    skipped = [m for m in records.messages if m.startswith('skipped bad sample')]
    assert len(skipped) == 2, records.messages
    assert sum(m.startswith(f'skipped bad sample {orphan}: image missing') for m in skipped) == 1
    assert sum(m.startswith(f'skipped bad sample {truncated}: ') and 'truncated PNG' in m
               for m in skipped) == 1


def test_a_missing_image_counts_towards_the_limit(broken_ade):
    root, orphan, _, _ = broken_ade
    with pytest.raises(BadSampleLimitError, match='image missing'):
        ds = _build(root, max_bad_count=1)
        for i in range(len(ds)):
            ds[i]
    # the missing image alone is within a limit of 1, and found when the set is parsed
    ds = _build(root, max_bad_count=1, lazy_init=True)
    assert ds.bad_samples == {}
    ds.full_init()
    assert [p for p, _ in ds.bad_samples.values()] == [orphan]
