#!/usr/bin/env python
"""Write the ``projects/InLine/`` folder of an upstream pull request to mmdet or mmseg.

    python tools/model_zoo/export_project.py --toolkit mmdet OUT_DIR   # OUT_DIR/InLine
    python tools/model_zoo/export_project.py --toolkit mmseg ~/mmsegmentation/projects

The folder follows the toolkits' ``projects/example_project`` layout:

* ``inline/``: the backbone code (inline_mm's ``models``, ``checkpoint``, ``registry``
  and ``errors`` modules, relative imports unchanged), registering into that toolkit
  only; none of inline-mm's training extensions (``inline_mm.engine``), toy datasets
  or version checks: the folder runs without inline-mm installed;
* ``configs/``: the toolkit's configs of this zoo (mmdet: configs/det with the toy
  Mask R-CNN in ``configs/toy/``; mmseg: configs/seg), their ``custom_imports`` naming
  ``projects.InLine.inline``, their bases the toolkit's own files
  (``'../../../configs/...'``), inline-mm's fault-tolerance hooks, loop and dataset
  wrapper replaced by mmengine's / the toolkit's own (``CheckpointHook``,
  ``EpochBasedTrainLoop``, the dataset itself);
* ``metafile.yml`` (the zoo's entries, paths in the project) and ``README.md`` in the
  toolkit's project template (description, usage, results, citation, checklist).

In the toolkit's root: ``python tools/train.py projects/InLine/configs/CONFIG.py``.
"""
import argparse
import ast
import itertools
import os
import os.path as osp
import re
import shutil
import sys
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import _project_readme  # noqa: E402
import _zoo  # noqa: E402

from inline_mm.engine.launch import cli_main  # noqa: E402
from inline_mm.errors import ConfigError  # noqa: E402

#: the project's folder and module, as the configs import it
PROJECT = 'InLine'
MODULE = 'inline'
IMPORT = f'projects.{PROJECT}.{MODULE}'

#: where the backbone code starts: the project holds what this imports, nothing else
ENTRY = 'models/__init__.py'
#: inline_mm's parts that must not come along (training extensions, toy data, version checks)
LEFT_OUT = ('engine', 'datasets', 'stack.py', 'deploy')

#: inline-mm's engine types in configs -> what the toolkits have instead (None: dropped)
ENGINE_TYPES: Dict[str, Optional[str]] = {
    'AtomicCheckpointHook': 'CheckpointHook',
    'ResumableEpochBasedTrainLoop': 'EpochBasedTrainLoop',
    'SkipBadSamples': None,  # the wrapped dataset (its dataset_type) in its place
    'MeanLossLoggerHook': None, 'RNGStateHook': None, 'PreemptionHook': None,
    'NonFiniteLossHook': None,
    'CPUAutocastOptimWrapper': 'OptimWrapper',  # fp32 where the toolkit has no CPU autocast
}
#: the arguments of our engine types that the toolkits' types in their place do not take
#: (SkipBadSamples: all but the wrapped dataset's own)
ENGINE_ARGS: Dict[str, Tuple[str, ...]] = {
    'SkipBadSamples': ('dataset_type', 'max_bad_fraction', 'max_bad'),
    'CPUAutocastOptimWrapper': ('dtype', 'parts', 'only_with_bf16_units'),
}

TOOLKITS = {
    'mmdet': dict(configs=('configs/det', 'configs/det/toy'), name='MMDetection',
                  repo='open-mmlab/mmdetection'),
    'mmseg': dict(configs=('configs/seg',), name='MMSegmentation',
                  repo='open-mmlab/mmsegmentation'),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out_dir', metavar='OUT_DIR',
                        help=f'the toolkit\'s projects/ folder (or any folder): {PROJECT}/ '
                        'is written into it')
    parser.add_argument('--toolkit', choices=sorted(TOOLKITS), required=True)
    parser.add_argument('--overwrite', action='store_true',
                        help=f'replace an existing OUT_DIR/{PROJECT}')
    return parser.parse_args(argv)


