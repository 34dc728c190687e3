#!/usr/bin/env python
"""Evaluate a checkpoint on a config's test set (COCO bbox / segm mAP, or mIoU).

    python tools/test.py CONFIG CHECKPOINT [--show-dir DIR] [--out results.pkl]
    bash tools/dist_test.sh CONFIG CHECKPOINT 8
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from inline_mm.engine.dist import finish_distributed, prepare_distributed  # noqa: E402
from inline_mm.engine.runner_utils import check_datasets, task_of  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test a detector / segmentor')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='where the evaluation log goes')
    parser.add_argument('--out', help='dump the raw predictions to this pickle file')
    parser.add_argument('--show-dir', help='write images with drawn predictions into '
                        '<work_dir>/<timestamp>/<show-dir>')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint {args.checkpoint!r} not found')
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    task = task_of(cfg)
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or osp.join(
        './work_dirs', osp.splitext(osp.basename(args.config))[0])
    cfg.load_from = args.checkpoint
    if args.show_dir:
        hook = cfg.default_hooks.visualization
        hook.draw = True
        if task == 'mmdet':
            hook.test_out_dir = args.show_dir
        else:
            hook.interval = 1
            cfg.visualizer.save_dir = osp.join(cfg.work_dir, args.show_dir)
    if args.out:
        if not args.out.endswith(('.pkl', '.pickle')):
            raise ValueError(f'--out must end with .pkl, got {args.out!r}')
        dump = dict(type='DumpResults', out_file_path=args.out)
        if task == 'mmdet':
            dump['type'] = 'DumpDetResults'
        cfg.test_evaluator = [cfg.test_evaluator, dump] if isinstance(
            cfg.test_evaluator, dict) else [*cfg.test_evaluator, dump]
    check_datasets(cfg, ('test_dataloader',))
    prepare_distributed(cfg, args.launcher)
    runner = Runner.from_cfg(cfg)
    runner.test()
    finish_distributed()


if __name__ == '__main__':
    main()
