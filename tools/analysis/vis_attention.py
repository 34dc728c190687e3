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
the paper's injectivity check: among sampled queries, how many pairs receive
the same attention distribution (InLine: none; linear attention: every pair
whose kernelised queries are parallel).
"""
import argparse
import os
import os.path as osp
import sys
from typing import List, Tuple

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from inline_mm.models.layers.inline_attention import InLineAttention  # noqa: E402

MEAN = np.array([123.675, 116.28, 103.53])
STD = np.array([58.395, 57.12, 57.375])


def capture_qk(model: torch.nn.Module, block: torch.nn.Module, image: Tensor
               ) -> Tuple[Tensor, Tensor, Tuple[int, int], int]:
    """Run the model and return ``phi(q), phi(k)`` ``(heads, N, d)`` of the block."""
    attn = block.attn
    if not isinstance(attn, InLineAttention):
        raise ValueError(f'block {type(block).__name__} has no InLine attention')
    store = {}

    def hook(module, args, kwargs):
        store['x'], store['hw'] = args[0], args[1]

    handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
    with torch.no_grad():
        model(image)
    handle.remove()
    x, hw = store['x'], store['hw']
    if x.shape[0] != image.shape[0] or x.shape[1] - attn.num_prefix_tokens != hw[0] * hw[1]:
        raise ValueError('the chosen block attends within windows: pick a global block '
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


def identical_pairs(rows: Tensor, tol: float = 1e-6) -> int:
    """Pairs of rows (distributions) equal within ``tol`` (max abs difference)."""
    count = 0
    for i in range(rows.shape[0] - 1):
        diff = (rows[i + 1:] - rows[i]).abs().amax(dim=-1)
        count += int((diff <= tol).sum())
    return count


def load_image(path: str, size: int) -> Tuple[np.ndarray, Tensor]:
    import mmcv
    img = mmcv.imread(path, channel_order='rgb')
    img = mmcv.imresize(img, (size, size))
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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('image')
    parser.add_argument('--backbone', default='inline_pvt_t',
                        help='inline_<pvt|deit|swin|cswin>_<t|s|m|l|b>')
    parser.add_argument('--checkpoint', help="authors' or inline-mm checkpoint (else random)")
    parser.add_argument('--block', default='1.0', help='STAGE.INDEX (1-based stage), e.g. 1.0')
    parser.add_argument('--queries', nargs='+', default=['0.5,0.5'],
                        help='query points as x,y fractions of width, height')
    parser.add_argument('--size', type=int, default=224)
    parser.add_argument('--sample', type=int, default=512,
                        help='queries sampled for the injectivity check')
    parser.add_argument('--out', default='work_dirs/vis_attention.png')
    args = parser.parse_args(argv)

    sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
    from benchmark import build_backbone
    model = build_backbone(args.backbone).eval()
    if args.checkpoint:
        from inline_mm import load_pretrained
        load_pretrained(model, args.checkpoint)
    stage, index = (int(v) for v in args.block.split('.'))
    blocks = {'InLinePVT': lambda: getattr(model, f'block{stage}'),
              'InLineSwin': lambda: model.layers[stage - 1].blocks,
              'InLineCSWin': lambda: getattr(model, f'stage{stage}'),
              'InLineDeiT': lambda: model.blocks}[type(model).__name__]()
    block = blocks[index]
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
    inl_all, lin_all = inline_rows(q, k, sample, attn.scale, attn.phi), linear_rows(q, k, sample)
    report = dict(out=args.out, grid=list(grid), queries=len(sample),
                  pairs=len(sample) * (len(sample) - 1) // 2,
                  identical_inline=identical_pairs(inl_all),
                  identical_linear=identical_pairs(lin_all),
                  row_sums_inline=[float(s) for s in inl.sum(-1)])
    print(f"wrote {args.out}; block {args.block} on a {grid[0]}x{grid[1]} grid")
    print(f"injectivity check over {report['queries']} queries ({report['pairs']} pairs): "
          f"identical distributions: InLine {report['identical_inline']}, "
          f"linear {report['identical_linear']}")
    return report


if __name__ == '__main__':
    main()
