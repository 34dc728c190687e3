"""Checkpoint files as the authors' training scripts write them load without yacs, safely.

The authors' ``save_checkpoint`` stores ``{'model', 'optimizer', 'lr_scheduler',
'max_accuracy', 'epoch', 'config'}`` (a yacs ``CfgNode``), the EMA script adds
``state_dict_ema``, and timm-style scripts store their argparse ``Namespace``.
The files are written here with a stand-in ``yacs.config.CfgNode`` module (yacs'
own pickling: a dict subclass with its flags as instance state) and loaded in
a fresh process in which ``import yacs`` fails.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import REPO_ROOT

from inline_mm.checkpoint import load_checkpoint_file
from inline_mm.errors import CheckpointError

# subprocess runs (training, a fresh interpreter): the slow tier
pytestmark = pytest.mark.slow

YACS_STAND_IN = '''
class CfgNode(dict):
    """yacs' CfgNode as far as pickling goes: a dict with flags in __dict__."""
    IMMUTABLE = '__immutable__'

    def __init__(self, init_dict=None, new_allowed=False):
        init_dict = {} if init_dict is None else init_dict
        for k, v in init_dict.items():
            if isinstance(v, dict):
                init_dict[k] = CfgNode(v, new_allowed=new_allowed)
        super().__init__(init_dict)
        self.__dict__[CfgNode.IMMUTABLE] = False
        self.__dict__['__deprecated_keys__'] = set()
        self.__dict__['__renamed_keys__'] = {}
        self.__dict__['__new_allowed__'] = new_allowed

    def freeze(self):
        self.__dict__[CfgNode.IMMUTABLE] = True
'''

WRITER = '''
import argparse, sys, torch
from yacs.config import CfgNode
from inline_mm import InLineCSWin, InLinePVT

def authors_file(model, ema=None, args=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(1, 3, 64, 64))[-1].mean().backward()
    opt.step()
    config = CfgNode({'MODEL': {'TYPE': 'inline_pvt', 'DROP_PATH_RATE': 0.1},
                      'TRAIN': {'EPOCHS': 300, 'BASE_LR': 1e-3}, 'OUTPUT': 'output'})
    config.freeze()
    state = {'model': model.state_dict(), 'optimizer': opt.state_dict(),
             'lr_scheduler': {'t_initial': 375000, 'lr_min': 5e-06, 'warmup_t': 25000,
                              'base_values': [0.001], 'noise_range_t': None,
                              't_in_epochs': False, 'param_group_field': 'lr'},
             'max_accuracy': 78.2, 'epoch': 299, 'config': config,
             'scaler': {'scale': 65536.0, 'growth_factor': 2.0, 'backoff_factor': 0.5,
                        'growth_interval': 2000, '_growth_tracker': 0}}
    if ema is not None:
        state['state_dict_ema'] = ema
    if args is not None:
        state['args'] = args
    return state

torch.manual_seed(0)
pvt = InLinePVT(arch='tiny', depths=[1, 1, 1, 1])
torch.save(authors_file(pvt), sys.argv[1] + '/pvt_authors.pth')
torch.save({'model': pvt.state_dict()}, sys.argv[1] + '/pvt_expected.pth')
cswin = InLineCSWin(arch='tiny', depths=[1, 1, 1, 1])
ema = {k: v + 1 if v.is_floating_point() else v for k, v in cswin.state_dict().items()}
args = argparse.Namespace(model='inline_cswin_tiny', lr=2e-3, model_ema=True)
torch.save(authors_file(cswin, ema=ema, args=args), sys.argv[1] + '/cswin_ema_authors.pth')
torch.save({'model': cswin.state_dict(), 'ema': ema}, sys.argv[1] + '/cswin_expected.pth')
print('written')
'''

# yacs must not be importable in the loading process
NO_YACS = 'import sys; sys.modules["yacs"] = None; sys.modules["yacs.config"] = None\n'

LOADER = NO_YACS + '''
import torch
from inline_mm import InLineCSWin, InLinePVT
from inline_mm.checkpoint import load_checkpoint_file
try:
    import yacs  # noqa: F401
    raise SystemExit('yacs is importable')
except ImportError:
    pass
root = sys.argv[1]
ckpt = load_checkpoint_file(root + '/pvt_authors.pth')
assert type(ckpt['config']) is dict and ckpt['config']['MODEL']['TYPE'] == 'inline_pvt', ckpt
assert type(ckpt['config']['TRAIN']) is dict and ckpt['epoch'] == 299
assert ckpt['optimizer']['param_groups'][0]['lr'] == 1e-3

