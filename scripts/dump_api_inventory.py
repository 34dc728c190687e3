"""The API inventory of the oldest supported stack, and the references it is checked against.

Run inside the environment of the oldest stack (``make test-compat`` builds it)::

    .venv-compat/bin/python scripts/dump_api_inventory.py

It writes ``tests/data/api_floors/<package>-<version>.txt`` for torch, mmengine, timm
and mmcv: the dotted names that exist in that version along every API chain the code
of ``inline_mm/`` and ``tools/`` references (the modules on the way listed whole, with
their submodules; classes and other objects on the way listed one level down), and the
parameter names of the callables found there.  ``tests/test_api_floors.py`` reads
those files on the current stack (no old torch needed) and fails on every name the
code uses that the oldest stack lacks.  Rerun this script when the test says the
inventory does not cover a new reference.

The references come from :mod:`api_references` (beside this file); the check itself
is :func:`find_violations`.

Inventory format: a line ``[dotted.name]`` opens the section of an object whose
members are all listed; each following line is one member name, optionally followed
by `` (p1,p2,**)`` -- its parameter names (``**`` when it takes any keyword).
"""
import argparse
import inspect
import os
import os.path as osp
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))  # api_references: a sibling script
from api_references import (GUARD_COMMENT, PACKAGES, REPO_ROOT, Reference,  # noqa: E402,F401
                            collect_references, source_files)

INVENTORY_DIR = osp.join(REPO_ROOT, 'tests', 'data', 'api_floors')

#: objects listed whole whatever the code references today, so that new uses of the
#: common namespaces are checked without a new dump
SEEDS = ('torch', 'torch.nn', 'torch.nn.functional', 'torch.Tensor', 'torch.distributed',
         'torch.utils', 'torch.utils.data', 'torch.nn.init', 'torch.nn.utils', 'torch.onnx',
         'torch.cpu', 'torch.cuda', 'torch.backends', 'torch.compiler', 'torch.jit',
         'torch.serialization', 'torch.nn.Module', 'mmengine', 'mmengine.dist',
         'mmengine.runner', 'mmengine.hooks', 'mmengine.model', 'mmengine.optim',
         'mmengine.registry', 'mmengine.config', 'mmengine.logging', 'mmengine.utils',
         'mmengine.fileio', 'timm', 'timm.layers', 'mmcv', 'mmcv.ops', 'mmcv.cnn',
         'mmcv.transforms')


@dataclass
class Inventory:
    """The names of one package version: sections (objects listed whole) and members."""
    package: str
    version: str
    sections: Dict[str, Set[str]] = field(default_factory=dict)
    #: parameter names of callables by dotted name; '**' among them: any keyword
    params: Dict[str, Tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str) -> 'Inventory':
        """Read a file written by :meth:`dump`."""
        with open(path, encoding='utf-8') as f:
            lines = f.read().splitlines()
        package, version = lines[0].lstrip('# ').split()[:2]
        inv = cls(package, version)
        members: Set[str] = set()
        section = ''
        for line in lines[1:]:
            if not line or line.startswith('#'):
                continue
            if line.startswith('['):
                section = line[1:-1]
                members = inv.sections.setdefault(section, set())
                continue
            name, _, sig = line.partition(' ')
            members.add(name)
            if sig:
                inv.params[f'{section}.{name}'] = tuple(sig[1:-1].split(',')) if sig != '()' \
                    else ()
        return inv

    def dump(self, path: str, header: str = '') -> None:
        """Write the inventory (sorted, so that a rerun on the same stack changes nothing)."""
        out = [f'# {self.package} {self.version}' + (f' {header}' if header else '')]
        for section in sorted(self.sections):
            out.append(f'[{section}]')
            for name in sorted(self.sections[section]):
                sig = self.params.get(f'{section}.{name}')
                out.append(name if sig is None else f"{name} ({','.join(sig)})")
        with open(path, 'w', encoding='utf-8') as f:
            f.write('\n'.join(out) + '\n')

    def check(self, dotted: str, keywords: Sequence[str] = ()) -> Tuple[str, Optional[str]]:
        """``('ok', None)``, ``('absent', first missing name)``, ``('keyword', name)``
        for a keyword the callable does not take, or ``('stale', covered prefix)`` when
        the inventory does not list the object the chain goes through."""
        parts = dotted.split('.')
        prefix = parts[0]
        if prefix not in self.sections:
            return 'stale', prefix
        for part in parts[1:]:
            if part.startswith('__') and part.endswith('__'):
                return 'ok', None  # Python's protocol, not the package's API
            if prefix not in self.sections:
                return 'stale', prefix
            if part not in self.sections[prefix]:
                return 'absent', f'{prefix}.{part}'
            prefix = f'{prefix}.{part}'
        sig = self.params.get(dotted)
        if sig is not None and '**' not in sig:
            for kw in keywords:
                if kw not in sig:
                    return 'keyword', kw
        return 'ok', None


def load_inventories(folder: str = INVENTORY_DIR) -> Dict[str, Inventory]:
    """The inventories in ``folder`` by package name."""
    invs = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith('.txt'):
            inv = Inventory.load(osp.join(folder, name))
            invs[inv.package] = inv
    return invs


