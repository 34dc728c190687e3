"""The peak memory of one forward of a benchmark model (:func:`peak_memory_mb`).

On the CPU the peak resident memory of a fresh process that builds the model again
(the kernel's VmHWM mark, reset after the build), so neither the build nor the models
timed before count; on a GPU the CUDA allocator's peak during one forward.
"""
import json
import os.path as osp
import subprocess
import sys
from typing import Optional, Sequence

import torch
import torch.nn as nn

from _bench_common import cuda_peak_mb, load, num_params, precision


def _status_kib(field: str) -> int:
    with open('/proc/self/status') as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ':'))


def peak_memory_mb(spec: str, size: Sequence[int], batch: int, dtype: str, device: str,
                   threads: int, model: Optional[nn.Module] = None,
                   cfg_options: Optional[dict] = None) -> float:
    """Peak memory of one forward over the loaded model, in MiB: on the CPU in a fresh
    process (``threads`` threads) that builds ``spec`` again, which fails when its parameter
    count differs from ``model``'s; on a GPU of ``model`` itself (built when None)."""
    if device == 'cuda':
        if model is None:
            model = load(spec, cfg_options).to(device).eval()
        x = torch.randn(batch, 3, *size, device=device)

        def forward():
            with torch.inference_mode(), precision(model, dtype, device):
                model(x)
        return cuda_peak_mb(forward)
    # the options are literals (mmengine's DictAction parses them): their repr is code
    code = (f'import sys; sys.argv=[""]; sys.path.insert(0, {osp.dirname(__file__)!r}); '
            f'import _bench_memory as b; print(b._child_peak({spec!r}, {tuple(size)!r}, '
            f'{batch}, {dtype!r}, {threads}, {cfg_options!r}))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f'memory measurement of {spec} failed:\n{out.stderr[-2000:]}')
    child = json.loads(out.stdout.strip().splitlines()[-1])
    if model is not None and child['params'] != num_params(model):
        raise RuntimeError(f'the memory run of {spec} built another model ({child["params"]} '
                           f'parameters, the timed one has {num_params(model)})')
    return child['peak_mib']


def _child_peak(spec: str, size, batch: int, dtype: str, threads: int,
                cfg_options: Optional[dict] = None) -> str:
    """In the fresh process of :func:`peak_memory_mb`: JSON with the peak and the
    model's parameter count."""
    torch.set_num_threads(threads)
    model = load(spec, cfg_options)
    model.eval()
    x = torch.randn(batch, 3, *size)
    with torch.inference_mode(), precision(model, dtype, 'cpu'):
        model(torch.randn(batch, 3, 64, 64))  # lazy initialisation outside the measurement
        # the peak of the import / build phase must not hide the forward's peak: reset the
        # kernel's peak-RSS mark (VmHWM) of this process (Linux >= 4.0)
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        base = _status_kib('VmRSS')
        model(x)
        peak = _status_kib('VmHWM')
    return json.dumps(dict(peak_mib=(peak - base) / 1024, params=num_params(model)))
