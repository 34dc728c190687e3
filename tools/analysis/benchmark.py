#!/usr/bin/env python
"""Latency, throughput and peak memory of InLine backbones (and whole models).

    # InLine backbones against their softmax counterparts, interleaved in one process
    python tools/analysis/benchmark.py --compare pvt swin deit --sizes 512 1333x800 2048x1024
    # one backbone by name, or a whole detector / segmentor from a config
    python tools/analysis/benchmark.py --models inline_pvt_t mmdet_pvt_t --sizes 224 512
    python tools/analysis/benchmark.py --config configs/det/mask_rcnn_inline_pvt.py \\
        --sizes 1333x800 --cfg-options model.backbone.arch=small

Sizes are ``WIDTHxHEIGHT`` (``1333x800``, as mmdet writes its scales) or ``N``
for ``NxN``.  ``--cfg-options`` changes the configs of ``--config`` (also in
the subprocesses that measure peak memory, which build the model again).

Latency is the median (with the 25-75 % spread) of ``--repeats`` forward passes
after ``--warmup`` passes, models interleaved round by round so that machine
noise hits all of them alike.  Peak memory is, on the CPU, the increase of the
process's peak RSS during one forward over the loaded model, measured in a fresh
subprocess per model and size; on a GPU (``--device cuda``, the default when one
is visible), the increase of ``torch.cuda.max_memory_allocated`` during one
forward of the timed model, in the same process.  On a GPU every timed pass is
bracketed by ``torch.cuda.synchronize`` and ``--threads`` is not applied.
Writes JSON and a log-log PNG (latency against pixels, one line per model) and
prints a table with the InLine / softmax ratio per size, the bf16 / fp32 ratio
when both run, and the log-log slope of latency against pixel count for every
model.  The JSON's ``cpu`` entry names the CPU (model, AVX2 / AVX-512 / bf16 /
AMX flags, threads, load) and its fp32 and bf16 matmul peaks of this run.

``--dtypes fp32 fp16 bf16`` runs every model in each: ``fp16`` / ``bf16`` are
``torch.autocast`` of the whole forward for backbones, and of the backbone and
the neck for detector configs (mmcv's CPU RoIAlign / NMS take fp32 only).
Each row also gives the achieved GFLOP/s: the model's FLOPs at that size
(mmengine's ``FlopAnalyzer``, traced, counted once per model and size, one
multiply-add = 2 FLOPs here) over the median latency, and its share of the
machine's matmul peak for that dtype, measured in the same run (best of a few
``--peak-size`` square matmuls).

``--compile`` adds, for every row, a row of the same model through
``torch.compile(dynamic=True)`` (inductor; runtime ``compiled``): one
compilation serves every size, and the row's ``compile_s`` is the first pass
at that size, compilation included; the table gives compiled / eager per row.
``--compile-static`` compiles with ``dynamic=False`` instead: static shapes, one
compilation per size.
All passes then run under ``torch.no_grad`` (eager too), not ``inference_mode``,
and a compiled model that fails is a failed row (``failed_rows``), not the end
of the run.

``--profile`` runs one more pass of every model per size and dtype under
``torch.profiler`` and writes its 20 costliest operators (self CPU time) into
``OUT/profile/`` (compiled models: inductor's kernels and the library calls
they make).

``--onnxruntime`` adds, for every fp32 row, an onnxruntime (CPU) row of the
same model and size: the model is exported once per size with a fixed input
shape (the softmax counterparts do not all export with dynamic sizes; a fixed
shape also lets onnxruntime fold the size arithmetic) and timed with
``--threads`` intra-op threads (needs the ``deploy`` extra).  Backbones export
whole, segmentor configs export whole (logits at the input size), detector
configs export backbone + neck (their RoI heads need mmdeploy); the row's
``part`` says which.  The table then gives onnxruntime / PyTorch per row
(not for a detector's backbone + neck: its PyTorch row is the whole model).
"""
import argparse
import json
import os
import os.path as osp
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
# (MMDET_BACKBONES, autocast, build_backbone, build_from_config, slope: used as benchmark.X)
from _bench_common import (COUNTERPARTS, MMDET_BACKBONES, add_peak_args,  # noqa: E402,F401
                           autocast, build_backbone, build_from_config, count_macs,
                           cpu_record, cuda_missing, latency_ms, load, matmul_peak_gflops,
                           num_params, precision, slope, sync)
from _bench_memory import peak_memory_mb  # noqa: E402
from _bench_onnx import time_onnxruntime_rows  # noqa: E402
from _bench_report import plot, print_table, summarise  # noqa: E402

