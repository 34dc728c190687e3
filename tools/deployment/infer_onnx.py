#!/usr/bin/env python
"""Segment images with an exported segmentor (onnxruntime) and draw the label maps.

    python tools/deployment/export_onnx.py configs/seg/toy/fpn_inline_pvt_toy.py CKPT \\
        --part model --size 128 --dynamic --out work_dirs/onnx/fpn_toy.onnx
    python tools/deployment/infer_onnx.py img1.jpg img2.jpg \\
        --config configs/seg/toy/fpn_inline_pvt_toy.py --onnx work_dirs/onnx/fpn_toy.onnx \\
        --out-dir work_dirs/onnx/vis [--compare-checkpoint CKPT]

The network runs in onnxruntime; loading, resizing and normalising the image
and resizing the logits back are mmseg's own code from the same config, and
the drawing is mmseg's visualizer (as ``tools/infer.py``), so the picture is
the one PyTorch inference draws.  A file that is not the config's whole
segmentor (a backbone export, another config's classes) is refused before
anything runs.  ``--compare-checkpoint CKPT`` (the checkpoint
the file was exported from) also runs the PyTorch model and prints the share
of pixels whose labels agree.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from inline_mm.engine.launch import add_cfg_options, cli_main  # noqa: E402
from inline_mm.engine.runner_utils import check_image_files  # noqa: E402
from inline_mm.deploy import (DeployError, build_model, check_onnx_fits,  # noqa: E402
                              onnx_session, require_onnx)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Segment images with an ONNX segmentor')
    parser.add_argument('images', nargs='+', help='image files')
    parser.add_argument('--config', required=True, help='the config the model was exported from')
    parser.add_argument('--onnx', required=True, help='ONNX file (export_onnx.py --part model)')
    parser.add_argument('--out-dir', required=True, help='where the drawn images go')
    parser.add_argument('--opacity', type=float, default=0.5,
                        help='opacity of the label colours')
    parser.add_argument('--threads', type=int, default=None, help='onnxruntime threads')
    parser.add_argument('--compare-checkpoint', default=None,
                        help='also run PyTorch with this checkpoint and report label agreement')
    add_cfg_options(parser)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    require_onnx()
    check_image_files(args.images)
    from inline_mm.deploy.segmentor import draw_images, predict_images
    model, cfg, task = build_model(args.config, args.compare_checkpoint,
                                   cfg_options=args.cfg_options)
    if task != 'mmseg':
        raise DeployError('infer_onnx.py runs segmentors; for detectors see '
                          'inline_mm.deploy.detector.predict_image')
    session = onnx_session(args.onnx, args.threads)
    # a backbone export or another config's file would draw meaningless labels
    check_onnx_fits(session, model, 'model', task, args.onnx, args.config)
    results = predict_images(model, session, args.images, args.threads)
    written = draw_images(model, cfg, args.images, results, args.out_dir, args.opacity)
    print(f'wrote {len(written)} image(s) to {args.out_dir}')
    if args.compare_checkpoint:
        from mmseg.apis import inference_model
        for path, result in zip(args.images, results):
            ref = inference_model(model, path).pred_sem_seg.data
            agree = (ref == result.pred_sem_seg.data).float().mean().item()
            print(f'  {osp.basename(path)}: {100 * agree:.3f} % of pixels as PyTorch')
    return 0


if __name__ == '__main__':
    sys.exit(cli_main(main))
