"""The plugin fits an existing OpenMMLab environment: ranges, light import, one toolkit."""
import configparser
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
from conftest import REPO_ROOT, site_packages_farm

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
    # mmengine / mmcv come in two lines (OpenMMLab's, OneDL's): through the extras only
    assert {'torch', 'timm'} <= names and not names & {'mmengine', 'mmcv'}, names
    extras = cfg['options.extras_require']
    assert not [r for key in ['options', 'options.extras_require'] for r in
                _requirements('\n'.join(cfg[key].values())) if '==' in r]
    assert 'mmcv>=2.1,<2.2' in _requirements(extras['mmdet'])
    assert 'mmdet>=3.2,<3.4' in _requirements(extras['mmdet'])
    assert 'mmsegmentation>=1.2.1,<1.3' in _requirements(extras['mmseg'])
    assert 'onedl-mmcv>=2.3,<2.4' in _requirements(extras['onedl'])
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
    # OneDL's mmseg prints 'Could not import OneDL' where mmdet is absent
    assert out.stdout.strip().splitlines()[-1] == 'ok', out.stdout


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


# --- installing into an environment that holds a whole stack already ---------------------

#: site-packages entries of this environment a new one leaves out: inline-mm itself, and
#: (for OneDL's line) OpenMMLab's packages, which OneDL's distributions install instead
INLINE_MM_ENTRIES = ('inline_mm', 'inline_mm-*', '__editable__*inline_mm*')
OPENMMLAB_ENTRIES = ('mmengine', 'mmengine-*', 'mmcv', 'mmcv-*', 'mmdet', 'mmdet-*', 'mmseg',
                     'mmsegmentation-*')


