"""What the benchmark tools of this folder share: the models they build by name or from a
config, precision and timing, why the GPU cannot be used, the machine's record (CPU,
matmul peaks) and FLOP counts.  Imported as ``_bench_common`` (the tools put their own
folder on ``sys.path``).
"""
import argparse
import copy
import math
import os
import os.path as osp
import statistics
import sys
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Tuple

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from inline_mm.engine.cpu_info import CPU_FLAGS, allocator_settings, read_cpuinfo  # noqa: E402
from inline_mm.errors import ConfigError  # noqa: E402

#: CSWin-T (Dong et al., 2022), the softmax network InLine-CSwin-T was made from, built
#: from our blocks: the same stripes (1 / 2 / 7 / 7) with softmax in all four stages and
#: CSWin-T's own depths; neither mmdet nor timm ships a CSWin
CSWIN_T = dict(embed_dims=64, depths=(1, 2, 21, 1), num_heads=(2, 4, 8, 16), attn_type='SSSS')

#: family -> (InLine backbone, softmax counterpart), as :func:`build_backbone` names them
COUNTERPARTS = {'pvt': ('inline_pvt_t', 'mmdet_pvt_t'), 'swin': ('inline_swin_t', 'mmdet_swin_t'),
                'deit': ('inline_deit_t', 'timm_deit_t'), 'cswin': ('inline_cswin_t', 'cswin_t')}

TORCH_DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}
#: the InLine backbones' arch names -> the letters of the benchmark names (inline_pvt_t)
ARCH_LETTERS = {'tiny': 't', 'small': 's', 'medium': 'm', 'large': 'l', 'base': 'b'}


