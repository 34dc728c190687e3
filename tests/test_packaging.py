"""The plugin fits an existing OpenMMLab environment: ranges, light import, one toolkit."""
import configparser
import glob
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

SETUP_CFG = os.path.join(REPO_ROOT, 'setup.cfg')

# subprocess runs (training, fresh interpreters): the slow tier
pytestmark = pytest.mark.slow


def _setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(SETUP_CFG)
    return cfg


def _requirements(text):
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith('#')]


def test_setup_cfg_declares_ranges_not_pins():
    cfg = _setup_cfg()
    requires = _requirements(cfg['options']['install_requires'])
    names = {re.split(r'[<>=!~ ]', r)[0] for r in requires}
    assert {'torch', 'mmengine', 'mmcv', 'timm'} <= names
    assert not [r for r in requires if '==' in r], requires
    assert 'mmcv>=2.0,<2.2' in requires
    extras = cfg['options.extras_require']
    assert 'mmdet>=3.0,<3.4' in _requirements(extras['mmdet'])
    assert 'mmsegmentation>=1.0,<1.3' in _requirements(extras['mmseg'])
    # the exact stack of the two-command path lives in the install script's constraints
    pins = _requirements(open(os.path.join(REPO_ROOT, 'scripts', 'constraints.txt')).read())
    assert 'torch==2.14.1' in pins and 'mmcv==2.1.0' in pins


def test_python_requires_is_the_real_floor():
    """vermin's minimum Python for the package and tools equals setup.cfg's python_requires."""
    declared = _setup_cfg()['options']['python_requires']
    floor = re.fullmatch(r'>=(\d+)\.(\d+)', declared.strip())
    assert floor, declared
    vermin = os.path.join(os.path.dirname(sys.executable), 'vermin')
    # annotations are evaluated at import time (no `from __future__ import annotations`),
    # so `X | Y` unions in them count
    out = subprocess.run([vermin, '--no-tips', '--eval-annotations', '--feature', 'union-types',
                          '--backport', 'typing', '-vv',
                          os.path.join(REPO_ROOT, 'inline_mm'), os.path.join(REPO_ROOT, 'tools')],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    found = re.search(r'Minimum required versions: (?:~2\.\d+, )?(\d+)\.(\d+)', out.stdout)
    assert found, out.stdout[-2000:]
    assert (int(found.group(1)), int(found.group(2))) == (int(floor.group(1)),
                                                          int(floor.group(2))), out.stdout[-1500:]


def _python(code):
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          cwd=REPO_ROOT)


def test_import_is_light():
    """import inline_mm registers the backbones and brings in nothing else of the plugin."""
    out = _python('import sys, inline_mm\n'
                  'extra = sorted(m for m in sys.modules if m.startswith("inline_mm.")\n'
                  '               and m.split(".")[1] in ("datasets", "engine", "deploy"))\n'
                  'print(extra)\n')
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == '[]'


BLOCK = 'import sys\nsys.modules["{name}"] = None  # not installed\n'


def test_detection_only_environment():
    """Without mmsegmentation the mmdet backbones register and a detector config builds."""
    config = os.path.join(REPO_ROOT, 'configs', 'det', 'mask_rcnn_inline_pvt.py')
    code = BLOCK.format(name='mmseg') + f'''
import inline_mm, torch
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.registry import init_default_scope
assert inline_mm.available_toolkits() == ('mmdet',), inline_mm.available_toolkits()
assert MODELS.get('InLinePVT') is inline_mm.InLinePVT
cfg = Config.fromfile({config!r})
cfg.model.backbone.update(depths=[1, 1, 1, 1], init_cfg=None)
init_default_scope('mmdet')
model = MODELS.build(cfg.model)
feats = model.extract_feat(torch.randn(1, 3, 64, 96))
print(type(model).__name__, len(feats))
'''
    out = _python(code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == 'MaskRCNN 5'


def test_segmentation_only_environment():
    """Without mmdet the mmseg backbones and the toy dataset class register."""
    code = BLOCK.format(name='mmdet') + '''
import inline_mm, inline_mm.datasets
from mmseg.registry import DATASETS, MODELS
assert inline_mm.available_toolkits() == ('mmseg',), inline_mm.available_toolkits()
assert MODELS.get('InLineSwin') is inline_mm.InLineSwin
assert DATASETS.get('ADEToyDataset') is not None
print('ok')
'''
    out = _python(code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == 'ok'


def test_no_toolkit_gives_a_clear_error():
    out = _python(BLOCK.format(name='mmdet') + 'sys.modules["mmseg"] = None\nimport inline_mm\n')
    assert out.returncode != 0
    assert 'needs MMDetection 3.x (mmdet) or MMSegmentation 1.x' in out.stderr


def _toolkit_tools(toolkit):
    root = os.path.dirname(__import__(toolkit).__file__)
    return sorted(glob.glob(os.path.join(root, '.mim', 'tools', '**', '*.py'), recursive=True))


@pytest.mark.parametrize('toolkit,tools', [
    ('mmdet', ['train.py', 'test.py', 'analysis_tools/benchmark.py',
               'analysis_tools/get_flops.py', 'analysis_tools/analyze_logs.py',
               'analysis_tools/confusion_matrix.py', 'analysis_tools/browse_dataset.py']),
    ('mmseg', ['train.py', 'test.py', 'analysis_tools/benchmark.py',
               'analysis_tools/get_flops.py', 'analysis_tools/analyze_logs.py',
               'analysis_tools/confusion_matrix.py', 'analysis_tools/browse_dataset.py']),
])
def test_the_toolkits_own_tools_find_their_imports(toolkit, tools):
    """What mmdet's / mmseg's own training, testing and analysis tools import is installed."""
    available = {os.path.relpath(p, os.path.join(os.path.dirname(__import__(toolkit).__file__),
                                                 '.mim', 'tools')): p
                 for p in _toolkit_tools(toolkit)}
    for tool in tools:
        assert tool in available, f'{toolkit} ships no tools/{tool}'
        out = subprocess.run([sys.executable, available[tool], '--help'], capture_output=True,
                             text=True, cwd=REPO_ROOT)
        assert out.returncode == 0, f'{toolkit} tools/{tool}: {out.stderr[-1500:]}'
