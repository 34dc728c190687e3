"""The checker's library: every use of torch / mmengine / timm / mmcv names in the code.

:func:`collect_references` parses the sources of ``inline_mm/`` and ``tools/`` with
:mod:`ast` (standard library only) and returns each dotted name they use, with the
keyword names of calls and whether a version guard protects it.
``scripts/dump_api_inventory.py`` lists those names in the oldest stack and
``tests/test_api_floors.py`` checks them against its inventory.
"""
import ast
import io
import os
import os.path as osp
import sys
import tokenize
from dataclasses import dataclass
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