from inline_mm.engine.cli_sizes import add_size_option, format_size  # noqa: E402
from inline_mm.engine.launch import add_cfg_options  # noqa: E402

#: suffix of the spec of a model's ``torch.compile`` twin (``--compile``)
COMPILED = '+compiled'


def _grad_off(models: Dict[str, nn.Module]):
    """``inference_mode``, or ``no_grad`` for all models where one is compiled (dynamo's
    guards fail on tensors made inside ``inference_mode``: torch 2.14, mmdet's PVT)."""
    compiled = any(name.endswith(COMPILED) for name in models)
    return torch.no_grad() if compiled else torch.inference_mode()


def time_models(models: Dict[str, nn.Module], size, batch, dtype, device, warmup, repeats,
                progress: Callable[[str], None]
                ) -> Tuple[Dict[str, List[float]], Dict[str, float], Dict[str, str]]:
    """Per model the timed passes (interleaved) and the first warm-up pass, in seconds
    (a compiled model's compilation for this size and dtype happens there; without
    warm-up passes it falls into the timed ones and ``first`` is empty), and the error
    of every compiled twin that failed (removed from ``models``: the other rows go on).

    With compiled twins every pass runs under ``torch.no_grad``, eager ones too (the
    same mode for both; see :func:`_grad_off`).
    """
    x = torch.randn(batch, 3, *size, device=device)
    times = {name: [] for name in models}
    first, errors = {}, {}

    def run(name: str) -> bool:
        try:
            models[name](x)
            return True
        except Exception as err:  # noqa: BLE001  (a compiled twin that fails: keep the rest)
            if not name.endswith(COMPILED):
                raise
            errors[name] = f'{type(err).__name__}: {err}'.strip().splitlines()[0][:300]
            progress(f'  {name} failed: {errors[name]}')
            del models[name], times[name]
            return False

    with _grad_off(models):
        for name in list(models):
            with precision(models[name], dtype, device):
                for i in range(warmup):
                    t0 = time.perf_counter()
                    if not run(name):
                        break
                    sync(device)
                    if i == 0:
                        first[name] = time.perf_counter() - t0
        for r in range(repeats):  # interleaved: one pass of every model per round
            for name in list(models):
                with precision(models[name], dtype, device):
                    sync(device)
                    t0 = time.perf_counter()
                    if not run(name):
                        continue
                    sync(device)
                times[name].append(time.perf_counter() - t0)
            progress(f'  {format_size(size)} b{batch} {dtype}: round {r + 1}/{repeats}')
    return times, first, errors


