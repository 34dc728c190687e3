"""Conventions every tool shares: what the log says about mixed precision."""
import os

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
