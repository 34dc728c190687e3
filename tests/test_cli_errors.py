"""User errors in the tools: one clear line, exit status 2, no traceback, nothing written."""
import glob
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from inline_mm.datasets import make_coco_toy

# subprocess runs (training, a fresh interpreter): the slow tier
pytestmark = pytest.mark.slow

TOY_DET = os.path.join(REPO_ROOT, 'configs', 'det', 'toy', 'mask_rcnn_inline_pvt_toy.py')


def tool(*parts):
    return os.path.join(REPO_ROOT, 'tools', *parts)


def run(*args):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=dict(os.environ, OMP_NUM_THREADS='1'))


def one_line_error(out, *fragments):
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert 'Traceback' not in out.stderr, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    last = lines[-1]
    assert last.startswith('error: '), last
    # nothing else but argparse's usage: no warning (e.g. pkg_resources' deprecation)
    assert [line for line in lines if 'Warning' in line] == [], out.stderr[-2000:]
    for fragment in fragments:
        assert fragment in last, (fragment, last)
    return last


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('data') / 'coco_toy')
    make_coco_toy(root, num_train=2, num_val=1, image_size=64, seed=1)
    return root


@pytest.mark.parametrize('options,args,fragments', [
    # a missing data folder: names the folder and the layout expected
    ({'train_dataloader.dataset.data_root': 'nowhere/'}, [],
     ["dataset folder 'nowhere' not found", 'COCO layout', 'nowhere/train/',
      'Put COCO 2017 (or your own COCO-format set) there']),
    # a toy set's folder: how to write it
    ({'train_dataloader.dataset.data_root': 'nowhere/coco_toy/'}, [],
     ["dataset folder 'nowhere/coco_toy' not found",
      'For the bundled toy set run: python tools/make_toy_data.py --task det']),
    # a typo in an option
    ({'train_cfg.max_iter': 3}, [],
     ["unknown config option 'train_cfg.max_iter'", "did you mean 'train_cfg.max_iters'"]),
    # an index past the end of a list
    ({'train_pipeline.9.prob': 0}, [], ['train_pipeline is a list of 5']),
    # a bad arch, attn_type or type name: the model is built before the Runner
    ({'model.backbone.arch': 'tiniest'}, [], ["unknown arch 'tiniest' for InLinePVT"]),
    ({'model.backbone.attn_type': 'III'}, [], ["attn_type 'III' does not fit InLinePVT"]),
    ({'model.backbone.type': 'InLinePVTX'}, [],
     ['InLinePVTX is not in the mmdet::model registry', 'InLinePVT, InLineSwin']),
    ({}, ['--resume', 'no_such.pth'], ["checkpoint to resume from 'no_such.pth' not found"]),
    # a multi-process launcher without the launch
    ({}, ['--launcher', 'pytorch'], ['--launcher pytorch needs the environment torchrun']),
])
def test_train_user_errors(tmp_path, toy_root, options, args, fragments):
    data = {f'{split}_dataloader.dataset.data_root': toy_root + '/'
            for split in ('train', 'val', 'test')}
    data.update({'val_evaluator.ann_file': toy_root + '/annotations/instances_val.json',
                 'test_evaluator.ann_file': toy_root + '/annotations/instances_val.json'})
    data.update(options)
    work = tmp_path / 'work'
    out = run(tool('train.py'), TOY_DET, '--work-dir', work, *args, '--cfg-options',
              *[f'{k}={v}' for k, v in data.items()])
    one_line_error(out, *fragments)
    assert not work.exists()  # checked before the Runner starts: nothing written


