#!/usr/bin/env python
"""Train a detector or segmentor from an inline-mm / mmdet / mmseg config.

    python tools/train.py configs/det/mask_rcnn_inline_pvt.py
    python tools/train.py CONFIG --work-dir work_dirs/x --amp --resume
    bash tools/dist_train.sh CONFIG 8

The task (detection or segmentation) comes from the config's default_scope.
Before anything is written, the model is built once (a bad arch, attn_type or type
name), a --resume file is checked against it, and the data folders and the dataset
classes are checked against the config (each once, on process 0 of a multi-process job);
an error in the input prints one line and every process exits with status 2.
"""
import argparse
import os.path as osp
import sys
from typing import Optional

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.config import Config  # noqa: E402

from inline_mm.checkpoint import load_checkpoint_file  # noqa: E402
from inline_mm.engine.amp import configure_amp  # noqa: E402
from inline_mm.engine.hooks.preemption import PENDING_VALIDATION  # noqa: E402
from inline_mm.engine.launch import (add_runner_args, cli_main, default_work_dir,  # noqa: E402
                                     load_config, run_with_runner, set_local_rank)
from inline_mm.engine.model_fit import check_checkpoint_fits  # noqa: E402
from inline_mm.engine.runner_utils import build_model, task_of  # noqa: E402
from inline_mm.errors import CheckpointError, ConfigError, MissingFileError  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a detector / segmentor')
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go '
                        '(default: work_dirs/<config name>)')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from CKPT, or from the latest checkpoint of the work dir '
                        'when no path is given')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision: fp16 AMP on a GPU; bf16 autocast on the CPU '
                        '(detectors: backbone and neck, the heads and mmcv ops stay fp32)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the learning rate by the actual total batch size')
    add_runner_args(parser)
    args = parser.parse_args(argv)
    set_local_rank(args.local_rank)
    return args


def build_config(args) -> Config:
    cfg = load_config(args.config, args.cfg_options, args.launcher)
    task_of(cfg)
    cfg.work_dir = default_work_dir(cfg, args.config, args.work_dir)
    if args.amp:  # fp16 AMP on a GPU; bf16 autocast on the CPU (detectors: backbone + neck)
        configure_amp(cfg, task_of(cfg))
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise ConfigError('--auto-scale-lr needs auto_scale_lr.base_batch_size (the total '
                              'batch size the learning rate was set for) in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise MissingFileError(f'checkpoint to resume from {args.resume!r} not found')
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def check_model(cfg: Config, resume: Optional[str]) -> None:
    """Build the model once before the Runner, and check the checkpoint to resume from.

    A bad arch, ``attn_type`` or type name, or a ``--resume`` file that is not a
    training checkpoint of this model (mmengine would load what fits with warnings,
    then fail in the optimizer), stops here in one line: the Runner has not yet
    written its log and config dump into the work dir.
    """
    model = build_model(cfg)
    if resume is None or resume == 'auto':
        return
    checkpoint = load_checkpoint_file(resume)  # one line for a text / truncated file
    missing = [key for key in ('state_dict', 'meta', 'message_hub') if key not in checkpoint]
    if missing:
        raise CheckpointError(
            f"{resume} holds no training state ({', '.join(missing)} missing): --resume "
            'continues a run from a checkpoint its training wrote (iter_<n>.pth / '
            f'epoch_<n>.pth); to train from these weights use --cfg-options load_from={resume}')
    meta, schedule = checkpoint['meta'], cfg.get('train_cfg') or {}
    unit = 'epoch' if 'max_epochs' in schedule else 'iter'
    end = schedule.get(f'max_{unit}s')
    # a preemption in the final validation leaves it pending: the resumed run runs it
    pending = ((checkpoint.get('message_hub') or {}).get('runtime_info') or {}).get(
        PENDING_VALIDATION)
    if isinstance(meta, dict) and end is not None and int(meta.get(unit, -1)) >= int(end) \
            and pending is None:
        raise ConfigError(f'{resume} is at {unit} {meta[unit]} and the schedule ends at {end} '
                          f'(train_cfg.max_{unit}s): nothing left to train; raise '
                          f'train_cfg.max_{unit}s to train on')
    check_checkpoint_fits(model, resume, min_found=1.0, checkpoint=checkpoint)


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = build_config(args)
    run_with_runner(cfg, args.launcher, ('train_dataloader', 'val_dataloader'),
                    lambda runner: runner.train(), check=lambda: check_model(cfg, args.resume),
                    check_pretrained=True)


if __name__ == '__main__':
    sys.exit(cli_main(main))
