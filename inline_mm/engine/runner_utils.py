"""A config's model for the tools, the same calls for mmdet and mmseg.

The toolkits build, run and draw their models through separate APIs, and their
forward needs data samples.  Shared by train / test / infer, the benchmarks,
the FLOP counter and the exporters: :func:`build_model` (in its toolkit's
scope, random backbone weights unless asked), :class:`TensorModeForward`
(backbone, neck and heads on a bare image batch, data samples made for its
size), :func:`dataset_metainfo`, :func:`load_trained_model`,
:func:`check_image_files` and :func:`draw_predictions`.  The dataset
checks are in :mod:`inline_mm.engine.data_checks`.
"""
import importlib
import os
import os.path as osp
from typing import Any, Iterable, List, Optional, Sequence

import torch
from mmengine.config import Config

from ..errors import ConfigError, DataError, MissingFileError

# the dataset checks live in data_checks; these names are imported from here too
from .data_checks import (check_datasets, check_datasets_once, dataset_class,  # noqa: F401
                          dataset_configs, task_of)


def dataset_metainfo(cfg: Config, loader: str = 'test_dataloader') -> dict:
    """Classes / palette of a config's dataset: its class defaults updated by ``metainfo``."""
    task = task_of(cfg)
    found = dataset_configs(cfg, (loader,))
    if not found:
        return {}
    ds = found[0][1]
    cls = dataset_class(task, ds)
    meta = dict(getattr(cls, 'METAINFO', None) or {}) if cls else {}
    meta.update(ds.get('metainfo') or {})
    return meta


def build_model(cfg: Config, pretrained: bool = False) -> Any:
    """Build the detector / segmentor of ``cfg`` in its toolkit's scope.

    Args:
        cfg: a full mmdet / mmseg config.
        pretrained: keep the backbone's ``init_cfg`` (load its ImageNet weights);
            by default random weights, so analysis tools need no checkpoint.
    """
    from mmengine.registry import init_default_scope
    task = task_of(cfg)
    init_default_scope(task)
    model_cfg = cfg.model.copy()
    if not pretrained and 'backbone' in model_cfg:
        model_cfg.backbone = dict(model_cfg.backbone, init_cfg=None)
    try:
        return importlib.import_module(f'{task}.registry').MODELS.build(model_cfg)
    except KeyError as err:  # mmengine's registry: a type name nothing registered
        message = str(err.args[0]) if err.args else ''
        if 'registry' not in message or 'is not in the' not in message:
            raise
        raise ConfigError(f"{message.split('. ')[0]}: check the model's type names in the "
                          'config (inline-mm registers InLinePVT, InLineSwin, InLineCSWin and '
                          'InLineDeiT; a config needs custom_imports=dict(imports=[\'inline_mm'
                          '\']) to use them)') from None


def dummy_data_samples(task: str, height: int, width: int, batch: int = 1) -> list:
    """Data samples with the metadata a tensor-mode forward needs for an ``H x W`` input."""
    module = importlib.import_module(f'{task}.structures')
    sample_cls = module.DetDataSample if task == 'mmdet' else module.SegDataSample
    meta = dict(img_shape=(height, width), ori_shape=(height, width),
                pad_shape=(height, width), batch_input_shape=(height, width),
                scale_factor=(1., 1.))
    return [sample_cls(metainfo=meta) for _ in range(batch)]


class TensorModeForward(torch.nn.Module):
    """``forward(inputs)`` = a detector's / segmentor's tensor-mode forward.

    Backbone, neck and heads on a batch of images, as ``model(inputs, samples,
    mode='tensor')`` runs them (no pre- / post-processing); data samples for
    the input size are made on the fly.  What FLOP counters, benchmarks and exporters run.
    """

    def __init__(self, model: torch.nn.Module, task: str) -> None:
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, inputs: torch.Tensor) -> Any:
        batch, height, width = inputs.shape[0], inputs.shape[-2], inputs.shape[-1]
        if not torch.onnx.is_in_onnx_export():
            # plain ints outside ONNX export (whose graph keeps the sizes symbolic): the
            # samples' metadata is deep-copied, and torch 2.1's jit tracer (mmengine's FLOP
            # counter) cannot copy traced size tensors
            batch, height, width = int(batch), int(height), int(width)
        samples = dummy_data_samples(self.task, height, width, batch)
        return self.model(inputs, samples, mode='tensor')


