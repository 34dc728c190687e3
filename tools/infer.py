#!/usr/bin/env python
"""Run a trained model on images and write the visualised predictions.

    python tools/infer.py img1.jpg img2.jpg --config CONFIG --checkpoint CKPT --out-dir out/

Detection configs draw boxes and masks; segmentation configs a colour-coded
label map over the image.  The task comes from the config's default_scope.
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import mmcv  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.utils import ProgressBar  # noqa: E402

from inline_mm.runner_utils import task_of  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Visualise predictions on images')
    parser.add_argument('images', nargs='+', help='image files')
    parser.add_argument('--config', required=True, help='config file')
    parser.add_argument('--checkpoint', required=True, help='checkpoint file')
    parser.add_argument('--out-dir', required=True, help='where the drawn images go')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detection: draw instances above this score')
    parser.add_argument('--opacity', type=float, default=0.5,
                        help='segmentation: opacity of the label colours')
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    missing = [p for p in args.images if not osp.isfile(p)]
    if missing:
        raise FileNotFoundError(f'image file(s) not found: {", ".join(missing)}')
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint {args.checkpoint!r} not found')
    cfg = Config.fromfile(args.config)
    task = task_of(cfg)
    os.makedirs(args.out_dir, exist_ok=True)
    if task == 'mmdet':
        from mmdet.apis import inference_detector, init_detector
        from mmdet.registry import VISUALIZERS
        model = init_detector(cfg, args.checkpoint, device=args.device)
        predict = inference_detector
    else:
        from mmseg.apis import inference_model, init_model
        from mmseg.registry import VISUALIZERS
        model = init_model(cfg, args.checkpoint, device=args.device)
        predict = inference_model
    visualizer = VISUALIZERS.build(dict(cfg.visualizer, name='inline_mm_infer',
                                        save_dir=None, vis_backends=None))
    visualizer.dataset_meta = model.dataset_meta
    bar = ProgressBar(len(args.images))
    for path in args.images:
        result = predict(model, path)
        image = mmcv.imconvert(mmcv.imread(path), 'bgr', 'rgb')
        out_file = osp.join(args.out_dir, osp.splitext(osp.basename(path))[0] + '.png')
        kwargs = dict(pred_score_thr=args.score_thr) if task == 'mmdet' else {}
        if task == 'mmseg':
            visualizer.alpha = args.opacity
        visualizer.add_datasample(osp.basename(path), image, data_sample=result,
                                  draw_gt=False, show=False, out_file=out_file, **kwargs)
        bar.update()
    print(f'\nwrote {len(args.images)} image(s) to {args.out_dir}')


if __name__ == '__main__':
    main()
