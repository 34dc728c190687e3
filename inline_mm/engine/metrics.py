"""``tools/test.py --out`` for segmentors: keep the label maps, not the logits.

mmengine's ``DumpResults`` pickles every data sample whole; a segmentor's
samples carry ``seg_logits`` (classes x H x W floats per image), so 40 toy
images give a 108 MB file.  :class:`DumpSegResults` keeps what evaluation and
users need: the predicted label map (as the smallest integer type that holds
the class indices), the ground-truth path and the image metadata.
"""
from typing import Any, Dict, Sequence

import torch
from mmengine.evaluator import DumpResults

#: per-sample entries kept besides the predicted label map
KEPT_META = ('img_path', 'seg_map_path', 'ori_shape', 'img_shape', 'pad_shape',
             'scale_factor', 'flip', 'flip_direction', 'reduce_zero_label')

try:
    from mmseg.registry import METRICS
except ImportError:  # segmentation toolkit not installed
    METRICS = None


def _compact_labels(labels: torch.Tensor) -> torch.Tensor:
    """Class indices in the smallest integer type that holds them."""
    top = int(labels.max()) if labels.numel() else 0
    return labels.to(torch.uint8 if top < 256 else torch.int16 if top < 32768 else torch.int32)


class DumpSegResults(DumpResults):
    """Dump segmentation predictions: label maps and metadata, no logits.

    Each entry of the pickle is a dict with ``pred_sem_seg`` (``(1, H, W)``
    integer tensor at the original image size) and the keys of
    :data:`KEPT_META` the sample has.
    """

    def process(self, data_batch: Any, predictions: Sequence[Dict]) -> None:
        kept = []
        for sample in predictions:
            entry = {k: sample[k] for k in KEPT_META if k in sample}
            entry['pred_sem_seg'] = _compact_labels(sample['pred_sem_seg']['data'].cpu())
            kept.append(entry)
        super().process(data_batch, kept)


if METRICS is not None:
    METRICS.register_module(module=DumpSegResults)
