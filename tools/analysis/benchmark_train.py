#!/usr/bin/env python
"""Time of one training iteration of a detector, InLine backbone against softmax.

    python tools/analysis/benchmark_train.py                       # Mask R-CNN, PVT-T pair
    python tools/analysis/benchmark_train.py CONFIG --size 800x800 --batch-size 2 \\
        --dtypes fp32 bf16 --repeats 5 --out work_dirs/benchmark_train.json

``--size`` is ``WIDTHxHEIGHT`` (``1333x800``) or ``N`` for ``NxN``.

One iteration is mmengine's ``model.train_step``: data preprocessing, forward
with losses, backward and the optimiser step of the config's ``optim_wrapper``.
The detector of ``CONFIG`` runs once with its own backbone and once with the
softmax counterpart in its place (same neck, heads, optimiser, data), all runs
interleaved round by round after ``--warmup`` iterations each, on one
synthetic batch of ``--batch-size`` images with random boxes and masks (the
same batch for all).  The counterpart follows the config's backbone
(``--softmax-backbone auto``): mmdet's ``PyramidVisionTransformer`` with the
depths and widths of an ``InLinePVT``, mmdet's ``SwinTransformer`` with those
of an ``InLineSwin``.

``--dtypes fp32 bf16`` times each detector in both precisions: ``bf16`` is
what ``tools/train.py --amp`` does without a GPU
(``CPUAutocastOptimWrapper`` with ``parts=('backbone', 'neck')``: backbone
and neck under bf16 autocast, heads, losses and mmcv's ops in fp32).

``--device cuda`` runs on a GPU (every timed iteration bracketed by
``torch.cuda.synchronize``; ``--threads`` not applied) and adds ``fp16``:

- ``fp16`` is what ``tools/train.py --amp`` does on a GPU: mmengine's
  ``AmpOptimWrapper`` (the whole training forward under fp16 autocast,
  dynamic loss scale);
- ``bf16`` autocasts the parts the config names (``optim_wrapper.parts``: the toy
  detector's backbone, neck, RPN and RoI heads), else the backbone and the neck, as
  ``--amp`` on the CPU: mmcv 2.1's CUDA RoIAlign has fp32 / fp16 kernels only and its
  NMS takes fp32, so each part's outputs go back to fp32.

On a GPU each row also gives the peak memory of one iteration: the increase
of ``torch.cuda.max_memory_allocated`` over what was allocated before it (the
weights and optimiser states of every run), in one more iteration after the
timed ones.

Prints the median time per iteration (with the 25-75 % spread), the InLine /
softmax ratio per dtype and the bf16 / fp32 ratio per backbone; ``--out``
writes them as JSON, with the CPU (model, flags, its fp32 / bf16 matmul peaks
measured after the timed rounds).  ``--breakdown`` adds, per run, where one iteration's time
goes: the forward time of the backbone, neck, RPN and RoI parts, the remainder
(backward, losses, sampling, optimiser), and the slowest operators.
"""
import argparse
import copy
import json
import os
import os.path as osp
import sys
import time
import warnings
from typing import Dict, List, Tuple

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.logging import MMLogger  # noqa: E402
from mmengine.optim import build_optim_wrapper  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

from _bench_common import (MMDET_BACKBONES, add_peak_args, cpu_record,  # noqa: E402
                           cuda_missing, describe_cpu, mmcv_cuda_ops_missing, quartiles,
                           sync)  # (same folder)
from inline_mm.engine.amp import configure_amp, configure_fp32  # noqa: E402
from inline_mm.engine.cli_sizes import add_size_option, format_size  # noqa: E402
from inline_mm.engine.launch import add_cfg_options, cli_main, load_config  # noqa: E402
from inline_mm.engine.runner_utils import task_of  # noqa: E402
from inline_mm.errors import ConfigError  # noqa: E402

