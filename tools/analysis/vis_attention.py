#!/usr/bin/env python
"""Draw InLine attention maps of chosen query pixels, beside plain linear attention.

    python tools/analysis/vis_attention.py IMAGE --backbone inline_pvt_t \\
        [--checkpoint checkpoints/inline_pvt_t.pth] --block 1.0 --queries 0.3,0.4 0.7,0.6 \\
        --out work_dirs/vis_attention.png

For each query (x, y given as fractions of the image width / height) the row
``InL(Q_i)`` of the chosen global InLine block (``STAGE.INDEX``, PVT / DeiT / Swin
at 224) is computed directly from ``phi(Q_i)`` and ``phi(K)`` (one row, no N x N
matrix), averaged over heads, and drawn over the image.  Beside it: the weights
of plain linear attention with the ReLU kernel, ``relu(q)^T relu(k_j) /
sum_s relu(q)^T relu(k_s)``, on the same projections.  The script also reports
the paper's injectivity check on the image's own queries: among sampled
queries whose vectors differ (near-duplicates from flat regions are counted
apart), how many pairs receive the same attention distribution (InLine: none;
linear attention: every pair whose kernelised queries are parallel), and the
scaled-query test: ``q`` and ``c * q`` (c = 0.5, 2) get identical rows under
linear attention and different rows under InLine.
"""
import argparse
import os
import os.path as osp
import re
import sys
from typing import List, Tuple

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from inline_mm.engine.cli_sizes import add_size_option  # noqa: E402
from inline_mm.engine.launch import cli_main  # noqa: E402
from inline_mm.errors import ConfigError, MissingFileError  # noqa: E402
from inline_mm.models.layers.inline_attention import InLineAttention  # noqa: E402

MEAN = np.array([123.675, 116.28, 103.53])
STD = np.array([58.395, 57.12, 57.375])


def capture_qk(model: torch.nn.Module, block: torch.nn.Module, image: Tensor
               ) -> Tuple[Tensor, Tensor, Tuple[int, int], int]:
    """Run the model and return ``phi(q), phi(k)`` ``(heads, N, d)`` of the block."""
    attn = block.attn
    if not isinstance(attn, InLineAttention):
        raise ConfigError(f'block {type(block).__name__} has no InLine attention: pick an '
                          f'InLine block')
    store = {}

    def hook(module, args, kwargs):
        store['x'], store['hw'] = args[0], args[1]

    handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
    with torch.no_grad():
        model(image)
    handle.remove()
    x, hw = store['x'], store['hw']
    if x.shape[0] != image.shape[0] or x.shape[1] - attn.num_prefix_tokens != hw[0] * hw[1]:
        raise ConfigError('the chosen block attends within windows: pick a global block '
                         "(PVT, DeiT, or Swin / CSwin with inline_window='global')")
    with torch.no_grad():
        if attn.separate_q:
            q, (k, _) = attn.q(x), attn.kv(x).chunk(2, dim=-1)
        else:
            q, k, _ = attn.qkv(x).chunk(3, dim=-1)
    heads = lambda t: t[0].view(t.shape[1], attn.num_heads, attn.head_dim).transpose(0, 1)  # noqa
    return heads(q), heads(k), hw, attn.num_prefix_tokens


def inline_rows(q: Tensor, k: Tensor, idx: Tensor, scale: float, phi=None) -> Tensor:
    """``InL(Q_i)`` for the queries ``idx``, averaged over heads: ``(len(idx), N)``.

    Each head's row is ``(s/N) phi(q_i)^T phi(k_j) - mean_j(...) + 1/N``; it sums to 1.
    """
    if phi is not None:
        q, k = phi(q), phi(k)
    n = k.shape[1]
    logits = (scale / n) * q[:, idx] @ k.transpose(1, 2)           # heads, M, N
    rows = logits - logits.mean(dim=-1, keepdim=True) + 1.0 / n
    return rows.mean(dim=0)


def linear_rows(q: Tensor, k: Tensor, idx: Tensor) -> Tensor:
    """Plain linear attention (ReLU kernel) weights for the queries ``idx``."""
    q, k = torch.relu(q[:, idx]), torch.relu(k)
    sims = q @ k.transpose(1, 2)
    rows = sims / sims.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    return rows.mean(dim=0)


def relative_change(a: Tensor, b: Tensor) -> Tensor:
    """Per row, the largest difference of ``a`` and ``b`` over the larger row's largest entry."""
    top = torch.maximum(a.abs().amax(dim=-1), b.abs().amax(dim=-1)).clamp_min(1e-30)
    return (a - b).abs().amax(dim=-1) / top


def same_rows(a: Tensor, b: Tensor, rtol: float = 1e-5) -> Tensor:
    """Whether rows of ``a`` and ``b`` are the same distribution up to float rounding (rows of
    N = 3136 tokens hold values near 1 / N: a relative test; all-zero rows are equal)."""
    return relative_change(a, b) <= rtol


