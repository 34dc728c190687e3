#!/usr/bin/env python
"""The GPU timing table: InLine-PVT-T / InLine-Swin-T against mmdet's PVT-T / Swin-T.

    python tools/analysis/gpu_report.py                 # what `make test-gpu` runs after the tests
    python tools/analysis/gpu_report.py --out work_dirs/gpu_report --batch-sizes 1 8

What the toolkits' tools cannot: in this one process (one CUDA start-up), the forward
pass of the four backbones (``benchmark.py --device cuda``, interleaved, peak memory from
the CUDA allocator) and one Mask R-CNN training iteration of each detector config with
its InLine backbone and with mmdet's softmax counterpart in its place
(``benchmark_train.py --device cuda``), per batch size and dtype, in one Markdown table.
``fp16`` / ``bf16`` autocast the whole backbone forward; for the training iteration
``fp16`` is ``tools/train.py --amp`` on a GPU and ``bf16`` autocasts the backbone and the
neck only (mmcv 2.1's CUDA RoIAlign / NMS have no bf16 kernels).

Writes ``table.md`` (with the device, versions, date, host load and CPU, the command of
every part) and ``report.json`` (every figure; the benchmarks' own JSON files beside).
A part that fails leaves its error in the table and the other parts run; the training
rows are left out with the reason when mmcv has no CUDA ops.  Without a CUDA device the
script stops at once with one line (exit status 2).
"""
import argparse
import datetime
import gc
import os
import os.path as osp
import sys
import time
from typing import Dict, List, Optional, Sequence

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))
sys.path.insert(0, HERE)

import benchmark  # noqa: E402
import benchmark_train  # noqa: E402
import torch  # noqa: E402
from _bench_common import (COUNTERPARTS, cpu_record, cuda_missing,  # noqa: E402
                           describe_cpu, first_line, machine, mmcv_cuda_ops_missing)
from mmengine import dump  # noqa: E402

from inline_mm.engine.cli_sizes import add_size_option, format_size  # noqa: E402

#: the detector configs of the training rows (their backbones' softmax twins come from
#: benchmark_train.softmax_counterpart: mmdet's PVT-T and Swin-T)
DETECTORS = {'pvt': 'configs/det/mask_rcnn_inline_pvt.py',
             'swin': 'configs/det/mask-rcnn_inline-swin-t_fpn_1x_coco.py'}
#: what the table calls the benchmarks' model names
DISPLAY = {'inline_pvt_t': 'InLine-PVT-T', 'mmdet_pvt_t': 'mmdet PVT-T',
           'inline_swin_t': 'InLine-Swin-T', 'mmdet_swin_t': 'mmdet Swin-T',
           'InLinePVT(tiny)': 'InLine-PVT-T', 'InLineSwin(tiny)': 'InLine-Swin-T'}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', default='work_dirs/gpu_report',
                        help='folder of table.md, report.json and the benchmarks\' JSON')
    add_size_option(parser, '--size', default='1333x800', help='size of every input')
    parser.add_argument('--batch-sizes', type=int, nargs='+', default=[1, 8])
    parser.add_argument('--dtypes', nargs='+', default=['fp32', 'fp16', 'bf16'],
                        choices=['fp32', 'fp16', 'bf16'])
    parser.add_argument('--families', nargs='+', default=sorted(DETECTORS),
                        choices=sorted(DETECTORS))
    parser.add_argument('--warmup', type=int, default=2, help='backbone passes before timing')
    parser.add_argument('--repeats', type=int, default=5, help='timed backbone passes')
    parser.add_argument('--train-warmup', type=int, default=1)
    parser.add_argument('--train-repeats', type=int, default=3)
    parser.add_argument('--flops', action='store_true',
                        help='add GFLOP/s and the share of the matmul peak to the backbone '
                        'rows (traces every model once: slower)')
    parser.add_argument('--skip-backbones', action='store_true')
    parser.add_argument('--skip-train', action='store_true')
    parser.add_argument('--peak-size', type=int, default=4096,
                        help="side of the square matmul of the host CPU's peak (every JSON "
                        'records the CPU)')
    return parser.parse_args(argv)


def backbone_argv(args, out: str) -> List[str]:
    """The arguments of the backbone part for ``benchmark.py``."""
    argv = ['--compare', *args.families, '--sizes', format_size(args.size),
            '--batch-sizes', *map(str, args.batch_sizes), '--dtypes', *args.dtypes,
            '--device', 'cuda', '--warmup', str(args.warmup), '--repeats', str(args.repeats),
            '--peak-size', str(args.peak_size), '--out', out]
    return argv if args.flops else argv + ['--no-flops']


