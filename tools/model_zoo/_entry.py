"""What a finished run gives the model zoo (the run itself: :func:`_zoo.read_run`).

* :func:`published_checkpoint`: the weights-only file mmdet's
  ``tools/model_converters/publish_model.py`` writes (``meta`` and ``state_dict``
  only), as bytes, with its ``<config>_<yyyymmdd>-<sha256[:8]>.pth`` name;
* :func:`results_of` / :func:`metadata_of` / :func:`readme_cell`: what a run gives its
  metafile entry and README row (the textual edits themselves: :mod:`_metafile`).
"""
import datetime
import hashlib
import io
from typing import Any, Dict, List, Optional, Tuple

from _zoo import Run

#: metric keys of the logs -> metafile metric names (mmdet's / mmseg's metafiles), x100
DET_METRICS = {'bbox': ('Object Detection', 'box'), 'segm': ('Instance Segmentation', 'mask')}
DET_SUFFIXES = (('', 'AP'), ('_50', 'AP50'), ('_75', 'AP75'), ('_s', 'APs'), ('_m', 'APm'),
                ('_l', 'APl'))
SEG_METRICS = ('mIoU', 'mAcc', 'aAcc')


# ------------------------------------------------------------------ the published file
#: meta entries kept in the published file (mmengine writes them; all plain values)
META_KEYS = ('epoch', 'iter', 'cfg', 'seed', 'experiment_name', 'time', 'mmengine_version',
             'dataset_meta')


def _plain(value: Any) -> bool:
    if isinstance(value, (str, int, float, bool, type(None))):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def published_checkpoint(run: Run, date: Optional[str] = None) -> Tuple[str, bytes]:
    """(file name, bytes) of the weights-only checkpoint of ``run``.

    ``state_dict`` is the run's weights: with mmengine's ``EMAHook`` the averaged ones
    (the hook swaps them into ``state_dict`` when it saves; ``ema_state_dict`` then holds
    the raw weights and is dropped with the optimiser, the schedulers and the message
    hub); ``meta`` keeps :data:`META_KEYS`, plain values only, so the file loads with
    ``torch.load(weights_only=True)`` and no allow-list.
    """
    import torch
    meta = {k: v for k, v in (run.checkpoint.get('meta') or {}).items()
            if k in META_KEYS and _plain(v)}
    buffer = io.BytesIO()
    torch.save({'meta': meta, 'state_dict': run.checkpoint['state_dict']}, buffer)
    data = buffer.getvalue()
    date = date or datetime.datetime.now().strftime('%Y%m%d')
    return f'{run.name}_{date}-{hashlib.sha256(data).hexdigest()[:8]}.pth', data


# ------------------------------------------------------------------ metafile entries
def results_of(run: Run, dataset: str) -> List[dict]:
    """The metafile ``Results`` of a run: mmdet's box / mask AP (x100, one decimal, with
    AP50 / AP75 / APs / APm / APl; undefined ones, logged as -1, left out) or mmseg's
    mIoU / mAcc / aAcc (two decimals)."""
    results = []
    if run.task == 'mmdet':
        for kind, (task, prefix) in DET_METRICS.items():
            metrics = {}
            for suffix, label in DET_SUFFIXES:
                value = run.metrics.get(f'coco/{kind}_mAP{suffix}')
                if value is not None and value >= 0:
                    metrics[f'{prefix} {label}'] = round(100 * value, 1)
            if metrics:
                results.append(dict(Task=task, Dataset=dataset, Metrics=metrics))
    else:
        metrics = {k: round(run.metrics[k], 2) for k in SEG_METRICS if k in run.metrics}
        results.append(dict(Task='Semantic Segmentation', Dataset=dataset, Metrics=metrics))
    return results


def metadata_of(run: Run) -> Dict[str, Any]:
    """The ``Metadata`` keys a run measures (the others of the entry stay as they are)."""
    meta: Dict[str, Any] = {run.schedule[0]: run.schedule[1]}
    if run.resources:
        meta['Training Resources'] = run.resources
    if run.memory_gb is not None:
        meta['Training Memory (GB)'] = run.memory_gb
    if run.iter_time_s is not None:
        meta['Training Time (s/iter)'] = run.iter_time_s
    if run.inference:
        entry = dict(value=run.inference['value'], hardware=run.inference['hardware'],
                     backend='PyTorch', **{'batch size': run.inference['batch_size']},
                     mode='FP32')
        if run.inference.get('resolution'):
            entry['resolution'] = str(tuple(run.inference['resolution']))
        meta['inference time (ms/im)'] = [entry]
    if run.ema:
        meta['Training Techniques'] = ['EMA']
    return meta


# ------------------------------------------------------------------ README cells
def readme_cell(run: Run, link: str) -> str:
    """The "ours" cell: box AP / mask AP, or mIoU / mAcc, with the model link.

    A run trained for another schedule than the config's own (the row's schedule
    column) says so: ``12.3 / 10.1 (2 iterations, not the config's 1500)``.
    """
    if run.task == 'mmdet':
        values = [run.metrics.get(f'coco/{k}_mAP') for k in DET_METRICS]
        text = ' / '.join(f'{100 * v:.1f}' for v in values if v is not None and v >= 0)
    else:
        text = ' / '.join(f'{run.metrics[k]:.2f}' for k in ('mIoU', 'mAcc') if k in run.metrics)
    if run.config_schedule is not None and run.schedule != run.config_schedule:
        unit, count = run.schedule
        text += f" ({count} {unit.lower()}, not the config's {run.config_schedule[1]}" + \
            (f' {run.config_schedule[0].lower()})' if run.config_schedule[0] != unit else ')')
    return f'{text} ([model]({link}))'
