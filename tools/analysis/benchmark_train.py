#!/usr/bin/env python
"""Time of one training iteration of a detector, InLine backbone against softmax.

    python tools/analysis/benchmark_train.py                       # Mask R-CNN, PVT-T pair
    python tools/analysis/benchmark_train.py CONFIG --softmax-backbone mmdet_pvt_t \\
        --size 800x800 --batch-size 2 --repeats 5 --out work_dirs/benchmark_train.json

One iteration is mmengine's ``model.train_step``: data preprocessing, forward
with losses, backward and the optimiser step of the config's ``optim_wrapper``.
The detector of ``CONFIG`` runs once with its own backbone and once with the
softmax counterpart in its place (same neck, heads, optimiser, data), the two
interleaved round by round after ``--warmup`` iterations each, on one
synthetic batch of ``--batch-size`` images with random boxes and masks (the
same batch for both).  Prints the median time per iteration (with the 25-75 %
spread) and the InLine / softmax ratio; ``--out`` writes them as JSON.
"""
import argparse
import copy
import json
import os
import os.path as osp
import sys
import time
from typing import Dict, List

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.logging import MMLogger  # noqa: E402
from mmengine.optim import build_optim_wrapper  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

from benchmark import MMDET_BACKBONES, parse_size, quartiles  # noqa: E402  (same folder)
from inline_mm.engine.runner_utils import task_of  # noqa: E402

DEFAULT_CONFIG = osp.join(ROOT, 'configs', 'det', 'mask_rcnn_inline_pvt.py')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', nargs='?', default=DEFAULT_CONFIG,
                        help='detector config with an InLine backbone')
    parser.add_argument('--softmax-backbone', default='mmdet_pvt_t',
                        choices=sorted(MMDET_BACKBONES))
    parser.add_argument('--size', default='800x800', help='W x H (or S) of every image')
    parser.add_argument('--batch-size', type=int, default=2)
    parser.add_argument('--objects', type=int, default=8, help='ground-truth objects per image')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--out', help='write the figures as JSON')
    return parser.parse_args(argv)


def synthetic_batch(size, batch_size: int, objects: int, num_classes: int) -> dict:
    """A fixed batch in the layout of mmdet's ``PackDetInputs`` (boxes, labels, masks)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    h, w = size
    gen = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for _ in range(batch_size):
        inputs.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen))
        wh = torch.rand(objects, 2, generator=gen) * 0.4 + 0.05
        xy = torch.rand(objects, 2, generator=gen) * (1 - wh)
        boxes = torch.cat([xy, xy + wh], dim=1) * torch.tensor([w, h, w, h])
        masks = torch.zeros(objects, h, w, dtype=torch.uint8)
        for i, (x0, y0, x1, y1) in enumerate(boxes.round().long().tolist()):
            masks[i, y0:y1, x0:x1] = 1
        gt = InstanceData(bboxes=boxes,
                          labels=torch.randint(0, num_classes, (objects, ), generator=gen),
                          masks=BitmapMasks(masks.numpy(), h, w))
        samples.append(DetDataSample(gt_instances=gt, metainfo=dict(
            img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), scale_factor=(1., 1.),
            flip=False, flip_direction=None)))
    return dict(inputs=inputs, data_samples=samples)


def build(cfg: Config):
    from mmdet.registry import MODELS
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    return model, build_optim_wrapper(model, cfg.optim_wrapper)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = Config.fromfile(args.config)
    if task_of(cfg) != 'mmdet':
        raise ValueError(f'{args.config} is not a detection config: this benchmark times '
                         f'detector training iterations')
    init_default_scope('mmdet')
    # the optimiser builder logs one line per parameter group at INFO
    MMLogger.get_instance('mmengine', log_level='WARNING')
    h, w = parse_size(args.size)
    cfg.model.backbone.init_cfg = None
    softmax_cfg = copy.deepcopy(cfg)
    softmax_cfg.model.backbone = copy.deepcopy(MMDET_BACKBONES[args.softmax_backbone])
    inline_name = f"{cfg.model.backbone.type}({cfg.model.backbone.get('arch', '')})"
    models = {inline_name: build(cfg), args.softmax_backbone: build(softmax_cfg)}
    data = synthetic_batch((h, w), args.batch_size, args.objects,
                           cfg.model.roi_head.bbox_head.num_classes)

    times: Dict[str, List[float]] = {name: [] for name in models}
    for name, (model, optim) in models.items():
        for _ in range(args.warmup):
            model.train_step(data, optim)
    for r in range(args.repeats):  # interleaved: one iteration of every model per round
        for name, (model, optim) in models.items():
            t0 = time.perf_counter()
            model.train_step(data, optim)
            times[name].append(time.perf_counter() - t0)
        print(f'round {r + 1}/{args.repeats}: ' + ', '.join(
            f'{n} {t[-1]:.2f} s' for n, t in times.items()), flush=True)

    rows = {}
    for name, ts in times.items():
        median, p25, p75 = quartiles(ts)
        rows[name] = dict(median_s=median, p25_s=p25, p75_s=p75, times_s=ts)
    ratio = rows[inline_name]['median_s'] / rows[args.softmax_backbone]['median_s']
    result = dict(config=args.config, size=[h, w], batch_size=args.batch_size,
                  threads=args.threads, device='cpu', rows=rows, ratio=ratio)
    print(f'\none training iteration, batch {args.batch_size} at {w}x{h}, '
          f'{args.threads} threads (median, 25-75 %):')
    for name, row in rows.items():
        print(f"  {name:<24} {row['median_s']:.2f} s  ({row['p25_s']:.2f}-{row['p75_s']:.2f})")
    print(f'  ratio InLine / softmax: {ratio:.2f}')
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == '__main__':
    main()