def train_argv(args, config: str, batch: int, out: str) -> List[str]:
    """The arguments of one training part for ``benchmark_train.py``."""
    return [config, '--device', 'cuda', '--size', format_size(args.size),
            '--batch-size', str(batch), '--dtypes', *args.dtypes,
            '--warmup', str(args.train_warmup), '--repeats', str(args.train_repeats),
            '--peak-size', str(args.peak_size), '--out', out]


def command(script: str, argv: Sequence[str]) -> str:
    return ' '.join(['python', f'tools/analysis/{script}', *argv])


def _free_gpu() -> None:
    gc.collect()
    torch.cuda.empty_cache()


# ---------------------------------------------------------------- formatting (no GPU needed)
def _cell(value: Optional[float], fmt: str) -> str:
    return '-' if value is None else format(value, fmt)


def _name(model: str) -> str:
    return DISPLAY.get(model, model)


def _header(first: str, columns: List[str]) -> List[str]:
    return [_line(first, 'batch', columns), '|---|---:|' + '---:|' * len(columns)]


def _line(name: str, batch, cells: List[str]) -> str:
    return f'| {name} | {batch} | ' + ' | '.join(cells) + ' |'


def backbone_tables(result: dict, dtypes: Sequence[str]) -> List[str]:
    """Markdown of ``benchmark.main``'s result: latency / memory per model and batch,
    then the InLine / softmax latency ratio per family and batch."""
    rows = [r for r in result['rows'] if r.get('runtime', 'torch') == 'torch']
    find = {(r['model'], r['batch'], r['dtype']): r for r in rows}
    batches = sorted({r['batch'] for r in rows})
    lines = _header('backbone', [f'{d} ms' for d in dtypes] + [f'{d} peak MB' for d in dtypes])
    for batch in batches:
        for model in dict.fromkeys(r['model'] for r in rows):
            got = [find.get((model, batch, d)) for d in dtypes]
            lines.append(_line(_name(model), batch,
                               [_cell(g and g['latency_ms']['median'], '.1f') for g in got] +
                               [_cell(g and g.get('peak_mem_mb'), '.0f') for g in got]))
    ratios = {(r['family'], r['batch'], r['dtype']): r for r in result.get('ratios', [])
              if r.get('runtime', 'torch') == 'torch'}
    if ratios:
        lines += [''] + _header('InLine / softmax latency', list(dtypes))
        for family in dict.fromkeys(f for f, _, _ in ratios):
            name = ' / '.join(map(_name, COUNTERPARTS[family]))
            lines += [_line(name, batch, [_cell(ratios.get((family, batch, d), {}).get(
                'latency'), '.2f') for d in dtypes]) for batch in batches]
    return lines


def train_tables(results: Sequence[dict], dtypes: Sequence[str]) -> List[str]:
    """Markdown of ``benchmark_train.main``'s results (one per detector and batch size)."""
    lines = _header('Mask R-CNN backbone',
                    [f'{d} s' for d in dtypes] + [f'{d} peak MB' for d in dtypes])
    ratio_lines = []
    for result in results:
        by_dtype: Dict[str, Dict[str, dict]] = {}
        for row in result['rows'].values():
            by_dtype.setdefault(row['backbone'], {})[row['dtype']] = row
        for backbone, got in by_dtype.items():
            lines.append(_line(_name(backbone), result['batch_size'],
                               [_cell(got.get(d, {}).get('median_s'), '.3f') for d in dtypes] +
                               [_cell(got.get(d, {}).get('peak_mem_mb'), '.0f') for d in dtypes]))
        if result.get('ratios') and len(by_dtype) == 2:
            ratio_lines.append(_line(' / '.join(map(_name, by_dtype)), result['batch_size'],
                                     [_cell(result['ratios'].get(d), '.2f') for d in dtypes]))
    if ratio_lines:
        lines += [''] + _header('InLine / softmax iteration time', list(dtypes)) + ratio_lines
    return lines


