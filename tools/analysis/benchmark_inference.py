#!/usr/bin/env python
"""Whole-model inference throughput over a config's test set, on N processes.

    python tools/analysis/benchmark_inference.py CONFIG [--checkpoint CKPT] --max-iter 200
    bash tools/dist_benchmark.sh CONFIG 8 --max-iter 200          # torchrun, 8 processes

Why not the toolkits' own: mmdet's ``analysis_tools/benchmark.py`` moves the model
to CUDA unconditionally and allows one process; mmseg's has no launcher, a fixed 200
iterations of batch 1 and no data time.  This one runs on the CPU or GPUs, N processes.

Every process runs the model (test mode) over its share of the test dataloader and
records, after ``--warmup`` iterations, the time spent waiting for data and the time of
the model step; images/s per process and in total (the sum over processes), the
data-loading time apart.  ``--out``: the figures as JSON, with the CPU record (its
matmul peaks measured by process 0 after the timed iterations).
"""
import argparse
import os
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

import torch  # noqa: E402
from mmengine import dump  # noqa: E402
from mmengine.dist import all_gather_object, get_rank, get_world_size  # noqa: E402
from mmengine.logging import MMLogger  # noqa: E402
from mmengine.runner import Runner, load_checkpoint  # noqa: E402
from _bench_common import add_peak_args, cpu_record, describe_cpu, sync  # noqa: E402

from inline_mm.checkpoint import mmengine_checkpoint_globals  # noqa: E402
from inline_mm.engine.dist import finish_distributed  # noqa: E402
from inline_mm.engine.launch import (add_runner_args, cli_main, init_process_group,  # noqa: E402
                                     load_config)
from inline_mm.engine.runner_utils import build_model, check_datasets  # noqa: E402
from inline_mm.errors import MissingFileError  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config')
    parser.add_argument('--checkpoint', help='weights to load (random weights otherwise)')
    parser.add_argument('--max-iter', type=int, default=200, help='measured iterations')
    parser.add_argument('--warmup', type=int, default=5)
    parser.add_argument('--log-interval', type=int, default=20)
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--num-workers', type=int)
    parser.add_argument('--out', help='write the per-process and total figures as JSON')
    add_peak_args(parser)
    add_runner_args(parser)
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options, args.launcher)
    if args.checkpoint and not os.path.isfile(args.checkpoint):
        raise MissingFileError(f'checkpoint {args.checkpoint!r} not found')
    init_process_group(cfg, args.launcher)  # CPU: a gloo process group
    logger = MMLogger.get_instance('inline_mm_benchmark', log_level='INFO')
    check_datasets(cfg, ('test_dataloader',), check_classes=False)

    loader_cfg = cfg.test_dataloader.copy()
    loader_cfg.batch_size = args.batch_size
    if args.num_workers is not None:
        loader_cfg.num_workers = args.num_workers
        loader_cfg.persistent_workers = args.num_workers > 0
    # every process takes its own share of the images
    loader_cfg.sampler = dict(type='DefaultSampler', shuffle=False)
    loader = Runner.build_dataloader(loader_cfg, seed=0)

    model = build_model(cfg)
    if args.checkpoint:
        with mmengine_checkpoint_globals():  # a runner checkpoint's types, this load only
            load_checkpoint(model, args.checkpoint, map_location='cpu')
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    model = model.to(device).eval()

    data_times, step_times, images = [], [], 0
    total = args.warmup + args.max_iter
    it = iter(loader)
    with torch.no_grad():
        for i in range(total):
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                it = iter(loader)
                batch = next(it)
            t1 = time.perf_counter()
            model.test_step(batch)
            sync(device)
            t2 = time.perf_counter()
            if i >= args.warmup:
                data_times.append(t1 - t0)
                step_times.append(t2 - t1)
                images += len(batch['inputs'])
            if (i + 1) % args.log_interval == 0 and get_rank() == 0:
                done = len(step_times)
                if done:
                    logger.info(f'[{i + 1}/{total}] rank 0: '
                                f'{done / (sum(step_times) + sum(data_times)):.2f} img/s, '
                                f'data {1e3 * sum(data_times) / done:.1f} ms/iter')
    del it  # stop the loader's workers before the process group goes away
    wall = sum(data_times) + sum(step_times)
    mine = dict(rank=get_rank(), images=images, wall_s=wall, data_s=sum(data_times),
                model_s=sum(step_times), img_per_s=images / wall,
                img_per_s_model_only=images / sum(step_times))
    per_process = all_gather_object(mine)  # [mine] in one process
    result = dict(config=args.config, world_size=get_world_size(), device=device,
                  per_process=per_process,
                  total_img_per_s=sum(p['img_per_s'] for p in per_process),
                  total_img_per_s_model_only=sum(p['img_per_s_model_only']
                                                 for p in per_process))
    if get_rank() == 0:
        # after the timed iterations of every process (all_gather_object waited for them)
        result['cpu'] = cpu_record(n=args.peak_size, repeats=args.peak_repeats)
        logger.info(describe_cpu(result['cpu']))
        for p in per_process:
            logger.info(f"rank {p['rank']}: {p['images']} images, {p['img_per_s']:.2f} img/s "
                        f"(model only {p['img_per_s_model_only']:.2f}), data loading "
                        f"{1e3 * p['data_s'] / max(p['images'], 1):.1f} ms/img")
        logger.info(f"total over {result['world_size']} process(es): "
                    f"{result['total_img_per_s']:.2f} img/s "
                    f"(model only {result['total_img_per_s_model_only']:.2f})")
        if args.out:
            dump(result, args.out, file_format='json', indent=2)
    finish_distributed()
    return result


if __name__ == '__main__':
    sys.exit(cli_main(main))