def distinct_pairs(q: Tensor, rtol: float = 1e-3) -> Tensor:
    """``(P, 2)`` index pairs of queries whose vectors (all heads) differ by more than
    ``rtol`` of the largest entry: near-duplicates from flat image regions get near-identical
    rows from any continuous attention, so they say nothing about injectivity."""
    flat = q.transpose(0, 1).reshape(q.shape[1], -1)       # queries x (heads * d)
    i, j = torch.triu_indices(flat.shape[0], flat.shape[0], offset=1)
    apart = (flat[i] - flat[j]).abs().amax(dim=-1) > rtol * flat.abs().max()
    return torch.stack([i[apart], j[apart]], dim=1)


def collisions(rows: Tensor, pairs: Tensor, chunk: int = 4096) -> int:
    """How many of ``pairs`` (distinct queries) get the same attention distribution."""
    return sum(int(same_rows(rows[p[:, 0]], rows[p[:, 1]]).sum()) for p in pairs.split(chunk))


def scaled_query_change(q: Tensor, k: Tensor, idx: Tensor, scale: float, phi,
                        factors=(0.5, 2.0)) -> dict:
    """The paper's scaled-query test: the rows of ``q_i`` and ``c * q_i`` for ``c`` in
    ``factors``.  Linear attention normalises ``c`` away (``relu(c q) = c relu(q)``);
    InLine's rows change.  Per method: the largest and smallest relative change of a row,
    and how many rows stayed the same."""
    methods = {'inline': lambda q: inline_rows(q, k, idx, scale, phi),
               'linear': lambda q: linear_rows(q, k, idx)}
    out = {}
    for name, rows in methods.items():
        changes, same = [], 0
        for c in factors:
            scaled = q.clone()
            scaled[:, idx] = q[:, idx] * c
            a, b = rows(q), rows(scaled)
            changes.append(relative_change(a, b))
            same += int(same_rows(a, b).sum())
        rel = torch.cat(changes)
        out[name] = dict(max_relative_change=float(rel.max()),
                         min_relative_change=float(rel.min()), unchanged_rows=same,
                         rows=int(rel.numel()))
    return out


def load_image(path: str, size: Tuple[int, int]) -> Tuple[np.ndarray, Tensor]:
    """The image resized to ``size`` (height, width), and its normalised tensor."""
    import mmcv
    img = mmcv.imresize(mmcv.imread(path, channel_order='rgb'), (size[1], size[0]))  # (w, h)
    x = torch.from_numpy(((img - MEAN) / STD).transpose(2, 0, 1)).float()[None]
    return img, x


def draw(img: np.ndarray, maps: List[Tuple[np.ndarray, np.ndarray]],
         queries: List[Tuple[float, float]], out: str, grid: Tuple[int, int]) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(queries), 3, figsize=(9, 3 * len(queries)), squeeze=False)
    h, w = img.shape[:2]
    for r, ((inl, lin), (qx, qy)) in enumerate(zip(maps, queries)):
        axes[r, 0].imshow(img)
        axes[r, 0].plot([qx * w], [qy * h], 'r*', markersize=12)
        axes[r, 0].set_title('query')
        for c, (m, title) in enumerate([(inl, 'InLine'), (lin, 'linear (ReLU)')], start=1):
            axes[r, c].imshow(img)
            axes[r, c].imshow(m.reshape(grid), cmap='jet', alpha=0.55, extent=(0, w, h, 0))
            axes[r, c].plot([qx * w], [qy * h], 'w*', markersize=10)
            axes[r, c].set_title(f'{title} (row sums to {m.sum():.3f})', fontsize=9)
        for ax in axes[r]:
            ax.axis('off')
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('image')
    parser.add_argument('--backbone', default='inline_pvt_t',
                        help='inline_<pvt|deit|swin|cswin>_<t|s|m|l|b>')
    parser.add_argument('--checkpoint', help="authors' or inline-mm checkpoint (else random)")
    parser.add_argument('--block', default='1.0', help='STAGE.INDEX (1-based stage), e.g. 1.0')
    parser.add_argument('--queries', nargs='+', default=['0.5,0.5'],
                        help='query points as x,y fractions of width, height')
    add_size_option(parser, '--size', default='224', help='the image is resized to this size')
    parser.add_argument('--sample', type=int, default=512,
                        help='queries sampled for the injectivity check')
    parser.add_argument('--out', default='work_dirs/vis_attention.png')
    return parser.parse_args(argv)


