#!/usr/bin/env python
"""Run a trained model on images and write the visualised predictions.

    python tools/infer.py img1.jpg img2.jpg --config CONFIG --checkpoint CKPT --out-dir out/

Detection configs draw boxes and masks; segmentation configs a colour-coded
label map over the image.  The task comes from the config's default_scope.

Why not the toolkits' ``DetInferencer`` / ``MMSegInferencer``: they load with
mmengine's plain ``torch.load`` (refused by torch >= 2.6 for the full checkpoints
training writes) and load a checkpoint of another model with ``strict=False``; this
tool reads with ``weights_only=True``, refuses a checkpoint that does not fit the
config, and has ``--amp``.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from inline_mm.engine.amp import enable_inference_autocast  # noqa: E402
from inline_mm.engine.atomic_io import check_can_make_folder  # noqa: E402
from inline_mm.engine.launch import add_cfg_options, cli_main, load_config  # noqa: E402
from inline_mm.engine.runner_utils import (check_image_files, draw_predictions,  # noqa: E402
                                           load_trained_model, task_of)
from inline_mm.errors import ConfigError, MissingFileError  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Visualise predictions on images')
    parser.add_argument('images', nargs='+', help='image files')
    parser.add_argument('--config', required=True, help='config file')
    parser.add_argument('--checkpoint', required=True, help='checkpoint file')
    parser.add_argument('--out-dir', required=True, help='where the drawn images go')
    parser.add_argument('--device', default=None,
                        help='device to run on (default: cuda when a GPU is available, else cpu)')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision: fp16 on a GPU, bf16 on the CPU (detectors: '
                        'backbone and neck, the heads and mmcv ops stay fp32)')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detection: draw instances above this score')
    parser.add_argument('--opacity', type=float, default=0.5,
                        help='segmentation: opacity of the label colours')
    add_cfg_options(parser)
    args = parser.parse_args(argv)
    if args.device is None:
        import torch
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    check_image_files(args.images)
    if not osp.isfile(args.checkpoint):
        raise MissingFileError(f'checkpoint {args.checkpoint!r} not found')
    try:
        check_can_make_folder(args.out_dir)
    except OSError as err:
        raise ConfigError(f'--out-dir {args.out_dir!r} cannot be made: {err.strerror}') from None
    cfg = load_config(args.config, args.cfg_options)
    # a checkpoint that is not one, or not of this config's model, is refused in one line
    # (the toolkits' init_model would load it with a warning and draw meaningless output)
    model = load_trained_model(cfg, args.checkpoint, args.device)
    if args.amp:
        enable_inference_autocast(model, task_of(cfg))
    written = draw_predictions(model, cfg, args.images, args.out_dir, args.score_thr,
                               args.opacity)
    print(f'\nwrote {len(written)} image(s) to {args.out_dir}')


if __name__ == '__main__':
    sys.exit(cli_main(main))
