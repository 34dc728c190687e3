#!/usr/bin/env python
"""Publish finished training runs: the model-zoo checkpoint, metafile entry and README row.

    python tools/model_zoo/publish.py WORK_DIR [WORK_DIR ...]
    python tools/model_zoo/publish.py work_dirs/x --weights-url 'https://host/zoo/{filename}'

For each work dir of a finished run of one of configs/det, configs/seg (what mmengine
wrote there: the config its newest checkpoint records, ``<timestamp>/vis_data/scalars.json``,
the checkpoints):

* the published checkpoint, as mmdet's ``tools/model_converters/publish_model.py``
  writes it: ``meta`` and ``state_dict`` only (EMA weights where the run kept them,
  ``meta`` trimmed to plain values), named ``<config>_<yyyymmdd>-<sha256[:8]>.pth``,
  in ``WORK_DIR/published/`` (``--out-dir``);
* the model's metafile entry (the ``metafile.yml`` beside the config): ``Results``
  (COCO box / mask AP with AP50 / AP75 / APs / APm / APl, or mIoU / mAcc / aAcc, from
  the validation the run logged for those weights), ``Weights`` (``--weights-url``
  with ``{filename}`` / ``{name}``, else the file's path) and the measured
  ``Metadata`` (epochs or iterations, training resources, peak training memory,
  median iteration time, inference time);
* the "ours" cell of the config's row in its collection's README results table.

Everything is checked before anything is written: a work dir that is not a finished
run of one of the zoo's configs, a log without the final metrics, or a checkpoint that
does not load into the config's model stops the tool with one line per work dir (exit
status 2) and nothing changes; the files are written atomically.
"""
import argparse
import os
import os.path as osp
import sys
from typing import Dict, List, Tuple

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import _entry  # noqa: E402
import _metafile  # noqa: E402
import _zoo  # noqa: E402

from inline_mm.engine.atomic_io import atomic_write  # noqa: E402
from inline_mm.engine.launch import (USER_ERROR_EXIT, cli_main,  # noqa: E402
                                     format_user_error)
from inline_mm.errors import ConfigError, UserInputError  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('work_dirs', nargs='+', metavar='WORK_DIR',
                        help='work dir of a finished run (tools/train.py --work-dir)')
    parser.add_argument('--checkpoint', default='last',
                        help="'last' (default: the run's final checkpoint), 'best' (the "
                        "newest best_*.pth of save_best) or a checkpoint file of the run")
    parser.add_argument('--out-dir', help='where the published checkpoint goes '
                        '(default: WORK_DIR/published)')
    parser.add_argument('--weights-url', metavar='TEMPLATE',
                        help="the metafile's Weights: a URL with {filename} (and {name}), "
                        "e.g. 'https://host/inline-mm/{name}/{filename}'; default: the "
                        'published file\'s path')
    parser.add_argument('--root', default=_zoo.ROOT,
                        help='the inline-mm checkout whose configs/ hold the configs, '
                        'metafiles and READMEs (default: this one)')
    args = parser.parse_args(argv)
    if args.weights_url is not None and '{filename}' not in args.weights_url:
        parser.error(f'--weights-url {args.weights_url!r} has no {{filename}}: write where '
                     f'the file will be, e.g. https://host/zoo/{{filename}}')
    if args.checkpoint not in ('last', 'best') and len(args.work_dirs) > 1:
        parser.error('--checkpoint FILE takes one WORK_DIR (last / best take several)')
    return args


def metafile_of(root: str, config: str, name: str) -> Tuple[str, str]:
    """(metafile path, entry name) of a config: the nearest ``metafile.yml`` from the
    config's folder up to configs/<task>/ with an entry of that name (a short-name config,
    ``_base_ = './X.py'`` alone, is published as X's entry)."""
    names = [name]
    target = _zoo.alias_target(osp.join(root, config))
    if target is not None:
        names.append(osp.splitext(osp.basename(target))[0])
    folder = osp.dirname(osp.join(root, config))
    top = osp.join(root, *config.split(os.sep)[:2])
    tried = []
    while True:
        path = osp.join(folder, 'metafile.yml')
        if osp.isfile(path):
            tried.append(osp.relpath(path, root))
            with open(path) as f:
                text = f.read()
            for entry in names:
                if _metafile.find_entry(text, entry) is not None:
                    return path, entry
        if osp.samefile(folder, top) or osp.dirname(folder) == folder:
            break
        folder = osp.dirname(folder)
    raise ConfigError(f"no metafile entry named {' or '.join(map(repr, names))} for {config} "
                      f"(looked in {', '.join(tried) or 'no metafile.yml'}): add the entry first")


