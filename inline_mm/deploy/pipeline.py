"""One image through a config's test pipeline and the model's data preprocessor.

The preprocessing of the ONNX runners must be the toolkits' own, so that
onnxruntime sees what PyTorch inference sees; mmseg keeps its version of
this step private (``mmseg.apis.inference``), mmdet's is inside
``inference_detector``.  This is the same step through public calls only:
mmcv's ``Compose`` on the test pipeline, then ``model.data_preprocessor``.
"""
import copy
from typing import Any, Dict, List

import numpy as np
import torch
import torch.nn as nn


def preprocess_image(model: nn.Module, image: Any, pipeline_cfg: List[dict],
                     scope: str, **info: Any) -> Dict[str, Any]:
    """``dict(inputs=batch tensor, data_samples=[sample])`` for one image.

    Args:
        model: the detector / segmentor (its ``data_preprocessor`` runs).
        image: a file path or an image array (HxWxC, BGR as mmcv reads).
        pipeline_cfg: the test pipeline; not changed (an array input gets a
            copy whose loader is ``<scope>.LoadImageFromNDArray``).
        scope: ``'mmdet'`` or ``'mmseg'``, the registry of the array loader.
        **info: more keys of the pipeline's input dict (``img_id=0``).
    """
    from mmcv.transforms import Compose
    pipeline_cfg = copy.deepcopy(list(pipeline_cfg))
    if isinstance(image, np.ndarray):
        pipeline_cfg[0]['type'] = f'{scope}.LoadImageFromNDArray'
        data = dict(img=image, **info)
    else:
        data = dict(img_path=image, **info)
    data = Compose(pipeline_cfg)(data)
    with torch.no_grad():
        return model.data_preprocessor(dict(inputs=[data['inputs']],
                                            data_samples=[data['data_samples']]), False)
