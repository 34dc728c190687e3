"""Detectors with ONNX features: backbone + neck in onnxruntime, heads in PyTorch.

Whole Mask R-CNN export goes through mmdeploy (RoIAlign, NMS and the box /
mask post-processing need its rewrites and custom ops); the fallback here
exports ``extract_feat`` (``--part backbone_neck``) with dynamic sizes and
runs mmdet's own RPN and RoI heads on the onnxruntime feature maps.
"""
from typing import List, Optional

import numpy as np
import torch
import torch.nn as nn

from .onnx_check import run_onnxruntime
from .pipeline import preprocess_image


def predict_with_features(model: nn.Module, feats: List[np.ndarray | torch.Tensor],
                          data_samples: list, rescale: bool = True) -> list:
    """mmdet's two-stage ``predict`` from given FPN maps instead of ``extract_feat``.

    Args:
        model: an mmdet two-stage detector (Mask R-CNN, Faster R-CNN ...).
        feats: the neck outputs (e.g. from onnxruntime), finest first.
        data_samples: the batch's ``DetDataSample`` (from the data preprocessor).
        rescale: boxes / masks in the original image's coordinates.

    Returns:
        The data samples with ``pred_instances``.
    """
    x = tuple(torch.as_tensor(np.asarray(f)) for f in feats)
    with torch.no_grad():
        if data_samples[0].get('proposals', None) is None:
            proposals = model.rpn_head.predict(x, data_samples, rescale=False)
        else:
            proposals = [s.proposals for s in data_samples]
        results = model.roi_head.predict(x, proposals, data_samples, rescale=rescale)
    return model.add_pred_to_datasample(data_samples, results)


def predict_image(model: nn.Module, session, image: str | np.ndarray,
                  threads: Optional[int] = None) -> object:
    """Detect on one image: mmdet's test pipeline and data preprocessor, the ONNX
    backbone + neck ``session``, then the PyTorch heads.  Returns a ``DetDataSample``."""
    from mmdet.utils import get_test_pipeline_cfg
    data = preprocess_image(model, image, get_test_pipeline_cfg(model.cfg.copy()), 'mmdet',
                            img_id=0)
    feats = run_onnxruntime(session, data['inputs'], threads)
    return predict_with_features(model, feats, data['data_samples'])[0]
