"""Helpers shared by the command-line tools (train / test / infer / benchmarks)."""
import importlib
import inspect
import json
import os
import os.path as osp
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import torch
from mmengine.config import Config, ConfigDict
from mmengine.registry import DefaultScope

from ..errors import ConfigError, DataError, MissingFileError

#: expected layouts, quoted in errors about a missing data folder
LAYOUTS = {
    'mmdet': 'COCO layout: {ann} and the image folder {img}. For the bundled toy set run: '
             'python tools/make_toy_data.py --task det',
    'mmseg': 'ADE20K layout: images in {img} (*.jpg) and label maps in {seg} (*.png). For '
             'the bundled toy set run: python tools/make_toy_data.py --task seg',
}

#: how many label maps :func:`check_datasets` reads to check label values
LABEL_MAPS_CHECKED = 20


def task_of(cfg: Config) -> str:
    """``'mmdet'`` or ``'mmseg'``: the toolkit a config belongs to (its default scope)."""
    scope = cfg.get('default_scope')
    if scope not in ('mmdet', 'mmseg'):
        raise ConfigError(f"config default_scope is {scope!r}: inline-mm tools handle 'mmdet' "
                          f"(detection) and 'mmseg' (segmentation) configs")
    return scope


def _datasets(cfg: Config, loaders: Iterable[str]) -> List[Tuple[str, ConfigDict]]:
    found = []
    for name in loaders:
        loader = cfg.get(name)
        if not loader:
            continue
        stack = [loader['dataset']]
        while stack:  # unwrap RepeatDataset / ConcatDataset / MultiImageMixDataset ...
            ds = stack.pop()
            if 'dataset' in ds:
                stack.append(ds['dataset'])
            elif 'datasets' in ds:
                stack.extend(ds['datasets'])
            else:
                found.append((name, ds))
    return found


def _join(root: str, path: str) -> str:
    return osp.normpath(path if osp.isabs(path) or not root else osp.join(root, path))


def _dataset_class(task: str, ds: ConfigDict) -> Optional[type]:
    """The dataset class a dataset config builds (None when it cannot be resolved)."""
    registry = importlib.import_module(f'{task}.registry').DATASETS
    importlib.import_module(f'{task}.datasets')  # registers the toolkit's datasets
    # a wrapper that builds its dataset in place names the dataset's type apart
    ds_type = ds.get('dataset_type') or ds.get('type')
    if not isinstance(ds_type, str):
        return ds_type if isinstance(ds_type, type) else None
    with DefaultScope.overwrite_default_scope(task):
        return registry.get(ds_type)


def _config_classes(task: str, ds: ConfigDict) -> Tuple[Optional[Sequence[str]], str]:
    """The class names a dataset config trains on, and where they come from."""
    metainfo = ds.get('metainfo') or {}
    if metainfo.get('classes'):
        return tuple(metainfo['classes']), 'metainfo.classes of the dataset config'
    cls = _dataset_class(task, ds)
    classes = getattr(cls, 'METAINFO', {}).get('classes') if cls else None
    name = cls.__name__ if cls else ds.get('type')
    return (tuple(classes) if classes else None), f'the default classes of {name}'


def dataset_metainfo(cfg: Config, loader: str = 'test_dataloader') -> dict:
    """Classes / palette of a config's dataset: its class defaults updated by ``metainfo``."""
    task = task_of(cfg)
    found = _datasets(cfg, (loader,))
    if not found:
        return {}
    ds = found[0][1]
    cls = _dataset_class(task, ds)
    meta = dict(getattr(cls, 'METAINFO', None) or {}) if cls else {}
    meta.update(ds.get('metainfo') or {})
    return meta


def _head_num_classes(model: Any, path: str = 'model') -> List[Tuple[str, int]]:
    """``(key path, num_classes)`` of every head of a model config (RPN heads excepted)."""
    found = []
    if isinstance(model, dict):
        for key, value in model.items():
            sub = f'{path}.{key}'
            if key == 'num_classes' and isinstance(value, int) and 'rpn_head' not in path:
                found.append((sub, value))
            elif isinstance(value, (dict, list, tuple)) and key != 'train_cfg':
                found += _head_num_classes(value, sub)
    elif isinstance(model, (list, tuple)):
        for i, value in enumerate(model):
            found += _head_num_classes(value, f'{path}.{i}')
    return found