# ------------------------------------------------------------------ code
def _rewrite_code(text: str, toolkit: str, name: str) -> str:
    """A module of inline_mm as the project's: docstring names, one toolkit's registry."""
    text = re.sub(r'\binline_mm\b(?!_)', IMPORT, text)
    if name == 'registry.py':
        old = "TOOLKITS: Tuple[str, ...] = ('mmdet', 'mmseg')"
        if old not in text:
            raise RuntimeError(f'inline_mm/registry.py no longer has {old!r}: update '
                               f'tools/model_zoo/export_project.py')
        text = text.replace(old, f"TOOLKITS: Tuple[str, ...] = ('{toolkit}',)")
    return text


PACKAGE_INIT = '''"""InLine (injective linear attention) backbones, from inline-mm.

Importing this module registers InLinePVT, InLineSwin, InLineCSWin and InLineDeiT in
{toolkit}'s model registry (configs: ``custom_imports = dict(imports=['{module}'])``).
"""
from .models import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin
from .models.pretrained import load_pretrained

__all__ = ['InLinePVT', 'InLineSwin', 'InLineCSWin', 'InLineDeiT', 'load_pretrained']
'''


def _module_file(source: str, parts: List[str]) -> Optional[str]:
    """inline_mm/<parts>.py or inline_mm/<parts>/__init__.py, relative to ``source``."""
    base = osp.join(*parts) if parts else ''
    for rel in (base + '.py', osp.join(base, '__init__.py')):
        if rel != '.py' and osp.isfile(osp.join(source, rel)):
            return osp.normpath(rel)
    return None


def code_files(source: str) -> List[str]:
    """The files of ``source`` (inline_mm/) the backbones import, from :data:`ENTRY` on.

    Follows every relative and ``inline_mm.`` import (function-level ones too), so the
    project holds exactly the modules the models need, whatever files they live in.
    """
    todo, found = [ENTRY], set()
    while todo:
        rel = todo.pop()
        if rel in found:
            continue
        found.add(rel)
        package = osp.dirname(rel).split(os.sep) if osp.dirname(rel) else []
        with open(osp.join(source, rel)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.level:
                up = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                mod = up + (node.module.split('.') if node.module else [])
                targets += [mod] + [mod + [a.name] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith('inline_mm'):
                mod = node.module.split('.')[1:]
                targets += [mod] + [mod + [a.name] for a in node.names]
            elif isinstance(node, ast.Import):
                targets += [a.name.split('.')[1:] for a in node.names
                            if a.name.startswith('inline_mm.')]
            for parts in targets:
                # a package's own __init__ on the way, then the module itself
                for depth in range(1, len(parts) + 1):
                    init = _module_file(source, parts[:depth])
                    if init and (depth == len(parts) or init.endswith('__init__.py')):
                        todo.append(init)
    files = sorted(found)
    bad = [f for f in files if f.split(os.sep)[0] in LEFT_OUT]
    if bad:
        raise RuntimeError(f'the backbone code imports {bad}, which the project leaves out: '
                           f'update tools/model_zoo/export_project.py')
    return files


def write_code(out: str, toolkit: str) -> List[str]:
    """Copy the backbone code into ``out/inline``; returns the files written."""
    source = osp.join(_zoo.ROOT, 'inline_mm')
    written = []
    for rel in code_files(source):
        with open(osp.join(source, rel)) as f:
            text = _rewrite_code(f.read(), toolkit, osp.basename(rel))
        target = osp.join(out, MODULE, rel)
        os.makedirs(osp.dirname(target), exist_ok=True)
        with open(target, 'w') as f:
            f.write(text)
        written.append(target)
    with open(osp.join(out, MODULE, '__init__.py'), 'w') as f:
        f.write(PACKAGE_INIT.format(toolkit=toolkit, module=IMPORT))
    return written + [osp.join(out, MODULE, '__init__.py')]


# ------------------------------------------------------------------ configs
class _Edits:
    """Byte-range edits of a source text, applied back to front."""

    def __init__(self, text: str):
        self.data = text.encode('utf-8')
        self.starts = [0]
        for line in self.data.split(b'\n'):
            self.starts.append(self.starts[-1] + len(line) + 1)
        self.edits: List[Tuple[int, int, str]] = []

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> Tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset),
                self.offset(node.end_lineno, node.end_col_offset))

    def replace(self, start: int, end: int, text: str) -> None:
        self.edits.append((start, end, text))

    def drop_statement(self, node: ast.stmt) -> None:
        """Remove a statement's lines and the comment lines right above it."""
        first = node.lineno
        lines = self.data.split(b'\n')
        while first > 1 and lines[first - 2].lstrip().startswith(b'#'):
            first -= 1
        self.replace(self.starts[first - 1], self.starts[node.end_lineno], '')

    def result(self) -> str:
        data = self.data
        for start, end, text in sorted(self.edits, reverse=True):
            data = data[:start] + text.encode('utf-8') + data[end:]
        return data.decode('utf-8')


