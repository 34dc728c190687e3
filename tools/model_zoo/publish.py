#!/usr/bin/env python
"""Publish finished training runs: the model-zoo checkpoint, metafile entry and README row.

    python tools/model_zoo/publish.py WORK_DIR [WORK_DIR ...]
    python tools/model_zoo/publish.py work_dirs/x --weights-url 'https://host/zoo/{filename}'

The toolkits' ``publish_model.py`` writes the weights file only; this also reads the run's
metrics, resources and timings from its logs into the config's metafile entry and README
row (README.md, "Contribute a trained model").  Everything is checked before anything is
written: one bad work dir stops the tool with one line per work dir (exit status 2) and
nothing changes; the files are written atomically.
"""
import argparse
import os
import os.path as osp
import sys
from typing import Dict, List, Tuple

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

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
    target = _zoo.alias_target(osp.join(root, config))
    names = [name] + ([osp.splitext(osp.basename(target))[0]] if target else [])
    folder, top = osp.dirname(osp.join(root, config)), osp.join(root, *config.split(os.sep)[:2])
    tried = []
    while True:
        path = osp.join(folder, 'metafile.yml')
        if osp.isfile(path):
            tried.append(osp.relpath(path, root))
            with open(path) as f:
                text = f.read()
            entry = next((n for n in names if _metafile.find_entry(text, n)), None)
            if entry:
                return path, entry
        if osp.samefile(folder, top) or osp.dirname(folder) == folder:
            break
        folder = osp.dirname(folder)
    raise ConfigError(f"no metafile entry named {' or '.join(map(repr, names))} for {config} "
                      f"(looked in {', '.join(tried) or 'no metafile.yml'}): add the entry first")


def _shown(path: str, root: str) -> str:
    """``path`` relative to ``root`` when inside it (the form the metafiles use)."""
    full = osp.abspath(path)
    return osp.relpath(full, root) if full.startswith(osp.abspath(root) + os.sep) else full


def prepare(work_dir: str, args) -> dict:
    """Everything one run publishes, in memory; raises UserInputError for a bad run."""
    run = _zoo.read_run(work_dir, args.root, args.checkpoint)
    _zoo.check_loads_into_model(run)
    filename, data = _zoo.published_checkpoint(run)
    target = osp.join(args.out_dir or osp.join(work_dir, 'published'), filename)
    weights = args.weights_url.format(filename=filename, name=run.name) if args.weights_url \
        else _shown(target, args.root)
    metafile, entry_name = metafile_of(args.root, run.config, run.name)
    with open(metafile) as f:
        entry = _metafile.entry_fields(f.read(), entry_name)
    collection = entry['_collection']
    dataset = (entry.get('Metadata') or {}).get('Training Data') or \
        (collection.get('Metadata') or {}).get('Training Data') or 'COCO'
    # the README of the entry's collection, else the metafile's neighbour
    readme = osp.join(args.root, collection['README']) if collection.get('README') else \
        osp.join(osp.dirname(metafile), 'README.md')
    link = weights if args.weights_url else osp.relpath(osp.abspath(target),
                                                        osp.dirname(readme))
    return dict(run=run, data=data, target=target, weights=weights, metafile=metafile,
                entry=entry_name, readme=readme, results=_zoo.results_of(run, dataset),
                metadata=_zoo.metadata_of(run), cell=_zoo.readme_cell(run, link),
                config_link=osp.relpath(osp.join(args.root, run.config), osp.dirname(readme)))


def edited_texts(jobs: List[dict]) -> Dict[str, str]:
    """path -> new text of every metafile and README the jobs change."""
    old: Dict[str, str] = {}
    new: Dict[str, str] = {}

    def current(path: str) -> str:
        if path not in old:
            if not osp.isfile(path):
                raise ConfigError(f'{path} not found: the zoo needs it for the results')
            with open(path) as f:
                old[path] = new[path] = f.read()
        return new[path]

    for job in jobs:
        text, values = current(job['metafile']), (job['results'], job['weights'], job['metadata'])
        new[job['metafile']] = _metafile.set_metafile_entry(text, job['entry'], *values)
        _metafile.check_metafile(text, new[job['metafile']], job['entry'], *values)
        new[job['readme']] = _metafile.set_readme_row(
            current(job['readme']), job['config_link'], {'ours': job['cell']}, job['readme'])
    return {path: text for path, text in new.items() if text != old[path]}


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
    for path, text in texts.items():
        atomic_write(text, path)
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
