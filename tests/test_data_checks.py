"""The tools' dataset checks: one parse per annotation file, run on process 0 only.

The multi-process tests run ``tools/train.py`` under ``torch.distributed.run``
through a small driver (written by the test) that counts, per process, which
annotation files are opened and which the checks summarise, by wrapping
``open`` and :func:`inline_mm.engine.data_checks.read_coco_summary` before it
runs the tool as ``__main__``.
"""
import builtins
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, TOY_DET_CONFIG, free_port, tool_env, toy_det_options
from mmengine.config import Config

from inline_mm.engine.launch import read_config
from inline_mm.datasets import make_coco_toy
from inline_mm.engine import data_checks
from inline_mm.errors import DataError

FULL_CONFIG = os.path.join(REPO_ROOT, 'configs', 'det', 'mask_rcnn_inline_pvt.py')
BENCHMARK = os.path.join(REPO_ROOT, 'tools', 'analysis', 'benchmark_startup.py')


def toy_config(root: str) -> Config:
    """The toy detector on ``root``: val and test name the same annotation file."""
    cfg = read_config(TOY_DET_CONFIG)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = root + '/'
    return cfg


@pytest.fixture()
def count_opens(monkeypatch):
    """Every ``.json`` file opened while the test runs, in order."""
    opened = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file).endswith('.json'):
            opened.append(os.path.abspath(str(file)))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, 'open', counting_open)
    return opened


def test_each_annotation_file_is_read_once(toy_root, count_opens):
    cfg = toy_config(toy_root)
    ann = os.path.join(toy_root, 'annotations')
    # the independent expectation: the distinct files the three loaders name
    named = {os.path.abspath(os.path.join(cfg[f'{s}_dataloader'].dataset.data_root,
                                          cfg[f'{s}_dataloader'].dataset.ann_file))
             for s in ('train', 'val', 'test')}
    assert named == {os.path.join(ann, 'instances_train.json'),
                     os.path.join(ann, 'instances_val.json')}
    data_checks.check_datasets(cfg)
    assert sorted(count_opens) == sorted(named)


@pytest.mark.parametrize('classes,expected', [
    (('circle', 'rectangles', 'wedge'),
     "2 of the config's 3 classes are not in the file: 'rectangles' (the file has "
     "'rectangle'), 'wedge'"),
    (('circle', 'rectangle', 'triangles'),
     "1 of the config's 3 classes is not in the file: 'triangles' (the file has 'triangle')"),
    (('ball', 'crate', 'wedge'), "none of the config's classes is in the file")])
def test_misspelt_classes_are_named(toy_root, classes, expected):
    """The message counts the classes that are missing (not those found) and names each,
    with the file's category it is close to."""
    cfg = toy_config(toy_root)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.metainfo = dict(classes=classes)
    with pytest.raises(DataError) as err:
        data_checks.check_datasets(cfg)
    assert expected + ', so mmdet would drop their images' in str(err.value)


def _write_coco(path, indent=None):
    """A COCO file with what the reduced parse must get right: crowd RLE, two polygons,
    empty segmentation, a category name holding the text of a polygon key."""
    images = [{'id': i, 'file_name': f'{i}.jpg', 'width': 64, 'height': 48}
              for i in range(1, 6)]
    anns = [
        {'id': 1, 'image_id': 1, 'category_id': 3, 'iscrowd': 0, 'area': 10.5,
         'bbox': [1, 2, 3, 4], 'segmentation': [[1.5, 2, 3e1, 4.25, -0.0, 6, 7, 8]]},
        {'id': 2, 'image_id': 2, 'category_id': 7, 'iscrowd': 0, 'area': 3,
         'bbox': [0, 0, 2, 2], 'segmentation': [[0, 0, 2, 0, 2, 2], [5, 5, 6, 5, 6, 6]]},
        {'id': 3, 'image_id': 3, 'category_id': 9, 'iscrowd': 1, 'area': 4,
         'bbox': [0, 0, 2, 2], 'segmentation': {'counts': [0, 4, 2], 'size': [48, 64]}},
        {'id': 4, 'image_id': 4, 'category_id': 11, 'iscrowd': 0, 'area': 0,
         'bbox': [0, 0, 0, 0], 'segmentation': []},
    ]
    cats = [{'id': 3, 'name': 'circle'}, {'id': 7, 'name': '"segmentation": [[1, 2]]'},
            {'id': 9, 'name': 'crowd only'}, {'id': 11, 'name': 'empty mask'},
            {'id': 12, 'name': 'unused'}]
    with open(path, 'w') as f:
        json.dump({'info': {'segmentation': [[1, 2]]}, 'images': images,
                   'annotations': anns, 'categories': cats}, f, indent=indent)