def _type_of(call: ast.AST) -> Optional[str]:
    if isinstance(call, ast.Call) and getattr(call.func, 'id', None) == 'dict':
        for kw in call.keywords:
            if kw.arg == 'type' and isinstance(kw.value, ast.Constant):
                return kw.value.value
    return None


def _vacuous(node: ast.AST) -> bool:
    """A ``dict(...)`` that only names inline-mm engine types (nothing left once replaced)."""
    if not (isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'dict'):
        return False
    engine = _type_of(node) in ENGINE_TYPES
    for kw in node.keywords:
        if kw.arg == 'type' and engine:
            continue
        if kw.arg in ENGINE_ARGS.get(_type_of(node), ()):
            continue
        if not _vacuous(kw.value):
            return False
    return bool(node.keywords)


def _edit_calls(node: ast.AST, edits: _Edits) -> None:
    """Replace the engine types of every ``dict(type=...)`` under ``node``."""
    for call in ast.walk(node):
        kind = _type_of(call)
        if kind not in ENGINE_TYPES:
            continue
        type_kw = next(kw for kw in call.keywords if kw.arg == 'type')
        if kind == 'SkipBadSamples':
            inner = next((kw for kw in call.keywords if kw.arg == 'dataset_type'), None)
            if inner is None:
                raise ConfigError('a SkipBadSamples without dataset_type cannot be exported')
            edits.replace(*edits.span(type_kw.value), ast.unparse(inner.value))
        elif ENGINE_TYPES[kind] is not None:
            edits.replace(*edits.span(type_kw.value), repr(ENGINE_TYPES[kind]))
        _drop_keywords(call, ENGINE_ARGS.get(kind, ()), edits)


def _drop_keywords(call: ast.Call, names: Tuple[str, ...], edits: _Edits) -> None:
    """Remove the keywords ``names`` of ``call``: each up to the keyword after it, and
    the ones after the last kept keyword from that keyword's end (no stray comma)."""
    keywords = call.keywords
    kept = [i for i, kw in enumerate(keywords) if kw.arg not in names]
    last_kept = kept[-1] if kept else None
    for i, kw in enumerate(keywords):
        if kw.arg not in names:
            continue
        if last_kept is not None and i > last_kept:  # the trailing run, removed once
            if i == last_kept + 1:
                prev, last = keywords[last_kept], keywords[-1]
                edits.replace(edits.offset(prev.end_lineno, prev.end_col_offset),
                              edits.offset(last.end_lineno, last.end_col_offset), '')
            continue
        nxt = keywords[i + 1] if i + 1 < len(keywords) else None
        end = (nxt.lineno, nxt.col_offset) if nxt else (kw.end_lineno, kw.end_col_offset)
        edits.replace(edits.offset(kw.lineno, kw.col_offset), edits.offset(*end), '')


def _base_path(value: str, depth: int) -> Optional[str]:
    """A base of ours as the project's: the toolkit's own file, relative; ours dropped."""
    if 'inline_mm_runtime' in value:
        return None
    if '::' in value:
        return '../' * depth + 'configs/' + value.split('::', 1)[1]
    return value