def render(report: dict) -> str:
    """The whole ``table.md`` from ``report.json``'s content."""
    meta = report['meta']
    dtypes = meta['dtypes']
    lines = ['# GPU timing table', '',
             f"{meta['device_name']}, torch {meta['torch']} (CUDA {meta['cuda']}), "
             f"{meta['date']}, host load average {meta['load']} at the start; "
             f"inputs {meta['size']} (W x H).", '']
    if meta.get('cpu'):
        lines += [f"Host {describe_cpu(meta['cpu'])}.", '']
    lines += ['## Backbone forward', '']
    part = report.get('backbone')
    if part is None:
        lines.append('not run (--skip-backbones)')
    elif 'error' in part:
        lines.append(f"failed: {part['error']}")
    else:
        res = part['result']
        lines += [f"Median of {res['repeats']} passes after {res['warmup']} warm-up passes, "
                  'models interleaved; peak memory: the CUDA allocator\'s peak during one '
                  'forward over what was allocated before it.', '']
        lines += backbone_tables(res, dtypes)
    if part is not None:
        lines += ['', f"`{part['command']}`"]
    lines += ['', '## Mask R-CNN training iteration', '']
    train = report.get('train')
    if train is None:
        lines.append('not run (--skip-train)')
    elif 'skipped' in train:
        lines.append(f"not measured: {train['skipped']}")
    else:
        done = [p['result'] for p in train['parts'] if 'result' in p]
        if done:
            first = done[0]
            lines += [f"One `train_step` (forward with losses, backward, AdamW step), "
                      f"{first['repeats']} timed iterations after {first['warmup']} warm-up, "
                      'runs interleaved; synthetic batch, 8 boxes and masks per image; fp16: '
                      'AmpOptimWrapper (as `tools/train.py --amp`), bf16: backbone and neck '
                      'under autocast; peak memory of one more iteration.', '']
            lines += train_tables(done, dtypes)
        for p in train['parts']:
            if 'error' in p:
                lines.append(f"- {p['config']} batch {p['batch']}: failed: {p['error']}")
        lines += [''] + [f"`{p['command']}`" for p in train['parts']]
    return '\n'.join(lines) + '\n'


# ---------------------------------------------------------------- the runs (GPU)
def run_part(part: dict, main, argv: List[str]) -> dict:
    """``part`` with ``main(argv)``'s result, or its error (the other parts run)."""
    try:
        part['result'] = main(argv)
    except (Exception, SystemExit) as err:  # noqa: BLE001  (keep the other parts)
        part['error'] = first_line(err)
    _free_gpu()
    return part


def run_backbones(args, out: str) -> dict:
    argv = backbone_argv(args, osp.join(out, 'backbone'))
    return run_part(dict(command=command('benchmark.py', argv)), benchmark.main, argv)


def run_training(args, out: str) -> dict:
    missing = mmcv_cuda_ops_missing()
    if missing:
        return dict(skipped=missing)
    parts = []
    for family in args.families:
        for batch in args.batch_sizes:
            path = osp.join(out, f'train_{family}_b{batch}.json')
            part = dict(config=DETECTORS[family], batch=batch, command=command(
                'benchmark_train.py', train_argv(args, DETECTORS[family], batch, path)))
            # the config by its absolute path: the report may run from any folder
            parts.append(run_part(part, benchmark_train.main, train_argv(
                args, osp.join(ROOT, DETECTORS[family]), batch, path)))
    return dict(parts=parts)


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = cuda_missing('the GPU report times CUDA kernels: run it on a machine with an '
                           'NVIDIA GPU (tools/analysis/benchmark.py --device cpu times the CPU)')
    if missing:
        print(f'error: {missing}', file=sys.stderr)
        return 2
    out = args.out
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    report = dict(meta=dict(
        **machine('cuda', None), date=datetime.datetime.now(datetime.timezone.utc).date()
        .isoformat(), load=' '.join(f'{v:.2f}' for v in os.getloadavg()),
        size=format_size(args.size), cpu=cpu_record(n=args.peak_size),
        dtypes=args.dtypes, batch_sizes=args.batch_sizes,
        command=' '.join(['python', 'tools/analysis/gpu_report.py'] +
                         (sys.argv[1:] if argv is None else list(argv)))))
    if not args.skip_backbones:
        report['backbone'] = run_backbones(args, out)
    if not args.skip_train:
        report['train'] = run_training(args, out)
    report['meta']['wall_s'] = time.perf_counter() - start
    dump(report, osp.join(out, 'report.json'), file_format='json', indent=2)
    table = osp.join(out, 'table.md')
    with open(table, 'w') as f:
        f.write(render(report))
    print(f"wrote {table} and {osp.join(out, 'report.json')} "
          f"({report['meta']['wall_s']:.0f} s)")
    failed = [p for p in [report.get('backbone')] + (report.get('train') or {}).get('parts', [])
              if p and 'error' in p]
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