DEFAULT_CONFIG = osp.join(ROOT, 'configs', 'det', 'mask_rcnn_inline_pvt.py')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', nargs='?', default=DEFAULT_CONFIG,
                        help='detector config with an InLine backbone')
    parser.add_argument('--softmax-backbone', default='auto',
                        choices=['auto', 'none'] + sorted(MMDET_BACKBONES),
                        help="softmax backbone put in place of the InLine one: 'auto' (the "
                        "counterpart of the config's backbone), a name, or 'none' (time the "
                        "config's model only)")
    add_size_option(parser, '--size', default='800x800', help='size of every image')
    parser.add_argument('--batch-size', type=int, default=2)
    parser.add_argument('--objects', type=int, default=8, help='ground-truth objects per image')
    parser.add_argument('--dtypes', nargs='+', default=['fp32'], choices=['fp32', 'fp16', 'bf16'],
                        help='bf16: the config\'s autocast parts, else backbone and neck, '
                        'under bf16 autocast (as --amp on the CPU); fp16 (--device cuda '
                        'only): AmpOptimWrapper, as --amp on a GPU')
    parser.add_argument('--device', choices=['cpu', 'cuda'], default='cpu')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--threads', type=int, default=2,
                        help='intra-op threads of a CPU run (not set with --device cuda)')
    parser.add_argument('--breakdown', action='store_true',
                        help='after the timed rounds, one more iteration per run with the '
                        'forward time of each part of the detector and the slowest operators '
                        '(torch.profiler, self CPU time)')
    parser.add_argument('--out', help='write the figures as JSON')
    add_peak_args(parser)
    add_cfg_options(parser)
    args = parser.parse_args(argv)
    if args.device == 'cuda' and args.breakdown:
        parser.error('--breakdown times the parts on the host clock: CPU runs only '
                     '(drop --breakdown or use --device cpu)')
    if args.device == 'cpu' and 'fp16' in args.dtypes:
        parser.error("--dtypes fp16 is the GPU's --amp (AmpOptimWrapper): add --device cuda")
    return args


# the parts of a two-stage detector whose forward time --breakdown reports
DETECTOR_PARTS = ('backbone', 'neck', 'rpn_head', 'roi_head.bbox_roi_extractor',
                  'roi_head.bbox_head', 'roi_head.mask_roi_extractor', 'roi_head.mask_head')