def pick_block(model: torch.nn.Module, spec: str) -> torch.nn.Module:
    """The block ``STAGE.INDEX`` (1-based stage, 0-based index; DeiT has one stage)."""
    match = re.fullmatch(r'(\d+)\.(\d+)', spec)
    if match is None:
        raise ConfigError(f'--block is STAGE.INDEX (1-based stage, 0-based block), e.g. 1.0; '
                          f'got {spec!r}')
    stage, index = int(match.group(1)), int(match.group(2))
    num_stages = len(getattr(model, 'depths', ()))
    stages = {'InLinePVT': lambda: [getattr(model, f'block{i + 1}') for i in range(num_stages)],
              'InLineSwin': lambda: [layer.blocks for layer in model.layers],
              'InLineCSWin': lambda: [getattr(model, f'stage{i + 1}')
                                      for i in range(num_stages)],
              'InLineDeiT': lambda: [model.blocks]}[type(model).__name__]()
    depths = [len(blocks) for blocks in stages]
    if not 1 <= stage <= len(stages) or index >= depths[stage - 1]:
        raise ConfigError(f'--block {spec}: {type(model).__name__} has {len(stages)} stage(s) of '
                          f'{depths} blocks (STAGE from 1, INDEX from 0)')
    return stages[stage - 1][index]


def main(argv=None) -> dict:
    args = parse_args(argv)

    sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
    from _bench_common import build_backbone
    model = build_backbone(args.backbone).eval()
    loaded = None
    if args.checkpoint:
        from mmengine.logging import MMLogger

        from inline_mm import load_pretrained
        # prints what was loaded / resized / missing (as init_cfg does in training)
        loaded = load_pretrained(model, args.checkpoint,
                                 logger=MMLogger.get_instance('vis_attention', log_level='INFO'))
    block = pick_block(model, args.block)
    if not osp.isfile(args.image):
        raise MissingFileError(f'image {args.image!r} not found')
    img, x = load_image(args.image, args.size)
    q, k, grid, prefix = capture_qk(model, block, x)
    q, k = q[:, prefix:], k[:, prefix:]  # queries and keys on the image grid
    attn = block.attn
    queries = [tuple(float(v) for v in s.split(',')) for s in args.queries]
    idx = torch.tensor([min(int(qy * grid[0]), grid[0] - 1) * grid[1] +
                        min(int(qx * grid[1]), grid[1] - 1) for qx, qy in queries])
    inl = inline_rows(q, k, idx, attn.scale, attn.phi)
    lin = linear_rows(q, k, idx)
    draw(img, [(a.numpy(), b.numpy()) for a, b in zip(inl, lin)], queries, args.out, grid)

    g = torch.Generator().manual_seed(0)
    sample = torch.randperm(q.shape[1], generator=g)[:args.sample]
    qs = q[:, sample]
    pairs = distinct_pairs(attn.phi(qs) if attn.phi is not None else qs)
    inl_all, lin_all = inline_rows(q, k, sample, attn.scale, attn.phi), linear_rows(q, k, sample)
    total = len(sample) * (len(sample) - 1) // 2
    report = dict(out=args.out, grid=list(grid), queries=len(sample), pairs=total,
                  near_duplicate_query_pairs=total - len(pairs), distinct_pairs=len(pairs),
                  collisions_inline=collisions(inl_all, pairs),
                  collisions_linear=collisions(lin_all, pairs),
                  scaled_queries=scaled_query_change(q, k, sample, attn.scale, attn.phi),
                  row_sums_inline=[float(s) for s in inl.sum(-1)])
    if args.checkpoint:
        report['checkpoint'] = dict(path=args.checkpoint, loaded=len(loaded['loaded']),
                                    missing=len(loaded['missing']),
                                    unexpected=len(loaded['unexpected']))
    scaled = report['scaled_queries']
    print(f"wrote {args.out}; block {args.block} on a {grid[0]}x{grid[1]} grid")
    print(f"injectivity over {report['queries']} sampled queries ({total} pairs):")
    print(f"  near-duplicate query vectors (within 1e-3 of the largest entry), left out: "
          f"{report['near_duplicate_query_pairs']} pairs")
    print(f"  distinct queries with the same attention distribution: InLine "
          f"{report['collisions_inline']}, linear (ReLU) {report['collisions_linear']} "
          f"of {len(pairs)} pairs")
    print(f"  scaled queries q -> c*q (c = 0.5, 2): InLine rows change by "
          f"{scaled['inline']['min_relative_change']:.2%} to "
          f"{scaled['inline']['max_relative_change']:.2%} "
          f"({scaled['inline']['unchanged_rows']} of {scaled['inline']['rows']} unchanged); "
          f"linear rows by at most {scaled['linear']['max_relative_change']:.1e} "
          f"({scaled['linear']['unchanged_rows']} of {scaled['linear']['rows']} unchanged): "
          f"linear attention cannot tell q from c*q, InLine can")
    return report


if __name__ == '__main__':
    sys.exit(cli_main(main))