@pytest.mark.parametrize('indent', [None, 2])
def test_summary_equals_a_full_parse(tmp_path, indent):
    path = str(tmp_path / 'instances.json')
    _write_coco(path, indent)
    with open(path) as f:
        full = json.load(f)
    summary = data_checks.read_coco_summary(path)
    assert summary.categories == full['categories']
    assert summary.num_images == len(full['images'])
    assert summary.annotated == {a['category_id'] for a in full['annotations']
                                 if not a.get('iscrowd', 0)}
    assert summary.annotated == {3, 7, 11}


def test_broken_file_error_has_the_position_in_the_file(tmp_path):
    path = tmp_path / 'instances.json'
    _write_coco(str(path))
    text = path.read_text()
    cut = text[:text.index('"crowd only"')]  # truncated after the polygons
    path.write_text(cut)
    with pytest.raises(json.JSONDecodeError) as exact:
        json.loads(cut)
    with pytest.raises(DataError) as err:
        data_checks.read_coco_summary(str(path))
    assert 'cannot be read as JSON' in str(err.value)
    assert str(exact.value) in str(err.value)  # e.g. 'line 1 column 801 (char 800)'


# --------------------------------------------------------------------- several processes
DRIVER = '''
import builtins, os, runpy, sys
out, data = sys.argv.pop(1), sys.argv.pop(1)
rank = os.environ.get('RANK', '0')
real_open = builtins.open
opened = real_open(os.path.join(out, f'opened_{rank}.txt'), 'w')

def counting_open(file, *args, **kwargs):
    path = os.path.abspath(str(file))
    if path.endswith('.json') and path.startswith(data):
        opened.write(path + '\\n')
        opened.flush()
    return real_open(file, *args, **kwargs)

builtins.open = counting_open


def counted(call, name):
    """``call`` (of one path), each path it is called with written to name_<rank>.txt."""
    log = real_open(os.path.join(out, f'{name}_{rank}.txt'), 'w')

    def counting(path):
        log.write(os.path.abspath(path) + '\\n')
        log.flush()
        return call(path)
    return counting


from inline_mm.engine import data_checks
from inline_mm.checkpoint import safe_load
data_checks.read_coco_summary = counted(data_checks.read_coco_summary, 'summarised')
safe_load._load_restricted = counted(safe_load._load_restricted, 'loaded')
sys.argv[0] = os.path.join(REPO, 'tools', 'train.py')
try:
    runpy.run_path(sys.argv[0], run_name='__main__')
    status = 0
except SystemExit as exit:
    status = exit.code
real_open(os.path.join(out, f'status_{rank}.txt'), 'w').write(str(status))
sys.exit(status)
'''


