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
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith('error: ') and str(ckpt) in line, line
    assert not out.exists()


SEG_CONFIG = os.path.join(REPO_ROOT, 'configs', 'seg', 'toy', 'fpn_inline_pvt_toy.py')


def _one_error_line(proc, *expected):
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith('error: '), line
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