def export_config(text: str, depth: int) -> str:
    """One of our config files as the project's (see the module docstring).

    ``depth``: folders between the toolkit's root and the exported file (3 for
    ``projects/InLine/configs/x.py``).
    """
    tree = ast.parse(text)
    edits = _Edits(text)
    for node in tree.body:
        names = [getattr(t, 'id', None) for t in getattr(node, 'targets', [])]
        if names == ['_base_']:
            values = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            bases = [b for b in (_base_path(v.value, depth) for v in values) if b]
            new = repr(bases) if isinstance(node.value, ast.List) else repr(bases[0])
            edits.replace(*edits.span(node.value), new)
        elif names == ['custom_imports']:
            edits.replace(*edits.span(node),
                          f"custom_imports = dict(imports=['{IMPORT}'], "
                          f'allow_failed_imports=False)')
        elif names == ['custom_hooks'] and isinstance(node.value, ast.List):
            kept = [e for e in node.value.elts if _type_of(e) not in ENGINE_TYPES]
            if not kept:
                edits.drop_statement(node)
            elif len(kept) < len(node.value.elts):
                edits.replace(*edits.span(node.value),
                              '[' + ', '.join(ast.unparse(e) for e in kept) + ']')
        elif isinstance(node, ast.Assign) and _vacuous(node.value):
            edits.drop_statement(node)
        else:
            _edit_calls(node, edits)
    out = edits.result()
    for folder in ('configs/det', 'configs/seg'):  # our READMEs -> the project's
        out = out.replace(f'{folder}/README.md', f'projects/{PROJECT}/README.md')
    # comments that describe inline-mm's training extensions go with them: each run of
    # comment lines that names one goes whole (no half-sentences left behind)
    words = ('inline_mm', 'docs/', *ENGINE_TYPES)
    kept: List[str] = []
    for is_comment, run in itertools.groupby(
            out.split('\n'), key=lambda line: line.lstrip().startswith('#')):
        run = list(run)
        if not (is_comment and any(w in line for line in run for w in words)):
            kept.extend(run)
    out = '\n'.join(kept)
    compile(out, '<exported config>', 'exec')
    left = [w for w in ('inline_mm', *ENGINE_TYPES) if w in out]
    if left:
        raise RuntimeError(f'the exported config still names {left}: update export_project.py')
    return out


def write_configs(out: str, toolkit: str) -> List[str]:
    written = []
    for folder in TOOLKITS[toolkit]['configs']:
        sub = osp.relpath(folder, TOOLKITS[toolkit]['configs'][0])
        for path in sorted(os.listdir(osp.join(_zoo.ROOT, folder))):
            if not path.endswith('.py'):
                continue
            rel = osp.normpath(osp.join('configs', sub, path))
            depth = 2 + rel.count('/')  # projects/InLine/ + the folders of rel
            with open(osp.join(_zoo.ROOT, folder, path)) as f:
                text = export_config(f.read(), depth)
            target = osp.join(out, rel)
            os.makedirs(osp.dirname(target), exist_ok=True)
            with open(target, 'w') as f:
                f.write(text)
            written.append(target)
    return written


# ------------------------------------------------------------------ metafile, README
def main(argv=None) -> None:
    args = parse_args(argv)
    out = osp.join(args.out_dir, PROJECT)
    if osp.exists(out) and not args.overwrite:
        raise ConfigError(f'{out} exists: pass --overwrite to replace it, or another OUT_DIR')
    # written beside the target and moved into place: a failed export leaves no half folder
    tmp = osp.join(args.out_dir, f'.{PROJECT}.export.tmp')
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        code = write_code(tmp, args.toolkit)
        configs = write_configs(tmp, args.toolkit)
        _, meta = _project_readme.write_metafile(tmp, TOOLKITS[args.toolkit]['configs'][0],
                                                 PROJECT)
        with open(osp.join(tmp, 'README.md'), 'w') as f:
            f.write(_project_readme.readme_text(args.toolkit, TOOLKITS[args.toolkit]['name'],
                                                meta, PROJECT, IMPORT))
        if osp.exists(out):
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f'wrote {out}: {len(code)} code files ({IMPORT}), {len(configs)} configs, '
          f'metafile.yml, README.md\nin the toolkit\'s root: python tools/train.py '
          f'projects/{PROJECT}/configs/{osp.basename(configs[0])}')


if __name__ == '__main__':
    sys.exit(cli_main(main))