def _environment_over_this_one(root, hide):
    """A new virtual environment that sees this one's site-packages less ``hide``.

    Its ``.pth`` file names a folder of symlinks to this environment's entries, so pip
    there finds torch, mmcv, mmdet, ... installed, without a copy of them.
    """
    parent = site_packages_farm(root / 'parent-site-packages', hide)
    venv = root / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    python = str(venv / 'bin' / 'python')
    own = subprocess.run([python, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
                         capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(own, 'parent.pth'), 'w') as file:
        file.write(f'{parent}\n')
    return python


def _project_copy(root):
    """The packaging files and the package: the install writes its egg-info there."""
    project = root / 'inline-mm'
    shutil.copytree(os.path.join(REPO_ROOT, 'inline_mm'), project / 'inline_mm',
                    ignore=shutil.ignore_patterns('__pycache__'))
    for name in ('setup.cfg', 'pyproject.toml', 'README.md'):
        shutil.copy(os.path.join(REPO_ROOT, name), project / name)
    return project


def _pip(python, *args, check=True):
    out = subprocess.run([python, '-m', 'pip', '--disable-pip-version-check', *args],
                         capture_output=True, text=True, timeout=1200)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _install_changes_only_inline_mm(python, project, extras):
    """``pip install -e project[extras]`` with no index at all: everything else must be
    installed already, and pip freeze differs by inline-mm only."""
    before = set(_pip(python, 'freeze', '--all').stdout.splitlines())
    out = _pip(python, 'install', '--no-index', '--no-build-isolation',
               '-e', f'{project}[{extras}]', check=False)
    # without an index, a requirement not installed already fails the install here
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.findall(r'^Successfully installed (.*)$', out.stdout, re.M) == ['inline-mm-0.1.0']
    after = set(_pip(python, 'freeze', '--all').stdout.splitlines())
    assert not before - after, sorted(before - after)
    # the editable inline-mm: its line (and pip's comment on it)
    assert after - before and all('inline-mm' in line or str(project) in line
                                  for line in after - before), sorted(after - before)


def test_install_into_an_openmmlab_environment_changes_nothing_else(tmp_path):
    """This environment (OpenMMLab's line) plus ``pip install -e .[all]``: only inline-mm."""
    from inline_mm import stack
    if stack.check_stack() is not stack.OPENMMLAB:
        pytest.skip("this environment holds OneDL's line: the install into OpenMMLab's is "
                    'tested in an environment of that line (make test, make test-compat)')
    python = _environment_over_this_one(tmp_path, INLINE_MM_ENTRIES)
    project = _project_copy(tmp_path)
    _install_changes_only_inline_mm(python, project, 'all')
    out = subprocess.run([python, '-c', 'import inline_mm; print(inline_mm.__file__)'],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str(project / 'inline_mm' / '__init__.py')


def _constraint_pins(name):
    text = open(os.path.join(REPO_ROOT, 'scripts', name)).read()
    return dict(re.findall(r'^([A-Za-z0-9_.-]+)==(\S+)', text, re.M))


def _onedl_wheels():
    """OneDL's distributions at scripts/constraints-onedl.txt's pins, as wheels for pip's view.

    onedl-mmcv's setup.py always compiles its ops (minutes on 2 cores): this metadata-only
    build leaves the extension out, which is enough for what pip resolves.  Built once from
    PyPI into the cache of scripts/install.sh; skipped when PyPI cannot be reached.
    """
    pins = _constraint_pins('constraints-onedl.txt')
    dists = ['onedl-mmengine', 'onedl-mmcv', 'onedl-mmdetection', 'onedl-mmsegmentation']
    cache = os.environ.get('INLINE_MM_CACHE') or os.path.join(
        os.environ.get('XDG_CACHE_HOME', os.path.expanduser('~/.cache')), 'inline-mm')
    folder = os.path.join(cache, 'wheels', 'onedl-metadata-only-' + '-'.join(
        pins[d] for d in dists))
    wheels = sorted(glob.glob(os.path.join(folder, '*.whl')))
    if len(wheels) == len(dists):
        return wheels
    with tempfile.TemporaryDirectory() as build:
        out = _pip(sys.executable, 'download', '--no-deps', '-d', build,
                   *[f'{d}=={pins[d]}' for d in dists], check=False)
        if out.returncode != 0:
            pytest.skip(f'OneDL\'s distributions could not be downloaded: {out.stderr[-300:]}')
        for sdist in glob.glob(os.path.join(build, '*.tar.gz')):
            subprocess.run(['tar', '-xzf', sdist, '-C', build], check=True)
            source = sdist[:-len('.tar.gz')]
            if os.path.basename(source).startswith('onedl_mmcv-'):
                setup_py = os.path.join(source, 'setup.py')
                text = open(setup_py).read()
                assert 'ext_modules=get_extensions(),' in text
                with open(setup_py, 'w') as file:
                    file.write(text.replace('ext_modules=get_extensions(),', 'ext_modules=[],'))
            _pip(sys.executable, 'wheel', '--no-deps', '--no-build-isolation', '--no-index',
                 '-w', os.path.join(build, 'dist'), source)
        os.makedirs(folder, exist_ok=True)
        for wheel in glob.glob(os.path.join(build, 'dist', '*.whl')) + glob.glob(
                os.path.join(build, '*.whl')):
            shutil.copy(wheel, os.path.join(folder, os.path.basename(wheel)))
    return sorted(glob.glob(os.path.join(folder, '*.whl')))


def test_install_into_a_onedl_environment_changes_nothing_else(tmp_path):
    """OneDL's line (no OpenMMLab mmengine / mmcv / mmdet / mmseg in sight) plus ``pip
    install -e .[onedl]``: only inline-mm; no OpenMMLab mmcv is fetched over onedl-mmcv."""
    wheels = _onedl_wheels()
    python = _environment_over_this_one(tmp_path, INLINE_MM_ENTRIES + OPENMMLAB_ENTRIES)
    # the user's OneDL environment: the four distributions and what they require
    out = _pip(python, 'install', '--no-build-isolation', *wheels, check=False)
    if out.returncode != 0 and 'No matching distribution' in out.stderr:
        pytest.skip(f'the requirements of OneDL\'s distributions: {out.stderr[-300:]}')
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    project = _project_copy(tmp_path)
    _install_changes_only_inline_mm(python, project, 'onedl')
