"""import inline_mm checks the OpenMMLab stack first: one message, never a toolkit traceback.

Wrong versions are made by shadowing the real distributions: a folder put first on
PYTHONPATH holds a ``<dist>-<version>.dist-info/METADATA`` and, where the package
files change too, a package folder of that version.  Everything else (torch, the real
mmengine / mmcv / mmdet / mmseg) is the environment's own.
"""
import configparser
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, site_packages_farm
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from inline_mm import stack

# what a toolkit would print if it failed first: its own files in the traceback
TOOLKIT_FILE = re.compile(r'File "[^"]*[/\\](mmengine|mmcv|mmdet|mmseg)[/\\]')


def _fake_dist(root, dist, version, package=None, init=None, version_py=None):
    """A distribution's metadata (and optionally its package files) under ``root``."""
    info = root / f'{dist.replace("-", "_")}-{version}.dist-info'
    info.mkdir()
    (info / 'METADATA').write_text(f'Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n')
    if package:
        folder = root / package
        folder.mkdir()
        (folder / '__init__.py').write_text(init if init is not None
                                            else f'__version__ = {version!r}\n')
        if version_py is not None:
            (folder / 'version.py').write_text(version_py)


def _import(shadow, code='import inline_mm', hide=(), **env):
    """Run ``code`` with ``shadow`` first on the path; ``hide``: site-packages entries
    (glob patterns) left out, by running on a symlink copy of site-packages without them."""
    environ = dict(os.environ, PYTHONPATH=str(shadow), **env)
    command = [sys.executable, '-c', code]
    if hide:
        farm = site_packages_farm(shadow / 'site-packages-copy', hide)
        # -S: not the real site-packages; addsitedir runs the copy's .pth files
        command = [sys.executable, '-S', '-c', f'import site; site.addsitedir({str(farm)!r}); '
                   + code]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT,
                          env=environ, timeout=600)


def _the_one_message(out):
    """The last stderr line, after checking that it is the only error and no toolkit's."""
    assert out.returncode != 0, out.stdout[-2000:]
    assert not TOOLKIT_FILE.search(out.stderr), out.stderr[-3000:]
    assert 'During handling' not in out.stderr, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith('inline_mm.errors.ToolkitVersionError: '), out.stderr[-3000:]
    return last


#: the environment's own line (the suite runs on either), and the other one
LINE = stack.check_stack() or stack.OPENMMLAB
OTHER = next(line for line in stack.LINES if line is not LINE)
#: a version inside each line's ranges, for faked distributions
IN_RANGE = {stack.OPENMMLAB.name: {'mmcv': '2.1.0', 'mmdet': '3.3.0'},
            stack.ONEDL.name: {'mmcv': '2.3.6', 'mmdet': '3.5.1'}}


def _dist(component, line=LINE):
    return line.requirements[component][0]


def _named(component, version, line=LINE):
    """How the message names a component: ``mmcv 2.3.6 (onedl-mmcv)``."""
    dist = _dist(component, line)
    return f'{component} {version}' + (f' ({dist})' if dist != component else '')


def test_wrong_mmcv_version_stops_at_import(tmp_path):
    _fake_dist(tmp_path, _dist('mmcv'), '9.9.9', package='mmcv')
    message = _the_one_message(_import(tmp_path))
    assert f'{_named("mmcv", "9.9.9")} is outside {LINE.requirement("mmcv")}' in message
    assert f'Fix: pip install "{LINE.requirement("mmcv")}"' in message
    # the rest of the stack is named as found
    assert f'mmdet {stack._find("mmdet").version}' in message


@pytest.mark.skipif(LINE is not stack.OPENMMLAB, reason="OpenMMLab's line only")
@pytest.mark.parametrize('dist,package,version', [('mmsegmentation', 'mmseg', '1.2.0'),
                                                   ('mmdet', 'mmdet', '3.1.0'),
                                                   ('mmcv', 'mmcv', '2.0.1')])
def test_below_the_floors_stops_at_import(tmp_path, dist, package, version):
    """Releases under the floors (mmsegmentation 1.2.0's wheel misses a file mmseg.engine
    reads; mmdet 3.1 asserts mmcv < 2.1; mmcv 2.0 has no torch 2.1 wheels) are named."""
    _fake_dist(tmp_path, dist, version, package=package)
    message = _the_one_message(_import(tmp_path))
    assert f'{_named(package, version)} is outside {LINE.requirement(package)}' in message
    assert stack.in_range(stack._find(package).version, LINE.requirements[package][1])


def test_without_the_check_the_toolkit_fails_inside(tmp_path):
    """The same environment, check skipped: the failure comes from inside mmdet / mmseg
    (OpenMMLab's mmdet asserts its mmcv range at import; OneDL's imports and fails where
    its models import mmcv's ops)."""
    _fake_dist(tmp_path, _dist('mmcv'), '9.9.9', package='mmcv')
    out = _import(tmp_path, 'import inline_mm; import mmdet.models',
                  INLINE_MM_SKIP_STACK_CHECK='1')
    assert out.returncode != 0
    assert TOOLKIT_FILE.search(out.stderr), out.stderr[-3000:]


