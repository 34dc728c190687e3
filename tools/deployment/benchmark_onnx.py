#!/usr/bin/env python
"""onnxruntime (CPU, fp32) vs PyTorch eager latency of InLine backbones and their
softmax counterparts.

    python tools/deployment/benchmark_onnx.py --threads 2 --warmup 1 --repeats 3 \\
        --sizes 512 1333x800 2048x1024 --out work_dirs/onnx_bench/results.json

Every model is exported once per size with a fixed input shape (the softmax
counterparts do not all export with dynamic sizes; a fixed shape also lets
onnxruntime fold every size computation), then timed: ``--warmup`` untimed
runs, ``--repeats`` timed runs each of PyTorch (``torch.inference_mode``,
``torch.set_num_threads(threads)``) and of onnxruntime (``threads`` intra-op
threads).  Medians with the 25-75 % spread are printed and written as JSON.
Models come from ``tools/analysis/benchmark.py`` (``build_backbone``).
"""
import argparse
import json
import os
import os.path as osp
import sys
import time
import traceback

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, osp.join(ROOT, 'tools', 'analysis'))

import torch  # noqa: E402

from benchmark import build_backbone, parse_size, quartiles  # noqa: E402
from inline_mm.engine.launch import cli_main  # noqa: E402
from inline_mm.deploy.onnx_export import (example_input,  # noqa: E402
                                          export_onnx, require_onnx, time_onnxruntime,
                                          wrap_part)

PAIRS = {'pvt': ('inline_pvt_t', 'mmdet_pvt_t'), 'swin': ('inline_swin_t', 'mmdet_swin_t'),
         'deit': ('inline_deit_t', 'timm_deit_t')}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='onnxruntime vs PyTorch latency (CPU fp32)')
    parser.add_argument('--compare', nargs='+', choices=list(PAIRS), default=list(PAIRS),
                        help='InLine / softmax pairs to run')
    parser.add_argument('--models', nargs='+', default=None,
                        help='benchmark.py model names instead of --compare')
    parser.add_argument('--sizes', nargs='+', default=['512', '1333x800', '2048x1024'],
                        help='N or WxH')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--work-dir', default='work_dirs/onnx_bench',
                        help='where the exported .onnx files go')
    parser.add_argument('--out', default=None, help='JSON file (default: WORK_DIR/results.json)')
    return parser.parse_args(argv)


def time_torch(model, size, warmup, repeats):
    """Seconds per eager forward of ``model`` on a ``(1, 3, H, W)`` input."""
    x = example_input(size)
    times = []
    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        for _ in range(repeats):
            start = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - start)
    return times


def run(args) -> dict:
    require_onnx()
    torch.set_num_threads(args.threads)
    names = args.models or [n for pair in args.compare for n in PAIRS[pair]]
    sizes = [parse_size(s) for s in args.sizes]
    os.makedirs(args.work_dir, exist_ok=True)
    results = dict(threads=args.threads, warmup=args.warmup, repeats=args.repeats,
                   torch=torch.__version__, onnxruntime=__import__('onnxruntime').__version__,
                   rows=[])
    print(f"{'model':<15}{'size (WxH)':>12}{'torch ms':>12}{'ort ms':>12}{'ort/torch':>11}")
    for name in names:
        model = wrap_part(build_backbone(name).eval(), 'backbone')
        for size in sizes:
            row = dict(model=name, size=f'{size[1]}x{size[0]}')
            path = osp.join(args.work_dir, f'{name}_{size[1]}x{size[0]}.onnx')
            try:
                start = time.perf_counter()
                export_onnx(model, size, path, dynamic=False)
                row['export_s'] = time.perf_counter() - start
                row['torch_s'] = time_torch(model, size, args.warmup, args.repeats)
                row['ort_s'] = time_onnxruntime(path, size, 1, args.warmup, args.repeats,
                                                args.threads)
            except Exception as err:  # a model that does not export: keep the others
                row['error'] = f'{type(err).__name__}: {err}'.splitlines()[0][:300]
                traceback.print_exc(limit=2)
            results['rows'].append(row)
            if 'error' in row:
                print(f"{name:<15}{row['size']:>12}  failed: {row['error']}")
                continue
            t, o = quartiles(row['torch_s'])[0], quartiles(row['ort_s'])[0]
            row['torch_ms'], row['ort_ms'] = 1000 * t, 1000 * o
            print(f"{name:<15}{row['size']:>12}{1000 * t:>12.0f}{1000 * o:>12.0f}{o / t:>11.2f}")
            sys.stdout.flush()
    out = args.out or osp.join(args.work_dir, 'results.json')
    with open(out, 'w') as f:
        json.dump(results, f, indent=1)
    print(f'wrote {out}')
    return results


def main(argv=None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == '__main__':
    sys.exit(cli_main(main))
