"""Helpers shared by the command-line tools (train / test / infer / benchmarks)."""
import json
import os
import os.path as osp
from typing import Iterable, List

from mmengine.config import Config, ConfigDict

#: expected layouts, quoted in errors about a missing data folder
LAYOUTS = {
    'mmdet': ('COCO layout: {root}/annotations/instances_{{train,val}}*.json and the image '
              'folders named by data_prefix (e.g. {root}/train2017/). For the bundled toy set '
              'run: python tools/make_toy_data.py --task det'),
    'mmseg': ('ADE20K layout: {root}/images/{{training,validation}}/*.jpg and '
              '{root}/annotations/{{training,validation}}/*.png. For the bundled toy set run: '
              'python tools/make_toy_data.py --task seg'),
}


def task_of(cfg: Config) -> str:
    """``'mmdet'`` or ``'mmseg'``: the toolkit a config belongs to (its default scope)."""
    scope = cfg.get('default_scope')
    if scope not in ('mmdet', 'mmseg'):
        raise ValueError(f"config default_scope is {scope!r}: inline-mm tools handle 'mmdet' "
                         f"(detection) and 'mmseg' (segmentation) configs")
    return scope


def _datasets(cfg: Config, loaders: Iterable[str]) -> List[ConfigDict]:
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
                found.append(ds)
    return found


def check_datasets(cfg: Config, loaders: Iterable[str] = ('train_dataloader', 'val_dataloader',
                                                          'test_dataloader')) -> None:
    """Fail before any work starts when a dataset folder or annotation file is unusable.

    Raises:
        FileNotFoundError: a data root, image folder or annotation file is missing
            (the message names it and the layout expected).
        ValueError: an annotation file cannot be parsed (the message names it).
    """
    task = task_of(cfg)
    for ds in _datasets(cfg, loaders):
        root = ds.get('data_root', '') or ''
        layout = LAYOUTS[task].format(root=root or '<data_root>')
        if root and not osp.isdir(root):
            raise FileNotFoundError(f'dataset folder {root!r} not found (from {os.getcwd()}). '
                                    f'Expected the {layout}')
        for folder in (ds.get('data_prefix') or {}).values():
            path = osp.join(root, folder)
            if folder and not osp.isdir(path):
                raise FileNotFoundError(f'dataset folder {path!r} not found. Expected the {layout}')
        ann = ds.get('ann_file')
        if ann:
            path = ann if osp.isabs(ann) else osp.join(root, ann)
            if not osp.isfile(path):
                raise FileNotFoundError(f'annotation file {path!r} not found. Expected the '
                                        f'{layout}')
            if path.endswith('.json'):
                try:
                    with open(path) as f:
                        json.load(f)
                except (OSError, ValueError) as err:
                    raise ValueError(f'annotation file {path!r} cannot be read as JSON: '
                                     f'{err}') from err


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
