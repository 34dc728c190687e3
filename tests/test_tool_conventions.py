"""Conventions every tool shares: what the log says about mixed precision, one `error:`
line for a file that is not a fitting checkpoint."""
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.logging import MMLogger

from conftest import REPO_ROOT
from inline_mm.engine.amp import configure_amp

DET_CONFIG = os.path.join(REPO_ROOT, 'configs', 'det', 'toy', 'mask_rcnn_inline_pvt_toy.py')


def test_amp_says_in_the_log_what_it_turned_on(tmp_path):
    log = tmp_path / 'amp.log'
    MMLogger.get_instance('amp_log_test', log_file=str(log), log_level='INFO')
    configure_amp(Config.fromfile(DET_CONFIG), 'mmdet', device='cpu')
    configure_amp(Config.fromfile(DET_CONFIG), 'mmdet', device='cuda')
    text = log.read_text()
    assert '--amp: bfloat16 autocast on the CPU for backbone and neck' in text
    assert '--amp: fp16 mixed precision on cuda (AmpOptimWrapper, loss scale dynamic)' in text


def _tool(name, *args):
    return subprocess.run([sys.executable, os.path.join(REPO_ROOT, 'tools', name), *args],
                          capture_output=True, text=True, cwd=REPO_ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS='1'), timeout=600)


@pytest.mark.parametrize('content', [b'not a checkpoint\n', b'PK\x03\x04truncated'])
def test_infer_refuses_a_file_that_is_not_a_checkpoint(tmp_path, content):
    ckpt, image, out = tmp_path / 'model.pth', tmp_path / 'img.png', tmp_path / 'out'
    ckpt.write_bytes(content)
    cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
    proc = _tool('infer.py', str(image), '--config', DET_CONFIG, '--checkpoint', str(ckpt),
                 '--out-dir', str(out))
    _one_error_line(proc, str(ckpt))
    assert not out.exists()


SEG_CONFIG = os.path.join(REPO_ROOT, 'configs', 'seg', 'toy', 'fpn_inline_pvt_toy.py')


def _one_error_line(proc, *expected):
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr
    # ours, or argparse's 'PROG: error: ...' (after its usage line); warnings that an old
    # interpreter prints at exit (torch 2.1: ResourceWarning) may follow
    errors = [line for line in proc.stderr.splitlines()
              if line.startswith('error: ') or line.split(': ', 1)[-1].startswith('error: ')]
    assert len(errors) == 1, proc.stderr[-3000:]
    line = errors[0]
    for text in expected:
        assert text in line, line
    return line


def test_test_tool_refuses_unreadable_and_other_models_checkpoints(tmp_path):
    """tools/test.py: a text file, and a segmentor's checkpoint on a detector config
    (mmengine alone loads it with a warning and evaluates 0 mAP), stop before anything
    is written; train.py --resume with a text file too."""
    from mmengine.config import Config as Cfg

    from inline_mm.engine.runner_utils import build_model
    text = tmp_path / 'notes.pth'
    text.write_bytes(b'the weights are on the shared drive\n')
    seg = tmp_path / 'seg.pth'
    torch.save({'state_dict': build_model(Cfg.fromfile(SEG_CONFIG)).state_dict(),
                'meta': {}}, str(seg))
    work = tmp_path / 'work'
    _one_error_line(_tool('test.py', DET_CONFIG, str(text), '--work-dir', str(work)),
                    str(text))
    line = _one_error_line(_tool('test.py', DET_CONFIG, str(seg), '--work-dir', str(work)),
                           str(seg))
    assert 'segmentor' in line, line
    _one_error_line(_tool('train.py', DET_CONFIG, '--resume', str(text), '--work-dir',
                          str(work)), str(text))
    assert not work.exists()


FULL_DET = os.path.join(REPO_ROOT, 'configs', 'det', 'mask-rcnn_inline-pvt-t_fpn_1x_coco.py')


@pytest.mark.parametrize('tool,args,expected', [
    # an option without '=' (was a ValueError traceback from mmengine's DictAction)
    ('train.py', [DET_CONFIG, '--cfg-options', 'train_cfg.max_iters'],
     ["--cfg-options takes KEY=VALUE pairs, got 'train_cfg.max_iters'"]),
    # the schedule key of the other kind of loop (was the loop's TypeError)
    ('train.py', [FULL_DET, '--cfg-options', 'train_cfg.max_iters=4'],
     ['this config trains by epochs', 'set train_cfg.max_epochs=N instead']),
    # --cfg-options reaches the config in the tools that had none
    ('infer.py', ['img.png', '--config', DET_CONFIG, '--checkpoint', 'x.pth',
                  '--out-dir', 'out', '--cfg-options', 'model.backbone.drop_path_rat=0.1'],
     ["did you mean 'model.backbone.drop_path_rate'"]),
    ('deployment/export_onnx.py', [DET_CONFIG, '--out', 'x.onnx', '--cfg-options',
                                   'model.backbone.drop_path_rat=0.1'],
     ["did you mean 'model.backbone.drop_path_rate'"]),
    ('analysis/benchmark_train.py',
     [SEG_CONFIG, '--cfg-options', 'model.backbone.drop_path_rat=0.1'],
     ["did you mean 'model.backbone.drop_path_rate'"]),
    ('analysis/benchmark_train.py', [SEG_CONFIG], ['is a mmseg config: this benchmark']),
    # a backbone name that is not one (was a KeyError traceback)
    ('analysis/vis_attention.py', ['img.png', '--backbone', 'inline_pvt_x'],
     ["unknown model 'inline_pvt_x': the InLine backbones are inline_pvt_t, inline_pvt_s"]),
])
def test_user_errors_of_the_tools_are_one_line(tmp_path, tool, args, expected):
    image = tmp_path / 'img.png'
    cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
    (tmp_path / 'x.pth').write_bytes(b'')
    args = [str(tmp_path / a) if a in ('img.png', 'x.pth', 'out', 'x.onnx') else a
            for a in args]
    _one_error_line(_tool(tool, *args), *expected)
    assert not (tmp_path / 'out').exists() and not (tmp_path / 'x.onnx').exists()


def test_train_refuses_a_missing_pretrained_checkpoint_before_writing(tmp_path, toy_root):
    """The backbone's init_cfg checkpoint absent: one line, after the data checks passed and
    before the Runner writes the work dir and its log (mmengine reads it only then)."""
    from conftest import toy_det_options
    config = tmp_path / 'pretrained.py'
    config.write_text(f"_base_ = {DET_CONFIG!r}\nmodel = dict(backbone=dict(init_cfg=dict("
                      "_delete_=True, type='Pretrained',\n"
                      "checkpoint='checkpoints/no_such_weights.pth')))\n")
    work = tmp_path / 'work'
    _one_error_line(_tool('train.py', str(config), '--work-dir', str(work),
                          *toy_det_options(toy_root)),
                    "checkpoint file not found: 'checkpoints/no_such_weights.pth', named by "
                    'model.backbone.init_cfg.checkpoint')
    assert not work.exists()