def readme_of(root: str, metafile: str, entry: dict) -> str:
    """The README of the entry's collection (its ``README:``), else the metafile's neighbour."""
    path = (entry.get('_collection') or {}).get('README')
    return osp.join(root, path) if path else osp.join(osp.dirname(metafile), 'README.md')


def _shown(path: str, root: str) -> str:
    """``path`` relative to ``root`` when inside it (the form the metafiles use)."""
    full = osp.abspath(path)
    inside = full.startswith(osp.abspath(root) + os.sep)
    return osp.relpath(full, root) if inside else full


def prepare(work_dir: str, args) -> dict:
    """Everything one run publishes, in memory; raises UserInputError for a bad run."""
    run = _zoo.read_run(work_dir, args.root, args.checkpoint)
    _zoo.check_loads_into_model(run)
    filename, data = _entry.published_checkpoint(run)
    out_dir = args.out_dir or osp.join(work_dir, 'published')
    target = osp.join(out_dir, filename)
    weights = args.weights_url.format(filename=filename, name=run.name) if args.weights_url \
        else _shown(target, args.root)
    metafile, entry_name = metafile_of(args.root, run.config, run.name)
    with open(metafile) as f:
        entry = _metafile.entry_fields(f.read(), entry_name)
    dataset = (entry.get('Metadata') or {}).get('Training Data') or \
        (entry['_collection'].get('Metadata') or {}).get('Training Data') or 'COCO'
    readme = readme_of(args.root, metafile, entry)
    link = weights if args.weights_url else osp.relpath(osp.abspath(target),
                                                        osp.dirname(readme))
    return dict(run=run, filename=filename, data=data, target=target, weights=weights,
                metafile=metafile, entry=entry_name, readme=readme,
                results=_entry.results_of(run, dataset), metadata=_entry.metadata_of(run),
                config_link=osp.relpath(osp.join(args.root, run.config), osp.dirname(readme)),
                cell=_entry.readme_cell(run, link))


def edited_texts(jobs: List[dict]) -> Dict[str, Tuple[str, str]]:
    """path -> (old text, new text) of every metafile and README the jobs change."""
    texts: Dict[str, Tuple[str, str]] = {}

    def current(path: str) -> str:
        if path not in texts:
            if not osp.isfile(path):
                raise ConfigError(f'{path} not found: the zoo needs it for the results')
            with open(path) as f:
                text = f.read()
            texts[path] = (text, text)
        return texts[path][1]

    for job in jobs:
        old = current(job['metafile'])
        new = _metafile.set_metafile_entry(old, job['entry'], job['results'], job['weights'],
                                      job['metadata'])
        _metafile.check_metafile(old, new, job['entry'], job['results'], job['weights'],
                            job['metadata'])
        texts[job['metafile']] = (texts[job['metafile']][0], new)
        readme = current(job['readme'])
        texts[job['readme']] = (texts[job['readme']][0], _metafile.set_readme_row(
            readme, job['config_link'], {'ours': job['cell']}, job['readme']))
    return texts


def main(argv=None) -> int:
    args = parse_args(argv)
    jobs, failed = [], False
    for work_dir in args.work_dirs:
        try:
            jobs.append(prepare(work_dir, args))
        except UserInputError as err:  # one line per bad run, then nothing is written
            print(f'error: {work_dir}: {format_user_error(err)}', file=sys.stderr, flush=True)
            failed = True
    if failed:
        return USER_ERROR_EXIT
    texts = edited_texts(jobs)
    for job in jobs:  # the checkpoints first: the entries name them
        atomic_write(job['data'], job['target'])
    for path, (old, new) in texts.items():
        if new != old:
            atomic_write(new, path)
    for job in jobs:
        run = job['run']
        shown = ', '.join(f'{k} {v}' for result in job['results']
                          for k, v in result['Metrics'].items())
        print(f"published {run.name} ({osp.basename(run.checkpoint_path)}, iteration "
              f"{run.iteration}{', EMA weights' if run.ema else ''})\n"
              f"  checkpoint  {job['target']} ({len(job['data']) / 2**20:.1f} MiB, weights "
              f"only)\n  metrics     {shown}\n"
              f"  metafile    {_shown(job['metafile'], args.root)} (entry {job['entry']}: "
              f"Results, Weights, Metadata)\n"
              f"  README      {_shown(job['readme'], args.root)} (row {job['config_link']})")
    return 0


if __name__ == '__main__':
    sys.exit(cli_main(main))
