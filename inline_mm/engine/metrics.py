"""Segmentation evaluators for ``tools/test.py``: ``--out`` and ``--confusion-matrix``.

mmengine's ``DumpResults`` pickles every data sample whole; a segmentor's
samples carry ``seg_logits`` (classes x H x W floats per image), so 40 toy
images give a 108 MB file.  :class:`DumpSegResults` keeps what evaluation and
users need: the predicted label map (as the smallest integer type that holds
the class indices), the ground-truth path and the image metadata.

mmseg's ``tools/analysis_tools/confusion_matrix.py`` reads predictions saved as
label files (``format_only`` writes them with ``reduce_zero_label``'s 1 added
back) and subtracts 1 from ground truth its pipeline has already reduced, so on
ADE20K-layout sets (ADE20K itself) its rows and columns are off by one class.
:class:`SegConfusionMatrix` counts inside the test loop, from each sample's own
``gt_sem_seg`` and ``pred_sem_seg``, as mmseg's ``IoUMetric`` does.
"""
import json
from typing import Any, Dict, List, Optional, Sequence

import torch
from mmengine.evaluator import BaseMetric, DumpResults
from mmengine.logging import MMLogger

from ..errors import ConfigError
from .atomic_io import atomic_write, check_can_write

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


class SegConfusionMatrix(BaseMetric):
    """Pixel confusion matrix of a segmentor on its test set.

    Rows are the true classes, columns the predicted ones, counted over the
    pixels whose label is not ``ignore_index`` (the pixels ``IoUMetric``
    scores).  The matrix is logged as percentages of each true class and
    written to ``out_file`` as JSON (``classes``, ``counts``,
    ``percent_of_true`` rounded to 0.01).  It adds no metric to the run's
    results.  ``out_file`` is checked when the metric is built, so an
    unwritable path stops the run before the first image.

    Args:
        out_file (str): the JSON file to write (atomically).
        ignore_index (int): label of the pixels not scored. Defaults to 255.
    """

    default_prefix = 'confusion'

    def __init__(self, out_file: str, ignore_index: int = 255, collect_device: str = 'cpu',
                 prefix: Optional[str] = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        try:  # now, not after the whole test set (and on every rank, not only rank 0)
            check_can_write(out_file)
        except OSError as err:
            raise ConfigError(f'cannot write the confusion matrix to {out_file!r} '
                              f'({err.strerror}): name a file in a writable folder') from err
        self.out_file = out_file
        self.ignore_index = ignore_index

    def process(self, data_batch: Any, data_samples: Sequence[Dict]) -> None:
        n = len(self.dataset_meta['classes'])
        for sample in data_samples:
            if 'gt_sem_seg' not in sample:
                raise ValueError(
                    f'{sample.get("img_path", "a test image")} has no ground-truth label map: '
                    'a confusion matrix needs an annotated test set (seg_map_path in the '
                    'dataset and LoadAnnotations in the test pipeline); run without '
                    '--confusion-matrix on unannotated images')
            pred = sample['pred_sem_seg']['data'].squeeze().cpu().long()
            gt = sample['gt_sem_seg']['data'].squeeze().cpu().long()
            gt, pred = gt[gt != self.ignore_index], pred[gt != self.ignore_index]
            bad = gt[(gt < 0) | (gt >= n)]
            if bad.numel():
                raise ValueError(
                    f'label {int(bad[0])} in {sample.get("seg_map_path", "a label map")} is '
                    f'neither one of the {n} class indices nor ignore_index '
                    f'{self.ignore_index}: check the dataset\'s classes and reduce_zero_label')
            bad = pred[(pred < 0) | (pred >= n)]
            if bad.numel():  # would be counted in another true class's row
                raise ValueError(
                    f'the model predicted class {int(bad[0])} for '
                    f'{sample.get("img_path", "an image")}, but the dataset has {n} classes: '
                    'set the decode head\'s num_classes to the number of classes')
            # the (true, predicted) pairs that occur and their counts: a few per image,
            # where a whole n x n matrix per image would be 360 MB over ADE20K's val set
            counts = torch.bincount(n * gt + pred, minlength=n * n)  # linear, unlike unique
            pairs = counts.nonzero().squeeze(1)
            self.results.append(torch.stack([pairs, counts[pairs]]))

    def compute_metrics(self, results: List[torch.Tensor]) -> Dict[str, float]:
        classes = [str(c) for c in self.dataset_meta['classes']]
        n = len(classes)
        pairs, counts = torch.cat(results, dim=1) if results else torch.zeros(2, 0).long()
        counts = torch.zeros(n * n, dtype=torch.long).index_add_(0, pairs, counts).view(n, n)
        percent = 100 * counts.double() / counts.sum(1, keepdim=True).clamp(min=1)
        atomic_write(json.dumps(dict(classes=classes, rows='true class',
                                     columns='predicted class', counts=counts.tolist(),
                                     percent_of_true=[[round(v, 2) for v in row]
                                                      for row in percent.tolist()]),
                                indent=1), self.out_file)
        width = max(10, *map(len, classes)) + 1
        lines = ['confusion matrix (% of each true class; rows true, columns predicted):',
                 ''.ljust(width) + ''.join(c[:width - 1].rjust(width) for c in classes)]
        lines += [name.ljust(width) + ''.join(f'{v:{width}.1f}' for v in row.tolist())
                  for name, row in zip(classes, percent)]
        lines.append(f'counts and percentages written to {self.out_file}')
        MMLogger.get_current_instance().info('\n'.join(lines))
        return {}


if METRICS is not None:
    METRICS.register_module(module=DumpSegResults)
    METRICS.register_module(module=SegConfusionMatrix)
