"""benchmark.py's onnxruntime rows: each model exported at a fixed size and timed.

A fixed input shape because the softmax counterparts do not all export with dynamic
sizes, and a fixed shape lets onnxruntime fold the size arithmetic.
"""
import functools
import os.path as osp
import time
from contextlib import contextmanager
from typing import Dict, Iterator

import torch.nn as nn

from _bench_common import first_line


@contextmanager
def _exportable_timm_vit() -> Iterator[None]:
    """Export timm's dynamic-size ViT: its position table is resized per input with
    antialiased bicubic interpolation, which has no ONNX operator; during the export
    it is resized with plain bicubic interpolation (an upsampling here: the same cost,
    values within the interpolation kernels' difference)."""
    import timm.models.vision_transformer as vit
    original = vit.resample_abs_pos_embed
    vit.resample_abs_pos_embed = functools.partial(original, antialias=False)
    try:
        yield
    finally:
        vit.resample_abs_pos_embed = original


def time_onnxruntime_rows(models: Dict[str, nn.Module], size, batch, warmup, repeats,
                          threads, folder, progress) -> Dict[str, dict]:
    """Export every model at ``size`` and time it in onnxruntime: ``{spec: dict(part=...,
    times=[...], export_s=...)}``, or ``dict(part=..., error=...)`` where it does not export.

    Backbones export whole, segmentors too (logits at the input size), detectors their
    backbone + neck (their RoI heads need mmdeploy).
    """
    from inline_mm.deploy import export_onnx, time_onnxruntime
    from inline_mm.deploy.onnx_export import wrap_part
    results = {}
    for spec, model in models.items():
        if spec.endswith('.py'):
            part = 'model' if model.task == 'mmseg' else 'backbone_neck'
            module = wrap_part(model.model, part, model.task)
        else:
            part, module = 'backbone', wrap_part(model, 'backbone')
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
            results[spec] = dict(part=part, error=first_line(err))
            progress(f'  onnxruntime: {spec} failed: {results[spec]["error"]}')
            continue
        results[spec] = dict(part=part, times=times, export_s=export_s)
    return results
