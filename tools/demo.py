#!/usr/bin/env python
"""The main job: train and evaluate InLine-PVT-T end to end on the bundled toy data.

    python tools/demo.py --task det     # Mask R-CNN, COCO bbox / segm mAP  (make demo)
    python tools/demo.py --task seg     # Semantic FPN, mIoU                (make demo-seg)

Steps: write the synthetic dataset if it is missing (data/coco_toy, data/ade_toy);
evaluate the untrained model; train on the CPU with progress in the log (in the
toy config's precision: bf16 autocast where the CPU has bf16 units, fp32 on
the others; ``--precision bf16`` / ``fp32`` choose);
evaluate again; draw predictions for a few validation images; write
``metrics.json`` into the work dir and print where everything is.
Exits 1 when the trained model is not better than the untrained one.
"""
import argparse
import glob
import json
import os
import os.path as osp
import sys
import time

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from inline_mm.datasets import make_ade_toy, make_coco_toy  # noqa: E402
from inline_mm.engine.amp import configure_amp, configure_fp32, cpu_has_fast_bf16  # noqa: E402
from inline_mm.engine.launch import (add_cfg_options, cli_main, load_config,  # noqa: E402
                                     run_with_runner)
from inline_mm.engine.runner_utils import draw_predictions  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TASKS = {
    'det': dict(config='configs/det/toy/mask_rcnn_inline_pvt_toy.py', data='coco_toy',
                make=make_coco_toy, metric='coco/bbox_mAP_50', target=0.6,
                images='val/*.jpg', work_dir='work_dirs/demo'),
    'seg': dict(config='configs/seg/toy/fpn_inline_pvt_toy.py', data='ade_toy',
                make=make_ade_toy, metric='mIoU', target=55.0,
                images='images/validation/*.jpg', work_dir='work_dirs/demo-seg'),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--task', choices=sorted(TASKS), default='det')
    parser.add_argument('--work-dir', help='default: work_dirs/demo (det), work_dirs/demo-seg')
    parser.add_argument('--data-dir', default=osp.join(ROOT, 'data'),
                        help='where the toy datasets live / are written')
    parser.add_argument('--iters', type=int, help='training iterations (config default)')
    parser.add_argument('--precision', choices=['auto', 'fp32', 'bf16'], default='auto',
                        help="auto: the toy config's (bf16 autocast where the CPU has bf16 "
                        "units, fp32 elsewhere); bf16: the same for a config without autocast")
    parser.add_argument('--num-vis', type=int, default=8,
                        help='validation images to draw predictions for')
    add_cfg_options(parser)
    data = parser.add_argument_group(
        'a smaller toy set (a quick check of the pipeline; the targets hold for the defaults)')
    data.add_argument('--num-train', type=int, help='training images (det 400, seg 1000)')
    data.add_argument('--num-val', type=int, help='validation images (det 50, seg 40)')
    data.add_argument('--image-size', type=int, help='image side in pixels (256)')
    return parser.parse_args(argv)


def fit_schedule(cfg) -> None:
    """Fit the toy config's learning-rate schedule and logging to the run's length,
    in place, however it was set (``--iters`` or ``--cfg-options
    train_cfg.max_iters=N``): the toy configs have a linear warm-up, then one decay
    that ends at the last iteration; a run shorter than the logger interval still logs
    its losses and times once.  The configs' own length leaves them unchanged."""
    iters = cfg.train_cfg.max_iters
    warmup, decay = cfg.param_scheduler
    warmup.end = min(warmup.end, max(1, iters // 5))
    decay.begin, decay.end = warmup.end, iters
    logger = cfg.default_hooks.logger
    logger.interval = min(logger.interval, iters)


def set_precision(cfg, task: str, choice: str) -> str:
    """The training precision: ``auto`` keeps the toy config's (both toy configs ask for
    bf16 autocast where the CPU has bf16 units, ``only_with_bf16_units``); ``bf16``
    autocasts where the CPU has bf16 units (the config's parts, else what ``--amp`` takes:
    a detector's backbone and neck, mmcv's CPU RoIAlign / NMS take fp32); ``fp32`` turns
    autocast off.  Returns it in words."""
    wrapper = cfg.optim_wrapper
    autocast = wrapper.get('type') == 'CPUAutocastOptimWrapper'
    if choice == 'fp32' or (choice == 'auto' and not autocast):
        configure_fp32(cfg)
        return 'fp32'
    if torch.cuda.is_available():
        return "the config's (a GPU is visible)"
    units = cpu_has_fast_bf16()  # None: no CPU flags to read (the wrapper autocasts then)
    if units is False and (not autocast or wrapper.get('only_with_bf16_units')):
        return 'fp32 (this CPU has no bf16 units: AVX512-BF16 / AMX)'
    if not autocast:
        configure_amp(cfg, 'mmdet' if task == 'det' else 'mmseg', 'cpu')
    parts = cfg.optim_wrapper.get('parts') or ('the whole forward',)
    why = {True: 'the CPU has bf16 units', None: 'bf16 units unknown: no CPU flags to read',
           False: 'the config asks for it on any CPU; this one has no bf16 units'}[units]
    return f"bf16 autocast of {' + '.join(parts)} ({why})"


def main(argv=None) -> int:
    args = parse_args(argv)
    task = TASKS[args.task]
    start = time.time()
    os.chdir(ROOT)  # the configs use paths relative to the repository
    # the config first: a bad --cfg-options stops the demo before anything is written
    cfg = load_config(task['config'], args.cfg_options)
    data_root = osp.join(args.data_dir, task['data'])
    print(f'[demo] dataset: {data_root}', flush=True)
    # the generator's defaults for what the command line leaves out
    given = dict(num_train=args.num_train, num_val=args.num_val, image_size=args.image_size)
    summary = task['make'](data_root, progress=True,
                           **{key: value for key, value in given.items() if value is not None})
    print(f"[demo] {summary['num_images']} images, classes {summary['classes']}", flush=True)

    cfg.work_dir = args.work_dir or task['work_dir']
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = data_root + '/'
    if 'ann_file' in cfg.val_evaluator:
        cfg.val_evaluator.ann_file = osp.join(data_root, 'annotations/instances_val.json')
        cfg.test_evaluator = cfg.val_evaluator
    if args.iters:
        cfg.train_cfg.max_iters = args.iters
    fit_schedule(cfg)
    precision = set_precision(cfg, args.task, args.precision)
    print(f'[demo] training precision: {precision}', flush=True)
    # evaluate explicitly before and after training, not inside the loop (mmengine's
    # loop validates every val_interval and at its last iteration, from val_begin on)
    cfg.train_cfg.val_begin = cfg.train_cfg.max_iters + 1
    cfg.default_hooks.checkpoint.interval = cfg.train_cfg.max_iters

    def evaluate_train_evaluate(runner):
        print('[demo] evaluating the untrained model', flush=True)
        runner.model.init_weights()  # what runner.train() would do first
        before = runner.val_loop.run()
        print(f"[demo] training {cfg.train_cfg.max_iters} iterations on the CPU "
              f"(log: {runner.log_dir})", flush=True)
        runner.train()
        print('[demo] evaluating the trained model', flush=True)
        after = runner.val_loop.run()
        images = sorted(glob.glob(osp.join(data_root, task['images'])))[:args.num_vis]
        print(f'[demo] drawing predictions for {len(images)} validation images', flush=True)
        runner.model.cfg = cfg  # what the toolkits' inference helpers read
        runner.model.dataset_meta = runner.val_loop.dataloader.dataset.metainfo
        draw_predictions(runner.model.eval(), cfg, images, vis_dir)
        return before, after

    vis_dir = osp.join(cfg.work_dir, 'predictions')
    before, after = run_with_runner(cfg, 'none', ('train_dataloader', 'val_dataloader'),
                                    evaluate_train_evaluate)

    metric = task['metric']
    result = dict(task=args.task, config=task['config'], iterations=cfg.train_cfg.max_iters,
                  precision=precision,
                  wall_time_s=round(time.time() - start, 1),
                  untrained={k: float(v) for k, v in before.items()},
                  trained={k: float(v) for k, v in after.items()},
                  headline_metric=metric, target=task['target'],
                  checkpoint=osp.join(cfg.work_dir, f'iter_{cfg.train_cfg.max_iters}.pth'),
                  predictions=vis_dir)
    metrics_file = osp.join(cfg.work_dir, 'metrics.json')
    with open(metrics_file, 'w') as f:
        json.dump(result, f, indent=2)
    print('\n[demo] ' + '-' * 60)
    print(f"[demo] {metric}: untrained {before[metric]:.3f} -> trained {after[metric]:.3f} "
          f"(target >= {task['target']})")
    for key in sorted(after):
        print(f'[demo]   {key}: {after[key]:.4f}')
    print(f'[demo] metrics:     {metrics_file}')
    print(f'[demo] predictions: {vis_dir}/')
    print(f"[demo] checkpoint:  {result['checkpoint']}")
    print(f"[demo] wall time:   {result['wall_time_s'] / 60:.1f} min")
    if after[metric] <= before[metric]:
        print('[demo] the model did not improve over its untrained state', file=sys.stderr)
        return 1
    if after[metric] < task['target']:
        print(f"[demo] note: below the target {task['target']}", file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(cli_main(main))
