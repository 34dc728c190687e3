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

The module is also the checker's library: :func:`collect_references` parses the
sources with :mod:`ast` (standard library only at import time).

Inventory format: a line ``[dotted.name]`` opens the section of an object whose
members are all listed; each following line is one member name, optionally followed
by `` (p1,p2,**)`` -- its parameter names (``**`` when it takes any keyword).
"""
import argparse
import ast
import inspect
import io
import os
import os.path as osp
import pkgutil
import sys
import tokenize
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

#: the packages whose floors setup.cfg declares and the check covers
PACKAGES = ('torch', 'mmengine', 'timm', 'mmcv')

#: the inline comment that allows the names of its line (behind a version guard)
GUARD_COMMENT = 'api-floor: guarded'

#: exceptions whose ``try`` bodies count as version guards
GUARD_EXCEPTIONS = {'ImportError', 'ModuleNotFoundError', 'AttributeError'}

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: the code checked: the package and the tools
SOURCE_DIRS = ('inline_mm', 'tools')
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
class Reference:
    """One use of a dotted name of a checked package in the source."""
    path: str
    lineno: int
    name: str
    #: keyword argument names when the name is called
    keywords: Tuple[str, ...] = ()
    #: behind a version guard (the comment, ``try/except AttributeError``, ``hasattr``)
    guarded: bool = False


# ----------------------------------------------------------------- the source side
def _chain(node: ast.AST) -> Optional[List[str]]:
    """``a.b.c`` as ``['a', 'b', 'c']``; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _guarded_lines(source: str) -> Set[int]:
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and GUARD_COMMENT in tok.string:
            lines.add(tok.start[0])
    return lines


class _Collector(ast.NodeVisitor):
    """Resolves import aliases and attribute chains of one module to dotted names."""

    def __init__(self, path: str, source: str, packages: Sequence[str]):
        self.path = path
        self.packages = tuple(packages)
        self.comment_lines = _guarded_lines(source)
        self.aliases: Dict[str, str] = {}
        self.refs: List[Reference] = []
        self.call_keywords: Dict[int, Tuple[str, ...]] = {}
        #: dotted names a surrounding ``hasattr`` test vouches for; '*' = try/except guard
        self.guards: List[Set[str]] = []
        self.inner: Set[int] = set()  # attributes that are part of a longer chain

    # -- bookkeeping
    def _checked(self, dotted: str) -> bool:
        return dotted.split('.', 1)[0] in self.packages

    def _is_guarded(self, node: ast.AST, dotted: str) -> bool:
        lines = {node.lineno, getattr(node, 'end_lineno', node.lineno)}
        if lines & self.comment_lines:
            return True
        for guard in self.guards:
            if '*' in guard or any(dotted == g or dotted.startswith(g + '.') for g in guard):
                return True
        return False

    def _add(self, node: ast.AST, dotted: str, keywords: Tuple[str, ...] = ()) -> None:
        if self._checked(dotted):
            self.refs.append(Reference(self.path, node.lineno, dotted, keywords,
                                       self._is_guarded(node, dotted)))

    def resolve(self, node: ast.AST) -> Optional[str]:
        """The dotted name ``node`` stands for, through the module's import aliases."""
        parts = _chain(node)
        if parts is None or parts[0] not in self.aliases:
            return None
        return '.'.join([self.aliases[parts[0]]] + parts[1:])

    def _hasattr_guards(self, test: ast.AST) -> Set[str]:
        """``X.attr`` for each ``hasattr(X, 'attr')`` in ``test`` (not under ``not``)."""
        found = set()
        for node in ast.walk(test):
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                return set()
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == 'hasattr' and len(node.args) == 2
                    and isinstance(node.args[1], ast.Constant)
                    and isinstance(node.args[1].value, str)):
                base = self.resolve(node.args[0])
                if base:
                    found.add(f'{base}.{node.args[1].value}')
        return found

    def _visit_guarded(self, nodes: Iterable[ast.AST], guard: Set[str]) -> None:
        self.guards.append(guard)
        for node in nodes:
            self.visit(node)
        self.guards.pop()

    def visit(self, node: ast.AST) -> None:
        # the comment on a statement's first line guards the whole statement (an `if`
        # line: its body too)
        guarded = isinstance(node, ast.stmt) and node.lineno in self.comment_lines
        if guarded:
            self.guards.append({'*'})
        super().visit(node)
        if guarded:
            self.guards.pop()

    # -- imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                root = alias.name.split('.', 1)[0]
                self.aliases[root] = root
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return  # relative: our own package
        for alias in node.names:
            if alias.name == '*':
                continue
            dotted = f'{node.module}.{alias.name}'
            self.aliases[alias.asname or alias.name] = dotted
            self._add(node, dotted)

    # -- guards
    def visit_Try(self, node: ast.Try) -> None:
        caught = set()
        for handler in node.handlers:
            types = handler.type
            elts = types.elts if isinstance(types, ast.Tuple) else [types]
            caught |= {e.id for e in elts if isinstance(e, ast.Name)}
        guard = {'*'} if caught & GUARD_EXCEPTIONS else set()
        self._visit_guarded(node.body, guard)
        for part in (node.handlers, node.orelse, node.finalbody):
            for child in part:
                self.visit(child)

    visit_TryStar = visit_Try

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        self._visit_guarded(node.body, self._hasattr_guards(node.test))
        for child in node.orelse:
            self.visit(child)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.visit(node.test)
        self._visit_guarded([node.body], self._hasattr_guards(node.test))
        self.visit(node.orelse)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        if not isinstance(node.op, ast.And):
            return self.generic_visit(node)
        guard: Set[str] = set()
        for value in node.values:  # `hasattr(x, 'a') and x.a()`
            self._visit_guarded([value], set(guard))
            guard |= self._hasattr_guards(value)

    # -- uses
    def visit_Call(self, node: ast.Call) -> None:
        keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
        if keywords:
            self.call_keywords[id(node.func)] = keywords
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if id(node) not in self.inner:
            dotted = self.resolve(node)
            if dotted:
                self._add(node, dotted, self.call_keywords.get(id(node), ()))
        if isinstance(node.value, ast.Attribute):
            self.inner.add(id(node.value))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        keywords = self.call_keywords.get(id(node))
        if keywords and node.id in self.aliases:  # `from torch import load; load(x, k=...)`
            self._add(node, self.aliases[node.id], keywords)