def run_two_processes(tmp_path, data, args):
    driver = tmp_path / 'driver.py'
    driver.write_text(DRIVER.replace('REPO', repr(REPO_ROOT)))
    out = tmp_path / 'counts'
    out.mkdir()
    env = dict(tool_env(), PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    run = subprocess.run(
        [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
         '--master_port', str(free_port()), str(driver), str(out), os.path.abspath(data),
         *args, '--launcher', 'pytorch'],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=900)

    def lines(name, rank):
        path = out / f'{name}_{rank}.txt'
        return path.read_text().split() if path.exists() else None
    return run, lines


@pytest.mark.slow
def test_two_processes_stop_with_process_0s_verdict(tmp_path):
    """The full recipe on a set of other categories: both processes exit 2 with the same
    line; only process 0 read the annotation files, each once; nothing written."""
    root = str(tmp_path / 'my_set')
    make_coco_toy(root, num_train=4, num_val=2, image_size=64, seed=3)
    work = tmp_path / 'work'
    options = [f'{s}_dataloader.dataset.data_root={root}/' for s in ('train', 'val', 'test')]
    options += [f'{s}_dataloader.dataset.{k}' for s, k in [
        ('train', 'ann_file=annotations/instances_train.json'),
        ('train', 'data_prefix.img=train/'),
        ('val', 'ann_file=annotations/instances_val.json'), ('val', 'data_prefix.img=val/'),
        ('test', 'ann_file=annotations/instances_val.json'), ('test', 'data_prefix.img=val/')]]
    run, lines = run_two_processes(tmp_path, root, [FULL_CONFIG, '--work-dir', str(work),
                                                    '--cfg-options', *options])
    output = run.stdout + run.stderr
    # torchrun ends the other workers as soon as one has exited with an error (torch 2.1's
    # agent looks every 5 s), so the slower process may be stopped before it records its
    # status: every status recorded is 2, and each process that recorded one printed the line
    statuses = [lines('status', rank) for rank in (0, 1)]
    assert ['2'] in statuses and all(s in (['2'], None) for s in statuses), output[-3000:]
    assert run.returncode != 0
    # the two processes write to one pipe: their lines may interleave without a line break
    errors = re.findall(r'error: .*?see "Train on your own data" in the README', output)
    assert 2 - statuses.count(None) <= len(errors) <= 2 and len(set(errors)) == 1, output[-3000:]
    assert errors[0].startswith('error: the categories of')
    assert "'circle', 'rectangle', 'triangle'" in errors[0] and "'person'" in errors[0]
    # no traceback of the workers (torchrun prints one of its own for failed workers)
    assert 'DataError' not in output and 'train.py", line' not in output, output[-3000:]
    ann = os.path.join(os.path.abspath(root), 'annotations')
    # the train loader's file, then the file val and test share: once each, on process 0
    expected = [os.path.join(ann, 'instances_train.json')]
    assert lines('opened', 0) == expected and lines('summarised', 0) == expected
    assert lines('opened', 1) == [] and lines('summarised', 1) == []
    assert not work.exists()


@pytest.mark.slow
def test_two_processes_read_a_resume_file_once(toy_root, tmp_path):
    """--resume of a checkpoint that is not of the config's model, in two processes: process
    0 alone reads it, once, for both of the checks (training state, fit); both exit 2 with
    its line; nothing written."""
    import torch
    resume = str(tmp_path / 'other.pth')
    torch.save({'state_dict': {'backbone.stem.weight': torch.zeros(3)},
                'meta': {'iter': 1}, 'message_hub': {}}, resume)
    work = tmp_path / 'work'
    run, lines = run_two_processes(
        tmp_path, toy_root, [TOY_DET_CONFIG, '--work-dir', str(work), '--resume', resume]
        + toy_det_options(toy_root))
    output = run.stdout + run.stderr
    statuses = [lines('status', rank) for rank in (0, 1)]
    assert ['2'] in statuses and all(s in (['2'], None) for s in statuses), output[-3000:]
    errors = re.findall(r'error: checkpoint \S+ does not fit the model of the config', output)
    assert 2 - statuses.count(None) <= len(errors) <= 2, output[-3000:]
    assert lines('loaded', 0) == [resume] and lines('loaded', 1) in ([], None)
    assert not work.exists()


@pytest.mark.slow
def test_two_processes_train_after_one_check(toy_root, tmp_path):
    """Good data: process 0 summarises each file once, process 1 none; both train."""
    work = tmp_path / 'work'
    run, lines = run_two_processes(
        tmp_path, toy_root, [TOY_DET_CONFIG, '--work-dir', str(work)] + toy_det_options(
            toy_root, **{'train_cfg.max_iters': 1, 'train_dataloader.batch_size': 1,
                         'default_hooks.checkpoint.interval': 1}))
    output = run.stdout + run.stderr
    assert lines('status', 0) == ['0'] and lines('status', 1) == ['0'], output[-3000:]
    ann = os.path.join(os.path.abspath(toy_root), 'annotations')
    assert lines('summarised', 0) == [os.path.join(ann, 'instances_train.json'),
                                      os.path.join(ann, 'instances_val.json')]
    assert lines('summarised', 1) == []
    assert (work / 'iter_1.pth').is_file()


@pytest.mark.slow
def test_startup_benchmark_runs_at_a_tiny_scale(tmp_path):
    data, out = tmp_path / 'data', tmp_path / 'out'
    run = subprocess.run([sys.executable, BENCHMARK, '--scale', '0.0002', '--data-dir',
                          str(data), '--out', str(out), '--size', '128'],
                         capture_output=True, text=True, env=tool_env(), cwd=REPO_ROOT,
                         timeout=1500)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    with open(out / 'startup_coco_size.json') as f:
        result = json.load(f)
    rows = {(r['tool'], r['procs']): r for r in result['rows']}
    assert set(rows) == {(t, p) for t in ('inline-mm', 'mmdet') for p in (1, 2)}
    for row in rows.values():
        assert row['seconds'] > 0 and row['max_process_peak_mib'] > 100
        # two processes: the launcher and the two workers at least
        assert row['processes'] >= (1 if row['procs'] == 1 else 3)
        assert row['sum_process_peaks_mib'] >= row['max_process_peak_mib']
        if row['procs'] == 2:  # two workers, each about as large as one process alone
            assert row['peak_rss_sum_mib'] > 1.5 * rows[(row['tool'], 1)]['peak_rss_sum_mib']
    ratios = [r for r in result['summary'] if r['tool'].startswith('ratio')]
    assert len(ratios) == 2
    for ratio in ratios:
        mine = rows[('inline-mm', ratio['procs'])]
        theirs = rows[('mmdet', ratio['procs'])]
        assert ratio['seconds'] == pytest.approx(mine['seconds'] / theirs['seconds'], abs=1e-3)
    # the generated file: COCO's sizes scaled, COCO's categories, polygons of 20-30 points
    from mmdet.datasets import CocoDataset
    with open(data / 'annotations' / 'instances_train2017.json') as f:
        coco = json.load(f)
    assert len(coco['images']) == round(118287 * 0.0002)
    assert len(coco['annotations']) == round(860001 * 0.0002)
    assert [c['name'] for c in coco['categories']] == list(CocoDataset.METAINFO['classes'])
    for ann in coco['annotations']:
        assert all(40 <= len(p) <= 60 and len(p) % 2 == 0 for p in ann['segmentation'])
        x, y, w, h = ann['bbox']
        assert 0 <= x and x + w <= 640 and 0 <= y and y + h <= 480
    image = data / 'train2017' / coco['images'][0]['file_name']
    from PIL import Image
    assert Image.open(image).size == (640, 480)


def test_an_annotation_file_that_is_a_json_list_is_named(tmp_path):
    """Valid JSON that is not a COCO object (a list): one DataError naming the file, not
    pycocotools' AttributeError later."""
    root = str(tmp_path / 'coco')
    make_coco_toy(root, num_train=2, num_val=1, image_size=64, seed=0)
    ann = os.path.join(root, 'annotations', 'instances_train.json')
    with open(ann) as f:
        entries = json.load(f)['annotations']
    with open(ann, 'w') as f:
        json.dump(entries, f)
    with pytest.raises(DataError, match=r'instances_train.json is not a COCO annotation file'):
        data_checks.check_datasets(toy_config(root))


def test_missing_images_are_counted_before_anything_is_built(tmp_path):
    """A val image missing: one error naming it; a train image missing: a warning only,
    since the training set skips bad samples; an image folder without the listed images:
    one error naming the folder option."""
    from inline_mm.errors import MissingFileError
    root = str(tmp_path / 'coco')
    make_coco_toy(root, num_train=3, num_val=2, image_size=64, seed=0)
    with open(os.path.join(root, 'annotations', 'instances_val.json')) as f:
        val_name = json.load(f)['images'][1]['file_name']
    with open(os.path.join(root, 'annotations', 'instances_train.json')) as f:
        train_name = json.load(f)['images'][0]['file_name']
    os.remove(os.path.join(root, 'val', val_name))
    with pytest.raises(MissingFileError, match=rf"1 of the 2 images that .*instances_val.json "
                                              rf"lists are missing from .*: '{val_name}'"):
        data_checks.check_datasets(toy_config(root))
    # the val set complete again, a training image missing: SkipBadSamples handles it
    make_coco_toy(root, num_train=3, num_val=2, image_size=64, seed=0)
    os.remove(os.path.join(root, 'train', train_name))
    data_checks.check_datasets(toy_config(root))
    cfg = toy_config(root)
    os.makedirs(os.path.join(root, 'empty'))
    cfg.val_dataloader.dataset.data_prefix.img = 'empty/'
    with pytest.raises(MissingFileError, match='none of the 2 images that .*instances_val.json '
                                               'lists is in .*empty.*check data_prefix.img'):
        data_checks.check_datasets(cfg)


SEG_RECIPE = os.path.join(REPO_ROOT, 'configs', 'seg',
                          'fpn_inline-pvt-t_4xb4-80k_ade20k-512x512.py')
DET_RECIPE = os.path.join(REPO_ROOT, 'configs', 'det', 'mask-rcnn_inline-pvt-t_fpn_1x_coco.py')


@pytest.mark.parametrize('recipe,task,dataset_type', [(SEG_RECIPE, 'mmseg', 'BaseSegDataset'),
                                                      (DET_RECIPE, 'mmdet', 'CocoDataset')])
def test_type_over_the_in_place_wrapper_is_one_config_error(tmp_path, recipe, task,
                                                            dataset_type):
    """``type=`` written over the recipe's in-place SkipBadSamples leaves its keys to the
    dataset (a TypeError when built): refused first, naming the key path and both fixes;
    ``dataset_type=`` or ``_delete_=True`` pass on to the file checks."""
    from mmengine.registry import init_default_scope

    from inline_mm.errors import ConfigError, MissingFileError
    nowhere = str(tmp_path / 'nowhere') + '/'
    stale = read_config(recipe)
    stale.merge_from_dict({'train_dataloader.dataset.type': dataset_type,
                           'train_dataloader.dataset.data_root': nowhere})
    # the independent evidence that the config is broken: the dataset refuses the key
    init_default_scope(task)
    registry = __import__(f'{task}.registry', fromlist=['DATASETS']).DATASETS
    with pytest.raises(TypeError, match='dataset_type'):
        registry.build(dict(stale.train_dataloader.dataset, lazy_init=True))
    with pytest.raises(ConfigError) as err:
        data_checks.check_datasets(stale)
    message = str(err.value)
    assert '\n' not in message
    assert message.startswith(f"train_dataloader.dataset has type='{dataset_type}' but also "
                              f"dataset_type='{stale.train_dataloader.dataset.dataset_type}'")
    assert 'max_bad_fraction=0.01' in message
    assert f"write dataset_type='{dataset_type}' instead of type='{dataset_type}'" in message
    assert 'add _delete_=True to train_dataloader.dataset' in message
    # the two fixes the message names: past the config check, to the (missing) data folder
    fixed = read_config(recipe)
    fixed.merge_from_dict({'train_dataloader.dataset.dataset_type': dataset_type,
                           'train_dataloader.dataset.data_root': nowhere})
    replaced = read_config(recipe)
    replaced.merge_from_dict({'train_dataloader.dataset': dict(
        _delete_=True, type=dataset_type, data_root=nowhere,
        pipeline=replaced.train_dataloader.dataset.pipeline)})
    for cfg in (fixed, replaced):
        with pytest.raises(MissingFileError, match='nowhere'):
            data_checks.check_datasets(cfg)


def test_truncated_label_map_stops_the_val_set_only(tmp_path):
    """A truncated label map: one DataError naming it in the validation set; in the
    training set (SkipBadSamples) the check leaves it to the wrapper."""
    from inline_mm.datasets import make_ade_toy
    root = str(tmp_path / 'ade')
    make_ade_toy(root, num_train=3, num_val=2, image_size=64, seed=0)
    cfg = read_config(SEG_RECIPE)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = root + '/'
    data_checks.check_datasets(cfg)  # the intact set passes
    for split in ('training', 'validation'):
        folder = os.path.join(root, 'annotations', split)
        path = os.path.join(folder, sorted(os.listdir(folder))[1])
        with open(path, 'rb') as f:
            data = f.read()
        with open(path, 'wb') as f:
            f.write(data[:len(data) // 2])
        if split == 'training':
            data_checks.check_datasets(cfg)
    with pytest.raises(DataError, match=rf'label map {path} cannot be read \(truncated PNG'):
        data_checks.check_datasets(cfg)
