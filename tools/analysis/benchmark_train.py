#!/usr/bin/env python
"""Time of one training iteration of a detector, InLine backbone against softmax.

    python tools/analysis/benchmark_train.py                       # Mask R-CNN, PVT-T pair
    python tools/analysis/benchmark_train.py CONFIG --size 800x800 --batch-size 2 \\
        --dtypes fp32 bf16 --repeats 5 --out work_dirs/benchmark_train.json

What the toolkits' tools cannot: mmengine's ``model.train_step`` (preprocessing, forward
with losses, backward, the optimiser step of the config's ``optim_wrapper``) of the
detector of ``CONFIG`` with its own backbone and with the softmax counterpart in its
place (same neck, heads, optimiser; ``--softmax-backbone auto``: mmdet's
``PyramidVisionTransformer`` / ``SwinTransformer`` with the depths and widths of the
config's ``InLinePVT`` / ``InLineSwin``), all runs interleaved round by round after
``--warmup`` iterations each, on one synthetic batch of random boxes and masks.

Precisions are what ``tools/train.py --amp`` does: ``bf16`` autocasts the parts the
config names (``optim_wrapper.parts``), else backbone and neck, as ``--amp`` on the CPU
(heads, losses and mmcv's ops in fp32: mmcv 2.1's CUDA RoIAlign / NMS have no bf16
kernels); ``fp16`` (``--device cuda`` only) is ``--amp`` on a GPU (mmengine's
``AmpOptimWrapper``, dynamic loss scale).  On a GPU each row also gives the peak memory
of one more iteration (the increase of ``torch.cuda.max_memory_allocated``).

Prints the median time per iteration (with the 25-75 % spread), the InLine / softmax
ratio per dtype and the reduced precision / fp32 ratio per backbone; ``--out`` writes
them as JSON with the CPU record.  ``--breakdown`` adds, per run, the forward time of
the backbone, neck, RPN and RoI parts, the remainder (backward, losses, sampling,
optimiser), and the slowest operators.
"""
import argparse
import copy
import os.path as osp
import sys
import time
import warnings
from typing import Dict, Tuple

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

import torch  # noqa: E402
from mmengine import dump  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.logging import MMLogger  # noqa: E402
from mmengine.optim import build_optim_wrapper  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

# (softmax_counterpart: used as benchmark_train.softmax_counterpart)
from _bench_common import (MMDET_BACKBONES, add_timing_args, cpu_record,  # noqa: E402,F401
                           cuda_peak_mb, describe_cpu, machine, mmcv_cuda_ops_missing,
                           quartiles, softmax_counterpart, sync, use_device)
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
    add_timing_args(parser, 'cpu', warmup=1, dtypes_help=(
        "bf16: the config's autocast parts, else backbone and neck, under bf16 autocast (as "
        '--amp on the CPU); fp16 (--device cuda only): AmpOptimWrapper, as --amp on a GPU'))
    parser.add_argument('--breakdown', action='store_true',
                        help='after the timed rounds, one more iteration per run with the '
                        'forward time of each part of the detector and the slowest operators '
                        '(torch.profiler, self CPU time)')
    parser.add_argument('--out', help='write the figures as JSON')
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


def detector_configs(cfg: Config, choice: str) -> Tuple[Dict[str, Config], str, str]:
    """The config with its InLine backbone and, unless ``choice`` is 'none', one with the
    softmax backbone in its place; and the two backbones' names (the second None)."""
    cfg.model.backbone.init_cfg = None
    inline_name = f"{cfg.model.backbone.type}({cfg.model.backbone.get('arch', '')})"
    configs = {inline_name: cfg}
    if choice == 'none':
        return configs, inline_name, None
    if choice == 'auto':
        softmax_name, softmax_backbone = softmax_counterpart(cfg.model.backbone)
    else:
        softmax_name, softmax_backbone = choice, copy.deepcopy(MMDET_BACKBONES[choice])
    configs[softmax_name] = copy.deepcopy(cfg)
    configs[softmax_name].model.backbone = softmax_backbone
    return configs, inline_name, softmax_name


