"""The segmentation evaluators of ``tools/test.py``: the pixel confusion matrix."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, tool_env

pytest.importorskip('mmseg')
from mmengine.evaluator import Evaluator  # noqa: E402
from mmengine.structures import PixelData  # noqa: E402
from mmseg.structures import SegDataSample  # noqa: E402

import inline_mm.engine  # noqa: E402,F401  (registers SegConfusionMatrix)
from inline_mm.engine.metrics import SegConfusionMatrix  # noqa: E402

CLASSES = ('background', 'circle', 'rectangle')


def _sample(gt: np.ndarray, pred: np.ndarray) -> SegDataSample:
    sample = SegDataSample(metainfo=dict(seg_map_path='x.png'))
    sample.gt_sem_seg = PixelData(data=torch.from_numpy(gt)[None])
    sample.pred_sem_seg = PixelData(data=torch.from_numpy(pred)[None])
    return sample


def _evaluate(samples, out_file):
    # in tools/test.py's order: the matrix before the config's metrics
    evaluator = Evaluator([SegConfusionMatrix(out_file=str(out_file)),
                           dict(type='mmseg.IoUMetric', iou_metrics=['mIoU'])])
    evaluator.dataset_meta = dict(classes=CLASSES)
    evaluator.process(data_samples=samples)
    return evaluator.evaluate(len(samples))


def test_confusion_matrix_counts_the_scored_pixels_as_iou_metric_does(tmp_path):
    rng = np.random.default_rng(0)
    pairs = []
    for shape in ((6, 5), (4, 7)):
        gt = rng.integers(0, 3, shape)
        gt[0, :3] = 255  # not scored
        pairs.append((gt, rng.integers(0, 3, shape)))
    metrics = _evaluate([_sample(g, p) for g, p in pairs], tmp_path / 'cm.json')
    written = json.loads((tmp_path / 'cm.json').read_text())
    # independent count: pixel by pixel
    expected = np.zeros((3, 3), int)
    for gt, pred in pairs:
        for t, p in zip(gt.ravel(), pred.ravel()):
            if t != 255:
                expected[t, p] += 1
    assert written['classes'] == list(CLASSES)
    assert written['counts'] == expected.tolist()
    percent = np.array(written['percent_of_true'])
    assert np.allclose(percent, 100 * expected / expected.sum(1, keepdims=True), atol=0.005)
    assert all(v == round(v, 2) for v in percent.ravel())  # no float32 noise in the JSON
    # the IoU of its counts is mmseg's IoUMetric's
    counts = np.array(written['counts'])
    iou = np.diag(counts) / (counts.sum(0) + counts.sum(1) - np.diag(counts))
    assert metrics['mIoU'] == pytest.approx(100 * iou.mean(), abs=0.01)
    assert not any(k.startswith('confusion') for k in metrics)  # adds no metric


def test_a_label_outside_the_classes_is_named(tmp_path):
    gt = np.array([[0, 1], [4, 2]])  # 4: not one of the 3 classes, not 255
    with pytest.raises(ValueError, match=r"label 4 in x.png is neither one of the 3 class "
                                         r"indices nor ignore_index 255: check"):
        _evaluate([_sample(gt, np.zeros_like(gt))], tmp_path / 'cm.json')


def test_a_prediction_outside_the_classes_is_named(tmp_path):
    gt = np.array([[0, 1], [2, 2]])
    pred = np.array([[0, 3], [2, 2]])  # 3: a 4-class head on a 3-class set
    with pytest.raises(ValueError, match=r"predicted class 3 .* the dataset has 3 classes: "
                                         r"set the decode head's num_classes"):
        _evaluate([_sample(gt, pred)], tmp_path / 'cm.json')


def test_an_image_keeps_only_the_class_pairs_it_has(tmp_path):
    # a 150-class set (ADE20K): an image with two classes keeps 3 pairs, not 150 x 150 counts
    metric = SegConfusionMatrix(out_file=str(tmp_path / 'cm.json'))
    metric.dataset_meta = dict(classes=[str(i) for i in range(150)])
    gt = np.array([[0, 0, 7], [7, 7, 255]])
    metric.process(None, [_sample(gt, np.array([[0, 7, 7], [7, 7, 0]])).to_dict()])
    # (true, predicted) as true * 150 + predicted: (0, 0), (0, 7), (7, 7); and their counts
    assert [r.tolist() for r in metric.results] == [[[0, 7, 7 * 150 + 7], [1, 1, 3]]]


def test_an_unwritable_output_file_is_refused_when_the_metric_is_built(tmp_path):
    (tmp_path / 'a_file').write_text('')
    with pytest.raises(ValueError, match=r"cannot write the confusion matrix to '.*a_file/cm"
                                         r".json' \(a_file is a file, not a folder\): name a "
                                         r"file in a writable folder"):
        SegConfusionMatrix(out_file=str(tmp_path / 'a_file' / 'cm.json'))
    with pytest.raises(ValueError, match=r"\(a folder, not a file\)"):
        SegConfusionMatrix(out_file=str(tmp_path))
    (tmp_path / 'cm.json').write_text('earlier matrix')
    SegConfusionMatrix(out_file=str(tmp_path / 'cm.json'))  # checked, not touched
    assert (tmp_path / 'cm.json').read_text() == 'earlier matrix'
    assert sorted(os.listdir(tmp_path)) == ['a_file', 'cm.json']  # no probe file left


def test_a_test_set_without_label_maps_is_refused_with_the_fix_named(tmp_path):
    sample = SegDataSample(metainfo=dict(img_path='a.jpg'))
    sample.pred_sem_seg = PixelData(data=torch.zeros(1, 2, 2, dtype=torch.long))
    (tmp_path / 'cm.json').write_text('earlier matrix')
    with pytest.raises(ValueError, match=r"a.jpg has no ground-truth label map: a confusion "
                                         r"matrix needs an annotated test set .* without "
                                         r"--confusion-matrix"):
        _evaluate([sample], tmp_path / 'cm.json')
    assert (tmp_path / 'cm.json').read_text() == 'earlier matrix'  # not overwritten


@pytest.mark.slow
def test_test_tool_writes_the_matrix_of_a_segmentor_and_refuses_a_detector(tmp_path):
    from mmengine.config import Config

    from inline_mm.datasets import make_ade_toy
    from inline_mm.engine.runner_utils import build_model
    root = str(tmp_path / 'ade')
    make_ade_toy(root, num_train=1, num_val=3, image_size=64, seed=3)
    config = os.path.join(REPO_ROOT, 'configs', 'seg', 'toy', 'fpn_inline_pvt_toy.py')
    torch.manual_seed(0)
    ckpt = str(tmp_path / 'random.pth')
    torch.save({'state_dict': build_model(Config.fromfile(config)).state_dict()}, ckpt)
    test = os.path.join(REPO_ROOT, 'tools', 'test.py')
    out = subprocess.run([sys.executable, test, config, ckpt, '--work-dir', str(tmp_path / 'w'),
                          '--confusion-matrix', str(tmp_path / 'cm.json'),
                          '--show-dir', 'vis', '--cfg-options',
                          f'test_dataloader.dataset.data_root={root}/',
                          'test_evaluator.ignore_index=0'],  # the config's IoUMetric's
                         capture_output=True, text=True, env=tool_env(), cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    log = out.stdout + out.stderr
    counts = np.array(json.loads((tmp_path / 'cm.json').read_text())['counts'])
    assert counts.shape == (4, 4) and counts.sum() > 0
    assert counts[0].sum() == 0  # background: not scored with the config's ignore_index 0
    assert 'confusion matrix (% of each true class; rows true, columns predicted):' in log
    # --show-dir: one drawing per test image, named after it, where mmdet's tool puts them
    drawn = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / 'w' / '*' / 'vis' / '*')))
    assert drawn == sorted(os.path.basename(p)[:-4] + '.png' for p in
                           glob.glob(os.path.join(root, 'images', 'validation', '*.jpg')))
    # every scored pixel of the 3 images, as the run's own mIoU line has them
    iou = np.diag(counts) / np.maximum(counts.sum(0) + counts.sum(1) - np.diag(counts), 1)
    present = counts.sum(0) + counts.sum(1) > 0
    logged = float(log.split('mIoU: ')[-1].split()[0])
    assert logged == pytest.approx(100 * iou[present].mean(), abs=0.01)

    det = os.path.join(REPO_ROOT, 'configs', 'det', 'toy', 'mask_rcnn_inline_pvt_toy.py')
    out = subprocess.run([sys.executable, test, det, ckpt, '--confusion-matrix',
                          str(tmp_path / 'det.json')],
                         capture_output=True, text=True, env=tool_env(), cwd=REPO_ROOT)
    assert out.returncode == 2 and 'Traceback' not in out.stderr, out.stderr[-3000:]
    assert "--confusion-matrix is for segmentors; for a detector, write the predictions " \
           "with --out results.pkl and run mmdet's tools/analysis_tools/confusion_matrix.py" \
           in out.stderr
    assert not (tmp_path / 'det.json').exists()

    # an output that cannot be written stops the tool before the run, not after the test set
    (tmp_path / 'a_file').write_text('')
    out = subprocess.run([sys.executable, test, config, ckpt, '--work-dir', str(tmp_path / 'w2'),
                          '--confusion-matrix', str(tmp_path / 'a_file' / 'cm.json'),
                          '--cfg-options', f'test_dataloader.dataset.data_root={root}/'],
                         capture_output=True, text=True, env=tool_env(), cwd=REPO_ROOT)
    assert out.returncode == 2 and 'Traceback' not in out.stderr, out.stderr[-3000:]
    assert "a_file/cm.json' cannot be written (a_file is a file, not a folder): name a " \
           "file in a writable folder" in out.stderr
    assert not (tmp_path / 'w2').exists()


def _test_tool():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'test_tool', os.path.join(REPO_ROOT, 'tools', 'test.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tool_finds_the_iou_metric_however_the_config_names_it():
    from mmseg.evaluation import IoUMetric
    tool = _test_tool()
    iou = dict(type=IoUMetric, ignore_index=0)  # a class: new-style (Python) configs
    for evaluator in (iou, [dict(type='CityscapesMetric'), iou],
                      dict(type='Evaluator', metrics=[iou])):
        assert tool._metric_configs(evaluator)[-1] is iou
    assert {tool._type_name(t) for t in (IoUMetric, 'IoUMetric', 'mmseg.IoUMetric')} == \
        {'IoUMetric'}


def test_the_tool_checks_local_outputs_and_leaves_remote_ones_to_mmengine(tmp_path,
                                                                         monkeypatch):
    from inline_mm.errors import ConfigError
    tool = _test_tool()
    monkeypatch.chdir(tmp_path)
    tool._check_output_file('s3://bucket/results.pkl', '--out', atomic=False)  # mmengine's
    with pytest.raises(ConfigError, match=r"--confusion-matrix writes a local file, got "
                                          r"'s3://bucket/cm.json'"):
        tool._check_output_file('s3://bucket/cm.json', '--confusion-matrix', atomic=True)
    assert os.listdir(tmp_path) == []  # no local 's3:' folder
    with pytest.raises(ConfigError, match=r"--out 'results.pkl' cannot be written \(a folder, "
                                          r"not a file\): name a file in a writable folder"):
        os.mkdir('results.pkl')
        tool._check_output_file('results.pkl', '--out', atomic=False)
