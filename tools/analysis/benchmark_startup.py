#!/usr/bin/env python
"""Startup on COCO-size annotation files: time and memory up to the first training iteration.

    python tools/analysis/benchmark_startup.py --data-dir /tmp/coco_size \\
        --out docs/benchmark_results                  # full COCO train2017 size
    python tools/analysis/benchmark_startup.py --scale 0.001    # a small run

What the toolkits' tools cannot: this repository's ``tools/train.py`` against mmdet's own
(``mmdet/.mim/tools/train.py``) on the full recipe ``--config`` and a set the size of
COCO 2017 (``_coco_size_set.py``; ``--scale`` shrinks it; kept in ``--data-dir`` and
reused, else in a temporary folder), for each process count of ``--procs``, runs
interleaved for ``--repeats`` rounds, with the same ``--cfg-options``: no pretrained
checkpoint, batch 1, no loader workers, a small input (``--size``) so that the first
iteration is cheap, gloo for two processes.  From the launch to the log line of the
first training iteration (then the run is stopped) it measures the wall time and the
peak memory: the largest sum of the resident set sizes of the run's processes (sampled
every 0.1 s) and the largest peak of one process (``VmHWM``).

mmengine 0.10's ``init_dist`` calls ``torch.cuda.set_device``, and its DDP wrapper passes
``device_ids``; neither works without a GPU.  mmdet's own ``tools/train.py`` runs on two
CPU processes through a shim (this script with ``--cpu-shim``) that skips ``set_device``
when no GPU is present, with ``model_wrapper_cfg.type=AnyDeviceDistributedDataParallel``;
this repository's ``tools/train.py`` does the same by itself.  Nothing of the data
loading differs.  Prints a table and the ratios inline-mm / mmdet; ``--out DIR`` writes
``DIR/startup_coco_size.json`` (with the CPU record, measured after the runs).
"""
import argparse
import contextlib
import json
import os
import os.path as osp
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _coco_size_set import COCO_SIZES, make_coco_size_set  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEFAULT_CONFIG = osp.join(ROOT, 'configs', 'det', 'mask-rcnn_inline-pvt-t_fpn_1x_coco.py')

#: the log line of the first training iteration (epoch- and iteration-based loops)
FIRST_ITER = re.compile(r'(?:Epoch|Iter)\(train\)\s*(?:\[\s*1\])?\s*\[\s*1/\d+\]')


# ---------------------------------------------------------------------------- measuring
def _status(pid: int) -> Dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of a process in bytes ({} once it is gone)."""
    found = {}
    try:
        with open(f'/proc/{pid}/status') as f:
            for line in f:
                if line.startswith(('VmRSS:', 'VmHWM:')):
                    key, value = line.split(':')
                    found[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found


def _tree(root: int) -> List[int]:
    """``root`` and all its descendants (torchrun starts its workers in sessions of their own)."""
    import psutil
    try:
        return [root] + [p.pid for p in psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def measure(cmd: List[str], env: dict, timeout: float, interval: float = 0.1) -> dict:
    """Run ``cmd`` until its first training iteration is logged; time and memory."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=ROOT, text=True, start_new_session=True)
    lines: List[str] = []
    reached: List[float] = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if not reached and FIRST_ITER.search(line):
                reached.append(time.perf_counter() - start)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peak_sum, hwm, procs = 0, {}, set()
    try:
        while not reached and proc.poll() is None and time.perf_counter() - start < timeout:
            total = 0
            for pid in _tree(proc.pid):
                status = _status(pid)
                if status:
                    procs.add(pid)
                    total += status.get('VmRSS', 0)
                    hwm[pid] = max(hwm.get(pid, 0), status.get('VmHWM', 0))
            peak_sum = max(peak_sum, total)
            time.sleep(interval)
        for pid in _tree(proc.pid):  # the peaks up to the first iteration
            hwm[pid] = max(hwm.get(pid, 0), _status(pid).get('VmHWM', 0))
    finally:
        for pid in _tree(proc.pid) if proc.poll() is None else []:
            try:  # the workers too: they are not in the launcher's process group
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait()
        reader.join(timeout=10)
    if not reached:
        tail = ''.join(lines[-40:])
        raise RuntimeError(f'no training iteration within {timeout:.0f} s (exit status '
                           f'{proc.returncode}) of: {" ".join(cmd)}\n{tail}')
    mib = 1024 * 1024
    return dict(seconds=round(reached[0], 2), peak_rss_sum_mib=round(peak_sum / mib),
                max_process_peak_mib=round(max(hwm.values()) / mib),
                sum_process_peaks_mib=round(sum(hwm.values()) / mib), processes=len(procs))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def mmdet_train_script() -> str:
    """mmdet's own ``tools/train.py`` as mmdet ships it."""
    import mmdet
    path = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'train.py')
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path} not found: this mmdet install does not ship its tools')
    return path


