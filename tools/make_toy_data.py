"""Write the synthetic toy datasets used by the demo configs and the tests.

Usage::

    python tools/make_toy_data.py                      # both, into data/
    python tools/make_toy_data.py --task det --out data --num-train 400 --num-val 50
    python tools/make_toy_data.py --task seg --size 256 --seed 0

Detection writes ``OUT/coco_toy/`` (COCO layout: ``train/``, ``val/``,
``annotations/instances_{train,val}.json``); segmentation writes
``OUT/ade_toy/`` (ADE20K layout: ``images/{training,validation}``,
``annotations/{training,validation}``).  The real datasets keep their
standard folders (``data/coco``, ``data/ade/ADEChallengeData2016``).

A folder that already holds a complete set made with the same arguments is
reused; ``--force`` regenerates it.
"""
import argparse
import importlib
import os.path as osp
import sys
import time
import types

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _load_toy_data():
    """Import ``inline_mm/datasets/toy_data.py`` (and the ``toy_scenes.py`` it draws with)
    without the rest of the plugin.

    The generator needs only numpy / OpenCV; loading its two files as a package of
    their own avoids importing the whole plugin (torch, mmdet, mmseg) just to draw
    images, and works from a plain checkout without installing it.
    """
    name = 'inline_mm_toy_data'
    if name not in sys.modules:
        package = types.ModuleType(name)  # a namespace for the relative import only
        package.__path__ = [osp.join(REPO_ROOT, 'inline_mm', 'datasets')]
        sys.modules[name] = package
    return importlib.import_module(f'{name}.toy_data')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Write the synthetic COCO / ADE20K toy datasets.')
    parser.add_argument('--task', choices=('det', 'seg', 'all'), default='all',
                        help='det: COCO instance set, seg: ADE20K semantic set, all: both')
    parser.add_argument('--out', default='data',
                        help='parent folder; the sets go to OUT/coco_toy and OUT/ade_toy')
    parser.add_argument('--num-train', type=int, default=None,
                        help='training images (default: 400 det, 1000 seg)')
    parser.add_argument('--num-val', type=int, default=None,
                        help='validation images (default: 50 det, 40 seg)')
    parser.add_argument('--size', type=int, default=256,
                        help='side of the square images, in pixels (one number: not the '
                        'WIDTHxHEIGHT input size the analysis tools take)')
    parser.add_argument('--seed', type=int, default=0, help='base random seed')
    parser.add_argument('--num-classes', type=int, default=3,
                        help='shape classes of the detection set, 3 to 5')
    parser.add_argument('--force', action='store_true',
                        help='regenerate even if a complete set is already there')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    toy = _load_toy_data()
    jobs = []
    if args.task in ('det', 'all'):
        jobs.append(('det', osp.join(args.out, 'coco_toy'), toy.make_coco_toy,
                     dict(num_train=400, num_val=50), dict(num_classes=args.num_classes)))
    if args.task in ('seg', 'all'):
        jobs.append(('seg', osp.join(args.out, 'ade_toy'), toy.make_ade_toy,
                     dict(num_train=1000, num_val=40), {}))

    for task, root, make, defaults, extra in jobs:
        kwargs = dict(
            num_train=defaults['num_train'] if args.num_train is None else args.num_train,
            num_val=defaults['num_val'] if args.num_val is None else args.num_val,
            image_size=args.size, seed=args.seed, force=args.force, **extra)
        print(f'[{task}] writing {osp.abspath(root)} '
              f"({kwargs['num_train']} train + {kwargs['num_val']} val, "
              f'{args.size} px, seed {args.seed})', flush=True)
        start = time.time()
        try:
            summary = make(root, progress=True, **kwargs)
        except (ValueError, FileExistsError) as err:
            print(f'error: {err}', file=sys.stderr)
            return 2
        if summary['generated']:
            print(f'\n[{task}] done in {time.time() - start:.1f} s', flush=True)
        else:
            print(f'[{task}] already complete with these arguments, kept '
                  '(--force regenerates)', flush=True)
        counts = ', '.join(f'{split}: {n} images' for split, n in summary['num_images'].items())
        if 'num_annotations' in summary:
            counts += ', ' + ', '.join(f'{split}: {n} instances'
                                       for split, n in summary['num_annotations'].items())
        print(f"[{task}] {summary['root']}: classes {tuple(summary['classes'])}; {counts}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
