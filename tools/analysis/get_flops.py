#!/usr/bin/env python
"""Parameters and FLOPs of a model from a config, or of its backbone alone.

    python tools/analysis/get_flops.py CONFIG --shape 800 1333
    python tools/analysis/get_flops.py CONFIG --shape 224 224 --backbone-only
    python tools/analysis/get_flops.py configs/seg/*.py --shape 512 512 --out flops.json

With several configs it also prints a Markdown table (config, params, FLOPs)
and ``--out`` keeps every figure as JSON; the model-zoo FLOPs columns come from
these runs.

Counted by mmengine's analysis tools (``get_model_complexity_info``: a traced
FLOP counter in which one multiply-add counts as one FLOP).  Tracing sees every
matmul of the InLine attention (``K^T V`` and ``Q Cov``) and the depthwise
convolution of the local branch, which hook-based counters miss.
"""
import argparse
import json
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
from mmengine.analysis import get_model_complexity_info  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

from inline_mm.engine.runner_utils import task_of  # noqa: E402


class _Forward(torch.nn.Module):
    """The tensor-mode forward of a detector / segmentor (what the FLOPs are of)."""

    def __init__(self, model, data_samples):
        super().__init__()
        self.model = model
        self.data_samples = data_samples

    def forward(self, inputs):
        return self.model._forward(inputs, self.data_samples)


def complexity(cfg: Config, shape, backbone_only: bool = False) -> dict:
    """``{'flops': int, 'params': int, ...}`` of the model of ``cfg`` at ``shape``."""
    task = task_of(cfg)
    init_default_scope(task)
    if task == 'mmdet':
        from mmdet.registry import MODELS
        from mmdet.structures import DetDataSample as Sample
    else:
        from mmseg.registry import MODELS
        from mmseg.structures import SegDataSample as Sample
    cfg.model.backbone.init_cfg = None
    model = MODELS.build(cfg.model).eval()
    h, w = shape
    inputs = torch.randn(1, 3, h, w)
    if backbone_only:
        target, args = model.backbone, (inputs,)
    else:
        sample = Sample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w),
                                      batch_input_shape=(h, w), scale_factor=(1., 1.)))
        target, args = _Forward(model, [sample]), (inputs,)
    with torch.no_grad():
        info = get_model_complexity_info(target, inputs=args, show_table=False,
                                         show_arch=False)
    info['backbone_params'] = sum(p.numel() for p in model.backbone.parameters())
    info['model_params'] = sum(p.numel() for p in model.parameters())
    return info


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('configs', nargs='+', metavar='CONFIG')
    parser.add_argument('--shape', type=int, nargs=2, default=[800, 1333], metavar=('H', 'W'))
    parser.add_argument('--backbone-only', action='store_true')
    parser.add_argument('--out', help='write the figures of every config as JSON')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = parser.parse_args(argv)
    what = 'backbone' if args.backbone_only else 'model'
    rows = []
    for path in args.configs:
        cfg = Config.fromfile(path)
        if args.cfg_options:
            cfg.merge_from_dict(args.cfg_options)
        info = complexity(cfg, args.shape, args.backbone_only)
        rows.append(dict(config=path, shape=list(args.shape), counted=what,
                         flops=int(info['flops']), params=int(info['params']),
                         model_params=int(info['model_params']),
                         backbone_params=int(info['backbone_params'])))
        print(f'{path}  input 3x{args.shape[0]}x{args.shape[1]}  ({what})')
        print(f"  FLOPs:  {info['flops'] / 1e9:.2f} G  (one multiply-add = one FLOP)")
        print(f"  params: {info['params'] / 1e6:.2f} M counted  (whole model "
              f"{info['model_params'] / 1e6:.2f} M, backbone "
              f"{info['backbone_params'] / 1e6:.2f} M)", flush=True)
    if len(rows) > 1:
        print(f'\n| config | params ({what}) | FLOPs at {args.shape[1]}x{args.shape[0]} |')
        print('|---|---|---|')
        for row in rows:
            print(f"| {osp.basename(row['config'])} | {row['params'] / 1e6:.1f}M "
                  f"| {row['flops'] / 1e9:.0f}G |")
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == '__main__':
    main()
