#!/usr/bin/env python
"""Train a detector or segmentor from an inline-mm / mmdet / mmseg config.

    python tools/train.py configs/det/mask_rcnn_inline_pvt.py
    python tools/train.py CONFIG --work-dir work_dirs/x --amp --resume
    bash tools/dist_train.sh CONFIG 8

The task (detection or segmentation) comes from the config's default_scope.
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import torch  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from inline_mm.engine.dist import finish_distributed, prepare_distributed  # noqa: E402
from inline_mm.engine.runner_utils import check_datasets, task_of  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a detector / segmentor')
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go '
                        '(default: work_dirs/<config name>)')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from CKPT, or from the latest checkpoint of the work dir '
                        'when no path is given')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision (fp16 AMP on a GPU, bf16 autocast on the CPU)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the learning rate by the actual total batch size')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, key=value')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def build_config(args) -> Config:
    if not osp.isfile(args.config):
        raise FileNotFoundError(f'config file {args.config!r} not found')
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    task_of(cfg)
    if args.work_dir:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    if args.amp:
        wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if not torch.cuda.is_available():  # mmengine's AmpOptimWrapper needs a GPU
            if task_of(cfg) == 'mmdet':
                raise ValueError('--amp without a GPU means bf16 autocast, and the CPU kernels '
                                 "of mmcv's NMS / RoIAlign take fp32 only: train detectors "
                                 'on the CPU without --amp (segmentors support it)')
            cfg.optim_wrapper.type = 'CPUAutocastOptimWrapper'
            cfg.optim_wrapper.pop('loss_scale', None)
            cfg.optim_wrapper.setdefault('dtype', 'bfloat16')
        elif wrapper != 'AmpOptimWrapper':
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise ValueError('--auto-scale-lr needs auto_scale_lr.base_batch_size in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise FileNotFoundError(f'checkpoint to resume from {args.resume!r} not found')
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = build_config(args)
    # Fail on a missing data folder before the model is built or anything is written.
    check_datasets(cfg, ('train_dataloader', 'val_dataloader'))
    prepare_distributed(cfg, args.launcher)
    runner = Runner.from_cfg(cfg)
    runner.train()
    finish_distributed()


if __name__ == '__main__':
    main()
