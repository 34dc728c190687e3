"""mmcv's compiled ops run on the CPU and agree with torchvision."""
import torch
import torchvision
from mmcv.ops import RoIAlign, batched_nms, nms


def test_roi_align_forward_backward_matches_torchvision():
    torch.manual_seed(0)
    feat = torch.randn(2, 4, 16, 20, dtype=torch.float64)
    rois = torch.tensor([[0, 1.0, 2.0, 10.5, 12.0],
                         [1, 0.0, 0.0, 19.0, 15.0],
                         [0, 5.2, 3.3, 8.8, 9.9],
                         [1, 12.0, 1.0, 18.5, 6.0]], dtype=torch.float64)
    out_size, scale, ratio = (5, 4), 0.5, 2
    ours_in = feat.clone().requires_grad_(True)
    ref_in = feat.clone().requires_grad_(True)
    ours = RoIAlign(out_size, scale, ratio, aligned=True)(ours_in, rois)
    ref = torchvision.ops.roi_align(ref_in, rois, out_size, scale, ratio, aligned=True)
    assert ours.shape == (4, 4, 5, 4)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-8)
    grad = torch.randn_like(ours)
    ours.backward(grad)
    ref.backward(grad)
    assert ours_in.grad.abs().sum() > 0
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-6, atol=1e-8)


def test_batched_nms_matches_torchvision():
    g = torch.Generator().manual_seed(1)
    xy = torch.rand(200, 2, generator=g) * 100
    wh = torch.rand(200, 2, generator=g) * 30 + 2
    boxes = torch.cat([xy, xy + wh], dim=1)
    scores = torch.rand(200, generator=g)
    labels = torch.randint(0, 4, (200,), generator=g)
    dets, keep = batched_nms(boxes, scores, labels, dict(type='nms', iou_threshold=0.5))
    ref_keep = torchvision.ops.batched_nms(boxes, scores, labels, 0.5)
    assert keep.tolist() == ref_keep.tolist()
    torch.testing.assert_close(dets[:, 4], scores[ref_keep])
    # plain nms too: boxes overlapping a better box above the threshold are dropped
    _, keep_single = nms(boxes, scores, 0.5)
    assert keep_single.tolist() == torchvision.ops.nms(boxes, scores, 0.5).tolist()
    assert 0 < len(ref_keep) < 200
