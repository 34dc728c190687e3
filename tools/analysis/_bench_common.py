"""What the benchmark tools of this folder share.

* the models they build by name or from a config (:func:`load`), the softmax
  backbones of mmdet that stand beside the InLine ones (:data:`MMDET_BACKBONES`);
* the precision a model runs in (:func:`precision`), device synchronisation,
  timing statistics (:func:`quartiles`), why the GPU cannot be used
  (:func:`cuda_missing`, :func:`mmcv_cuda_ops_missing`);
* the machine: the matmul peak per dtype (:func:`matmul_peak_gflops`) and the
  CPU record every result file carries (:func:`cpu_record`);
* FLOP counts (:func:`count_macs`) and the log-log slope of latency against pixels.

The peak memory of one forward is measured in ``_bench_memory.py``, the onnxruntime
rows (a model exported at a fixed size) in ``_bench_onnx.py``.

Imported as ``_bench_common`` (the tools put their own folder on ``sys.path``).
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

#: mmdet's softmax backbones with the settings of PVT-T / Swin-T, as mmdet configs
#: (also what benchmark_train.py puts into a detector in place of the InLine backbone).
MMDET_BACKBONES = {
    'mmdet_pvt_t': dict(type='mmdet.PyramidVisionTransformer', num_layers=[2, 2, 2, 2],
                        embed_dims=64, num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
                        qkv_bias=True, init_cfg=None),
    'mmdet_swin_t': dict(type='mmdet.SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                         num_heads=[3, 6, 12, 24], window_size=7, init_cfg=None),
}

#: CSWin-T (Dong et al., 2022), the softmax network InLine-CSwin-T was made from, built
#: from our blocks: the same stripes (1 / 2 / 7 / 7) with softmax in all four stages and
#: CSWin-T's own depths; neither mmdet nor timm ships a CSWin
CSWIN_T = dict(embed_dims=64, depths=(1, 2, 21, 1), num_heads=(2, 4, 8, 16), attn_type='SSSS')

#: family -> (InLine backbone, softmax counterpart), as :func:`build_backbone` names them
COUNTERPARTS = {'pvt': ('inline_pvt_t', 'mmdet_pvt_t'), 'swin': ('inline_swin_t', 'mmdet_swin_t'),
                'deit': ('inline_deit_t', 'timm_deit_t'), 'cswin': ('inline_cswin_t', 'cswin_t')}

TORCH_DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}

# ---------------------------------------------------------------- models
class _ExplicitSoftmax(nn.Module):
    """An InLine backbone whose softmax blocks run the written-out matmuls, not SDPA."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        from inline_mm.models.layers.softmax_attention import explicit_softmax
        with explicit_softmax():
            return self.model(x)


class _Features(nn.Module):
    """The authors' classification model as a backbone: its ``forward_features``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model.forward_features(x)


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
        return _Features(module.inline_pvt_tiny(img_size=224, attn_type='IIII',
                                                la_sr_ratios='1111'))
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


def build_from_config(path: str, cfg_options: Optional[dict] = None) -> nn.Module:
    """The whole model of a config (random weights, ``--cfg-options`` applied) as an
    image -> outputs module."""
    from inline_mm.engine.launch import load_config
    from inline_mm.engine.runner_utils import build_model, task_of
    cfg = load_config(path, cfg_options)
    return _whole_model_class()(build_model(cfg), task_of(cfg))


def load(spec: str, cfg_options: Optional[dict] = None) -> nn.Module:
    """A config file (``*.py``, with ``cfg_options``) or a backbone by name."""
    return build_from_config(spec, cfg_options) if spec.endswith('.py') else \
        build_backbone(spec)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- precision, timing
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
    from inline_mm.engine.amp import autocast_parts
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
        first = ' '.join(str(err).strip().splitlines()[0].split()) if str(err).strip() else ''
        return (f'mmcv {mmcv.__version__} has no usable CUDA ops here ({type(err).__name__}: '
                f'{first[:200]}); install an mmcv built with CUDA (MMCV_WITH_OPS=1 '
                f'FORCE_CUDA=1, or an OpenMMLab wheel for this torch and CUDA)')
    return None


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


def cpu_record(peaks: Optional[Dict[str, float]] = None,
               peak_sizes: Optional[Dict[str, int]] = None, n: int = 4096,
               repeats: int = 3) -> dict:
    """The CPU a result was measured on, for its JSON file.

    Its model name, whether it has the flags of :data:`CPU_FLAGS` (None where
    /proc/cpuinfo is missing), the cores visible, torch's intra-op threads, the
    load average, the allocator settings (:func:`allocator_settings`), and the fp32 and
    bf16 matmul peaks measured now with those threads (see :func:`matmul_peak_gflops`).
    A dtype in ``peaks`` (the tool's own CPU measurement of this run) is reused.
    """
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
