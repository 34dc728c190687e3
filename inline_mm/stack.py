"""Which OpenMMLab stack is installed: checked by ``import inline_mm`` before any toolkit import.

Two lines of the toolkits share the import names ``mmengine``, ``mmcv``, ``mmdet`` and
``mmseg``: OpenMMLab's original releases (distributions ``mmengine``, ``mmcv``, ``mmdet``,
``mmsegmentation``; mmdet 3.3.0 and mmsegmentation 1.2.2 are the last) and OneDL's
maintained continuation (``onedl-mmengine``, ``onedl-mmcv``, ``onedl-mmdetection``,
``onedl-mmsegmentation``).  A version outside the ranges of its line, an mmcv of the other
line, or an mmcv without its compiled ops fails deep inside a toolkit (mmdet's own
assertion on the mmcv version, ``No module named 'mmcv._ext'`` when a detector is built).
:func:`check_stack` finds these first, from the distributions' metadata and the packages'
own ``version.py``, without importing any toolkit, and raises one
:class:`~inline_mm.errors.ToolkitVersionError` naming the versions found, the ranges of
the line and the pip command that fixes the environment.

The ranges are those of setup.cfg's extras (``[mmdet]``, ``[mmseg]``, ``[all]`` for
OpenMMLab's line, ``[onedl-mmdet]``, ``[onedl-mmseg]``, ``[onedl]`` for OneDL's);
tests/test_stack_check.py checks that the two agree.
"""
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

from .errors import ToolkitVersionError

#: the import names, in the order a stack depends on them
COMPONENTS: Tuple[str, ...] = ('mmengine', 'mmcv', 'mmdet', 'mmseg')
#: one of them is enough: the plugin registers into whichever is installed
TOOLKITS: Tuple[str, ...] = ('mmdet', 'mmseg')
#: set to 1 to skip the check (a toolkit from a source checkout newer than the ranges)
SKIP_ENV = 'INLINE_MM_SKIP_STACK_CHECK'


@dataclass(frozen=True, eq=False)
class Line:
    """One line of the toolkits: its distributions and the ranges inline-mm supports."""

    name: str
    #: import name -> (distribution, version range in setup.cfg's syntax)
    requirements: Dict[str, Tuple[str, str]]
    #: import name -> other distributions of the line installing that package
    variants: Dict[str, Tuple[str, ...]]
    #: setup.cfg extras of the line: detection, segmentation, both
    extras: Tuple[str, str, str]

    def requirement(self, component: str) -> str:
        dist, spec = self.requirements[component]
        return f'{dist}{spec}'

    def distributions(self, component: str) -> Tuple[str, ...]:
        return (self.requirements[component][0],) + self.variants.get(component, ())


# the floors: mmcv 2.1 is the first with torch 2.1 wheels; mmdet < 3.2 / mmsegmentation < 1.2
# assert mmcv < 2.1 at import; mmsegmentation 1.2.0's wheel misses a file mmseg.engine reads
OPENMMLAB = Line(
    name='OpenMMLab',
    requirements={'mmengine': ('mmengine', '>=0.10.3,<0.11'), 'mmcv': ('mmcv', '>=2.1,<2.2'),
                  'mmdet': ('mmdet', '>=3.2,<3.4'),
                  'mmseg': ('mmsegmentation', '>=1.2.1,<1.3')},
    # mmcv-lite has no compiled ops, mmcv-full is the 1.x series: named when found
    variants={'mmengine': ('mmengine-lite',), 'mmcv': ('mmcv-lite', 'mmcv-full')},
    extras=('mmdet', 'mmseg', 'all'))
ONEDL = Line(
    name='OneDL',
    requirements={'mmengine': ('onedl-mmengine', '>=0.10.8,<0.11'),
                  'mmcv': ('onedl-mmcv', '>=2.3,<2.4'),
                  'mmdet': ('onedl-mmdetection', '>=3.5,<3.6'),
                  'mmseg': ('onedl-mmsegmentation', '>=1.4,<1.5')},
    variants={},
    extras=('onedl-mmdet', 'onedl-mmseg', 'onedl'))
LINES: Tuple[Line, ...] = (OPENMMLAB, ONEDL)

_PRE_RELEASE = re.compile(r'[-_.]?(a|b|c|rc|alpha|beta|pre|preview|dev)\d*', re.I)