def profile_models(models: Dict[str, nn.Module], size, batch, dtype, device, folder: str,
                   top: int = 20) -> List[str]:
    """One pass of every model under ``torch.profiler`` (after its timed passes, so a
    compiled model is compiled already): the ``top`` operators by self CPU time, as
    ``folder/<model>_<WxH>_b<batch>_<dtype>.txt``; returns the paths."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == 'cuda' else [])
    os.makedirs(folder, exist_ok=True)
    x = torch.randn(batch, 3, *size, device=device)
    paths = []
    for name, model in models.items():
        with _grad_off(models), precision(model, dtype, device), \
                profile(activities=activities) as prof:
            model(x)
            sync(device)
        path = osp.join(folder, f"{name.replace('/', '_')}_{format_size(size)}_b{batch}_"
                        f"{dtype}.txt")
        with open(path, 'w') as f:
            f.write(prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=top))
        paths.append(path)
    return paths


# ---------------------------------------------------------------- the steps of main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--compare', nargs='+', choices=sorted(COUNTERPARTS), default=[],
                        help='InLine backbone families to run against their softmax counterparts')
    parser.add_argument('--models', nargs='+', default=[],
                        help='more backbones by name (see build_backbone)')
    parser.add_argument('--config', nargs='+', default=[], help='whole models from configs')
    add_cfg_options(parser)
    add_size_option(parser, '--sizes', many=True, default=['224', '512', '1333x800',
                                                          '2048x1024'], help='input sizes')
    parser.add_argument('--batch-sizes', type=int, nargs='+', default=[1])
    parser.add_argument('--dtypes', nargs='+', default=['fp32'], choices=['fp32', 'bf16', 'fp16'])
    parser.add_argument('--threads', type=int, default=2,
                        help='intra-op threads of the CPU runs (not set on a GPU)')
    parser.add_argument('--device', choices=['cpu', 'cuda'],
                        default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--no-memory', action='store_true', help='skip peak-memory runs')
    add_size_option(parser, '--memory-sizes', many=True,
                    help='measure peak memory at these sizes only (default: all)')
    parser.add_argument('--no-flops', action='store_true',
                        help='skip the FLOP counts (no GFLOP/s columns); the CPU record '
                        'still measures its fp32 / bf16 matmul peaks')
    add_peak_args(parser)
    parser.add_argument('--compile', action='store_true',
                        help='also time every model through torch.compile(dynamic=True)')
    parser.add_argument('--compile-static', action='store_true',
                        help='compile with dynamic=False: one compilation per input size, '
                        'static shapes (default: dynamic=True, one for all sizes)')
    parser.add_argument('--compile-backend', default='inductor',
                        help="torch.compile's backend for --compile (default: inductor)")
    parser.add_argument('--profile', action='store_true',
                        help='one more pass of every model per size and dtype under '
                        'torch.profiler: its top operators in OUT/profile/')
    parser.add_argument('--onnxruntime', action='store_true',
                        help='add onnxruntime (CPU, fp32) rows: each model exported at each '
                        'size (needs the deploy extra: onnx, onnxruntime)')
    parser.add_argument('--out', default='work_dirs/benchmark', help='folder for JSON and PNG')
    parser.add_argument('--reference-dir',
                        help="the authors' models/ folder: enables the model 'authors_pvt_t'")
    args = parser.parse_args(argv)
    args.specs = [n for fam in args.compare for n in COUNTERPARTS[fam] if n] + args.models + \
        args.config
    if not args.specs:
        parser.error('name what to run: --compare, --models and / or --config')
    if args.cfg_options and not args.config:
        parser.error('--cfg-options changes the configs of --config: give --config CONFIG')
    if args.onnxruntime and args.device != 'cpu':
        parser.error('--onnxruntime rows run on the CPU: add --device cpu')
    if args.compile_static and not args.compile:
        parser.error('--compile-static says how --compile compiles: add --compile')
    return args


def prepare(args) -> None:
    """Device, threads and optional dependencies checked before anything is built."""
    if args.device == 'cuda':
        missing = cuda_missing()
        if missing:
            print(f'error: {missing}', file=sys.stderr)
            sys.exit(2)
    else:  # thread settings are the CPU's: on a GPU they would only slow the host side
        torch.set_num_threads(args.threads)
    if args.onnxruntime:
        from inline_mm.deploy.onnx_export import require_onnx
        require_onnx()
    if args.reference_dir:
        sys.path.insert(0, osp.abspath(args.reference_dir))
        os.environ['INLINE_MM_REFERENCE_DIR'] = osp.abspath(args.reference_dir)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure_peaks(args) -> Tuple[Dict[str, float], Dict[str, int]]:
    """The matmul peak of the run's device for every dtype (none with ``--no-flops``)."""
    peaks: Dict[str, float] = {}
    sizes: Dict[str, int] = {}
    if not args.no_flops:
        for dtype in args.dtypes:
            peaks[dtype], sizes[dtype] = matmul_peak_gflops(dtype, args.device, args.peak_size,
                                                            args.peak_repeats)
            _progress(f'matmul peak {dtype} ({sizes[dtype]}^3): {peaks[dtype]:.1f} GFLOP/s')
    return peaks, sizes


def build_models(args) -> Dict[str, nn.Module]:
    """Every model to measure, by spec (backbone name or config path), on the device."""
    _progress(f'building {len(args.specs)} model(s): {", ".join(args.specs)}')
    models = {}
    for spec in args.specs:
        models[spec] = load(spec, args.cfg_options).to(args.device)
        models[spec].eval()  # not chained: mmdet's SwinTransformer.train() returns None
    if args.compile:  # inductor; graph breaks allowed: the softmax counterparts have some
        for spec in list(models):
            models[spec + COMPILED] = torch.compile(models[spec],
                                                    dynamic=not args.compile_static,
                                                    backend=args.compile_backend)
    return models


def _add_gflops(row: dict, macs: Optional[int], peak: Optional[float]) -> None:
    if macs is not None:
        row['gflop'] = 2 * macs * row['batch'] / 1e9  # one multiply-add = 2 FLOPs
        row['gflop_per_s'] = row['gflop'] / (row['latency_ms']['median'] / 1e3)
        row['peak_fraction'] = row['gflop_per_s'] / peak