def check(model, expected, **extra):
    model.init_cfg = dict(type='Pretrained', **extra)
    model.init_weights()
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected[key]), key

expected = torch.load(root + '/pvt_expected.pth')['model']
check(InLinePVT(arch='tiny', depths=[1, 1, 1, 1]), expected,
      checkpoint=root + '/pvt_authors.pth')
expected = torch.load(root + '/cswin_expected.pth')
cswin = InLineCSWin(arch='tiny', depths=[1, 1, 1, 1])
check(cswin, expected['model'], checkpoint=root + '/cswin_ema_authors.pth')
ema = {k: v for k, v in expected['ema'].items() if k in cswin.state_dict()}
check(InLineCSWin(arch='tiny', depths=[1, 1, 1, 1]), ema,
      checkpoint=root + '/cswin_ema_authors.pth', state_dict_key='state_dict_ema')
args = load_checkpoint_file(root + '/cswin_ema_authors.pth')['args']
assert args == {'model': 'inline_cswin_tiny', 'lr': 2e-3, 'model_ema': True}, args
print('loaded')
'''


@pytest.fixture(scope='module')
def authors_files(tmp_path_factory):
    root = tmp_path_factory.mktemp('authors')
    stand_in = root / 'stand_in'
    (stand_in / 'yacs').mkdir(parents=True)
    (stand_in / 'yacs' / '__init__.py').write_text('')
    (stand_in / 'yacs' / 'config.py').write_text(YACS_STAND_IN)
    out = subprocess.run([sys.executable, '-c', WRITER, str(root)], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(stand_in)))
    assert out.returncode == 0, out.stderr[-3000:]
    return root


def _run(code, *args):
    return subprocess.run([sys.executable, '-c', code, *map(str, args)], capture_output=True,
                          text=True, cwd=REPO_ROOT)


def test_authors_files_load_through_init_cfg_without_yacs(authors_files):
    out = _run(LOADER, authors_files)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith('loaded')


@pytest.mark.parametrize('name,key', [('pvt_authors.pth', None),
                                      ('cswin_ema_authors.pth', 'state_dict_ema')])
def test_converter_tool_reads_authors_files_without_yacs(authors_files, tmp_path, name, key):
    dst = tmp_path / 'converted.pth'
    tool = os.path.join(REPO_ROOT, 'tools', 'model_converters', 'inline2mm.py')
    code = NO_YACS + f'sys.argv = sys.argv[:1] + sys.argv[1:]; exec(open({tool!r}).read())'
    args = [authors_files / name, dst] + (['--state-dict-key', key] if key else [])
    out = subprocess.run([sys.executable, '-c', code, *map(str, args)], capture_output=True,
                         text=True, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    converted = torch.load(dst)['state_dict']
    expected = torch.load(authors_files / name.replace('_authors', '_expected')
                          .replace('_ema', ''))
    expected = expected['ema'] if key else expected['model']
    assert converted.keys() <= expected.keys() and len(converted) > 10
    for k, v in converted.items():
        assert torch.equal(v, expected[k]), k


class _SystemCall:
    """Unpickles as os.system(command): what a malicious checkpoint does."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_dangerous_global_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / 'executed'
    path = tmp_path / 'evil.pth'
    torch.save({'model': {'w': torch.ones(2)}, 'config': _SystemCall(f'touch {marker}')}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint_file(str(path))
    message = str(info.value)
    assert 'evil.pth' in message and 'system' in message  # the file and the class
    assert "torch.save({'model'" in message  # the safe way out
    assert 'weights_only=False' not in message
    assert not marker.exists()
    # through the command-line converter: one line, exit status 2, no traceback
    out = subprocess.run([sys.executable,
                          os.path.join(REPO_ROOT, 'tools', 'model_converters', 'inline2mm.py'),
                          str(path), str(tmp_path / 'out.pth')], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith('error: refused to load') and 'Traceback' not in out.stderr
    assert not marker.exists() and not (tmp_path / 'out.pth').exists()


def test_text_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / 'notes.pth'
    path.write_text('not a checkpoint')
    with pytest.raises(CheckpointError, match="notes.pth.*not a PyTorch checkpoint") as info:
        load_checkpoint_file(str(path))
    assert 'weights_only=False' not in str(info.value)


def test_unknown_class_is_named(tmp_path):
    """A pickled class outside the allow-list is named in the refusal."""
    path = tmp_path / 'other.pth'
    torch.save({'model': {'w': torch.ones(1)}, 'meta': textwrap.TextWrapper(width=3)}, path)
    with pytest.raises(CheckpointError, match='textwrap.TextWrapper'):
        load_checkpoint_file(str(path))
