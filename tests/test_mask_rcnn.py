"""mmdet's own Mask R-CNN base config trains and infers on the CPU (real ops, real stack)."""
import numpy as np
import pytest
import torch
from mmdet.structures import DetDataSample
from mmdet.structures.mask import BitmapMasks
from mmengine.registry import init_default_scope
from mmengine.structures import InstanceData

from inline_mm.engine.launch import read_config
import inline_mm  # noqa: F401

BACKBONES = {
    'resnet50': None,
    'inline_pvt': dict(
        backbone=dict(_delete_=True, type='InLinePVT', arch='tiny', depths=[1, 1, 1, 1]),
        neck=dict(in_channels=[64, 128, 320, 512])),
}


def _config(tmp_path, backbone):
    text = ["_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'",
            "custom_imports = dict(imports=['inline_mm'], allow_failed_imports=False)",
            "model = dict(backbone=dict(init_cfg=None))"]
    if BACKBONES[backbone]:
        text[-1] = f'model = {BACKBONES[backbone]!r}'
    path = tmp_path / 'mask_rcnn_test.py'
    path.write_text('\n'.join(text) + '\n')
    return read_config(str(path))


def _sample(h=320, w=480):
    g = torch.Generator().manual_seed(0)
    image = (torch.rand(3, h, w, generator=g) * 255).to(torch.uint8)
    boxes = torch.tensor([[40., 30., 200., 160.], [250., 100., 420., 290.]])
    masks = np.zeros((2, h, w), dtype=np.uint8)
    for i, (x1, y1, x2, y2) in enumerate(boxes.int().tolist()):
        masks[i, y1:y2, x1:x2] = 1
        colour = torch.tensor([200, 40 + 100 * i, 30], dtype=torch.uint8)
        image[:, y1:y2, x1:x2] = colour[:, None, None]
    sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w),
                                         scale_factor=(1.0, 1.0), batch_input_shape=(h, w)))
    sample.gt_instances = InstanceData(bboxes=boxes, labels=torch.tensor([1, 5]),
                                       masks=BitmapMasks(masks, h, w))
    return image, sample


# the ResNet-50 reference runs in the full suite only (make test)
@pytest.mark.parametrize('backbone', [pytest.param(b, marks=pytest.mark.slow) if b == 'resnet50'
                                      else b for b in BACKBONES])
def test_mask_rcnn_train_and_inference_step(tmp_path, backbone):
    cfg = _config(tmp_path, backbone)
    init_default_scope('mmdet')
    from mmdet.registry import MODELS
    model = MODELS.build(cfg.model)
    model.init_weights()
    image, sample = _sample()

    model.train()
    data = model.data_preprocessor(dict(inputs=[image], data_samples=[sample]), True)
    losses = model(**data, mode='loss')
    for name in ('loss_rpn_cls', 'loss_cls', 'loss_bbox', 'loss_mask'):
        assert name in losses
    total = sum(v.sum() if isinstance(v, torch.Tensor) else sum(x.sum() for x in v)
                for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(total)
    total.backward()
    # the losses reach every trainable backbone parameter
    trainable = [(n, p) for n, p in model.backbone.named_parameters() if p.requires_grad]
    assert trainable and [n for n, p in trainable if p.grad is None] == []
    assert all(torch.isfinite(p.grad).all() for _, p in trainable)

    model.eval()
    with torch.no_grad():
        results = model.test_step(dict(inputs=[image], data_samples=[sample.clone()]))
    pred = results[0].pred_instances
    assert pred.bboxes.shape[1] == 4
    assert len(pred.bboxes) == len(pred.scores) == len(pred.labels) == len(pred.masks)
    assert pred.masks.shape[1:] == (320, 480)
