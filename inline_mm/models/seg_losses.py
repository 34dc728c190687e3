"""A class-weighted cross-entropy for mmseg that accepts ignored (padded) pixels.

mmseg 1.2.2's ``CrossEntropyLoss`` with ``class_weight`` computes its
averaging factor as ``class_weight[label]`` over every pixel, so a batch that
holds the ignore label (255: padded borders, ``reduce_zero_label``'s
"other") ends the run with an ``IndexError``
(open-mmlab/mmsegmentation#3734, #3831); mmseg 1.2.1 fails on every
class-weighted batch (a ``ValueError``).  :class:`IgnoreSafeCrossEntropyLoss`
computes that factor over the labelled pixels only, the weighted mean
``torch.nn.functional.cross_entropy(weight=..., reduction='mean')`` takes, and
leaves everything else to mmseg's loss.

Registered in mmseg's ``MODELS`` when this module is imported
(``custom_imports = dict(imports=['inline_mm.models.seg_losses'])``).
"""
from typing import Optional

from mmseg.models.losses import CrossEntropyLoss
from mmseg.registry import MODELS
from torch import Tensor


@MODELS.register_module()
class IgnoreSafeCrossEntropyLoss(CrossEntropyLoss):
    """mmseg's ``CrossEntropyLoss`` whose ``class_weight`` works with ignored pixels.

    With ``class_weight`` and the ``'mean'`` reduction the loss is
    ``sum_i w[y_i] * ce_i / sum_i w[y_i]`` over the pixels whose label is not
    ``ignore_index`` (ignored pixels weigh 0, whatever ``avg_non_ignore``
    says); every other setting is mmseg's loss unchanged.  Arguments as
    mmseg's ``CrossEntropyLoss``.
    """

    def forward(self, cls_score: Tensor, label: Tensor, weight: Optional[Tensor] = None,
                avg_factor: Optional[float] = None, reduction_override: Optional[str] = None,
                ignore_index: int = -100, **kwargs) -> Tensor:
        reduction = reduction_override or self.reduction
        if (self.class_weight is not None and avg_factor is None and reduction == 'mean'
                and not self.use_sigmoid and not self.use_mask):
            avg_factor = self.weighted_pixel_count(label, cls_score, ignore_index)
        return super().forward(cls_score, label, weight=weight, avg_factor=avg_factor,
                               reduction_override=reduction_override,
                               ignore_index=ignore_index, **kwargs)

    def weighted_pixel_count(self, label: Tensor, cls_score: Tensor,
                             ignore_index: int) -> Tensor:
        """``sum_i w[y_i]`` over the labelled pixels: the weighted mean's denominator.

        Labels outside the classes are clamped here only to index the weights;
        ``F.cross_entropy`` itself then reports them (``Target ... is out of
        bounds``).  No host synchronisation: the count stays on the device.
        """
        class_weight = cls_score.new_tensor(self.class_weight)
        labelled = label != ignore_index
        index = label.clamp(0, class_weight.numel() - 1)
        return (class_weight[index] * labelled).sum()
