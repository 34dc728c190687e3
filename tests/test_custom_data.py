"""Training on a COCO-format / ADE20K-format set of one's own, as the README shows it.

The README's configs are read from the README itself (the fenced block after
each ``<!-- ... -->`` marker), so what users copy is what is tested.
"""
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from inline_mm.datasets import make_ade_toy, make_coco_toy

TRAIN = os.path.join(REPO_ROOT, 'tools', 'train.py')

# subprocess runs (training, fresh interpreters): the slow tier
pytestmark = pytest.mark.slow


def readme_config(marker: str) -> str:
    with open(os.path.join(REPO_ROOT, 'README.md')) as f:
        text = f.read()
    found = re.search(rf'<!-- {marker} -->\s*```python\n(.*?)```', text, re.S)
    assert found, f'README.md has no python block after <!-- {marker} -->'
    return found.group(1)


def run(args, **env):
    return subprocess.run([sys.executable, TRAIN, *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=dict(os.environ, OMP_NUM_THREADS='1', **env))


@pytest.fixture(scope='module')
def shapes_coco(tmp_path_factory):
    """A COCO-format set whose categories are not COCO's (circle, rectangle, triangle)."""
    root = str(tmp_path_factory.mktemp('custom') / 'my_set')
    make_coco_toy(root, num_train=4, num_val=2, image_size=96, seed=3)
    return root


def _data_options(root):
    return [f'train_dataloader.dataset.data_root={root}/',
            f'val_dataloader.dataset.data_root={root}/',
            f'test_dataloader.dataset.data_root={root}/',
            'train_dataloader.dataset.ann_file=annotations/instances_train.json',
            'train_dataloader.dataset.data_prefix.img=train/',
            'val_dataloader.dataset.ann_file=annotations/instances_val.json',
            'val_dataloader.dataset.data_prefix.img=val/',
            'test_dataloader.dataset.ann_file=annotations/instances_val.json',
            'test_dataloader.dataset.data_prefix.img=val/',
            f'val_evaluator.ann_file={root}/annotations/instances_val.json',
            f'test_evaluator.ann_file={root}/annotations/instances_val.json']


def test_other_categories_stop_with_both_class_lists(shapes_coco, tmp_path):
    """The full config pointed at the set without metainfo: one clear line, nothing written."""
    work = tmp_path / 'work'
    out = run([os.path.join(REPO_ROOT, 'configs', 'det', 'mask_rcnn_inline_pvt.py'),
               '--work-dir', str(work), '--cfg-options', *_data_options(shapes_coco)])
    assert out.returncode == 2, out.stderr[-3000:]
    assert 'Traceback' not in out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith('error: the categories of')
    # both class lists, and the lines to add
    assert "'circle', 'rectangle', 'triangle'" in line and "'person', 'bicycle'" in line
    assert "metainfo=dict(classes=('circle', 'rectangle', 'triangle'))" in line
    assert 'model.roi_head.bbox_head.num_classes=3' in line
    assert 'model.roi_head.mask_head.num_classes=3' in line
    assert not work.exists()


@pytest.mark.slow
def test_readme_config_trains_on_the_set(shapes_coco, tmp_path):
    config = readme_config('custom-coco-config')
    path = tmp_path / 'my_mask_rcnn.py'
    # the README's file lives in configs/det/; here the base is named by its full path
    path.write_text(config.replace("'./mask-rcnn_inline-pvt-t_fpn_1x_coco.py'",
                                   repr(os.path.join(REPO_ROOT, 'configs', 'det',
                                                     'mask-rcnn_inline-pvt-t_fpn_1x_coco.py')))
                    .replace("'data/my_set/'", repr(shapes_coco + '/')))
    work = tmp_path / 'work'
    # kept small for the CPU: no ImageNet weights, 128 px, one epoch of 2 iterations
    out = run([str(path), '--work-dir', str(work), '--cfg-options',
               'model.backbone.init_cfg=None', 'model.backbone.depths=[1,1,1,1]',
               'train_dataloader.dataset.pipeline.2.scale=(128,128)',
               'train_cfg.max_epochs=1', 'train_cfg.val_interval=10',
               'default_hooks.logger.interval=1'])
    assert out.returncode == 0, out.stderr[-3000:]
    assert (work / 'epoch_1.pth').is_file()
    log = out.stdout + out.stderr
    assert re.search(r'Epoch\(train\) \[1\]\[2/2\].*loss: [0-9.]+', log), log[-2000:]


@pytest.fixture(scope='module')
def shapes_ade(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('custom_seg') / 'my_seg_set')
    make_ade_toy(root, num_train=4, num_val=2, image_size=96, seed=3)
    return root


def test_ade20k_dataset_refuses_other_classes_clearly(shapes_ade, tmp_path):
    """ADE20KDataset with classes of one's own: the plugin names the dataset type to use."""
    out = run([os.path.join(REPO_ROOT, 'configs', 'seg',
                            'fpn_inline-pvt-t_4xb4-80k_ade20k-512x512.py'),
               '--work-dir', str(tmp_path / 'work'), '--cfg-options',
               f'train_dataloader.dataset.data_root={shapes_ade}/',
               f'val_dataloader.dataset.data_root={shapes_ade}/',
               "train_dataloader.dataset.metainfo.classes=['background','circle']"])
    assert out.returncode == 2, out.stderr[-3000:]
    # the recipe builds its training set in place through SkipBadSamples
    assert "use dataset_type='BaseSegDataset' in train_dataloader.dataset" in \
        out.stderr.strip().splitlines()[-1]


SEG_BASE = os.path.join(REPO_ROOT, 'configs', 'seg', 'fpn_inline-pvt-t_4xb4-80k_ade20k-512x512.py')
DET_BASE = os.path.join(REPO_ROOT, 'configs', 'det', 'mask-rcnn_inline-pvt-t_fpn_1x_coco.py')


def write_seg_config(path, root: str, config: str = '') -> str:
    """The README's seg block (or ``config``, a variant of it), its base named by full path."""
    config = config or readme_config('custom-ade-config')
    path.write_text(config.replace("'./fpn_inline-pvt-t_4xb4-80k_ade20k-512x512.py'",
                                   repr(SEG_BASE)).replace("'data/my_seg_set/'",
                                                           repr(root + '/')))
    return str(path)


def seg_options(iters: int) -> list:
    """Small for the CPU: no ImageNet weights, one block a stage, 96 px crops, batches of 2."""
    return ['--cfg-options', 'model.backbone.init_cfg=None', 'model.backbone.depths=[1,1,1,1]',
            'train_dataloader.dataset.pipeline.2.scale=(128,128)',
            'train_dataloader.dataset.pipeline.3.crop_size=(96,96)',
            'model.data_preprocessor.size=(96,96)', 'train_dataloader.batch_size=2',
            f'train_cfg.max_iters={iters}', 'train_cfg.val_interval=10',
            f'default_hooks.checkpoint.interval={iters}', 'default_hooks.logger.interval=1']


@pytest.mark.slow
def test_readme_seg_config_trains_on_the_set(shapes_ade, tmp_path):
    work = tmp_path / 'work'
    out = run([write_seg_config(tmp_path / 'my_fpn.py', shapes_ade), '--work-dir', str(work),
               *seg_options(2)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert (work / 'iter_2.pth').is_file()
    assert 'skipped bad sample' not in out.stdout + out.stderr


@pytest.mark.slow
def test_readme_seg_config_skips_a_missing_image_and_a_truncated_label_map(tmp_path):
    """One image deleted, one label map cut in half: both logged once as skipped, and
    the run trains on the others (a limit raised from 1 % for a set of 6)."""
    root = str(tmp_path / 'my_seg_set')
    make_ade_toy(root, num_train=6, num_val=1, image_size=96, seed=4)
    names = sorted(os.listdir(os.path.join(root, 'images', 'training')))
    os.remove(os.path.join(root, 'images', 'training', names[1]))
    orphan = os.path.join(root, 'annotations', 'training', names[1][:-4] + '.png')
    truncated = os.path.join(root, 'annotations', 'training', names[3][:-4] + '.png')
    with open(truncated, 'rb') as f:
        data = f.read()
    with open(truncated, 'wb') as f:
        f.write(data[:len(data) // 2])
    work = tmp_path / 'work'
    # 3 batches of 2 draw every one of the 5 listed samples (InfiniteSampler's first pass)
    out = run([write_seg_config(tmp_path / 'my_fpn.py', root), '--work-dir', str(work),
               *seg_options(3), 'train_dataloader.dataset.max_bad_fraction=0.5'])
    assert out.returncode == 0, out.stderr[-3000:]
    assert (work / 'iter_3.pth').is_file()
    log = out.stdout + out.stderr
    skipped = re.findall(r'skipped bad sample (\S+): ([^\n]*)', log)
    assert sorted(path for path, _ in skipped) == sorted([orphan, truncated]), log[-3000:]
    reasons = dict(skipped)
    assert reasons[orphan].startswith('image missing')
    assert 'truncated PNG' in reasons[truncated]
    assert re.search(r'Iter\(train\) \[3/3\].*loss: [0-9.]+', log), log[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize('task', ['seg', 'det'])
def test_type_over_the_in_place_wrapper_stops_with_one_line(task, shapes_ade, shapes_coco,
                                                            tmp_path):
    """The README's block with ``type=`` for the training set: one error line naming the
    key path and the fix, exit 2, nothing written."""
    if task == 'seg':
        block = readme_config('custom-ade-config')
        assert block.count("dataset_type='BaseSegDataset'") == 1
        config = write_seg_config(tmp_path / 'my_fpn.py', shapes_ade,
                                  block.replace("dataset_type='BaseSegDataset'",
                                                "type='BaseSegDataset'"))
        dataset_type = 'BaseSegDataset'
    else:
        block = readme_config('custom-coco-config')
        anchor = 'train_dataloader = dict(dataset=dict(\n'
        assert block.count(anchor) == 1
        (tmp_path / 'my_mask_rcnn.py').write_text(
            block.replace(anchor, anchor + "    type='CocoDataset',\n")
            .replace("'./mask-rcnn_inline-pvt-t_fpn_1x_coco.py'", repr(DET_BASE))
            .replace("'data/my_set/'", repr(shapes_coco + '/')))
        config, dataset_type = str(tmp_path / 'my_mask_rcnn.py'), 'CocoDataset'
    work = tmp_path / 'work'
    out = run([config, '--work-dir', str(work), '--cfg-options', 'model.backbone.init_cfg=None'])
    assert out.returncode == 2, out.stderr[-3000:]
    assert 'Traceback' not in out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: train_dataloader.dataset has type='{dataset_type}' but also "
                           f"dataset_type="), line
    assert f"write dataset_type='{dataset_type}' instead of type='{dataset_type}'" in line
    assert '_delete_=True' in line
    assert not work.exists()
