#!/usr/bin/env python
"""Check the plugin's backbones against the authors' reference models.

The authors' classification code (github LeapLabTHU/InLine, ``models/``) is
not part of this project.  Point ``--reference-dir`` at a checkout's
``models`` folder (its CSwin needs ``einops``): for every variant the script
builds the reference model with random weights, saves its state dict as an
authors' checkpoint, loads that file through the plugin's ``init_cfg``, and
compares, in eval mode and fp32, the reference ``forward_features`` with the
plugin's last output averaged over H x W (for DeiT: the normed patch tokens).

    python tools/verify_against_reference.py --reference-dir ../InLine/models

Exits non-zero when any difference exceeds ``--tol`` (1e-4).
"""
import argparse
import importlib
import os
import sys
import tempfile
import warnings

import torch

import inline_mm
from inline_mm import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin
from inline_mm.engine.launch import cli_main
from inline_mm.errors import MissingFileError

SWIN = {'tiny': dict(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                     attn_type='IIIS'),
        'small': dict(embed_dim=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24],
                      attn_type='IISS'),
        'base': dict(embed_dim=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
                     attn_type='IIMS2')}
DEIT = {'tiny': (192, 6, 224), 'small': (320, 10, 288), 'base': (384, 12, 448)}


def build_reference(family, arch, ref):
    if family == 'pvt':
        return getattr(ref['pvt'], f'inline_pvt_{arch}')(
            img_size=224, attn_type='IIII', la_sr_ratios='1111')
    if family == 'swin':
        return ref['swin'].InLineSwin(img_size=224, window_size=56, **SWIN[arch])
    if family == 'cswin':
        return getattr(ref['cswin'], f'inline_cswin_{arch}')(
            img_size=224, attn_type='IISS', la_split_size='56-28-14-7')
    dim, heads, size = DEIT[arch]
    return ref['deit'].VisionTransformer(img_size=size, patch_size=16, embed_dim=dim, depth=12,
                                         num_heads=heads)


def reference_features(model, family, x):
    if family != 'deit':
        return model.forward_features(x)
    tokens = model.patch_embed(x)
    tokens = torch.cat([model.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1)
    tokens = model.norm(model.blocks(tokens + model.pos_embed))
    return tokens[:, 1:].mean(dim=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--reference-dir', required=True,
                        help="the authors' models/ folder (inline_pvt.py, inline_swin.py, ...)")
    parser.add_argument('--families', nargs='+', default=['pvt', 'swin', 'cswin', 'deit'])
    parser.add_argument('--tol', type=float, default=1e-4)
    args = parser.parse_args(argv)
    missing = [f'inline_{f}.py' for f in args.families
               if not os.path.isfile(os.path.join(args.reference_dir, f'inline_{f}.py'))]
    if missing:
        raise MissingFileError(
            f"--reference-dir {args.reference_dir!r} does not hold the authors' model files "
            f"{', '.join(missing)}: point it at the models/ folder of a clone of the authors' "
            f'InLine repository')
    sys.path.insert(0, os.path.abspath(args.reference_dir))
    warnings.filterwarnings('ignore')
    ref = {f: importlib.import_module(f'inline_{f}') for f in args.families}
    ours = {'pvt': InLinePVT, 'swin': InLineSwin, 'cswin': InLineCSWin, 'deit': InLineDeiT}
    archs = {'pvt': ['tiny', 'small', 'medium', 'large'], 'swin': list(SWIN),
             'cswin': ['tiny', 'small', 'base'], 'deit': list(DEIT)}
    worst = 0.0
    torch.manual_seed(0)
    for family in args.families:
        for arch in archs[family]:
            reference = build_reference(family, arch, ref).eval()
            with torch.no_grad():  # move every weight off its initial value (norms, biases)
                for p in reference.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            sizes = [(224, 224)] + ([(256, 320)] if family == 'pvt' else [])
            if family == 'deit':
                sizes = [(DEIT[arch][2],) * 2]
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, 'official.pth')
                torch.save({'model': reference.state_dict()}, path)
                model = ours[family](arch=arch, init_cfg=dict(type='Pretrained', checkpoint=path))
                model.init_weights()
                model.eval()
            for size in sizes:
                x = torch.randn(2, 3, *size)
                with torch.no_grad():
                    expected = reference_features(reference, family, x)
                    got = model(x)[-1].mean(dim=(2, 3))
                diff = (expected - got).abs().max().item()
                worst = max(worst, diff)
                status = 'ok' if diff <= args.tol else 'FAIL'
                print(f'{family:6s} {arch:7s} {size[0]}x{size[1]}: max |diff| = {diff:.2e} '
                      f'(|ref| max {expected.abs().max().item():.2f}) {status}', flush=True)
    print(f'worst difference {worst:.2e} (tolerance {args.tol:g}); inline-mm '
          f'{inline_mm.__version__}')
    return 0 if worst <= args.tol else 1


if __name__ == '__main__':
    sys.exit(cli_main(main))
