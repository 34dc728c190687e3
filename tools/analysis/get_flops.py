#!/usr/bin/env python
"""Parameters and FLOPs of a model from a config, or of its backbone alone.

    python tools/analysis/get_flops.py CONFIG --size 1333x800
    python tools/analysis/get_flops.py CONFIG --size 224 --backbone-only
    python tools/analysis/get_flops.py configs/seg/*.py --size 512 --out flops.json

Why not the toolkits' own: mmseg's ``analysis_tools/get_flops.py`` raises on every
config with mmengine 0.10.7 (it passes both ``input_shape`` and ``inputs``), mmdet's
needs the validation set and averages real images at the sizes the pipeline pads to.
This one counts at a given size (``WIDTHxHEIGHT`` or ``N``), several configs at once
(with a Markdown table; the model-zoo FLOPs columns come from these runs), or the
backbone alone.  mmengine's ``get_model_complexity_info`` counts (one multiply-add = one
FLOP): its tracing sees every matmul of the InLine attention (``K^T V`` and ``Q Cov``)
and the depthwise convolution of the local branch, which hook-based counters miss.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
from mmengine import dump  # noqa: E402
from mmengine.analysis import get_model_complexity_info  # noqa: E402
from mmengine.config import Config  # noqa: E402

from inline_mm.engine.cli_sizes import add_size_option, format_size  # noqa: E402
from inline_mm.engine.launch import add_cfg_options, cli_main, load_config  # noqa: E402
from inline_mm.engine.runner_utils import TensorModeForward, build_model, task_of  # noqa: E402


def format_giga(value: float) -> str:
    """``value`` in G with three significant digits (2.59G, 31.9G, 217G)."""
    giga = value / 1e9
    return f'{giga:.0f}G' if giga >= 100 else f'{giga:#.3g}G'


def complexity(cfg: Config, size, backbone_only: bool = False) -> dict:
    """``{'flops': int, 'params': int, ...}`` of the model of ``cfg`` at ``size`` (H, W)."""
    model = build_model(cfg).eval()
    target = model.backbone if backbone_only else TensorModeForward(model, task_of(cfg))
    with torch.no_grad():
        info = get_model_complexity_info(target, inputs=(torch.randn(1, 3, *size),),
                                         show_table=False, show_arch=False)
    info['backbone_params'] = sum(p.numel() for p in model.backbone.parameters())
    info['model_params'] = sum(p.numel() for p in model.parameters())
    return info


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('configs', nargs='+', metavar='CONFIG')
    add_size_option(parser, '--size', default='1333x800', replaces=['--shape'],
                    help='input size')
    parser.add_argument('--backbone-only', action='store_true')
    parser.add_argument('--out', help='write the figures of every config as JSON')
    add_cfg_options(parser)
    return parser.parse_args(argv)


def main(argv=None) -> list:
    args = parse_args(argv)
    what = 'backbone' if args.backbone_only else 'model'
    (h, w), rows = args.size, []
    for path in args.configs:
        cfg = load_config(path, args.cfg_options)
        info = complexity(cfg, args.size, args.backbone_only)
        # shape: (H, W) as the tensor has it
        rows.append(dict(config=path, size=format_size(args.size), shape=[h, w], counted=what,
                         flops=int(info['flops']), params=int(info['params']),
                         model_params=int(info['model_params']),
                         backbone_params=int(info['backbone_params'])))
        print(f'{path}  input {format_size(args.size)} (3x{h}x{w})  ({what})')
        print(f"  FLOPs:  {info['flops'] / 1e9:.2f} G  (one multiply-add = one FLOP)")
        print(f"  params: {info['params'] / 1e6:.2f} M counted  (whole model "
              f"{info['model_params'] / 1e6:.2f} M, backbone "
              f"{info['backbone_params'] / 1e6:.2f} M)", flush=True)
    if len(rows) > 1:
        print(f'\n| config | params ({what}) | FLOPs at {format_size(args.size)} |')
        print('|---|---|---|')
        for row in rows:
            print(f"| {osp.basename(row['config'])} | {row['params'] / 1e6:.1f}M "
                  f"| {format_giga(row['flops'])} |")
    if args.out:
        dump(rows, args.out, file_format='json', indent=2)
    return rows


if __name__ == '__main__':
    sys.exit(cli_main(main))