def test_mixed_lines_are_named(tmp_path):
    """The other line's mmdet over this line's mmcv / mmengine: the mix and the fix that
    completes the toolkit's line (the toolkit is the user's choice)."""
    version = IN_RANGE[OTHER.name]['mmdet']
    dist = _dist('mmdet', OTHER)
    if dist == 'mmdet':  # OpenMMLab's version.py holds the version
        _fake_dist(tmp_path, dist, version, package='mmdet', init='',
                   version_py=f'__version__ = {version!r}\n')
    else:  # OneDL's version.py reads it from the metadata
        _fake_dist(tmp_path, dist, version, package='mmdet', init='',
                   version_py="from importlib.metadata import version\n"
                              f"__version__ = version({dist!r})\n")
    # this line's mmdet metadata left out: the mmdet package is the other line's alone
    ours = _dist('mmdet').replace('-', '_') + '-*.dist-info'
    message = _the_one_message(_import(tmp_path, 'import sys; sys.modules["mmseg"] = None; '
                                                 'import inline_mm', hide=[ours]))
    mmengine, mmcv = stack._find('mmengine').describe(), stack._find('mmcv').describe()
    assert ('a mix of the two lines, which share the import names (one line only): '
            f"{LINE.name}'s {mmengine}, {LINE.name}'s {mmcv} with {OTHER.name}'s "
            f'{_named("mmdet", version, OTHER)}') in message
    assert (f'Fix: pip uninstall -y {_dist("mmengine")} {_dist("mmcv")} && pip install '
            f'"{OTHER.requirement("mmengine")}" "{OTHER.requirement("mmcv")}"') in message


def test_two_distributions_of_one_package(tmp_path):
    """The other line's mmcv metadata beside this line's: both named, this line kept."""
    _fake_dist(tmp_path, _dist('mmcv', OTHER), IN_RANGE[OTHER.name]['mmcv'])
    message = _the_one_message(_import(tmp_path))
    assert '2 distributions install the one mmcv package (mmcv, onedl-mmcv)' in message
    assert f'pip uninstall -y mmcv onedl-mmcv && pip install "{LINE.requirement("mmcv")}"' \
        in message


def test_package_files_of_another_version_than_the_metadata(tmp_path):
    """A source folder of mmcv 2.0.0 first on the path, the line's mmcv metadata installed."""
    (tmp_path / 'mmcv').mkdir()
    (tmp_path / 'mmcv' / '__init__.py').write_text("__version__ = '2.0.0'\n")
    message = _the_one_message(_import(tmp_path))
    installed = stack._find('mmcv').version
    assert (f'the mmcv package files in {tmp_path / "mmcv"} are version 2.0.0 but the metadata '
            f'of {_dist("mmcv")} says {installed}') in message


def test_mmcv_without_ops_stops_a_detection_environment(tmp_path):
    version = IN_RANGE[LINE.name]['mmcv']
    _fake_dist(tmp_path, _dist('mmcv'), version, package='mmcv')
    out = _import(tmp_path, 'import sys; sys.modules["mmseg"] = None; import inline_mm')
    message = _the_one_message(out)
    assert (f'{_named("mmcv", version)} has no compiled ops (mmcv._ext in '
            f'{tmp_path / "mmcv"})') in message
    assert f'MMCV_WITH_OPS=1 pip install --no-cache-dir "{LINE.requirement("mmcv")}"' \
        in message


def test_no_toolkit_names_both_lines(tmp_path):
    out = _import(tmp_path, 'import sys; sys.modules["mmdet"] = sys.modules["mmseg"] = None; '
                            'import inline_mm')
    message = _the_one_message(out)
    assert '"inline-mm[mmdet]" / "inline-mm[mmseg]" (OpenMMLab)' in message
    assert '"inline-mm[onedl-mmdet]" / "inline-mm[onedl-mmseg]" (OneDL)' in message


def test_the_installed_stack_passes():
    """This environment's own stack is of one line, within its ranges."""
    line = stack.check_stack()
    assert line is not None
    for component in stack.COMPONENTS:
        found = stack._find(component)
        dist, spec = line.requirements[component]
        assert [d for d, _, _ in found.dists] == [dist]
        assert Version(found.version) in SpecifierSet(spec)


@pytest.mark.parametrize('spec', ['>=2.0,<2.2', '>=0.10.8,<0.11', '>=3.5,<3.6', '>=1.0,<1.3'])
@pytest.mark.parametrize('version', [
    '1.7.2', '2.0.0rc4', '2.0.0', '2.0', '2.1.0', '2.1.0+cu121', '2.2.0rc1', '2.2.0', '2.3.2.post2',
    '0.10.7', '0.10.8rc1', '0.10.8', '0.10.12', '0.11.0', '3.4.7', '3.5.0', '3.5.1', '3.6.0',
    '1.2.2', '1.3.0', '10.0'])
def test_in_range_agrees_with_packaging(version, spec):
    assert stack.in_range(version, spec) == (Version(version) in SpecifierSet(spec))


def _requirements(text):
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith('#')]


def test_setup_cfg_extras_are_the_checked_ranges():
    """Each line's extras require exactly the ranges import inline_mm checks; the core
    requires none of the packages that come in two lines."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO_ROOT, 'setup.cfg'))
    extras = cfg['options.extras_require']
    two_line = {d for line in stack.LINES for c in stack.COMPONENTS
                for d in line.distributions(c)}
    core = {re.split(r'[<>=!~ ;\[]', r)[0] for r in
            _requirements(cfg['options']['install_requires'])}
    assert core and not core & two_line, core
    for line in stack.LINES:
        for extra, toolkits in zip(line.extras, (['mmdet'], ['mmseg'], ['mmdet', 'mmseg'])):
            reqs = _requirements(extras[extra])
            named = [r for r in reqs if re.split(r'[<>=]', r)[0] in two_line]
            assert sorted(named) == sorted(line.requirement(c)
                                           for c in ['mmengine', 'mmcv'] + toolkits), extra
