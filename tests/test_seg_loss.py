"""IgnoreSafeCrossEntropyLoss: mmseg's class-weighted cross-entropy with ignored pixels."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip('mmseg')
from mmseg.models.losses import CrossEntropyLoss  # noqa: E402
from mmseg.registry import MODELS  # noqa: E402

import inline_mm.models.seg_losses  # noqa: E402,F401  (registers the loss)

WEIGHTS = [0.25, 1.0, 2.0, 1.0]


def build_loss(**kwargs):
    """The loss from mmseg's registry, as a config names it (whatever scope an earlier
    test left as the default)."""
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmseg'):
        return MODELS.build(dict(type='IgnoreSafeCrossEntropyLoss', **kwargs))


def _batch(with_ignored: bool):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 6, 7, generator=g)
    label = torch.randint(0, 4, (2, 6, 7), generator=g)
    if with_ignored:  # a padded border, as a batch of non-square images gets
        label[1, :, 5:] = 255
    return logits, label


def test_class_weight_with_ignored_pixels_is_pytorchs_weighted_mean():
    loss = build_loss(class_weight=WEIGHTS, loss_weight=0.5)
    logits, label = _batch(with_ignored=True)
    expected = F.cross_entropy(logits, label, weight=torch.tensor(WEIGHTS), ignore_index=255)
    torch.testing.assert_close(loss(logits, label, ignore_index=255), 0.5 * expected)
    # OpenMMLab's mmseg (1.2.2, the last of its line) fails on the same batch, the reason
    # this loss exists; OneDL's continuation (1.4) no longer does
    from inline_mm import stack
    if stack.check_stack() is stack.OPENMMLAB:
        with pytest.raises(IndexError):
            CrossEntropyLoss(class_weight=WEIGHTS)(logits, label, ignore_index=255)
    else:
        assert torch.isfinite(CrossEntropyLoss(class_weight=WEIGHTS)(
            logits, label, ignore_index=255))


def test_same_as_mmseg_where_mmseg_works():
    import mmseg
    logits, label = _batch(with_ignored=False)
    for kwargs in (dict(class_weight=WEIGHTS), dict(), dict(avg_non_ignore=True)):
        ours = build_loss(**kwargs)(logits, label, ignore_index=255)
        try:
            theirs = CrossEntropyLoss(**kwargs)(logits, label, ignore_index=255)
        except ValueError:
            # mmseg 1.2.1 (the floor) fails on every class-weighted batch, ignored pixels
            # or not ("only one element tensors ..."); 1.2.2 on those with ignored pixels
            assert 'class_weight' in kwargs and mmseg.__version__ == '1.2.1', mmseg.__version__
            theirs = F.cross_entropy(logits, label, weight=torch.tensor(WEIGHTS))
        torch.testing.assert_close(ours, theirs)


def test_labels_outside_the_classes_still_fail():
    loss = build_loss(class_weight=WEIGHTS)
    logits, label = _batch(with_ignored=True)
    label[0, 0, 0] = 7
    with pytest.raises((IndexError, RuntimeError), match='out of bounds'):
        loss(logits, label, ignore_index=255)


def test_toy_config_trains_on_a_padded_non_square_image():
    """The toy Semantic FPN config pads a 96x128 image to its 128x128 input size with
    label 255; its loss takes that batch (mmseg's class-weighted loss would not)."""
    import os

    from conftest import REPO_ROOT
    from mmseg.structures import SegDataSample
    from mmengine.structures import PixelData

    from inline_mm.engine.launch import load_config
    from inline_mm.engine.runner_utils import build_model
    cfg = load_config(os.path.join(REPO_ROOT, 'configs', 'seg', 'toy', 'fpn_inline_pvt_toy.py'))
    assert cfg.model.decode_head.loss_decode.type == 'IgnoreSafeCrossEntropyLoss'
    model = build_model(cfg)
    g = torch.Generator().manual_seed(0)
    image = (torch.rand(3, 96, 128, generator=g) * 255).to(torch.uint8)
    sample = SegDataSample(metainfo=dict(img_shape=(96, 128), ori_shape=(96, 128)))
    sample.gt_sem_seg = PixelData(data=torch.randint(0, 4, (1, 96, 128), generator=g))
    data = model.data_preprocessor(dict(inputs=[image], data_samples=[sample]), True)
    assert (data['data_samples'][0].gt_sem_seg.data == 255).any()  # the padded rows
    losses = model(**data, mode='loss')
    assert torch.isfinite(losses['decode.loss_ce'])