def _version_key(version: str) -> Optional[Tuple[int, ...]]:
    """Release numbers padded to 4 parts, then 0 for a pre-release, 1 for a release."""
    match = re.match(r'\s*v?(\d+(?:\.\d+)*)(.*)', version)
    if match is None:
        return None
    release = tuple(int(part) for part in match.group(1).split('.'))[:4]
    release += (0,) * (4 - len(release))
    return release + (0 if _PRE_RELEASE.match(match.group(2)) else 1,)


def in_range(version: str, spec: str) -> bool:
    """Whether ``version`` satisfies ``spec`` (``>=`` / ``<`` clauses, as in setup.cfg)."""
    key = _version_key(version)
    if key is None:
        return False
    for clause in spec.split(','):
        op, bound = re.fullmatch(r'\s*(>=|<)\s*(\S+)\s*', clause).groups()
        bound_key = _version_key(bound)
        # '<2.2' excludes 2.2's pre-releases too (as pip does): compare the release parts
        if op == '>=' and key < bound_key or op == '<' and key[:4] >= bound_key[:4]:
            return False
    return True


@dataclass
class _Found:
    """What the environment holds for one import name."""

    component: str
    folder: str
    #: (distribution, version, line) of every distribution of that package on the path
    dists: List[Tuple[str, str, Line]]
    #: ``__version__`` of the package files that ``import`` would load
    module_version: Optional[str]

    @property
    def version(self) -> Optional[str]:
        return self.dists[0][1] if len(self.dists) == 1 else self.module_version

    def lines(self) -> Set[Line]:
        if self.dists:
            return {line for _, _, line in self.dists}
        # no metadata (a source folder on PYTHONPATH): the line whose range fits the version
        return {line for line in LINES if self.module_version is not None
                and in_range(self.module_version, line.requirements[self.component][1])}

    def describe(self) -> str:
        if len(self.dists) == 1:
            dist = self.dists[0][0]
            return f'{self.component} {self.version}' + (
                f' ({dist})' if dist != self.component else '')
        if self.dists:
            names = ' + '.join(f'{dist} {version}' for dist, version, _ in self.dists)
            return f'{self.component} {self.version} ({names})'
        return f'{self.component} {self.module_version} (no distribution metadata: {self.folder})'


def _module_version(component: str, spec) -> Optional[str]:
    """``__version__`` of the package files, read without importing the package."""
    folders = list(spec.submodule_search_locations or ())
    if not folders:
        return None
    version_py = os.path.join(folders[0], 'version.py')
    if os.path.isfile(version_py):
        # the toolkits' version.py needs the standard library only; their __init__ imports
        # the toolkit (mmdet's asserts the mmcv version), which is what this check precedes
        namespace = {'__name__': f'{component}.version', '__file__': version_py}
        try:
            with open(version_py, encoding='utf-8') as file:
                exec(compile(file.read(), version_py, 'exec'), namespace)
        except Exception:  # OneDL's version.py reads its metadata, which may be absent
            namespace = {}
        if isinstance(namespace.get('__version__'), str):
            return namespace['__version__']
    if spec.origin and os.path.isfile(spec.origin):
        with open(spec.origin, encoding='utf-8') as file:
            match = re.search(r'^__version__\s*=\s*[\'"]([^\'"]+)[\'"]', file.read(), re.M)
        if match:
            return match.group(1)
    return None


def _find(component: str) -> Optional[_Found]:
    # find_spec of a top-level name imports nothing (and is None for sys.modules[name] = None)
    spec = importlib.util.find_spec(component)
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or ())
    dists = []
    for line in LINES:
        for dist in line.distributions(component):
            try:  # the first metadata of that name on sys.path, as pip and import see it
                dists.append((dist, importlib.metadata.version(dist), line))
            except importlib.metadata.PackageNotFoundError:
                pass
    return _Found(component, folders[0] if folders else str(spec.origin), dists,
                  _module_version(component, spec))