def measure(args, models: Dict[str, nn.Module], peaks: Dict[str, float]
            ) -> Tuple[List[dict], List[dict]]:
    """Time every model at every dtype, batch and size (rows), onnxruntime rows beside.

    Returns the rows and the onnxruntime rows of models that did not export.
    """
    rows: List[dict] = []
    failed: List[dict] = []
    memory_sizes = None if args.memory_sizes is None else set(args.memory_sizes)
    for dtype in args.dtypes:
        for batch in args.batch_sizes:
            for size in args.sizes:
                base = dict(height=size[0], width=size[1], pixels=size[0] * size[1],
                            batch=batch, dtype=dtype)
                times, first, errors = time_models(models, size, batch, dtype, args.device,
                                                   args.warmup, args.repeats, _progress)
                for name, error in errors.items():
                    failed.append(dict(model=name[:-len(COMPILED)], **base, runtime='compiled',
                                       error=error))
                if args.profile:
                    for path in profile_models(models, size, batch, dtype, args.device,
                                               osp.join(args.out, 'profile')):
                        _progress(f'  profile: {path}')
                for name, ts in times.items():
                    spec = name[:-len(COMPILED)] if name.endswith(COMPILED) else name
                    row = dict(model=spec, **base, params=num_params(models[spec]),
                               latency_ms=latency_ms(ts))
                    row['throughput_img_s'] = batch / (row['latency_ms']['median'] / 1e3)
                    if not args.no_flops:
                        _add_gflops(row, count_macs(spec, models[spec], size), peaks[dtype])
                    if name != spec:  # the compiled twin: its memory is not measured
                        rows.append(dict(row, runtime='compiled', compile_s=first.get(name)))
                        continue
                    if not args.no_memory and (memory_sizes is None or size in memory_sizes):
                        _progress(f'  peak memory of {spec} at {format_size(size)}')
                        row['peak_mem_mb'] = peak_memory_mb(
                            spec, size, batch, dtype, args.device, args.threads, models[spec],
                            args.cfg_options)
                    rows.append(dict(row, runtime='torch'))
                if not (args.onnxruntime and dtype == 'fp32'):
                    continue
                ort = time_onnxruntime_rows(models, size, batch, args.warmup, args.repeats,
                                            args.threads, osp.join(args.out, 'onnx'), _progress)
                for spec, res in ort.items():
                    row = dict(model=spec, **base, runtime='onnxruntime', part=res['part'])
                    if 'error' in res:
                        failed.append(dict(row, error=res['error']))
                        continue
                    row.update(latency_ms=latency_ms(res['times']), export_s=res['export_s'])
                    row['throughput_img_s'] = batch / (row['latency_ms']['median'] / 1e3)
                    # GFLOP/s where the exported graph is the PyTorch row's (backbones)
                    if not args.no_flops and res['part'] == 'backbone':
                        _add_gflops(row, count_macs(spec, models[spec], size), peaks[dtype])
                    rows.append(row)
    return rows, failed


def write(results: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(osp.join(out, 'benchmark.json'), 'w') as f:
        json.dump(results, f, indent=2)
    plot(results, osp.join(out, 'benchmark.png'))


def main(argv=None) -> dict:
    args = parse_args(argv)
    prepare(args)
    device = args.device
    peaks, peak_sizes = measure_peaks(args)
    models = build_models(args)
    rows, failed = measure(args, models, peaks)
    on_cpu = device == 'cpu'
    results = dict(device=device, device_name=torch.cuda.get_device_name() if not on_cpu else
                   f'CPU ({os.cpu_count()} cores visible)', threads=args.threads if on_cpu
                   else None, torch=torch.__version__,
                   cuda=None if on_cpu else torch.version.cuda,
                   warmup=args.warmup, repeats=args.repeats,
                   command=' '.join([osp.relpath(__file__)] + (argv or sys.argv[1:])),
                   compile_backend=args.compile_backend if args.compile else None,
                   compile_dynamic=not args.compile_static if args.compile else None,
                   cfg_options=args.cfg_options,
                   flop_convention='gflop counts one multiply-add as 2 FLOPs',
                   matmul_peak_gflop_per_s=peaks, matmul_peak_size=peak_sizes,
                   # the CPU's peaks: this run's where it measured them on the CPU
                   cpu=cpu_record(peaks if on_cpu else None, peak_sizes if on_cpu else None,
                                  args.peak_size, args.peak_repeats),
                   rows=rows, failed_rows=failed, **summarise(rows, args.compare))
    write(results, args.out)
    print_table(results)
    print(f"wrote {osp.join(args.out, 'benchmark.json')} and benchmark.png")
    return results


if __name__ == '__main__':
    main()