def _short(names: Sequence[str], limit: int = 12) -> str:
    shown = ', '.join(repr(n) for n in list(names)[:limit])
    return f'({shown}{", ..." if len(names) > limit else ""}; {len(names)} classes)'


def _fix_line(names: Sequence[str], heads: List[Tuple[str, int]]) -> str:
    heads_text = ', '.join(f'{p}={len(names)}' for p, _ in heads) or \
        f'the heads\' num_classes={len(names)}'
    return (f'metainfo=dict(classes={tuple(names)!r}) in the dataset config (train, val and '
            f'test dataloaders) and {heads_text}; see "Train on your own data" in the README')


def _check_coco_classes(cfg: Config, loader: str, ds: ConfigDict, ann_path: str) -> None:
    with open(ann_path) as f:
        coco = json.load(f)
    file_classes = [c.get('name') for c in coco.get('categories', [])]
    classes, source = _config_classes('mmdet', ds)
    heads = _head_num_classes(cfg.get('model', {}))
    if not coco.get('images'):
        raise DataError(f'annotation file {ann_path} lists no images: the dataset would be '
                        f'empty')
    if classes is None or not file_classes:
        return
    absent = [c for c in classes if c not in file_classes]
    if absent:
        what = 'none of' if len(absent) == len(classes) else f'{len(absent)} of'
        raise DataError(
            f'the categories of {ann_path} {_short(file_classes)} do not match the classes the '
            f'config trains on, {source} {_short(classes)}: {what} the config\'s classes are in '
            f'the file, so mmdet would drop their images. To train on the file\'s categories '
            f'set {_fix_line(file_classes, heads)}')
    wrong_heads = [(p, n) for p, n in heads if n != len(classes)]
    if wrong_heads:
        raise DataError(
            f'{", ".join(f"{p}={n}" for p, n in wrong_heads)} but the dataset has '
            f'{len(classes)} classes {_short(classes)}: set {_fix_line(classes, heads)}')
    if loader == 'train_dataloader' and (ds.get('filter_cfg') or {}).get('filter_empty_gt',
                                                                          False):
        ids = {c['id'] for c in coco.get('categories', []) if c.get('name') in classes}
        with_gt = {a['image_id'] for a in coco.get('annotations', [])
                   if a.get('category_id') in ids and not a.get('iscrowd', 0)}
        if not with_gt:
            raise DataError(f'no image of {ann_path} has an annotation of the config\'s classes '
                            f'{_short(classes)}: the training set would be empty')


def _check_seg_labels(cfg: Config, ds: ConfigDict, seg_dir: str) -> None:
    classes, source = _config_classes('mmseg', ds)
    heads = _head_num_classes(cfg.get('model', {}))
    if classes is None:
        return
    cls = _dataset_class('mmseg', ds)
    ade = importlib.import_module('mmseg.datasets').ADE20KDataset
    if cls is ade and (ds.get('metainfo') or {}).get('classes') and \
            not set(classes) <= set(ade.METAINFO['classes']):
        raise DataError(
            'ADE20KDataset accepts only ADE20K\'s own 150 class names; for an ADE20K-format set '
            "with classes of your own use type='BaseSegDataset' with img_suffix='.jpg', "
            "seg_map_suffix='.png', reduce_zero_label=True and metainfo=dict(classes=..., "
            'palette=...) (see "Train on your own data" in the README)')
    wrong_heads = [(p, n) for p, n in heads if n != len(classes)]
    if wrong_heads:
        raise DataError(
            f'{", ".join(f"{p}={n}" for p, n in wrong_heads)} but the dataset has '
            f'{len(classes)} classes ({source}) {_short(classes)}: set '
            f'{", ".join(f"{p}={len(classes)}" for p, _ in wrong_heads)}')
    # mmseg datasets take these as constructor arguments (with class defaults)
    defaults = inspect.signature(cls.__init__).parameters if cls else {}

    def arg(name: str, fallback: Any) -> Any:
        if name in ds:
            return ds[name]
        param = defaults.get(name)
        return fallback if param is None or param.default is inspect.Parameter.empty \
            else param.default

    suffix = arg('seg_map_suffix', '.png')
    reduce_zero = arg('reduce_zero_label', False)
    try:
        import numpy as np
        from PIL import Image
    except ImportError:  # pragma: no cover - both come with mmcv
        return
    files = sorted(f for f in os.listdir(seg_dir) if f.endswith(suffix))[:LABEL_MAPS_CHECKED]
    ignore = arg('ignore_index', 255)
    for name in files:
        values = np.unique(np.asarray(Image.open(osp.join(seg_dir, name))))
        if reduce_zero:  # 0 becomes the ignore index, k becomes k - 1
            values = values[values != 0] - 1
        bad = [int(v) for v in values if v != ignore and v >= len(classes)]
        if bad:
            raise DataError(
                f'label map {osp.join(seg_dir, name)} holds the value(s) '
                f'{bad[:5]}{" (after reduce_zero_label)" if reduce_zero else ""}, but the '
                f'config has {len(classes)} classes ({source}): a class index must be < '
                f'{len(classes)} (or {ignore} for pixels to ignore); check reduce_zero_label '
                f'and the classes')