def cfg_options(data_root: str, size, procs: int) -> List[str]:
    """What both tools get: the generated data, no checkpoint, batch 1, a small input
    (``size``: height, width)."""
    root = data_root.rstrip('/') + '/'
    opts = [f'{split}_dataloader.dataset.data_root={root}' for split in ('train', 'val', 'test')]
    opts += [f'val_evaluator.ann_file={root}annotations/instances_val2017.json',
             f'test_evaluator.ann_file={root}annotations/instances_val2017.json',
             'model.backbone.init_cfg=None', 'train_dataloader.batch_size=1',
             'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
             # mmdet's Resize scale is (width, height)
             f'train_dataloader.dataset.pipeline.2.scale=({size[1]},{size[0]})',
             'default_hooks.logger.interval=1']
    if procs > 1:
        opts += ['env_cfg.dist_cfg.backend=gloo']
    return opts


def commands(tool: str, config: str, work_dir: str, options: List[str], procs: int
             ) -> List[str]:
    script = osp.join(ROOT, 'tools', 'train.py') if tool == 'inline-mm' else mmdet_train_script()
    args = [config, '--work-dir', work_dir]
    if procs == 1:
        return [sys.executable, script, *args, '--cfg-options', *options]
    run = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', str(procs),
           '--master_port', str(_free_port())]
    if tool == 'inline-mm':
        return [*run, script, *args, '--launcher', 'pytorch', '--cfg-options', *options]
    # mmdet's tool on CPU processes: see the module docstring
    return [*run, osp.abspath(__file__), '--cpu-shim', script, *args, '--launcher', 'pytorch',
            '--cfg-options', *options,
            'model_wrapper_cfg.type=AnyDeviceDistributedDataParallel']


def cpu_shim(argv: List[str]) -> None:
    """Run the script ``argv[0]`` as ``__main__``; without GPUs ``torch.cuda.set_device``
    does nothing."""
    import runpy

    import torch
    if not torch.cuda.is_available():
        torch.cuda.set_device = lambda device: None
    sys.argv = list(argv)
    sys.path.insert(0, osp.dirname(argv[0]))
    runpy.run_path(argv[0], run_name='__main__')


def run_benchmark(args) -> dict:
    with contextlib.nullcontext(args.data_dir) if args.data_dir else tempfile.TemporaryDirectory(
            prefix='inline_mm_startup_', ignore_cleanup_errors=True) as data_dir:
        t0 = time.perf_counter()
        data = make_coco_size_set(data_dir, args.scale, args.seed)
        print(f'data in {data_dir} ({time.perf_counter() - t0:.0f} s): '
              f'{json.dumps({k: data[k] for k in COCO_SIZES})}', flush=True)
        rows = []
        for procs in args.procs:
            threads = max(1, (os.cpu_count() or 1) // procs)
            env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED='1')
            env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
            for repeat in range(args.repeats):
                for tool in args.tools:
                    with tempfile.TemporaryDirectory(prefix='inline_mm_startup_work_',
                                                     ignore_cleanup_errors=True) as work_dir:
                        cmd = commands(tool, args.config, work_dir,
                                       cfg_options(data_dir, args.size, procs), procs)
                        rows.append(dict(tool=tool, procs=procs, repeat=repeat,
                                         load_before=round(os.getloadavg()[0], 2),
                                         **measure(cmd, env, args.timeout)))
                    print(json.dumps(rows[-1]), flush=True)
        return dict(scale=args.scale, data=data, config=osp.relpath(args.config, ROOT),
                    size=f'{args.size[1]}x{args.size[0]}', rows=rows,
                    summary=summarise(rows, args))


