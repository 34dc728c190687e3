"""benchmark.py's onnxruntime rows: each model exported at a fixed size and timed.

A fixed input shape because the softmax counterparts do not all export with dynamic
sizes, and a fixed shape lets onnxruntime fold the size arithmetic.  Imported as
``_bench_onnx`` (the tools put their own folder on ``sys.path``).
"""
import os.path as osp
import time
from contextlib import contextmanager
from typing import Dict, Iterator, Tuple

import torch.nn as nn

def onnx_part(spec: str, model: nn.Module) -> Tuple[nn.Module, str]:
    """What ``--onnxruntime`` exports of a benchmarked model, and the part's name."""
    from inline_mm.deploy.onnx_export import wrap_part
    if not spec.endswith('.py'):
        return wrap_part(model, 'backbone'), 'backbone'
    part = 'model' if model.task == 'mmseg' else 'backbone_neck'
    return wrap_part(model.model, part, model.task), part


@contextmanager
def _exportable_timm_vit() -> Iterator[None]:
    """Export timm's dynamic-size ViT: its position table is resized per input with
    antialiased bicubic interpolation, which has no ONNX operator; during the export
    it is resized with plain bicubic interpolation (an upsampling here: the same cost,
    values within the interpolation kernels' difference)."""
    import functools

    import timm.models.vision_transformer as vit
    original = vit.resample_abs_pos_embed
    vit.resample_abs_pos_embed = functools.partial(original, antialias=False)
    try:
        yield
    finally:
        vit.resample_abs_pos_embed = original


def time_onnxruntime_rows(models: Dict[str, nn.Module], size, batch, warmup, repeats,
                          threads, folder, progress) -> Dict[str, dict]:
    """Export every model at ``size`` (fixed shape) and time it in onnxruntime.

    Returns ``{spec: dict(part=..., times=[...], export_s=...)}``, or
    ``dict(part=..., error=...)`` for a model that does not export.
    """
    from inline_mm.deploy import export_onnx, time_onnxruntime
    results = {}
    for spec, model in models.items():
        module, part = onnx_part(spec, model)
        name = osp.splitext(osp.basename(spec))[0]
        path = osp.join(folder, f'{name}_{part}_{size[1]}x{size[0]}_b{batch}.onnx')
        progress(f'  onnxruntime: {spec} ({part}) at {size[1]}x{size[0]} b{batch}')
        try:
            start = time.perf_counter()
            with _exportable_timm_vit():
                export_onnx(module, size, path, dynamic=False, batch=batch)
            export_s = time.perf_counter() - start
            times = time_onnxruntime(path, size, batch, warmup, repeats, threads)
        except Exception as err:  # noqa: BLE001  (a model that does not export: keep the rest)
            results[spec] = dict(part=part, error=f'{type(err).__name__}: {err}'.splitlines()[0])
            progress(f'  onnxruntime: {spec} failed: {results[spec]["error"][:300]}')
            continue
        results[spec] = dict(part=part, times=times, export_s=export_s)
    return results