def softmax_counterpart(backbone: dict) -> Tuple[str, dict]:
    """(name, mmdet config) of the softmax backbone that takes an InLine backbone's place,
    with its stages, depths and output widths, so the config's neck fits it: mmdet's
    ``PyramidVisionTransformer`` (64-channel heads) for ``InLinePVT``, its
    ``SwinTransformer`` (windows of 7) for ``InLineSwin``; ValueError for others."""
    import inline_mm
    from inline_mm.models.backbones.arch import resolve_arch
    kind = str(backbone.get('type', '')).split('.')[-1]
    classes = {'InLinePVT': inline_mm.InLinePVT, 'InLineSwin': inline_mm.InLineSwin}
    if kind not in classes:
        raise ValueError(f'no softmax counterpart of {kind or backbone!r} in mmdet (InLinePVT '
                         f'and InLineSwin have one): pass --softmax-backbone NAME or none')
    cls = classes[kind]
    arch = backbone.get('arch', 'tiny')
    keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios')
    arch_cfg = resolve_arch(kind, arch, cls.arch_settings,
                            {k: backbone.get(k) for k in keys if k in backbone})
    suffix = ARCH_LETTERS.get(arch, 'custom') if isinstance(arch, str) else 'custom'
    out_indices = list(backbone.get('out_indices', (0, 1, 2, 3)))
    if kind == 'InLinePVT':
        dims = list(arch_cfg['embed_dims'])
        return f'mmdet_pvt_{suffix}', dict(
            type='mmdet.PyramidVisionTransformer', num_layers=list(arch_cfg['depths']),
            embed_dims=dims[0], num_heads=[d // 64 for d in dims],  # PVT: 64 channels a head
            mlp_ratios=list(arch_cfg['mlp_ratios']), qkv_bias=True, out_indices=out_indices,
            init_cfg=None)
    return f'mmdet_swin_{suffix}', dict(
        type='mmdet.SwinTransformer', embed_dims=arch_cfg['embed_dims'],
        depths=list(arch_cfg['depths']), num_heads=list(arch_cfg['num_heads']),
        window_size=7, out_indices=out_indices, init_cfg=None)


#: mmdet's softmax backbones with the settings of PVT-T / Swin-T, as mmdet configs
MMDET_BACKBONES = dict(softmax_counterpart(dict(type=t)) for t in ('InLinePVT', 'InLineSwin'))


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
    ``mmdet_pvt_t``, ``mmdet_swin_t``, ``timm_deit_t``, ``cswin_t`` (softmax
    counterparts; ``cswin_t`` is :data:`CSWIN_T`);
    ``inline_..+explicit``: the softmax blocks through explicit matmuls instead of
    ``scaled_dot_product_attention`` (same weights' arithmetic, for the comparison)."""
    import inline_mm
    if name.startswith('inline_') and name.endswith('+explicit'):
        return _ExplicitSoftmax(build_backbone(name[:-len('+explicit')]))
    if name.startswith('inline_'):
        families = {'pvt': inline_mm.InLinePVT, 'swin': inline_mm.InLineSwin,
                    'cswin': inline_mm.InLineCSWin, 'deit': inline_mm.InLineDeiT}
        sizes = {letter: arch for arch, letter in ARCH_LETTERS.items()}
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
        import inline_pvt
        model = inline_pvt.inline_pvt_tiny(img_size=224, attn_type='IIII', la_sr_ratios='1111')
        model.forward = model.forward_features  # their classifier as a backbone
        return model
    if name == 'cswin_t':  # CSWin-T itself: softmax stripes in every stage, its own depths
        return inline_mm.InLineCSWin(arch=CSWIN_T)
    if name == 'timm_deit_t':
        from timm.models.vision_transformer import VisionTransformer
        # dynamic_img_pad: sizes that are not multiples of 16 (1333x800) are padded, as
        # the InLine backbones pad (no effect at multiples of 16)
        return VisionTransformer(img_size=224, patch_size=16, embed_dim=192, depth=12,
                                 num_heads=3, num_classes=0, global_pool='',
                                 dynamic_img_size=True, dynamic_img_pad=True)
    raise ConfigError(f'unknown model {name!r}: use inline_<family>_<t|s|m|l|b>, mmdet_pvt_t, '
                      f'mmdet_swin_t, timm_deit_t, cswin_t, or --config')


def build_from_config(path: str, cfg_options: Optional[dict] = None) -> nn.Module:
    """The whole model of a config (random weights, ``--cfg-options`` applied) as an
    image -> outputs module (its ``task`` says what :func:`precision` autocasts)."""
    from inline_mm.engine.launch import load_config
    from inline_mm.engine.runner_utils import TensorModeForward, build_model, task_of
    cfg = load_config(path, cfg_options)
    return TensorModeForward(build_model(cfg), task_of(cfg))


def load(spec: str, cfg_options: Optional[dict] = None) -> nn.Module:
    """A config file (``*.py``, with ``cfg_options``) or a backbone by name."""
    return build_from_config(spec, cfg_options) if spec.endswith('.py') else \
        build_backbone(spec)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- precision, devices
def autocast(dtype: str, device: str):
    if dtype == 'fp32':
        return torch.autocast(device_type=device, enabled=False)
    return torch.autocast(device_type=device, dtype=TORCH_DTYPES[dtype])


@contextmanager
def precision(model: nn.Module, dtype: str, device: str) -> Iterator[None]:
    """The context ``model`` runs in for ``dtype``: autocast of the whole forward, or of
    the backbone and neck only for a detector (mmcv's CPU RoIAlign / NMS take fp32 only)."""
    from inline_mm.engine.amp import amp_parts, autocast_parts
    parts = amp_parts(model.task) if hasattr(model, 'task') else None
    if dtype == 'fp32' or parts is None:
        with autocast(dtype, device):
            yield
        return
    with autocast_parts(model.model, parts, TORCH_DTYPES[dtype], enabled=False).enable():
        yield


def sync(device: str) -> None:
    """Wait for the device's queued kernels (CUDA runs asynchronously; a timer must not)."""
    if device == 'cuda':
        torch.cuda.synchronize()


def cuda_peak_mb(step) -> float:
    """The CUDA allocator's peak during ``step()`` over what was allocated before it, MiB."""
    sync('cuda')
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    sync('cuda')
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def first_line(err: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message``, blanks collapsed, at most ``limit`` characters."""
    text = ' '.join(str(err).strip().splitlines()[0].split()) if str(err).strip() else ''
    return f'{type(err).__name__}: {text}'[:limit]


def cuda_missing(fix: str = 'pass --device cpu') -> Optional[str]:
    """Why no CUDA device can be used here (one line ending with ``fix``), or None."""
    if torch.cuda.is_available():
        return None
    build = 'a CPU-only build' if torch.version.cuda is None else \
        f'built for CUDA {torch.version.cuda}, but no GPU or driver is visible'
    return (f'no CUDA device: torch {torch.__version__} is {build} '
            f'(torch.cuda.is_available() is False); {fix}')


def mmcv_cuda_ops_missing() -> Optional[str]:
    """Why mmcv's RoIAlign / NMS cannot run on the GPU here (one line), or None.

    An mmcv built without CUDA kernels (``FORCE_CUDA=0``, as a CPU machine
    builds it) imports fine and fails only inside the first RoI head.
    """
    try:
        from mmcv.ops import nms, roi_align
        feats = torch.rand(1, 2, 8, 8, device='cuda')
        rois = torch.tensor([[0., 1., 1., 6., 6.]], device='cuda')
        roi_align(feats, rois, (2, 2), 1.0, 0, 'avg', True)
        boxes = torch.tensor([[0., 0., 4., 4.], [1., 1., 5., 5.]], device='cuda')
        nms(boxes, torch.tensor([0.9, 0.8], device='cuda'), 0.5)
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001  (any failure means: no usable CUDA ops)
        import mmcv
        return (f'mmcv {mmcv.__version__} has no usable CUDA ops here ({first_line(err, 240)}); '
                f'install an mmcv built with CUDA (MMCV_WITH_OPS=1 FORCE_CUDA=1, or an '
                f'OpenMMLab wheel for this torch and CUDA)')
    return None


def use_device(device: str, threads: int, *checks) -> None:
    """CPU: ``threads`` intra-op threads (on a GPU they would only slow the host side).
    GPU: one ``error:`` line and exit status 2 where :func:`cuda_missing` or one of
    ``checks`` says why it cannot be used."""
    if device == 'cpu':
        torch.set_num_threads(threads)
        return
    missing = next(filter(None, (check() for check in (cuda_missing, *checks))), None)
    if missing:
        print(f'error: {missing}', file=sys.stderr)
        sys.exit(2)


def machine(device: str, threads: int) -> dict:
    """Where a result was measured, for its JSON file (threads: CPU runs only)."""
    on_cpu = device == 'cpu'
    return dict(device=device, device_name=f'CPU ({os.cpu_count()} cores visible)' if on_cpu
                else torch.cuda.get_device_name(), threads=threads if on_cpu else None,
                torch=torch.__version__, cuda=None if on_cpu else torch.version.cuda)


def quartiles(times: List[float]) -> Tuple[float, float, float]:
    """(median, 25 %, 75 %) of repeated timings."""
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return statistics.median(times), q[0], q[2]


def latency_ms(times: List[float]) -> dict:
    """Median, quartiles and minimum of timings in seconds, in ms."""
    med, p25, p75 = quartiles(times)
    return dict(median=med * 1e3, p25=p25 * 1e3, p75=p75 * 1e3, min=min(times) * 1e3)


# ---------------------------------------------------------------- the machine
def add_peak_args(parser: argparse.ArgumentParser) -> None:
    """``--peak-size`` / ``--peak-repeats``: the matmul that measures the machine's peak."""
    parser.add_argument('--peak-size', type=int, default=4096,
                        help='side of the square matmul that measures the peak GFLOP/s '
                        '(halved while one product would take over 10 s)')
    parser.add_argument('--peak-repeats', type=int, default=3)


def add_timing_args(parser: argparse.ArgumentParser, device: str, warmup: int,
                    dtypes_help: Optional[str] = None) -> None:
    """The options of the tools that time passes: precisions, device, passes, the peak."""
    parser.add_argument('--dtypes', nargs='+', default=['fp32'], choices=['fp32', 'bf16', 'fp16'],
                        help=dtypes_help)
    parser.add_argument('--device', choices=['cpu', 'cuda'], default=device)
    parser.add_argument('--threads', type=int, default=2,
                        help='intra-op threads of a CPU run (not set on a GPU)')
    parser.add_argument('--warmup', type=int, default=warmup)
    parser.add_argument('--repeats', type=int, default=5)
    add_peak_args(parser)


def matmul_peak_gflops(dtype: str, device: str, n: int = 4096, repeats: int = 3,
                       budget_s: float = 10.0) -> Tuple[float, int]:
    """(GFLOP/s, side used): the best of ``repeats`` ``n x n`` matmuls in ``dtype`` after a
    warm-up one.  The side shrinks while a 512-sized probe says one product would take over
    ``budget_s`` (a dtype without fast kernels here, e.g. bf16 on an AVX2-only CPU)."""
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


def cpu_record(peaks: Optional[Dict[str, float]] = None,
               peak_sizes: Optional[Dict[str, int]] = None, n: int = 4096,
               repeats: int = 3) -> dict:
    """The CPU a result was measured on, for its JSON file: model name, :data:`CPU_FLAGS`
    (None without /proc/cpuinfo), cores, threads, load, allocator settings, and the fp32 /
    bf16 matmul peaks measured now, unless in ``peaks`` (the tool's own CPU measurement)."""
    model, flags = read_cpuinfo()
    peaks, sizes = dict(peaks or {}), dict(peak_sizes or {})
    for dtype in ('fp32', 'bf16'):
        if dtype not in peaks:
            peaks[dtype], sizes[dtype] = matmul_peak_gflops(dtype, 'cpu', n, repeats)
    return dict(model=model,
                flags=None if flags is None else {f: f in flags for f in CPU_FLAGS},
                cores_visible=os.cpu_count(), threads=torch.get_num_threads(),
                load_average=[round(v, 2) for v in os.getloadavg()],
                allocator=allocator_settings(),
                matmul_peak_gflop_per_s={d: peaks[d] for d in ('fp32', 'bf16')},
                matmul_peak_size={d: sizes[d] for d in ('fp32', 'bf16')})


def describe_cpu(cpu: dict) -> str:
    """One line of :func:`cpu_record`'s result, for the printed output."""
    flags = ' '.join(f for f, on in (cpu['flags'] or {}).items() if on) or 'flags unknown'
    peaks = cpu['matmul_peak_gflop_per_s']
    return (f"CPU: {cpu['model']} ({flags}; {cpu['threads']} threads), matmul peak fp32 "
            f"{peaks['fp32']:.1f}, bf16 {peaks['bf16']:.1f} GFLOP/s; load "
            f"{' '.join(map(str, cpu['load_average']))}; allocator "
            f"{' '.join(f'{k}={v}' for k, v in cpu['allocator']['env'].items()) or 'default'}")


# ---------------------------------------------------------------- FLOPs
def _sdpa_flop_jit(inputs: list, outputs: list) -> int:
    """Multiply-adds of ``scaled_dot_product_attention``: ``q k^T`` and ``attn v``."""
    from mmengine.analysis.jit_handles import get_shape
    q, k, v = (get_shape(t) for t in inputs[:3])
    batch = math.prod(q[:-2])
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


#: (model name, H, W) -> multiply-adds of one image: counted once per model and size
_MACS_CACHE: Dict[Tuple[str, int, int], Optional[int]] = {}


def count_macs(name: str, model: nn.Module, size: Tuple[int, int]) -> Optional[int]:
    """Multiply-adds of one forward of ``model`` on a batch-1 ``size`` image (cached): what
    mmengine's traced ``FlopAnalyzer`` counts, fused attention included (the handle added
    here), elementwise ops not; None when tracing fails (a row without GFLOP/s)."""
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
    """Least-squares slope of log(latency) against log(pixels) (nan for a single size)."""
    xs, ys = zip(*((math.log(p), math.log(t)) for p, t in points))
    try:
        return statistics.linear_regression(xs, ys).slope
    except statistics.StatisticsError:
        return float('nan')
