#!/usr/bin/env python
"""Write the ``projects/InLine/`` folder of an upstream pull request to mmdet or mmseg.

    python tools/model_zoo/export_project.py --toolkit mmdet OUT_DIR   # OUT_DIR/InLine
    python tools/model_zoo/export_project.py --toolkit mmseg ~/mmsegmentation/projects

The toolkits have only a template (``projects/example_project``); this fills it from the
zoo: ``inline/`` (the modules the backbones import, registering into that toolkit only, so
the folder runs without inline-mm), ``configs/`` (inline-mm's engine types replaced by the
toolkit's, bases the toolkit's own files), ``metafile.yml`` and ``README.md``.
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

import yaml

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
    'mmdet': dict(configs=('configs/det', 'configs/det/toy'), name='MMDetection'),
    'mmseg': dict(configs=('configs/seg',), name='MMSegmentation'),
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


def code_files(source: str) -> List[str]:
    """The files of ``source`` (inline_mm/) the backbones import, from :data:`ENTRY` on.

    Follows every relative and ``inline_mm.`` import (function-level ones too), so the
    project holds exactly the modules the models need, whatever files they live in.
    """
    def module_file(parts: List[str]) -> Optional[str]:
        base = osp.join(*parts)
        return next((osp.normpath(rel) for rel in (base + '.py', osp.join(base, '__init__.py'))
                     if osp.isfile(osp.join(source, rel))), None)

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
            if isinstance(node, ast.Import):
                targets = [a.name.split('.')[1:] for a in node.names
                           if a.name.startswith('inline_mm.')]
            elif isinstance(node, ast.ImportFrom) and (
                    node.level or (node.module or '').startswith('inline_mm')):
                names = node.module.split('.') if node.module else []
                mod = package[:len(package) + 1 - node.level] + names if node.level else names[1:]
                targets = [mod] + [mod + [a.name] for a in node.names]
            else:
                continue
            for parts in targets:
                # a package's own __init__ on the way, then the module itself
                for depth in range(1, len(parts) + 1):
                    init = module_file(parts[:depth])
                    if init and (depth == len(parts) or init.endswith('__init__.py')):
                        todo.append(init)
    files = sorted(found)
    bad = [f for f in files if f.split(os.sep)[0] in LEFT_OUT]
    if bad:
        raise RuntimeError(f'the backbone code imports {bad}, which the project leaves out: '
                           f'update tools/model_zoo/export_project.py')
    return files


def _write(path: str, text: str) -> str:
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)
    return path


def write_code(out: str, toolkit: str) -> List[str]:
    """Copy the backbone code into ``out/inline``; returns the files written."""
    source = osp.join(_zoo.ROOT, 'inline_mm')
    written = []
    for rel in code_files(source):
        with open(osp.join(source, rel)) as f:
            text = _rewrite_code(f.read(), toolkit, osp.basename(rel))
        written.append(_write(osp.join(out, MODULE, rel), text))
    return written + [_write(osp.join(out, MODULE, '__init__.py'),
                             PACKAGE_INIT.format(toolkit=toolkit, module=IMPORT))]


# ------------------------------------------------------------------ configs
class _Edits:
    """Byte-range edits of a source text (ast's columns count UTF-8 bytes), applied back to
    front."""

    def __init__(self, text: str):
        self.data = text.encode('utf-8')
        self.lines = self.data.split(b'\n')
        self.starts = list(itertools.accumulate((len(ln) + 1 for ln in self.lines), initial=0))
        self.edits: List[Tuple[int, int, str]] = []

    def start(self, node: ast.AST) -> int:
        return self.starts[node.lineno - 1] + node.col_offset

    def end(self, node: ast.AST) -> int:
        return self.starts[node.end_lineno - 1] + node.end_col_offset

    def replace(self, node: ast.AST, text: str) -> None:
        self.edits.append((self.start(node), self.end(node), text))

    def drop_statement(self, node: ast.stmt) -> None:
        """Remove a statement's lines and the comment lines right above it."""
        first = node.lineno
        while first > 1 and self.lines[first - 2].lstrip().startswith(b'#'):
            first -= 1
        self.edits.append((self.starts[first - 1], self.starts[node.end_lineno], ''))

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
    kind = _type_of(node)
    dropped = ENGINE_ARGS.get(kind, ()) + (('type',) if kind in ENGINE_TYPES else ())
    return bool(node.keywords) and all(kw.arg in dropped or _vacuous(kw.value)
                                       for kw in node.keywords)


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
            edits.replace(type_kw.value, ast.unparse(inner.value))
        elif ENGINE_TYPES[kind] is not None:
            edits.replace(type_kw.value, repr(ENGINE_TYPES[kind]))
        _drop_keywords(call, ENGINE_ARGS.get(kind, ()), edits)


def _drop_keywords(call: ast.Call, names: Tuple[str, ...], edits: _Edits) -> None:
    """Remove the keywords ``names`` of ``call``: each up to the keyword after it, and
    the ones after the last kept keyword from that keyword's end (no stray comma)."""
    kws = call.keywords
    last = max((i for i, kw in enumerate(kws) if kw.arg not in names), default=-1)
    edits.edits += [(edits.start(kw), edits.start(kws[i + 1]), '')
                    for i, kw in enumerate(kws[:max(last, 0)]) if kw.arg in names]
    if last < len(kws) - 1:
        edits.edits.append((edits.end(kws[last]) if last >= 0 else edits.start(kws[0]),
                            edits.end(kws[-1]), ''))


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
            edits.replace(node.value,
                          repr(bases if isinstance(node.value, ast.List) else bases[0]))
        elif names == ['custom_imports']:
            edits.replace(node, f"custom_imports = dict(imports=['{IMPORT}'], "
                          f'allow_failed_imports=False)')
        elif names == ['custom_hooks'] and isinstance(node.value, ast.List):
            kept = [e for e in node.value.elts if _type_of(e) not in ENGINE_TYPES]
            if not kept:
                edits.drop_statement(node)
            elif len(kept) < len(node.value.elts):
                edits.replace(node.value, '[' + ', '.join(ast.unparse(e) for e in kept) + ']')
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
            if path.endswith('.py'):
                rel = osp.normpath(osp.join('configs', sub, path))
                with open(osp.join(_zoo.ROOT, folder, path)) as f:
                    # depth: projects/InLine/ + the folders of rel
                    text = export_config(f.read(), 2 + rel.count('/'))
                written.append(_write(osp.join(out, rel), text))
    return written


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
        metafile = _project_readme.project_metafile(TOOLKITS[args.toolkit]['configs'][0],
                                                    PROJECT)
        _write(osp.join(tmp, 'metafile.yml'), metafile)
        _write(osp.join(tmp, 'README.md'), _project_readme.readme_text(
            args.toolkit, TOOLKITS[args.toolkit]['name'], yaml.safe_load(metafile), PROJECT,
            IMPORT))
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
