"""Drawing test predictions of segmentors where detectors' drawings go.

mmdet's ``DetVisualizationHook`` writes ``--show-dir`` drawings to
``<work_dir>/<timestamp>/<show-dir>/<image name>``; mmseg's
``SegVisualizationHook`` has no such option and hands every drawing to the
visualizer's backends (``vis_data/vis_image/test_<name>_<step>.png``).
:class:`SegTestVisualizationHook` gives segmentors the mmdet behaviour, so
``tools/test.py --show-dir`` means the same folder for both tasks.
"""
import os
import os.path as osp
from typing import Optional, Sequence

try:
    import mmcv
    from mmengine.fileio import get as get_file
    from mmseg.engine.hooks import SegVisualizationHook
    from mmseg.registry import HOOKS
except ImportError:  # segmentation toolkit not installed
    SegVisualizationHook = None

if SegVisualizationHook is not None:

    @HOOKS.register_module()
    class SegTestVisualizationHook(SegVisualizationHook):
        """``SegVisualizationHook`` that writes test drawings into ``test_out_dir``.

        Args:
            test_out_dir: folder under ``<work_dir>/<timestamp>/`` for the
                drawings of the test loop (one PNG per image, named after it);
                None keeps mmseg's behaviour.
            **kwargs: as for mmseg's ``SegVisualizationHook``.
        """

        def __init__(self, test_out_dir: Optional[str] = None, **kwargs) -> None:
            super().__init__(**kwargs)
            self.test_out_dir = test_out_dir
            self._drawn = 0  # the visualizer's step of each drawing (mmseg keeps no count)

        def after_test_iter(self, runner, batch_idx: int, data_batch: dict,
                            outputs: Sequence) -> None:
            if not self.draw or self.test_out_dir is None:
                return super().after_test_iter(runner, batch_idx, data_batch, outputs)
            out_dir = osp.join(runner.work_dir, runner.timestamp, self.test_out_dir)
            os.makedirs(out_dir, exist_ok=True)
            for data_sample in outputs:
                self._drawn += 1
                img = mmcv.imfrombytes(get_file(data_sample.img_path,
                                                backend_args=self.backend_args),
                                       channel_order='rgb')
                name = osp.splitext(osp.basename(data_sample.img_path))[0] + '.png'
                self._visualizer.add_datasample(
                    f'test_{name}', img, data_sample=data_sample, show=self.show,
                    wait_time=self.wait_time, out_file=osp.join(out_dir, name),
                    step=self._drawn)