def load_trained_model(cfg: Config, checkpoint: str, device: str = 'cpu',
                       parts: Optional[Sequence[str]] = None) -> Any:
    """The config's model with a trained checkpoint's weights, for inference.

    What the toolkits' ``init_detector`` / ``init_model`` return (``model.cfg``
    set, eval mode on ``device``; mmdet's also with SyncBN reverted), with the
    checkpoint read once, safely
    (:func:`~inline_mm.checkpoint.load_checkpoint_file`), and refused in one
    line when it does not fit the model
    (:func:`~inline_mm.engine.model_fit.check_checkpoint_fits`); with ``parts``
    only those are checked and loaded (an export of the backbone takes it from
    another model's checkpoint without the warnings of the rest).  The toolkits
    load another model's checkpoint with a warning, mmseg's fails with a
    ``KeyError`` on a checkpoint without ``meta`` (converted weights), and both
    fall back to COCO / Cityscapes classes when the meta has no
    ``dataset_meta``: here the config's dataset classes and palette are taken.
    """
    import warnings

    from mmengine.logging import print_log
    from mmengine.runner import load_state_dict

    from ..checkpoint import load_checkpoint_file
    from ..models.pretrained import extract_state_dict
    from .model_fit import check_checkpoint_fits
    if task_of(cfg) == 'mmdet':
        from mmdet.apis import init_detector as init_model
    else:
        from mmseg.apis import init_model
    with warnings.catch_warnings():  # 'checkpoint is None, use COCO classes by default'
        warnings.simplefilter('ignore')
        model = init_model(cfg, None, device='cpu')
    loaded = load_checkpoint_file(checkpoint)
    check_checkpoint_fits(model, checkpoint, checkpoint=loaded, parts=parts)
    state = extract_state_dict(loaded, prefix='')
    if parts is None:
        load_state_dict(model, state, strict=False)
    else:  # only these: the checkpoint may be another model's (its heads not this one's)
        for part in parts:
            module = getattr(model, part, None)  # mmseg's UperNet configs have no neck
            if module is not None:
                load_state_dict(module, {k[len(part) + 1:]: v for k, v in state.items()
                                         if k.startswith(part + '.')}, strict=False)
    print_log(f'loaded the weights of {checkpoint}', logger='current')
    model.dataset_meta = _inference_dataset_meta(cfg, loaded.get('meta'))
    return model.to(device).eval()


def _inference_dataset_meta(cfg: Config, meta: Any) -> dict:
    """Classes and palette for drawing, in the toolkits' order, without their fallbacks.

    The checkpoint's classes (``dataset_meta``, or the 2.x toolkits' ``CLASSES`` /
    ``PALETTE``), else the config's dataset's.  The palette: for detectors the
    config's first (as ``init_detector``), for segmentors the checkpoint's first
    (as mmseg's ``init_model``); without one, a fixed random palette (mmdet's
    ``'random'``; for mmseg seeded as its datasets make one).
    """
    import numpy as np
    meta = meta if isinstance(meta, dict) else {}
    saved = meta.get('dataset_meta') if isinstance(meta.get('dataset_meta'), dict) else \
        {'classes': meta.get('CLASSES'), 'palette': meta.get('PALETTE')}
    saved = {k.lower(): v for k, v in saved.items() if v is not None}
    own = dataset_metainfo(cfg)
    dataset_meta = dict(saved) if saved.get('classes') else dict(own)
    if task_of(cfg) == 'mmdet':
        palette = own.get('palette') or saved.get('palette') or 'random'
    else:
        palette = saved.get('palette') or own.get('palette') or np.random.RandomState(
            42).randint(0, 255, size=(len(dataset_meta.get('classes') or ()), 3)).tolist()
    dataset_meta['palette'] = palette
    return dataset_meta