def collect_references(paths: Iterable[str], packages: Sequence[str] = PACKAGES,
                       root: str = REPO_ROOT, skip_unparsable: bool = False) -> List[Reference]:
    """Every use of a name of ``packages`` in the Python files ``paths``.

    Resolves ``import a.b``, ``import a.b as x``, ``from a.b import c [as x]`` and the
    attribute chains on those names (``x.c.d``); records the keyword names of calls.
    A ``try`` body whose handlers catch ImportError / AttributeError, the body of an
    ``if`` / conditional expression testing ``hasattr(X, 'a')`` (for ``X.a...``), the
    operands after such a test in an ``and``, any line with the comment
    ``# api-floor: guarded`` and the whole statement that begins on such a line (an
    ``if`` and its body) mark their references as guarded.  A file that does not
    parse raises SyntaxError, or is left out with a warning if ``skip_unparsable``.
    """
    refs = []
    for path in paths:
        with open(path, encoding='utf-8') as f:
            source = f.read()
        try:
            tree = ast.parse(source, filename=path)
        except SyntaxError as err:
            if not skip_unparsable:
                raise
            print(f'warning: {path} left out: {err}', file=sys.stderr)
            continue
        collector = _Collector(osp.relpath(path, root), source, packages)
        collector.visit(tree)
        refs += collector.refs
    return refs


def source_files(root: str = REPO_ROOT, dirs: Sequence[str] = SOURCE_DIRS) -> List[str]:
    """The ``.py`` files under ``dirs`` of ``root``, sorted."""
    files = []
    for d in dirs:
        for folder, _, names in os.walk(osp.join(root, d)):
            files += [osp.join(folder, n) for n in names if n.endswith('.py')]
    return sorted(files)


# ----------------------------------------------------------------- the inventory side
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

