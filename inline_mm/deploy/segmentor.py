"""Segmentation with an exported segmentor: mmseg's pre- and post-processing around
onnxruntime.

The ONNX file holds the network (``--part model``: normalised image -> logits
at the input size).  Loading, resizing, normalising and padding the image,
and cropping / resizing the logits back to the original image, are mmseg's
own code (the config's test pipeline, the model's data preprocessor and
``postprocess_result``), so the label map is the one PyTorch inference draws.
"""
import os
import os.path as osp
from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn

from .onnx_check import run_onnxruntime
from .pipeline import preprocess_image


def predict_images(model: nn.Module, session, images: Sequence[str | np.ndarray],
                   threads: Optional[int] = None) -> List[object]:
    """Segment images with an ONNX segmentor ``session``; returns ``SegDataSample`` s.

    ``model`` (built from the same config, weights unused) supplies the
    pipeline, the data preprocessor and the post-processing.
    """
    # mmseg's inference_model drops the annotation loader of the test pipeline
    pipeline_cfg = [t for t in model.cfg.test_pipeline if t.get('type') != 'LoadAnnotations']
    results = []
    for image in images:
        data = preprocess_image(model, image, pipeline_cfg, 'mmseg')
        logits = run_onnxruntime(session, data['inputs'], threads)[0]
        with torch.no_grad():
            results += model.postprocess_result(torch.from_numpy(logits), data['data_samples'])
    return results


def draw_images(model: nn.Module, cfg, images: Sequence[str], results: Sequence[object],
                out_dir: str, opacity: float = 0.5) -> List[str]:
    """Draw label maps over the images with mmseg's visualizer (PNG files in ``out_dir``)."""
    import mmcv
    from mmseg.registry import VISUALIZERS

    from ..engine.runner_utils import dataset_metainfo, drawing_names
    os.makedirs(out_dir, exist_ok=True)
    visualizer = VISUALIZERS.build(dict(cfg.visualizer, name=f'inline_mm_onnx_{id(model)}',
                                        save_dir=None, vis_backends=None))
    # a model loaded from a checkpoint carries its classes; a freshly built one takes
    # those of the config's test dataset
    visualizer.dataset_meta = getattr(model, 'dataset_meta', None) or dataset_metainfo(cfg)
    visualizer.alpha = opacity
    written = []
    for path, result, name in zip(images, results, drawing_names(images)):
        image = mmcv.imconvert(mmcv.imread(path), 'bgr', 'rgb')
        out_file = osp.join(out_dir, name)
        visualizer.add_datasample(osp.basename(path), image, data_sample=result,
                                  draw_gt=False, show=False, out_file=out_file)
        written.append(out_file)
    return written