def time_runs(runs: dict, data: dict, args) -> Dict[str, list]:
    """Seconds of every run's timed iterations: ``--warmup`` untimed ones each, then one
    iteration of every run per round."""
    times = {key: [] for key in runs}
    for _, _, model, optim in runs.values():
        for _ in range(args.warmup):
            model.train_step(data, optim)
    for r in range(args.repeats):
        for key, (_, _, model, optim) in runs.items():
            sync(args.device)
            t0 = time.perf_counter()
            model.train_step(data, optim)
            sync(args.device)
            times[key].append(time.perf_counter() - t0)
        print(f'round {r + 1}/{args.repeats}: ' + ', '.join(
            f'{n} {t[-1]:.2f} s' for n, t in times.items()), flush=True)
    return times


def print_breakdown(key: str, b: dict) -> None:
    print(f"\nbreakdown of one iteration, {key} ({b['step_s']:.2f} s under the profiler):")
    for part, sec in b['forward_s'].items():
        print(f'  forward {part:<30} {sec * 1e3:8.0f} ms')
    print(f"  {'backward, losses, sampling, optimiser':<38} {b['rest_s'] * 1e3:8.0f} ms")
    print('  slowest operators (self CPU):')
    for op in b['top_ops']:
        print(f"    {op['self_ms']:8.1f} ms  {op['calls']:4d} x {op['name']:<28} "
              f"{op['input_shapes']}")


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = args.device
    use_device(device, args.threads, mmcv_cuda_ops_missing)
    cfg = load_config(args.config, args.cfg_options)
    if task_of(cfg) != 'mmdet':
        raise ConfigError(f'{args.config} is a {task_of(cfg)} config: this benchmark times '
                          f'detector training iterations (give a configs/det config; '
                          f'segmentors: tools/analysis/benchmark.py --config)')
    init_default_scope('mmdet')
    # the optimiser builder logs one line per parameter group at INFO
    MMLogger.get_instance('mmengine', log_level='WARNING')
    configs, inline_name, softmax_name = detector_configs(cfg, args.softmax_backbone)
    # one model per backbone; each dtype has its own optimiser wrapper (and state) on it
    runs = {}
    for name, model_cfg in configs.items():
        model = build(model_cfg, device)
        for dtype in args.dtypes:
            key = name if dtype == 'fp32' else f'{name} ({dtype})'
            runs[key] = (name, dtype, model, optim_wrapper_for(model, model_cfg, dtype, device))
    data = synthetic_batch(args.size, args.batch_size, args.objects,
                           cfg.model.roi_head.bbox_head.num_classes)
    times = time_runs(runs, data, args)
    rows = {}
    for key, (name, dtype, _, _) in runs.items():
        median, p25, p75 = quartiles(times[key])
        rows[key] = dict(backbone=name, dtype=dtype, median_s=median, p25_s=p25, p75_s=p75,
                         times_s=times[key])
    for key, (_, _, model, optim) in runs.items():  # after all timed rounds, untimed
        if device == 'cuda':  # one more iteration: its memory peak
            rows[key]['peak_mem_mb'] = cuda_peak_mb(lambda: model.train_step(data, optim))
        if args.breakdown:  # (CPU runs only)
            rows[key]['breakdown'] = breakdown(model, data, optim)
            print_breakdown(key, rows[key]['breakdown'])

    def median(name: str, dtype: str) -> float:
        return rows[name if dtype == 'fp32' else f'{name} ({dtype})']['median_s']

    ratios = {d: median(inline_name, d) / median(softmax_name, d)
              for d in args.dtypes if softmax_name is not None}  # InLine / softmax
    dtype_ratios = {f'{name} {d}/fp32': median(name, d) / median(name, 'fp32')
                    for d in args.dtypes if d != 'fp32' and 'fp32' in args.dtypes
                    for name in configs}
    h, w = args.size
    result = dict(config=args.config, size=[h, w], size_wxh=format_size((h, w)),
                  batch_size=args.batch_size, cfg_options=args.cfg_options,
                  **machine(device, args.threads),
                  warmup=args.warmup, repeats=args.repeats, dtypes=args.dtypes,
                  softmax_backbone=softmax_name, rows=rows,
                  ratio=ratios.get(args.dtypes[0]), ratios=ratios, dtype_ratios=dtype_ratios,
                  # after the timed rounds: the matmuls must not heat or load the timed ones
                  cpu=cpu_record(n=args.peak_size, repeats=args.peak_repeats))
    print(describe_cpu(result['cpu']))
    where = result['device_name'] if device == 'cuda' else f'{args.threads} threads'
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
        dump(result, args.out, file_format='json', indent=2)
    return result


if __name__ == '__main__':
    sys.exit(cli_main(main))