def _has_ops(found: _Found) -> bool:
    return any(os.path.isfile(os.path.join(found.folder, '_ext' + suffix))
               for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def _target_line(found: Dict[str, _Found]) -> Line:
    """The line to complete: the toolkits' (the user's choice), else mmcv's, else OpenMMLab."""
    for component in ('mmdet', 'mmseg', 'mmcv', 'mmengine'):
        lines = found[component].lines() if component in found else set()
        if len(lines) == 1:
            return lines.pop()
    return OPENMMLAB


def _no_toolkit_message() -> str:
    hints = ' or '.join(
        f'"inline-mm[{line.extras[0]}]" / "inline-mm[{line.extras[1]}]" ({line.name})'
        for line in LINES)
    return ('inline-mm needs MMDetection 3.x (mmdet) or MMSegmentation 1.x (mmsegmentation) '
            f'installed to register its backbones: pip install {hints}')


def check_stack() -> Optional[Line]:
    """Check the installed mmengine / mmcv / mmdet / mmseg against the line they belong to.

    Returns:
        The line found (``None`` when ``INLINE_MM_SKIP_STACK_CHECK=1`` skips the check).

    Raises:
        ToolkitVersionError: no toolkit, a version outside its line's range, a mix of
            the two lines, two distributions of one package, or (with mmdet) an mmcv
            without its compiled ops; one message with the versions, the ranges and the
            pip command that fixes it.
    """
    if os.environ.get(SKIP_ENV) == '1':
        return None
    found = {c: f for c in COMPONENTS if (f := _find(c)) is not None}
    toolkits = [c for c in TOOLKITS if c in found]
    if not toolkits:
        raise ToolkitVersionError(_no_toolkit_message())
    line = _target_line(found)
    needed = ['mmengine', 'mmcv'] + toolkits
    problems: List[str] = []
    mixed: List[str] = []
    uninstall: List[str] = []
    install: List[str] = []
    build_ops = False
    for component in needed:
        item = found.get(component)
        requirement = line.requirement(component)
        other = sorted({ln for ln in (item.lines() if item else ()) if ln is not line},
                       key=LINES.index)
        if item is None:
            problems.append(f'{component} is not installed')
        elif len(item.dists) > 1:
            problems.append(f'{len(item.dists)} distributions install the one {component} '
                            f'package ({", ".join(d for d, _, _ in item.dists)})')
            uninstall += [d for d, _, _ in item.dists]
        elif other and line not in item.lines():
            mixed.append(f'{other[0].name}\'s {item.describe()}')
            uninstall += [d for d, _, _ in item.dists]
        elif item.version is None:
            problems.append(f'the version of {component} ({item.folder}) cannot be read')
        elif not in_range(item.version, line.requirements[component][1]):
            problems.append(f'{item.describe()} is outside {requirement}')
            # a variant (mmcv-full: the 1.x series) stays beside the new one otherwise
            uninstall += [d for d, _, _ in item.dists if d != line.requirements[component][0]]
        elif (item.dists and item.module_version is not None
              and _version_key(item.module_version) != _version_key(item.dists[0][1])):
            problems.append(f'the {component} package files in {item.folder} are version '
                            f'{item.module_version} but the metadata of {item.dists[0][0]} '
                            f'says {item.dists[0][1]} (another installation over it)')
            uninstall += [item.dists[0][0]]
        elif component == 'mmcv' and 'mmdet' in toolkits and not _has_ops(item):
            problems.append(f'{item.describe()} has no compiled ops (mmcv._ext in '
                            f'{item.folder}), which mmdet\'s RoIAlign / nms need')
            uninstall += [d for d, _, _ in item.dists]
            build_ops = True
        else:
            continue
        install.append(requirement)
    if mixed:
        ours = [found[c].describe() for c in COMPONENTS
                if c in found and found[c].lines() == {line}]
        problems.insert(0, f'a mix of the two lines, which share the import names (one line '
                           f'only): {", ".join(mixed)} with {line.name}\'s {", ".join(ours)}')
    if not problems:
        return line
    found_text = ', '.join(found[c].describe() if c in found else f'{c} not installed'
                           for c in COMPONENTS)
    ranges = ', '.join(line.requirement(c) + (' (with its ops for mmdet)' if c == 'mmcv' else '')
                       for c in COMPONENTS)
    fix = []
    if uninstall:
        fix.append('pip uninstall -y ' + ' '.join(dict.fromkeys(uninstall)))
    fix.append(('MMCV_WITH_OPS=1 pip install --no-cache-dir ' if build_ops else 'pip install ')
               + ' '.join(f'"{r}"' for r in install))
    raise ToolkitVersionError(
        f'inline-mm cannot run with the installed OpenMMLab toolkits: {"; ".join(problems)}. '
        f'Found: {found_text}. The {line.name} line needs {ranges} (mmdet or mmseg is '
        f'enough). Fix: {" && ".join(fix)} (or {SKIP_ENV}=1 to skip this check)')
