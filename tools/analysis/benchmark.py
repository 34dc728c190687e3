#!/usr/bin/env python
"""Latency, throughput and peak memory of InLine backbones (and whole models).

    # InLine backbones against their softmax counterparts, interleaved in one process
    python tools/analysis/benchmark.py --compare pvt swin deit --sizes 512 1333x800 2048x1024
    # one backbone by name, or a whole detector / segmentor from a config
    python tools/analysis/benchmark.py --models inline_pvt_t mmdet_pvt_t --sizes 224 512
    python tools/analysis/benchmark.py --config configs/det/mask_rcnn_inline_pvt.py --sizes 1333x800

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
model.

``--dtypes fp32 fp16 bf16`` runs every model in each: ``fp16`` / ``bf16`` are
``torch.autocast`` of the whole forward for backbones, and of the backbone and
the neck for detector configs (mmcv's CPU RoIAlign / NMS take fp32 only).
Each row also gives the achieved GFLOP/s: the model's FLOPs at that size
(mmengine's ``FlopAnalyzer``, traced, counted once per model and size, one
multiply-add = 2 FLOPs here) over the median latency, and its share of the
machine's matmul peak for that dtype, measured in the same run (best of a few
``--peak-size`` square matmuls).

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
import copy
import json
import math
import os
import os.path as osp
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Tuple

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from inline_mm.errors import ConfigError  # noqa: E402

# name -> (builder, family, softmax counterpart name or None)
COUNTERPARTS = {'pvt': ('inline_pvt_t', 'mmdet_pvt_t'), 'swin': ('inline_swin_t', 'mmdet_swin_t'),
                'deit': ('inline_deit_t', 'timm_deit_t'), 'cswin': ('inline_cswin_t', None)}


#: mmdet's softmax backbones with the settings of PVT-T / Swin-T, as mmdet configs
#: (also what benchmark_train.py puts into a detector in place of the InLine backbone).
MMDET_BACKBONES = {
    'mmdet_pvt_t': dict(type='mmdet.PyramidVisionTransformer', num_layers=[2, 2, 2, 2],
                        embed_dims=64, num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
                        qkv_bias=True, init_cfg=None),
    'mmdet_swin_t': dict(type='mmdet.SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                         num_heads=[3, 6, 12, 24], window_size=7, init_cfg=None),
}


def quartiles(times: List[float]) -> Tuple[float, float, float]:
    """(median, 25 %, 75 %) of repeated timings."""
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return statistics.median(times), q[0], q[2]


class _ExplicitSoftmax(nn.Module):
    """An InLine backbone whose softmax blocks run the written-out matmuls, not SDPA."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        from inline_mm.models.layers.softmax_attention import explicit_softmax
        with explicit_softmax():
            return self.model(x)


