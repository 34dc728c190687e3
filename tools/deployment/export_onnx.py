#!/usr/bin/env python
"""Export an InLine backbone, segmentor or detector backbone + neck to ONNX.

    # backbone of a config, dynamic H / W, checked with onnxruntime at 3 sizes
    python tools/deployment/export_onnx.py configs/det/mask-rcnn_inline-pvt-t_fpn_1x_coco.py \\
        --size 1344x800 --dynamic --out work_dirs/onnx/pvt_t.onnx \\
        --verify --verify-sizes 131x97 512x512
    # a whole segmentor (logits at the input size), from a checkpoint
    python tools/deployment/export_onnx.py configs/seg/toy/fpn_inline_pvt_toy.py CKPT \\
        --part model --size 128 --dynamic --out work_dirs/onnx/fpn_toy.onnx --verify
    # a detector's backbone + neck (its heads stay in PyTorch)
    python tools/deployment/export_onnx.py configs/det/toy/mask_rcnn_inline_pvt_toy.py \\
        --part backbone_neck --size 192 --dynamic --out work_dirs/onnx/det_feats.onnx

Without CHECKPOINT the weights are random (the backbone's ``init_cfg`` is
dropped).  ``--verify`` runs the file with onnxruntime and prints, per input
size, the max abs difference to PyTorch relative to the output's max abs value;
it exits with 1 if one exceeds ``--tolerance``.  Sizes (``--size``,
``--verify-sizes``) are ``WIDTHxHEIGHT``, as the toolkits write them, or ``N``
for ``NxN``.
"""
import argparse
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from inline_mm.engine.cli_sizes import add_size_option, format_size  # noqa: E402
from inline_mm.engine.launch import add_cfg_options, cli_main  # noqa: E402
from inline_mm.deploy import (PARTS, TOLERANCE, build_model, export_onnx,  # noqa: E402
                              require_onnx, verify_onnx, wrap_part)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Export to ONNX (and check with onnxruntime)')
    parser.add_argument('config', help='config file (configs/det, configs/seg, their toy/)')
    parser.add_argument('checkpoint', nargs='?', default=None,
                        help='checkpoint file (random weights without it)')
    add_size_option(parser, '--size', default='512', replaces=['--shape'],
                    help='input size traced at export')
    parser.add_argument('--dynamic', action='store_true',
                        help='dynamic input height / width (batch stays fixed)')
    parser.add_argument('--part', choices=PARTS, default='backbone',
                        help='backbone; backbone_neck (detectors: heads stay in PyTorch); '
                             'model (whole segmentor, logits at the input size)')
    parser.add_argument('--out', required=True, help='output .onnx file')
    parser.add_argument('--batch', type=int, default=1, help='batch size baked into the graph')
    parser.add_argument('--opset', type=int, default=17)
    parser.add_argument('--verify', action='store_true',
                        help='compare onnxruntime with PyTorch at --size (and, with '
                             '--dynamic, at --verify-sizes)')
    add_size_option(parser, '--verify-sizes', many=True, replaces=['--verify-shapes'],
                    help='more sizes checked by --verify with --dynamic (default: 131x97)')
    parser.add_argument('--tolerance', type=float, default=TOLERANCE,
                        help='largest relative difference --verify accepts')
    parser.add_argument('--threads', type=int, default=None, help='onnxruntime threads')
    add_cfg_options(parser)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    require_onnx()
    shape = tuple(args.size)
    model, _, task = build_model(args.config, args.checkpoint, cfg_options=args.cfg_options,
                                 part=args.part)
    module = wrap_part(model, args.part, task)
    start = time.perf_counter()
    export_onnx(module, shape, args.out, dynamic=args.dynamic, batch=args.batch,
                opset=args.opset)
    print(f'wrote {args.out} ({args.part} of {osp.basename(args.config)}, traced at '
          f"{format_size(shape)}, {'dynamic' if args.dynamic else 'fixed'} size, "
          f'{time.perf_counter() - start:.1f} s)')
    if not args.verify:
        return 0
    shapes = [shape]
    if args.dynamic:
        extra = args.verify_sizes if args.verify_sizes is not None else [(97, 131)]
        shapes += [s for s in extra if tuple(s) != shape]
    elif args.verify_sizes:
        print('fixed-size export: --verify-sizes ignored')
    diffs = verify_onnx(module, args.out, shapes, batch=args.batch, threads=args.threads)
    ok = True
    for (h, w), diff in diffs.items():
        passed = diff <= args.tolerance
        ok &= passed
        print(f"  {format_size((h, w))}: max |onnxruntime - torch| / max |torch| = {diff:.2e} "
              f"{'ok' if passed else f'FAILS (> {args.tolerance:g})'}")
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(cli_main(main))