def summarise(rows: List[dict], args) -> List[dict]:
    """Median per tool and process count, and the ratio inline-mm / mmdet."""
    import statistics
    keys = ('seconds', 'peak_rss_sum_mib', 'max_process_peak_mib')
    out = []
    for procs in args.procs:
        med = {}
        for tool in args.tools:
            sel = [r for r in rows if r['tool'] == tool and r['procs'] == procs]
            med[tool] = {k: statistics.median(r[k] for r in sel) for k in keys}
            out.append(dict(tool=tool, procs=procs, **med[tool]))
        if set(med) == {'inline-mm', 'mmdet'}:
            out.append(dict(tool='ratio inline-mm / mmdet', procs=procs,
                            **{k: round(med['inline-mm'][k] / med['mmdet'][k], 3)
                               for k in keys}))
    return out


def print_table(summary: List[dict]) -> None:
    print('| tool | processes | time to 1st iteration (s) | peak RSS, sum (MiB) | '
          'peak RSS, largest process (MiB) |')
    print('|---|---|---|---|---|')
    for r in summary:
        print(f"| {r['tool']} | {r['procs']} | {r['seconds']:g} | {r['peak_rss_sum_mib']:g} | "
              f"{r['max_process_peak_mib']:g} |")


def parse_args(argv: Optional[List[str]] = None):
    # imported here, not at the top: the --cpu-shim process (mmdet's measured run) must
    # import nothing of its own before mmdet's tool
    from _bench_common import add_peak_args

    from inline_mm.engine.cli_sizes import add_size_option
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', default=DEFAULT_CONFIG, help='the detection recipe')
    parser.add_argument('--data-dir', help='where the generated set is kept and reused '
                        '(default: a temporary folder, removed at the end)')
    parser.add_argument('--scale', type=float, default=1.0,
                        help='fraction of COCO 2017\'s size (1.0: 118,287 train images)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--procs', type=int, nargs='+', default=[1, 2],
                        help='process counts (torch.distributed.run for more than one)')
    parser.add_argument('--tools', nargs='+', default=['inline-mm', 'mmdet'],
                        choices=['inline-mm', 'mmdet'])
    parser.add_argument('--repeats', type=int, default=1, help='interleaved rounds')
    add_size_option(parser, '--size', default='320', replaces=['--input-size'],
                    help='training resize scale, so that the first iteration is cheap')
    add_peak_args(parser)
    parser.add_argument('--timeout', type=float, default=1800, help='seconds per run')
    parser.add_argument('--out', help='folder for startup_coco_size.json')
    args = parser.parse_args(argv)
    if not 0 < args.scale <= 1:
        parser.error(f'--scale must be in (0, 1], got {args.scale}')
    return args


def main(argv: Optional[List[str]] = None) -> dict:
    args = parse_args(argv)
    from _bench_common import cpu_record, describe_cpu
    from mmengine import dump
    result = run_benchmark(args)
    # after the runs, in this process (not one of the measured ones)
    result['cpu'] = cpu_record(n=args.peak_size, repeats=args.peak_repeats)
    print(describe_cpu(result['cpu']))
    print_table(result['summary'])
    if args.out:
        dump(result, osp.join(args.out, 'startup_coco_size.json'), file_format='json', indent=1)
        print(f"written: {osp.join(args.out, 'startup_coco_size.json')}")
    return result


if __name__ == '__main__':
    if len(sys.argv) > 1 and sys.argv[1] == '--cpu-shim':
        cpu_shim(sys.argv[2:])
    else:
        main()