def build_backbone(name: str) -> nn.Module:
    """Backbones by benchmark name: ``inline_{pvt,swin,cswin,deit}_{t,s,...}``,
    ``mmdet_pvt_t``, ``mmdet_swin_t``, ``timm_deit_t`` (softmax counterparts);
    ``inline_..+explicit``: the softmax blocks through explicit matmuls instead of
    ``scaled_dot_product_attention`` (same weights' arithmetic, for the comparison)."""
    import inline_mm
    if name.startswith('inline_') and name.endswith('+explicit'):
        return _ExplicitSoftmax(build_backbone(name[:-len('+explicit')]))
    if name.startswith('inline_'):
        families = {'pvt': inline_mm.InLinePVT, 'swin': inline_mm.InLineSwin,
                    'cswin': inline_mm.InLineCSWin, 'deit': inline_mm.InLineDeiT}
        sizes = {'t': 'tiny', 's': 'small', 'm': 'medium', 'l': 'large', 'b': 'base'}
        parts = name.split('_')
        cls = families.get(parts[1]) if len(parts) == 3 else None
        arch = sizes.get(parts[2]) if len(parts) == 3 else None
        if cls is None or arch not in cls.arch_settings:
            valid = ', '.join(f'inline_{f}_{k}' for f, c in families.items()
                              for k, a in sizes.items() if a in c.arch_settings)
            raise ConfigError(f'unknown model {name!r}: the InLine backbones are {valid}')
        return cls(arch=arch)
    if name in MMDET_BACKBONES:
        import mmdet.models  # noqa: F401  (registers the backbones)
        from mmdet.registry import MODELS
        return MODELS.build(copy.deepcopy(MMDET_BACKBONES[name]))
    if name == 'authors_pvt_t':  # the authors' code, from --reference-dir (not bundled)
        import importlib
        module = importlib.import_module('inline_pvt')
        model = module.inline_pvt_tiny(img_size=224, attn_type='IIII', la_sr_ratios='1111')

        class Features(nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, x):
                return self.model.forward_features(x)
        return Features()
    if name == 'timm_deit_t':
        from timm.models.vision_transformer import VisionTransformer
        # dynamic_img_pad: sizes that are not multiples of 16 (1333x800) are padded, as
        # the InLine backbones pad (no effect at multiples of 16)
        return VisionTransformer(img_size=224, patch_size=16, embed_dim=192, depth=12,
                                 num_heads=3, num_classes=0, global_pool='',
                                 dynamic_img_size=True, dynamic_img_pad=True)
    raise ConfigError(f'unknown model {name!r}: use inline_<family>_<t|s|m|l|b>, mmdet_pvt_t, '
                     f'mmdet_swin_t, timm_deit_t, or --config')


def _whole_model_class():
    from inline_mm.engine.runner_utils import TensorModeForward

    class WholeModel(TensorModeForward):
        """Tensor-mode forward of a detector / segmentor (backbone, neck and heads).

        ``amp_parts`` names what ``bf16`` / ``fp16`` autocasts: the backbone and
        the neck of a detector, None (all) for a segmentor.
        """

        def __init__(self, model: nn.Module, task: str) -> None:
            from inline_mm.engine.amp import amp_parts
            super().__init__(model, task)
            self.amp_parts = amp_parts(task)

    return WholeModel


def build_from_config(path: str) -> nn.Module:
    """The whole model of a config (random weights) as an image -> outputs module."""
    from inline_mm.engine.launch import load_config
    from inline_mm.engine.runner_utils import build_model, task_of
    cfg = load_config(path)
    return _whole_model_class()(build_model(cfg), task_of(cfg))


def parse_size(text: str) -> Tuple[int, int]:
    """``'512'`` -> (512, 512); ``'1333x800'`` (W x H, as the toolkits write it) -> (800, 1333)."""
    if 'x' in text:
        w, h = text.lower().split('x')
        return int(h), int(w)
    return int(text), int(text)


TORCH_DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}


def autocast(dtype: str, device: str):
    if dtype == 'fp32':
        return torch.autocast(device_type=device, enabled=False)
    return torch.autocast(device_type=device, dtype=TORCH_DTYPES[dtype])


@contextmanager
def precision(model: nn.Module, dtype: str, device: str) -> Iterator[None]:
    """The context ``model`` runs in for ``dtype``: autocast of the whole forward,
    or of ``model.amp_parts`` only (detector configs, see :func:`build_from_config`)."""
    parts = getattr(model, 'amp_parts', None)
    if dtype == 'fp32' or parts is None:
        with autocast(dtype, device):
            yield
        return
    from inline_mm.engine.autocast import autocast_parts
    with autocast_parts(model.model, parts, TORCH_DTYPES[dtype], enabled=False).enable():
        yield


def sync(device: str) -> None:
    """Wait for the device's queued kernels (CUDA runs asynchronously; a timer must not)."""
    if device == 'cuda':
        torch.cuda.synchronize()


def cuda_missing(fix: str = 'pass --device cpu') -> Optional[str]:
    """Why no CUDA device can be used here (one line ending with ``fix``), or None."""
    if torch.cuda.is_available():
        return None
    build = 'a CPU-only build' if torch.version.cuda is None else \
        f'built for CUDA {torch.version.cuda}, but no GPU or driver is visible'
    return (f'no CUDA device: torch {torch.__version__} is {build} '
            f'(torch.cuda.is_available() is False); {fix}')


