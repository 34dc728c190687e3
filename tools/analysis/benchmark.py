#!/usr/bin/env python
"""Latency, throughput and peak memory of InLine backbones (and whole models).

    # InLine backbones against their softmax counterparts, interleaved in one process
    python tools/analysis/benchmark.py --compare pvt swin deit --sizes 512 1333x800 2048x1024
    # one backbone by name, or a whole detector / segmentor from a config
    python tools/analysis/benchmark.py --models inline_pvt_t mmdet_pvt_t --sizes 224 512
    python tools/analysis/benchmark.py --config configs/det/mask_rcnn_inline_pvt.py \\
        --sizes 1333x800 --cfg-options model.backbone.arch=small

What the toolkits' ``benchmark.py`` (one model over its test set) cannot: backbones by
name and whole models at given sizes (``WIDTHxHEIGHT`` or ``N``), against their softmax
counterparts, interleaved round by round so that machine noise hits all alike; the
InLine / softmax, reduced precision / fp32, compiled / eager and onnxruntime / PyTorch
ratios, the log-log slope of latency against pixels, and the achieved GFLOP/s against
the machine's matmul peak measured in the same run.  Writes JSON and a log-log PNG.

Latency: the median (and 25-75 % spread) of ``--repeats`` passes after ``--warmup``.
Peak memory: on the CPU the increase of the peak RSS during one forward, in a fresh
subprocess per model and size (``--cfg-options`` reach it too); on a GPU the increase of
``torch.cuda.max_memory_allocated`` during one forward of the timed model (every timed
pass bracketed by ``torch.cuda.synchronize``, ``--threads`` not applied).  ``fp16`` /
``bf16`` autocast the whole forward of a backbone, the backbone and neck of a detector
(mmcv's CPU RoIAlign / NMS take fp32 only).  FLOPs: mmengine's ``FlopAnalyzer`` once per
model and size (one multiply-add = 2 FLOPs here).

``--compile`` adds rows through ``torch.compile`` (``dynamic=True``: one compilation for
all sizes, the row's ``compile_s`` is the first pass at its size; ``--compile-static``:
one per size); all passes then run under ``torch.no_grad`` and a compiled model that
fails is a failed row.  ``--onnxruntime`` adds an onnxruntime (CPU) row per fp32 row,
exported at a fixed shape (the row's ``part``; no onnxruntime / PyTorch ratio for a
detector's backbone + neck, whose PyTorch row is the whole detector).  ``--profile``
writes the 20 costliest operators of one more pass per model into ``OUT/profile/``.
"""
import argparse
import os
import os.path as osp
import sys
import time
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from mmengine import dump  # noqa: E402
# (MMDET_BACKBONES, autocast, build_backbone, build_from_config, slope: used as benchmark.X)
from _bench_common import (COUNTERPARTS, MMDET_BACKBONES, add_timing_args,  # noqa: E402,F401
                           autocast, build_backbone, build_from_config, count_macs,
                           cpu_record, latency_ms, load, machine, matmul_peak_gflops,
                           num_params, precision, slope, sync, use_device, first_line)
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
    """Per model the timed passes (interleaved) and the first warm-up pass (where a compiled
    model compiles), in seconds, and the error of every compiled twin that failed (removed
    from ``models``: the other rows go on)."""
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
            errors[name] = first_line(err)
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
        paths.append(osp.join(folder, f"{name.replace('/', '_')}_{format_size(size)}_b{batch}_"
                              f"{dtype}.txt"))
        with open(paths[-1], 'w') as f:
            # wide names: inductor's generated kernels (TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1)
            # are named after the operators they fuse
            f.write(prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=top,
                                              max_name_column_width=120))
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
    add_timing_args(parser, 'cuda' if torch.cuda.is_available() else 'cpu', warmup=2)
    parser.add_argument('--no-memory', action='store_true', help='skip peak-memory runs')
    add_size_option(parser, '--memory-sizes', many=True,
                    help='measure peak memory at these sizes only (default: all)')
    parser.add_argument('--no-flops', action='store_true',
                        help='skip the FLOP counts (no GFLOP/s columns); the CPU record '
                        'still measures its fp32 / bf16 matmul peaks')
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
    args.specs = [n for fam in args.compare for n in COUNTERPARTS[fam]] + args.models + \
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
    use_device(args.device, args.threads)
    if args.onnxruntime:
        from inline_mm.deploy.onnx_export import require_onnx
        require_onnx()
    if args.reference_dir:  # here and in the processes that measure memory
        sys.path.insert(0, osp.abspath(args.reference_dir))
        os.environ['PYTHONPATH'] = os.pathsep.join(
            filter(None, [osp.abspath(args.reference_dir), os.environ.get('PYTHONPATH')]))


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure_peaks(args) -> Tuple[Dict[str, float], Dict[str, int]]:
    """The matmul peak of the run's device for every dtype (none with ``--no-flops``)."""
    peaks, sizes = {}, {}
    for dtype in [] if args.no_flops else args.dtypes:
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