def test_resume_from_a_checkpoint_not_of_this_training(tmp_path, toy_root):
    """Weights without training state, and a training checkpoint of another arch: one line
    before the Runner, the work dir of the earlier run untouched."""
    import torch
    from mmengine.config import Config

    from inline_mm.engine.runner_utils import build_model
    cfg = Config.fromfile(TOY_DET)
    weights = tmp_path / 'weights.pth'
    torch.save({'state_dict': build_model(cfg).state_dict()}, weights)
    finished = tmp_path / 'finished.pth'  # the toy schedule's last iteration
    torch.save({'state_dict': build_model(cfg).state_dict(),
                'meta': {'iter': cfg.train_cfg.max_iters}, 'message_hub': {}}, finished)
    cfg.model.backbone.arch = 'small'
    other = tmp_path / 'other_arch.pth'
    torch.save({'state_dict': build_model(cfg).state_dict(), 'meta': {'iter': 2},
                'message_hub': {}}, other)
    work = tmp_path / 'work'
    work.mkdir()
    (work / 'earlier_run.py').write_text('# the config dump of an earlier run\n')
    data = [f'{split}_dataloader.dataset.data_root={toy_root}/'
            for split in ('train', 'val', 'test')]
    out = run(tool('train.py'), TOY_DET, '--work-dir', work, '--resume', weights,
              '--cfg-options', *data)
    one_line_error(out, f'{weights} holds no training state (meta, message_hub missing)',
                   f'--cfg-options load_from={weights}')
    out = run(tool('train.py'), TOY_DET, '--work-dir', work, '--resume', other,
              '--cfg-options', *data)
    one_line_error(out, str(other), 'does not fit the model of the config')
    out = run(tool('train.py'), TOY_DET, '--work-dir', work, '--resume', finished,
              '--cfg-options', *data)
    one_line_error(out, 'and the schedule ends at 1500 (train_cfg.max_iters): nothing left to '
                   'train')
    assert sorted(p.name for p in work.iterdir()) == ['earlier_run.py']


def test_missing_config_and_checkpoint(tmp_path):
    one_line_error(run(tool('train.py'), tmp_path / 'nope.py'), 'config file not found')
    one_line_error(run(tool('test.py'), TOY_DET, tmp_path / 'nope.pth'),
                   "checkpoint '" + str(tmp_path / 'nope.pth') + "' not found")
    one_line_error(run(tool('model_converters', 'inline2mm.py'), tmp_path / 'nope.pth',
                       tmp_path / 'out.pth'), 'checkpoint file not found')
    # nothing about init_cfg: the user did not use it
    out = run(tool('analysis', 'vis_attention.py'), tmp_path / 'img.png', '--checkpoint',
              tmp_path / 'nope.pth')
    assert 'init_cfg' not in one_line_error(out, 'not found')


def test_verify_tool_names_the_missing_reference_files(tmp_path):
    out = run(tool('verify_against_reference.py'), '--reference-dir', tmp_path)
    one_line_error(out, "does not hold the authors' model files", 'inline_pvt.py')


def test_unexpected_errors_keep_their_traceback(tmp_path):
    """A bug is not a user error: it keeps its traceback (here a broken config file)."""
    bad = tmp_path / 'bad.py'
    bad.write_text('model = dict(\n')
    out = run(tool('train.py'), bad)
    assert out.returncode not in (0, 2) and 'Traceback' in out.stderr


def test_a_work_dir_or_out_dir_below_a_file(tmp_path, toy_root):
    a_file = tmp_path / 'a_file'
    a_file.write_text('')
    data = [f'{split}_dataloader.dataset.data_root={toy_root}/'
            for split in ('train', 'val', 'test')]
    out = run(tool('train.py'), TOY_DET, '--work-dir', a_file / 'wd', '--cfg-options', *data)
    one_line_error(out, f"work dir '{a_file / 'wd'}' cannot be made: {a_file} is a file, "
                   'not a folder')
    image = sorted(glob.glob(os.path.join(toy_root, 'val', '*.jpg')))[0]
    out = run(tool('infer.py'), image, '--config', TOY_DET, '--checkpoint', a_file,
              '--out-dir', a_file / 'o')
    one_line_error(out, f"--out-dir '{a_file / 'o'}' cannot be made")
    assert a_file.read_text() == ''


def test_checking_a_folder_makes_nothing(tmp_path):
    from inline_mm.engine.atomic_io import check_can_make_folder
    check_can_make_folder(str(tmp_path / 'a' / 'b' / 'c'))
    assert list(tmp_path.iterdir()) == []