def find_violations(refs: Iterable[Reference], inventories: Dict[str, Inventory]) -> List[str]:
    """One line per unguarded reference the inventories do not vouch for."""
    problems = []
    for ref in refs:
        inv = inventories.get(ref.name.split('.', 1)[0])
        if inv is None or ref.guarded:
            continue
        status, what = inv.check(ref.name, ref.keywords)
        where = f'{ref.path}:{ref.lineno}'
        if status == 'absent':
            problems.append(f'{where}: {what} is not in {inv.package} {inv.version} '
                            f'(guard it and mark the line `# {GUARD_COMMENT}`)')
        elif status == 'keyword':
            problems.append(f'{where}: {ref.name}() takes no keyword {what!r} in '
                            f'{inv.package} {inv.version}')
        elif status == 'stale':
            problems.append(f'{where}: {ref.name}: the {inv.package} {inv.version} inventory '
                            f'does not list {what}; rerun `.venv-compat/bin/python '
                            f'scripts/dump_api_inventory.py` (make test-compat builds it)')
    return problems


# ----------------------------------------------------------------- dumping (old stack)
def _doc_params(obj) -> Optional[Tuple[str, ...]]:
    """The parameter names of a builtin from its docstring's first line,
    ``name(a, b=1, *, c=None) -> Tensor`` (torch's C functions have no other signature)."""
    name = getattr(obj, '__name__', None)
    doc = (getattr(obj, '__doc__', None) or '').lstrip()
    if not name or not doc.startswith(f'{name}('):
        return None
    depth, end = 0, None
    for i, ch in enumerate(doc):
        depth += {'(': 1, '[': 1, ')': -1, ']': -1}.get(ch, 0)
        if depth == 0 and ch == ')':
            end = i
            break
    if end is None:
        return None
    names = []
    for item in _split_top(doc[len(name) + 1:end]):
        item = item.split('=', 1)[0].split(':', 1)[0].strip()
        if item.startswith('**'):
            names.append('**')
        elif item and not item.startswith('*') and item.isidentifier():
            names.append(item)
        elif item and not item.startswith('*'):
            return None  # not a plain parameter list: give no signature rather than a wrong one
    return tuple(names)


def _split_top(text: str) -> List[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {'(': 1, '[': 1, '{': 1, ')': -1, ']': -1, '}': -1}.get(ch, 0)
        if ch == ',' and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _params(obj) -> Optional[Tuple[str, ...]]:
    if not callable(obj):
        return None
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return _doc_params(obj) if inspect.isbuiltin(obj) else None
    names = []
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            names.append('**')
        elif p.kind is not p.VAR_POSITIONAL:
            names.append(p.name)
    return tuple(names)


def _members(obj) -> Set[str]:
    """The attribute names of ``obj``; for a package also its submodules (not imported)."""
    names = set(dir(obj))
    if inspect.ismodule(obj):
        names = {n for n in names if not n.startswith('__') or n == '__version__'}
        for info in pkgutil.iter_modules(getattr(obj, '__path__', None) or []):
            names.add(info.name)
    else:
        names = {n for n in names if not (n.startswith('__') and n.endswith('__'))}
    return names


def _child(obj, dotted: str, part: str):
    try:
        return getattr(obj, part)
    except Exception:  # noqa: BLE001 (lazy attributes may raise anything)
        pass
    if inspect.ismodule(obj):
        import importlib
        try:
            return importlib.import_module(f'{dotted}.{part}')
        except Exception:  # noqa: BLE001
            return None
    return None


def build_inventory(package: str, chains: Iterable[str]) -> Inventory:
    """Walk every chain in the installed ``package``, listing each object on the way."""
    import importlib
    root = importlib.import_module(package)
    inv = Inventory(package, str(getattr(root, '__version__', 'unknown')).split('+')[0])

    def expand(obj, dotted: str) -> None:
        if dotted in inv.sections:
            return
        members = _members(obj)
        inv.sections[dotted] = members
        for name in members:
            try:
                child = inspect.getattr_static(obj, name)
            except AttributeError:
                continue
            if isinstance(child, (staticmethod, classmethod)):
                child = getattr(obj, name, None)
            if inspect.isfunction(child) or inspect.isclass(child) or \
                    inspect.isbuiltin(child) or inspect.ismethod(child):
                sig = _params(child)
                if sig is not None:
                    inv.params[f'{dotted}.{name}'] = sig

    for chain in sorted(set(chains)):
        parts = chain.split('.')
        if parts[0] != package:
            continue
        obj, dotted = root, package
        for part in parts[1:]:
            expand(obj, dotted)
            if part.startswith('__'):
                break
            obj = _child(obj, dotted, part)
            dotted = f'{dotted}.{part}'
            if obj is None:
                break
        else:
            if inspect.ismodule(obj) or inspect.isclass(obj):
                expand(obj, dotted)
    return inv


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default=INVENTORY_DIR, help='folder of the inventory files')
    parser.add_argument('--packages', nargs='+', default=list(PACKAGES))
    args = parser.parse_args(argv)
    chains = [r.name for r in collect_references(source_files(), args.packages,
                                                 skip_unparsable=True)]
    chains += list(SEEDS)
    os.makedirs(args.out, exist_ok=True)
    import torch
    for package in args.packages:
        inv = build_inventory(package, chains)
        for old in os.listdir(args.out):
            if old.startswith(f'{package}-') and old.endswith('.txt'):
                os.remove(osp.join(args.out, old))
        path = osp.join(args.out, f'{package}-{inv.version}.txt')
        inv.dump(path, header=f'(scripts/dump_api_inventory.py, Python '
                 f'{sys.version_info.major}.{sys.version_info.minor}, torch {torch.__version__})')
        print(f'{path}: {len(inv.sections)} objects, '
              f'{sum(map(len, inv.sections.values()))} names, {len(inv.params)} signatures')
    return 0


if __name__ == '__main__':
    sys.exit(main())