def check_datasets(cfg: Config, loaders: Iterable[str] = ('train_dataloader', 'val_dataloader',
                                                          'test_dataloader'),
                   check_classes: bool = True) -> None:
    """Fail before any work starts when a dataset does not fit the config.

    Checks every dataset of ``loaders`` (wrappers unwrapped): the data root,
    image / label folders and annotation file exist and the annotation file
    is valid JSON; with ``check_classes``, that the config's classes (the
    dataset's ``metainfo`` or its class defaults) are the annotation file's
    categories (COCO format) or cover the label values (segmentation maps),
    that the heads' ``num_classes`` equals the number of classes, and that the
    training set is not empty after mmdet filters it.

    Raises:
        MissingFileError: a data root, image folder or annotation file is
            missing (the message names it and the layout expected).
        DataError: an annotation file cannot be parsed, or the classes do not
            fit (the message lists both and the lines to add to the config).
    """
    task = task_of(cfg)
    for loader, ds in _datasets(cfg, loaders):
        root = ds.get('data_root', '') or ''
        prefix = ds.get('data_prefix') or {}
        ann = ds.get('ann_file')
        layout = LAYOUTS[task].format(
            ann=_join(root, ann) if ann else '<ann_file>',
            img=_join(root, prefix.get('img', prefix.get('img_path', ''))) + os.sep,
            seg=_join(root, prefix.get('seg_map_path', '')) + os.sep)
        if root and not osp.isdir(root):
            raise MissingFileError(f'dataset folder {osp.normpath(root)!r} not found (from '
                                   f'{os.getcwd()}). Expected the {layout}')
        for folder in prefix.values():
            path = _join(root, folder)
            if folder and not osp.isdir(path):
                raise MissingFileError(f'dataset folder {path!r} not found. Expected the '
                                       f'{layout}')
        ann_path = _join(root, ann) if ann else None
        if ann_path:
            if not osp.isfile(ann_path):
                raise MissingFileError(f'annotation file {ann_path!r} not found. Expected the '
                                       f'{layout}')
            if ann_path.endswith('.json'):
                try:
                    with open(ann_path) as f:
                        json.load(f)
                except (OSError, ValueError) as err:
                    raise DataError(f'annotation file {ann_path!r} cannot be read as JSON: '
                                    f'{err}') from None
        if not check_classes:
            continue
        if task == 'mmdet' and ann_path and ann_path.endswith('.json'):
            _check_coco_classes(cfg, loader, ds, ann_path)
        elif task == 'mmseg' and prefix.get('seg_map_path'):
            _check_seg_labels(cfg, ds, _join(root, prefix['seg_map_path']))


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
    return importlib.import_module(f'{task}.registry').MODELS.build(model_cfg)


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

    Backbone, neck and heads on a batch of images, as ``model._forward``
    runs them (no pre- / post-processing); data samples for the input size
    are made on the fly.  What FLOP counters, benchmarks and exporters run.
    """

    def __init__(self, model: torch.nn.Module, task: str) -> None:
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, inputs: torch.Tensor) -> Any:
        samples = dummy_data_samples(self.task, inputs.shape[-2], inputs.shape[-1],
                                     inputs.shape[0])
        return self.model._forward(inputs, samples)


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
    for path in images:
        result = predict(model, path)
        image = mmcv.imconvert(mmcv.imread(path), 'bgr', 'rgb')
        out_file = osp.join(out_dir, osp.splitext(osp.basename(path))[0] + '.png')
        kwargs = dict(pred_score_thr=score_thr) if task == 'mmdet' else {}
        visualizer.add_datasample(osp.basename(path), image, data_sample=result, draw_gt=False,
                                  show=False, out_file=out_file, **kwargs)
        written.append(out_file)
        if bar is not None:
            bar.update()
    return written