def check_image_files(paths: Sequence[str]) -> None:
    """Refuse, before a model is built, image paths that are absent or not images.

    The toolkits' image loaders stop at such a file with a bare ``AssertionError``
    after the earlier images' drawings are written.  Each file is decoded once
    (with mmcv, as their loaders do).

    Raises:
        MissingFileError: files that do not exist.
        DataError: files mmcv cannot decode (text, an empty or cut download ...).
    """
    import mmcv
    missing = [p for p in paths if not osp.isfile(p)]
    if missing:
        raise MissingFileError(f'image file(s) not found: {", ".join(missing)}')
    def readable(path: str) -> bool:
        try:
            return mmcv.imread(path) is not None
        except Exception:  # an empty file: OpenCV's assertion on the empty buffer
            return False
    unreadable = [p for p in paths if not readable(p)]
    if unreadable:
        raise DataError(f'{len(unreadable)} of the {len(paths)} file(s) given are not images '
                        f'mmcv can read: {", ".join(unreadable)}; pass image files (JPEG, '
                        f'PNG, BMP, TIFF ...)')


def drawing_names(images: Sequence[str]) -> List[str]:
    """One PNG file name per image, after the image's own name.

    Images that share a name (``a/x.jpg`` and ``b/x.jpg``, or ``x.jpg`` and
    ``x.png``) would overwrite each other's drawing: the second becomes
    ``x_2.png`` (the third ``x_3.png`` ...), a suffix no input's own name takes.
    Names that differ in case only (``X.jpg``, ``x.jpg``) count as the same: they
    are one file on case-insensitive file systems (macOS, Windows).
    """
    stems = [osp.splitext(osp.basename(path))[0] for path in images]
    own, taken, names = {s.casefold() for s in stems}, set(), []
    for stem in stems:
        name, k = stem, 1
        while name.casefold() in taken or (k > 1 and name.casefold() in own):
            k += 1
            name = f'{stem}_{k}'
        taken.add(name.casefold())
        names.append(name + '.png')
    return names


def draw_predictions(model, cfg: Config, images: Iterable[str], out_dir: str,
                     score_thr: float = 0.3, opacity: float = 0.5,
                     progress: bool = True) -> List[str]:
    """Run ``model`` on image files and write the drawn predictions as PNG files.

    Detection configs get boxes and masks; segmentation configs a colour-coded
    label map over the image.  Returns the written paths.
    """
    import mmcv
    from mmengine.utils import ProgressBar
    task = task_of(cfg)
    if task == 'mmdet':
        from mmdet.apis import inference_detector as predict
        from mmdet.registry import VISUALIZERS
    else:
        from mmseg.apis import inference_model as predict
        from mmseg.registry import VISUALIZERS
    images = list(images)
    os.makedirs(out_dir, exist_ok=True)
    visualizer = VISUALIZERS.build(dict(cfg.visualizer, name=f'inline_mm_draw_{id(model)}',
                                        save_dir=None, vis_backends=None))
    visualizer.dataset_meta = model.dataset_meta
    if task == 'mmseg':
        visualizer.alpha = opacity
    bar = ProgressBar(len(images)) if progress else None
    written = []
    for path, name in zip(images, drawing_names(images)):
        result = predict(model, path)
        image = mmcv.imconvert(mmcv.imread(path), 'bgr', 'rgb')
        out_file = osp.join(out_dir, name)
        kwargs = dict(pred_score_thr=score_thr) if task == 'mmdet' else {}
        visualizer.add_datasample(osp.basename(path), image, data_sample=result, draw_gt=False,
                                  show=False, out_file=out_file, **kwargs)
        written.append(out_file)
        if bar is not None:
            bar.update()
    return written