def time_models(models: Dict[str, nn.Module], size, batch, dtype, device, warmup, repeats,
                progress: Callable[[str], None]) -> Dict[str, List[float]]:
    x = torch.randn(batch, 3, *size, device=device)
    times = {name: [] for name in models}
    with torch.inference_mode():
        for name, model in models.items():
            with precision(model, dtype, device):
                for _ in range(warmup):
                    model(x)
            sync(device)
        for r in range(repeats):  # interleaved: one pass of every model per round
            for name, model in models.items():
                with precision(model, dtype, device):
                    sync(device)
                    t0 = time.perf_counter()
                    model(x)
                    sync(device)
                times[name].append(time.perf_counter() - t0)
            progress(f'  {size[1]}x{size[0]} b{batch} {dtype}: round {r + 1}/{repeats}')
    return times


def _status_kib(field: str) -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1])
    raise RuntimeError(f'{field} not in /proc/self/status')


def reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process (Linux >= 4.0)."""
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')


def peak_memory_mb(spec: str, size, batch, dtype, device, threads,
                   model: Optional[nn.Module] = None) -> float:
    """Peak memory of one forward over the loaded model, in MiB.

    On the CPU: the peak RSS of a fresh process (``threads`` threads).  On a
    GPU: ``torch.cuda.max_memory_allocated`` during one forward of ``model``
    (the one already timed, built from ``spec`` when None), minus what was
    allocated before it (the weights of every loaded model, the input).
    """
    if device == 'cuda':
        if model is None:
            model = load(spec).to(device).eval()
        x = torch.randn(batch, 3, *size, device=device)
        sync(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.inference_mode(), precision(model, dtype, device):
            model(x)
        sync(device)
        return (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    code = (f'import sys; sys.argv=[""]; sys.path.insert(0, {osp.dirname(__file__)!r}); '
            f'import benchmark as b; '
            f'print(b._child_peak({spec!r}, {tuple(size)!r}, {batch}, {dtype!r}, {threads}))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f'memory measurement of {spec} failed:\n{out.stderr[-2000:]}')
    return float(out.stdout.strip().splitlines()[-1])


def _child_peak(spec, size, batch, dtype, threads) -> float:
    torch.set_num_threads(threads)
    if os.environ.get('INLINE_MM_REFERENCE_DIR'):
        sys.path.insert(0, os.environ['INLINE_MM_REFERENCE_DIR'])
    model = load(spec)
    model.eval()
    x = torch.randn(batch, 3, *size)
    with torch.inference_mode(), precision(model, dtype, 'cpu'):
        model(torch.randn(batch, 3, 64, 64))  # lazy initialisation outside the measurement
        # the peak of the import / build phase must not hide the forward's peak
        reset_peak_rss()
        base = _status_kib('VmRSS')
        model(x)
        peak = _status_kib('VmHWM')
    return (peak - base) / 1024


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
    from inline_mm.deploy.onnx_export import export_onnx, time_onnxruntime
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


def load(spec: str) -> nn.Module:
    return build_from_config(spec) if spec.endswith('.py') else build_backbone(spec)


def matmul_peak_gflops(dtype: str, device: str, n: int = 4096, repeats: int = 3,
                       budget_s: float = 10.0) -> Tuple[float, int]:
    """The machine's matmul rate for ``dtype``: best of ``repeats`` ``n x n @ n x n``
    products (``2 n^3`` FLOPs each), in GFLOP/s, after one warm-up product.

    When a 512-sized probe shows that one ``n``-sized product would take more
    than ``budget_s`` (a dtype without fast kernels on this machine, e.g. bf16
    on an AVX2-only CPU), the side shrinks to fit the budget.

    Returns:
        (GFLOP/s, side of the matmul actually used)
    """
    def best_time(side: int, times: int) -> float:
        a = torch.randn(side, side, device=device, dtype=TORCH_DTYPES[dtype])
        b = torch.randn(side, side, device=device, dtype=TORCH_DTYPES[dtype])
        best = float('inf')
        with torch.inference_mode():
            torch.matmul(a, b)
            for _ in range(times):
                sync(device)
                t0 = time.perf_counter()
                torch.matmul(a, b)
                sync(device)
                best = min(best, time.perf_counter() - t0)
        return best

    probe = min(n, 512)
    rate = 2 * probe ** 3 / best_time(probe, 1)
    while n > probe and 2 * n ** 3 / rate > budget_s:
        n //= 2
    return 2 * n ** 3 / best_time(n, repeats) / 1e9, n


def _sdpa_flop_jit(inputs: list, outputs: list) -> int:
    """Multiply-adds of ``scaled_dot_product_attention``: ``q k^T`` and ``attn v``."""
    from mmengine.analysis.jit_handles import get_shape
    q, k, v = (get_shape(t) for t in inputs[:3])
    batch = math.prod(q[:-2])
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


#: (model name, H, W) -> multiply-adds of one image: counted once per model and size
_MACS_CACHE: Dict[Tuple[str, int, int], Optional[int]] = {}


def count_macs(name: str, model: nn.Module, size: Tuple[int, int]) -> Optional[int]:
    """Multiply-adds of one forward of ``model`` on a batch-1 ``size`` image (cached).

    mmengine's ``FlopAnalyzer`` traces the forward and counts matmuls,
    convolutions, normalisations and (with the handle added here) fused
    scaled-dot-product attention; elementwise ops are not counted.  None when
    tracing fails (the row then has no GFLOP/s).
    """
    key = (name, *size)
    if key not in _MACS_CACHE:
        from mmengine.analysis import FlopAnalyzer
        device = next(model.parameters()).device
        try:
            with torch.no_grad():
                analyzer = FlopAnalyzer(model, (torch.randn(1, 3, *size, device=device), ))
                analyzer.set_op_handle('aten::scaled_dot_product_attention', _sdpa_flop_jit)
                analyzer.unsupported_ops_warnings(False)
                analyzer.uncalled_modules_warnings(False)
                _MACS_CACHE[key] = int(analyzer.total())
        except Exception as err:  # noqa: BLE001  (a row without GFLOP/s is still a row)
            print(f'  FLOPs of {name} at {size[1]}x{size[0]} not counted: {err}',
                  file=sys.stderr)
            _MACS_CACHE[key] = None
    return _MACS_CACHE[key]


def slope(points: List[Tuple[int, float]]) -> float:
    """Least-squares slope of log(latency) against log(pixels)."""
    xs = [math.log(p) for p, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float('nan')


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 5))
    series: Dict[Tuple[str, int, str], List[Tuple[int, float]]] = {}
    for row in results['rows']:
        series.setdefault((row['model'], row['batch'], row['dtype'], row['runtime']),
                          []).append((row['pixels'], row['latency_ms']['median']))
    for (model, batch, dtype, runtime), pts in sorted(series.items()):
        pts.sort()
        where = ', onnxruntime' if runtime == 'onnxruntime' else ''
        ax.plot([p for p, _ in pts], [t for _, t in pts], marker='o',
                linestyle='--' if where else '-', label=f'{model} (b{batch}, {dtype}{where})')
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('pixels per image (H x W)')
    ax.set_ylabel('latency per batch (ms)')
    threads = f", {results['threads']} threads" if results.get('threads') else ''
    ax.set_title(f"forward latency, {results['device_name']}{threads}")
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _describe_slope(value: Optional[float]) -> str:
    return 'n/a (one size)' if value is None else f'{value:.2f}'


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--compare', nargs='+', choices=sorted(COUNTERPARTS), default=[],
                        help='InLine backbone families to run against their softmax counterparts')
    parser.add_argument('--models', nargs='+', default=[],
                        help='more backbones by name (see build_backbone)')
    parser.add_argument('--config', nargs='+', default=[], help='whole models from configs')
    parser.add_argument('--sizes', nargs='+', default=['224', '512', '1333x800', '2048x1024'],
                        help='input sizes: S (square) or WxH')
    parser.add_argument('--batch-sizes', type=int, nargs='+', default=[1])
    parser.add_argument('--dtypes', nargs='+', default=['fp32'], choices=['fp32', 'bf16', 'fp16'])
    parser.add_argument('--threads', type=int, default=2,
                        help='intra-op threads of the CPU runs (not set on a GPU)')
    parser.add_argument('--device', choices=['cpu', 'cuda'],
                        default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--no-memory', action='store_true', help='skip peak-memory runs')
    parser.add_argument('--memory-sizes', nargs='+',
                        help='measure peak memory at these sizes only (default: all)')
    parser.add_argument('--no-flops', action='store_true',
                        help='skip the FLOP counts and the matmul peak (no GFLOP/s columns)')
    parser.add_argument('--peak-size', type=int, default=4096,
                        help='side of the square matmul that measures the peak GFLOP/s '
                        '(halved while one product would take over 10 s)')
    parser.add_argument('--peak-repeats', type=int, default=3)
    parser.add_argument('--onnxruntime', action='store_true',
                        help='add onnxruntime (CPU, fp32) rows: each model exported at each '
                        'size (needs the deploy extra: onnx, onnxruntime)')
    parser.add_argument('--out', default='work_dirs/benchmark', help='folder for JSON and PNG')
    parser.add_argument('--reference-dir',
                        help="the authors' models/ folder: enables the model 'authors_pvt_t'")
    args = parser.parse_args(argv)

    if args.device == 'cuda':
        missing = cuda_missing()
        if missing:
            print(f'error: {missing}', file=sys.stderr)
            sys.exit(2)
    else:  # thread settings are the CPU's: on a GPU they would only slow the host side
        torch.set_num_threads(args.threads)
    threads = args.threads if args.device == 'cpu' else None
    if args.onnxruntime:
        from inline_mm.deploy.onnx_export import require_onnx
        if args.device != 'cpu':
            parser.error('--onnxruntime rows run on the CPU: add --device cpu')
        require_onnx()
    if args.reference_dir:
        sys.path.insert(0, osp.abspath(args.reference_dir))
        os.environ['INLINE_MM_REFERENCE_DIR'] = osp.abspath(args.reference_dir)
    specs = [n for fam in args.compare for n in COUNTERPARTS[fam] if n] + args.models + \
        args.config
    if not specs:
        parser.error('name what to run: --compare, --models and / or --config')
    sizes = [parse_size(s) for s in args.sizes]
    memory_sizes = None if args.memory_sizes is None else \
        {parse_size(s) for s in args.memory_sizes}
    device = args.device
    device_name = torch.cuda.get_device_name() if device == 'cuda' else \
        f'CPU ({os.cpu_count()} cores visible)'

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    peaks: Dict[str, float] = {}
    peak_sizes: Dict[str, int] = {}
    if not args.no_flops:
        for dtype in args.dtypes:
            peaks[dtype], peak_sizes[dtype] = matmul_peak_gflops(
                dtype, device, args.peak_size, args.peak_repeats)
            progress(f'matmul peak {dtype} ({peak_sizes[dtype]}^3): {peaks[dtype]:.1f} GFLOP/s')
    progress(f'building {len(specs)} model(s): {", ".join(specs)}')
    models = {}
    for spec in specs:
        model = load(spec).to(device)
        model.eval()  # not chained: mmdet's SwinTransformer.train() returns None
        models[spec] = model
    rows: List[dict] = []
    failed: List[dict] = []  # onnxruntime rows of models that did not export
    for dtype in args.dtypes:
        for batch in args.batch_sizes:
            for size in sizes:
                times = time_models(models, size, batch, dtype, device, args.warmup,
                                    args.repeats, progress)
                for spec, ts in times.items():
                    med, p25, p75 = quartiles(ts)
                    row = dict(model=spec, height=size[0], width=size[1],
                               pixels=size[0] * size[1], batch=batch, dtype=dtype,
                               latency_ms=dict(median=med * 1e3, p25=p25 * 1e3,
                                               p75=p75 * 1e3, min=min(ts) * 1e3),
                               throughput_img_s=batch / med)
                    macs = None if args.no_flops else count_macs(spec, models[spec], size)
                    if macs is not None:
                        row['gflop'] = 2 * macs * batch / 1e9  # one multiply-add = 2 FLOPs
                        row['gflop_per_s'] = row['gflop'] / med
                        row['peak_fraction'] = row['gflop_per_s'] / peaks[dtype]
                    if not args.no_memory and (memory_sizes is None or size in memory_sizes):
                        progress(f'  peak memory of {spec} at {size[1]}x{size[0]}')
                        row['peak_mem_mb'] = peak_memory_mb(spec, size, batch, dtype, device,
                                                            args.threads, models[spec])
                    rows.append(dict(row, runtime='torch'))
                if args.onnxruntime and dtype == 'fp32':
                    ort = time_onnxruntime_rows(models, size, batch, args.warmup, args.repeats,
                                                args.threads, osp.join(args.out, 'onnx'),
                                                progress)
                    for spec, res in ort.items():
                        row = dict(model=spec, height=size[0], width=size[1],
                                   pixels=size[0] * size[1], batch=batch, dtype=dtype,
                                   runtime='onnxruntime', part=res['part'])
                        if 'error' in res:
                            row['error'] = res['error']
                            failed.append(row)
                            continue
                        med, p25, p75 = quartiles(res['times'])
                        row.update(latency_ms=dict(median=med * 1e3, p25=p25 * 1e3,
                                                   p75=p75 * 1e3, min=min(res['times']) * 1e3),
                                   throughput_img_s=batch / med, export_s=res['export_s'])
                        # GFLOP/s where the exported graph is the PyTorch row's (backbones)
                        macs = None if args.no_flops or res['part'] != 'backbone' else \
                            count_macs(spec, models[spec], size)
                        if macs is not None:
                            row['gflop'] = 2 * macs * batch / 1e9
                            row['gflop_per_s'] = row['gflop'] / med
                            row['peak_fraction'] = row['gflop_per_s'] / peaks[dtype]
                        rows.append(row)
    results = dict(device=device, device_name=device_name, threads=threads,
                   torch=torch.__version__, cuda=torch.version.cuda if device == 'cuda' else None,
                   warmup=args.warmup, repeats=args.repeats,
                   command=' '.join([osp.relpath(__file__)] + (argv or sys.argv[1:])),
                   flop_convention='gflop counts one multiply-add as 2 FLOPs',
                   matmul_peak_gflop_per_s=peaks, matmul_peak_size=peak_sizes,
                   rows=rows, failed_rows=failed, slopes={}, ratios=[], dtype_ratios=[],
                   runtime_ratios=[])
    # slopes of latency against pixels (>= 512x512 when such sizes exist); None with one size
    def series(r: dict) -> tuple:
        where = ' onnxruntime' if r['runtime'] == 'onnxruntime' else ''
        return r['model'], r['batch'], r['dtype'] + where

    for key in sorted({series(r) for r in rows}):
        pts = [(r['pixels'], r['latency_ms']['median']) for r in rows if series(r) == key]
        big = [p for p in pts if p[0] >= 512 * 512]
        pts = big if len(big) >= 2 else pts
        value = slope(pts) if len({p for p, _ in pts}) >= 2 else None
        results['slopes']['/'.join(map(str, key))] = value

    def twin(row: dict, **change) -> Optional[dict]:
        want = {k: row[k] for k in ('model', 'pixels', 'batch', 'dtype', 'runtime')}
        want.update(change)
        return next((x for x in rows if all(x[k] == v for k, v in want.items())), None)

    for fam in args.compare:
        inline, softmax = COUNTERPARTS[fam]
        if softmax is None:
            continue
        for r in rows:
            s = twin(r, model=softmax) if r['model'] == inline else None
            if s is None:
                continue
            ratio = dict(family=fam, size=f"{r['width']}x{r['height']}", batch=r['batch'],
                         dtype=r['dtype'], runtime=r['runtime'],
                         latency=r['latency_ms']['median'] / s['latency_ms']['median'])
            if 'peak_mem_mb' in r and 'peak_mem_mb' in s:
                ratio['memory'] = r['peak_mem_mb'] / max(s['peak_mem_mb'], 1e-9)
            results['ratios'].append(ratio)
    for r in rows:  # reduced precision against fp32, same model, size and batch
        base = twin(r, dtype='fp32') if r['dtype'] != 'fp32' else None
        if base is not None:
            results['dtype_ratios'].append(dict(
                model=r['model'], size=f"{r['width']}x{r['height']}", batch=r['batch'],
                dtype=r['dtype'],
                latency=r['latency_ms']['median'] / base['latency_ms']['median']))
    # onnxruntime against PyTorch eager, same model, size and batch (fp32); not for a
    # detector's backbone + neck, whose PyTorch row is the whole detector
    for r in rows:
        base = twin(r, runtime='torch') if r['runtime'] == 'onnxruntime' and \
            r['part'] != 'backbone_neck' else None
        if base is not None:
            results['runtime_ratios'].append(dict(
                model=r['model'], part=r['part'], size=f"{r['width']}x{r['height']}",
                batch=r['batch'],
                latency=r['latency_ms']['median'] / base['latency_ms']['median']))
    os.makedirs(args.out, exist_ok=True)
    with open(osp.join(args.out, 'benchmark.json'), 'w') as f:
        json.dump(results, f, indent=2)
    plot(results, osp.join(args.out, 'benchmark.png'))

    def cell(value: Optional[float], width: int, scale: float = 1.0) -> str:
        return f'{value * scale:{width}.1f}' if value is not None else f'{"-":>{width}s}'

    if peaks:
        where = f'{threads} threads' if threads else device_name
        print(f'matmul peak ({where}): ' + ', '.join(
            f'{d} {v:.1f} GFLOP/s ({peak_sizes[d]}^3)' for d, v in peaks.items()))
    print(f"{'model':18s} {'size':>10s} {'b':>2s} {'dtype':>5s} {'runtime':>11s} "
          f"{'median ms':>10s} {'p25-p75 ms':>15s} {'img/s':>8s} {'GFLOP':>7s} {'GFLOP/s':>8s} "
          f"{'% peak':>6s} {'peak MB':>8s}")
    for r in rows:
        lat = r['latency_ms']
        print(f"{r['model']:18s} {r['width']:>5d}x{r['height']:<4d} {r['batch']:>2d} "
              f"{r['dtype']:>5s} {r['runtime']:>11s} {lat['median']:10.1f} "
              f"{lat['p25']:7.1f}-{lat['p75']:<7.1f} "
              f"{r['throughput_img_s']:8.2f} {cell(r.get('gflop'), 7)} "
              f"{cell(r.get('gflop_per_s'), 8)} {cell(r.get('peak_fraction'), 6, 100)} "
              f"{cell(r.get('peak_mem_mb'), 8)}")
    for ratio in results['ratios']:
        mem = f", memory {ratio['memory']:.2f}x" if 'memory' in ratio else ''
        print(f"InLine/softmax {ratio['family']:5s} {ratio['size']:>10s} b{ratio['batch']} "
              f"{ratio['dtype']} {ratio['runtime']}: latency {ratio['latency']:.2f}x{mem}")
    for ratio in results['dtype_ratios']:
        print(f"{ratio['dtype']}/fp32 {ratio['model']:18s} {ratio['size']:>10s} "
              f"b{ratio['batch']}: latency {ratio['latency']:.2f}x")
    for ratio in results['runtime_ratios']:
        print(f"onnxruntime/PyTorch {ratio['model']:18s} ({ratio['part']}) {ratio['size']:>10s} "
              f"b{ratio['batch']}: latency {ratio['latency']:.2f}x")
    for row in failed:
        print(f"onnxruntime {row['model']} at {row['width']}x{row['height']}: not exported "
              f"({row['error'][:200]})")
    for key, value in results['slopes'].items():
        model, batch, dtype = key.rsplit('/', 2)  # config paths contain '/'
        print(f'log-log slope of latency vs pixels, {model} b{batch} {dtype}: '
              f'{_describe_slope(value)}')
    print(f"wrote {osp.join(args.out, 'benchmark.json')} and benchmark.png")
    return results


if __name__ == '__main__':
    main()
