"""Dataset helpers: deterministic synthetic COCO / ADE20K toy sets.

:mod:`.toy_data` writes the sets, :mod:`.toy_scenes` draws their images (numpy + OpenCV
only).  Importing this package also registers two thin dataset classes whose
``METAINFO`` names the toy classes, into whichever toolkit is installed, so configs
can use them with
``custom_imports=dict(imports=['inline_mm', 'inline_mm.datasets'])``:

* ``ADEToyDataset`` (mmseg ``DATASETS``): needed because mmseg's
  ``ADE20KDataset`` refuses ``metainfo=dict(classes=...)`` whose names are not
  a subset of its 150 ADE20K classes (``BaseSegDataset.get_label_map`` raises
  ``ValueError``).  Same file layout and suffixes, ``reduce_zero_label=True``.
* ``CocoToyDataset`` (mmdet ``DATASETS``): ``CocoDataset`` with the toy
  classes and palette as defaults (``CocoDataset`` itself also accepts
  ``metainfo=dict(classes=COCO_TOY_CLASSES)``).
"""
from . import toy_data
from .toy_data import *  # noqa: F401,F403

__all__ = list(toy_data.__all__)

try:
    from mmseg.datasets import ADE20KDataset
    from mmseg.registry import DATASETS as MMSEG_DATASETS
except ImportError:  # segmentation toolkit not installed
    pass
else:
    @MMSEG_DATASETS.register_module()
    class ADEToyDataset(ADE20KDataset):
        """mmseg ``ADE20KDataset`` for the set written by :func:`make_ade_toy`."""
        METAINFO = dict(classes=toy_data.ADE_TOY_CLASSES, palette=toy_data.ADE_TOY_PALETTE)

    __all__.append('ADEToyDataset')

try:
    from mmdet.datasets import CocoDataset
    from mmdet.registry import DATASETS as MMDET_DATASETS
except ImportError:  # detection toolkit not installed
    pass
else:
    @MMDET_DATASETS.register_module()
    class CocoToyDataset(CocoDataset):
        """mmdet ``CocoDataset`` for the set written by :func:`make_coco_toy`.

        The default classes are the three of ``num_classes=3``; for a set made
        with more classes pass ``metainfo=dict(classes=coco_toy_classes(n))``.
        """
        # The palette covers all five classes, so it also fits larger sets.
        METAINFO = dict(classes=toy_data.COCO_TOY_CLASSES, palette=toy_data.COCO_TOY_PALETTE)

    __all__.append('CocoToyDataset')