def _row(base: dict, times: List[float], macs, peak, **fields) -> dict:
    """A timed row: latency, throughput and, where ``macs`` were counted, GFLOP/s."""
    row = dict(base, **fields, latency_ms=latency_ms(times))
    seconds = row['latency_ms']['median'] / 1e3
    row['throughput_img_s'] = row['batch'] / seconds
    if macs is not None:
        row['gflop'] = 2 * macs * row['batch'] / 1e9  # one multiply-add = 2 FLOPs
        row['gflop_per_s'] = row['gflop'] / seconds
        row['peak_fraction'] = row['gflop_per_s'] / peak
    return row


def measure(args, models: Dict[str, nn.Module], peaks: Dict[str, float]
            ) -> Tuple[List[dict], List[dict]]:
    """Time every model at every dtype, batch and size (rows), onnxruntime rows beside.

    Returns the rows and the failed rows (compiled twins, models that did not export).
    """
    rows, failed = [], []
    for dtype in args.dtypes:
        for batch in args.batch_sizes:
            for size in args.sizes:
                base = dict(height=size[0], width=size[1], pixels=size[0] * size[1],
                            batch=batch, dtype=dtype)

                def macs(spec):
                    return None if args.no_flops else count_macs(spec, models[spec], size)

                times, first, errors = time_models(models, size, batch, dtype, args.device,
                                                   args.warmup, args.repeats, _progress)
                failed += [dict(model=name[:-len(COMPILED)], **base, runtime='compiled',
                                error=error) for name, error in errors.items()]
                if args.profile:
                    for path in profile_models(models, size, batch, dtype, args.device,
                                               osp.join(args.out, 'profile')):
                        _progress(f'  profile: {path}')
                for name, ts in times.items():
                    spec = name.removesuffix(COMPILED)
                    row = _row(dict(model=spec, **base), ts, macs(spec), peaks.get(dtype),
                               params=num_params(models[spec]))
                    if name != spec:  # the compiled twin: its memory is not measured
                        rows.append(dict(row, runtime='compiled', compile_s=first.get(name)))
                        continue
                    if not args.no_memory and (args.memory_sizes is None or
                                               size in args.memory_sizes):
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
                    else:  # GFLOP/s where the exported graph is the PyTorch row's (backbones)
                        rows.append(_row(row, res['times'], macs(spec) if res['part'] ==
                                         'backbone' else None, peaks.get(dtype),
                                         export_s=res['export_s']))
    return rows, failed


def write(results: dict, out: str) -> None:
    dump(results, osp.join(out, 'benchmark.json'), file_format='json', indent=2)
    plot(results, osp.join(out, 'benchmark.png'))


def main(argv=None) -> dict:
    args = parse_args(argv)
    prepare(args)
    peaks, peak_sizes = measure_peaks(args)
    models = build_models(args)
    rows, failed = measure(args, models, peaks)
    on_cpu = args.device == 'cpu'
    results = dict(**machine(args.device, args.threads),
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