def breakdown(model, data: dict, optim, top: int = 12) -> dict:
    """One ``train_step`` under ``torch.profiler``: forward seconds per detector part and
    the ``top`` operators by self CPU time (grouped by input shapes).

    The rest of the step (backward, losses, target assignment, the optimiser) is
    ``step_s`` minus the forward parts.  Times include the profiler's overhead.
    """
    from torch.profiler import ProfilerActivity, profile
    modules = dict(model.named_modules())
    forward: Dict[str, float] = {}
    handles = []
    for name in DETECTOR_PARTS:
        if name not in modules:
            continue

        def pre(_module, _args, name=name):
            forward[name] = forward.get(name, 0.0) - time.perf_counter()

        def post(_module, _args, _out, name=name):
            forward[name] += time.perf_counter()

        handles += [modules[name].register_forward_pre_hook(pre),
                    modules[name].register_forward_hook(post)]
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            t0 = time.perf_counter()
            model.train_step(data, optim)
            step = time.perf_counter() - t0
    finally:
        for handle in handles:
            handle.remove()
    events = sorted(prof.key_averages(group_by_input_shape=True),
                    key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    ops = [dict(name=e.key, input_shapes=str(e.input_shapes)[:120], calls=e.count,
                self_ms=e.self_cpu_time_total / 1e3) for e in events]
    return dict(step_s=step, forward_s=forward,
                rest_s=step - sum(forward.values()), top_ops=ops)


_ARCH_LETTER = {'tiny': 't', 'small': 's', 'medium': 'm', 'large': 'l', 'base': 'b'}


def softmax_counterpart(backbone: dict) -> Tuple[str, dict]:
    """The softmax backbone that takes an InLine backbone's place: (name, mmdet config).

    Same stages, depths and output widths, so the config's neck fits it:
    ``InLinePVT`` -> mmdet's ``PyramidVisionTransformer`` (PVT's 64-channel
    heads, spatial-reduction attention), ``InLineSwin`` -> mmdet's
    ``SwinTransformer`` (windows of 7).  ``InLinePVT(tiny)`` gives
    ``mmdet_pvt_t``, ``InLineSwin(tiny)`` ``mmdet_swin_t``.

    Raises:
        ValueError: the backbone has no softmax counterpart in mmdet.
    """
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
    suffix = _ARCH_LETTER.get(arch, 'custom') if isinstance(arch, str) else 'custom'
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


def synthetic_batch(size, batch_size: int, objects: int, num_classes: int) -> dict:
    """A fixed batch in the layout of mmdet's ``PackDetInputs`` (boxes, labels, masks)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    h, w = size
    gen = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for _ in range(batch_size):
        inputs.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen))
        wh = torch.rand(objects, 2, generator=gen) * 0.4 + 0.05
        xy = torch.rand(objects, 2, generator=gen) * (1 - wh)
        boxes = torch.cat([xy, xy + wh], dim=1) * torch.tensor([w, h, w, h])
        masks = torch.zeros(objects, h, w, dtype=torch.uint8)
        for i, (x0, y0, x1, y1) in enumerate(boxes.round().long().tolist()):
            masks[i, y0:y1, x0:x1] = 1
        gt = InstanceData(bboxes=boxes,
                          labels=torch.randint(0, num_classes, (objects, ), generator=gen),
                          masks=BitmapMasks(masks.numpy(), h, w))
        samples.append(DetDataSample(gt_instances=gt, metainfo=dict(
            img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), scale_factor=(1., 1.),
            flip=False, flip_direction=None)))
    return dict(inputs=inputs, data_samples=samples)


def build(cfg: Config, device: str = 'cpu'):
    from mmdet.registry import MODELS
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.to(device)  # mmengine's BaseModel moves its data preprocessor's target too
    model.train()
    return model


def optim_wrapper_for(model, cfg: Config, dtype: str, device: str = 'cpu'):
    """The optimiser wrapper of a run: the config's for ``fp32`` (a config's CPU autocast
    turned off); for ``bf16`` the one ``--amp`` sets up on the CPU (the config's autocast
    parts, else backbone + neck under bf16 autocast, on either device); for ``fp16`` (GPU)
    the one ``--amp`` sets up on a GPU (``AmpOptimWrapper``)."""
    cfg = copy.deepcopy(cfg)
    if dtype == 'fp32':
        configure_fp32(cfg)
    elif dtype == 'bf16':
        with warnings.catch_warnings():
            if device != 'cpu':  # its "slow bf16 on this CPU" warning is about the CPU
                warnings.simplefilter('ignore', RuntimeWarning)
            configure_amp(cfg, 'mmdet', device='cpu')
    elif dtype == 'fp16':
        configure_amp(cfg, 'mmdet', device=device)
    return build_optim_wrapper(model, cfg.optim_wrapper)


def peak_step_mb(model, data: dict, optim) -> float:
    """One ``train_step`` on the GPU; the increase of the allocator's peak over its
    allocation before the step, in MiB."""
    sync('cuda')
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model.train_step(data, optim)
    sync('cuda')
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = args.device
    if device == 'cuda':
        missing = cuda_missing() or mmcv_cuda_ops_missing()
        if missing:
            print(f'error: {missing}', file=sys.stderr)
            sys.exit(2)
    else:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.cfg_options)
    if task_of(cfg) != 'mmdet':
        raise ConfigError(f'{args.config} is a {task_of(cfg)} config: this benchmark times '
                          f'detector training iterations (give a configs/det config; '
                          f'segmentors: tools/analysis/benchmark.py --config)')
    init_default_scope('mmdet')
    # the optimiser builder logs one line per parameter group at INFO
    MMLogger.get_instance('mmengine', log_level='WARNING')
    h, w = args.size
    cfg.model.backbone.init_cfg = None
    inline_name = f"{cfg.model.backbone.type}({cfg.model.backbone.get('arch', '')})"
    backbones = {inline_name: cfg}
    softmax_name = None
    if args.softmax_backbone != 'none':
        if args.softmax_backbone == 'auto':
            softmax_name, softmax_backbone = softmax_counterpart(cfg.model.backbone)
        else:
            softmax_name = args.softmax_backbone
            softmax_backbone = copy.deepcopy(MMDET_BACKBONES[softmax_name])
        softmax_cfg = copy.deepcopy(cfg)
        softmax_cfg.model.backbone = softmax_backbone
        backbones[softmax_name] = softmax_cfg
    # one model per backbone; each dtype has its own optimiser wrapper (and state) on it
    runs = {}
    for name, model_cfg in backbones.items():
        model = build(model_cfg, device)
        for dtype in args.dtypes:
            key = name if dtype == 'fp32' else f'{name} ({dtype})'
            runs[key] = (name, dtype, model, optim_wrapper_for(model, model_cfg, dtype, device))
    data = synthetic_batch((h, w), args.batch_size, args.objects,
                           cfg.model.roi_head.bbox_head.num_classes)

    times: Dict[str, List[float]] = {key: [] for key in runs}
    peaks: Dict[str, float] = {}  # GPU only: the memory peak of one iteration of each run
    for key, (_, _, model, optim) in runs.items():
        for _ in range(args.warmup):
            model.train_step(data, optim)
    for r in range(args.repeats):  # interleaved: one iteration of every run per round
        for key, (_, _, model, optim) in runs.items():
            sync(device)
            t0 = time.perf_counter()
            model.train_step(data, optim)
            sync(device)
            times[key].append(time.perf_counter() - t0)
        print(f'round {r + 1}/{args.repeats}: ' + ', '.join(
            f'{n} {t[-1]:.2f} s' for n, t in times.items()), flush=True)

    if device == 'cuda':  # one more iteration per run, untimed: its memory peak
        for key, (_, _, model, optim) in runs.items():
            peaks[key] = peak_step_mb(model, data, optim)

    breakdowns = {}
    if args.breakdown:
        for key, (_, _, model, optim) in runs.items():
            breakdowns[key] = b = breakdown(model, data, optim)
            print(f"\nbreakdown of one iteration, {key} ({b['step_s']:.2f} s under the "
                  f'profiler):')
            for part, sec in b['forward_s'].items():
                print(f'  forward {part:<30} {sec * 1e3:8.0f} ms')
            print(f"  {'backward, losses, sampling, optimiser':<38} {b['rest_s'] * 1e3:8.0f} ms")
            print('  slowest operators (self CPU):')
            for op in b['top_ops']:
                print(f"    {op['self_ms']:8.1f} ms  {op['calls']:4d} x {op['name']:<28} "
                      f"{op['input_shapes']}")

    rows = {}
    for key, ts in times.items():
        median, p25, p75 = quartiles(ts)
        name, dtype = runs[key][:2]
        rows[key] = dict(backbone=name, dtype=dtype, median_s=median, p25_s=p25, p75_s=p75,
                         times_s=ts)
        if key in peaks:
            rows[key]['peak_mem_mb'] = peaks[key]
        if key in breakdowns:
            rows[key]['breakdown'] = breakdowns[key]

    def row(name: str, dtype: str) -> dict:
        return rows[name if dtype == 'fp32' else f'{name} ({dtype})']

    ratios = {}  # InLine / softmax, per dtype
    dtype_ratios = {}  # bf16 / fp32, per backbone
    for dtype in args.dtypes:
        if softmax_name is not None:
            ratios[dtype] = row(inline_name, dtype)['median_s'] / \
                row(softmax_name, dtype)['median_s']
        if dtype != 'fp32' and 'fp32' in args.dtypes:
            for name in backbones:
                dtype_ratios[f'{name} {dtype}/fp32'] = row(name, dtype)['median_s'] / \
                    row(name, 'fp32')['median_s']
    on_gpu = device == 'cuda'
    result = dict(config=args.config, size=[h, w], size_wxh=format_size((h, w)),
                  batch_size=args.batch_size, cfg_options=args.cfg_options,
                  threads=None if on_gpu else args.threads, device=device,
                  device_name=torch.cuda.get_device_name() if on_gpu else
                  f'CPU ({os.cpu_count()} cores visible)',
                  torch=torch.__version__, cuda=torch.version.cuda if on_gpu else None,
                  warmup=args.warmup, repeats=args.repeats, dtypes=args.dtypes,
                  softmax_backbone=softmax_name, rows=rows,
                  ratio=ratios.get(args.dtypes[0]), ratios=ratios, dtype_ratios=dtype_ratios,
                  # after the timed rounds: the matmuls must not heat or load the timed ones
                  cpu=cpu_record(n=args.peak_size, repeats=args.peak_repeats))
    print(describe_cpu(result['cpu']))
    where = result['device_name'] if on_gpu else f'{args.threads} threads'
    print(f'\none training iteration, batch {args.batch_size} at {w}x{h}, '
          f'{where} (median, 25-75 %):')
    for key, r in rows.items():
        mem = f", peak {r['peak_mem_mb']:.0f} MB" if 'peak_mem_mb' in r else ''
        print(f"  {key:<30} {r['median_s']:.3f} s  ({r['p25_s']:.3f}-{r['p75_s']:.3f}){mem}")
    for dtype, value in ratios.items():
        print(f'  ratio InLine / softmax, {dtype}: {value:.2f}')
    for what, value in dtype_ratios.items():
        print(f'  ratio {what}: {value:.2f}')
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == '__main__':
    sys.exit(cli_main(main))
