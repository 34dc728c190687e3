"""Every shipped config builds its model and runs a forward pass on the CPU.

Depths are shrunk here (not in the configs) so the whole set runs in CI time;
checkpoints are not loaded (the authors' weights are not bundled).
"""
import copy
import glob
import os

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT
from mmengine.registry import init_default_scope

import inline_mm  # noqa: F401
from inline_mm.engine.launch import read_config

CONFIGS = sorted(glob.glob(os.path.join(REPO_ROOT, 'configs', '*', '*.py')) +
                 glob.glob(os.path.join(REPO_ROOT, 'configs', '*', 'toy', '*.py')))
SHRINK = {'InLinePVT': dict(depths=[1, 1, 1, 1]), 'InLineSwin': dict(depths=[1, 1, 2, 1]),
          'InLineCSWin': dict(depths=[1, 1, 2, 1]), 'InLineDeiT': dict(depth=12)}


def _ids(paths):
    return [os.path.relpath(p, os.path.join(REPO_ROOT, 'configs')) for p in paths]


def test_the_expected_configs_exist():
    names = set(_ids(CONFIGS))
    for required in ['det/mask_rcnn_inline_pvt.py', 'det/toy/mask_rcnn_inline_pvt_toy.py',
                     'seg/toy/fpn_inline_pvt_toy.py']:
        assert required in names
    assert len([n for n in names if n.startswith('det/mask-rcnn_inline-pvt')]) == 4
    assert len([n for n in names if n.startswith('det/mask-rcnn_inline-swin')]) == 4
    assert len([n for n in names if n.startswith('det/mask-rcnn_inline-cswin')]) == 2
    assert len([n for n in names if n.startswith('seg/fpn_inline-pvt')]) == 4
    assert len([n for n in names if n.startswith('seg/upernet_inline-swin')]) == 3
    assert len([n for n in names if n.startswith('seg/upernet_inline-cswin')]) == 3
    assert 'seg/upernet_inline-deit-s_mln_8xb2-160k_ade20k-512x512.py' in names


def test_mmseg_bases_resolve_where_the_distribution_has_another_name(monkeypatch):
    """OneDL's mmengine looks ``mmseg::`` bases up under the distribution name
    ``mmsegmentation``, which its line ships as ``onedl-mmsegmentation``.  Here the
    table names a distribution that is not installed (what that line sees): mmengine's
    own ``Config.fromfile`` stops, ``read_config`` resolves the base through the
    importable ``mmseg`` and leaves the table as it was."""
    from mmengine.config import Config
    from mmengine.config import utils as config_utils
    config = os.path.join(REPO_ROOT, 'configs', 'seg',
                          'fpn_inline-pvt-t_4xb4-80k_ade20k-512x512.py')
    monkeypatch.setitem(config_utils.MODULE2PACKAGE, 'mmseg', 'no-such-mmsegmentation-dist')
    with pytest.raises(Exception, match='not installed'):
        Config.fromfile(config)
    cfg = read_config(config)
    assert cfg.model.type == 'EncoderDecoder' and cfg.model.decode_head.type == 'FPNHead'
    assert config_utils.MODULE2PACKAGE['mmseg'] == 'no-such-mmsegmentation-dist'
    assert config_utils.MODULE2PACKAGE['mmdet'] == 'mmdet'


def _metafile_entry(path):
    """The model-zoo entry of a config (the metafile.yml of its folder: configs/<task>/ for
    the full recipes, configs/<task>/toy/ for the toy ones), or None."""
    import yaml
    rel = os.path.relpath(path, REPO_ROOT)
    with open(os.path.join(os.path.dirname(path), 'metafile.yml')) as f:
        models = yaml.safe_load(f)['Models']
    return next((m for m in models if m['Config'] == rel), None)


def _decayed_norms(model, optim_wrapper_cfg) -> list:
    """The backbone's norm-layer parameters that the config's optimizer decays."""
    from mmengine.optim import build_optim_wrapper
    from torch.nn.modules.batchnorm import _BatchNorm
    cfg = copy.deepcopy(optim_wrapper_cfg)
    cfg.type = 'OptimWrapper'  # the param groups are the constructor's; AMP needs a GPU
    wrapper = build_optim_wrapper(model, cfg)
    decay = {id(p): group['weight_decay'] for group in wrapper.optimizer.param_groups
             for p in group['params']}
    return [name for prefix, module in model.backbone.named_modules()
            if isinstance(module, (torch.nn.LayerNorm, torch.nn.GroupNorm, _BatchNorm))
            for name, p in module.named_parameters(prefix=prefix) if decay[id(p)] != 0]


@pytest.mark.slow
@pytest.mark.parametrize('path', CONFIGS, ids=_ids(CONFIGS))
def test_config_builds_and_runs_forward(path):
    cfg = read_config(path)
    assert cfg.custom_imports['imports'][0] == 'inline_mm'
    backbone = cfg.model.backbone
    assert backbone.type in SHRINK
    if 'toy' not in path:
        # every full recipe starts from the authors' ImageNet weights
        assert backbone.init_cfg['type'] == 'Pretrained'
        assert backbone.init_cfg['checkpoint'].startswith('checkpoints/inline_')
        # no weight decay on norms and position tables
        keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
        assert keys['norm']['decay_mult'] == 0
        assert any(keys.get(k, {}).get('decay_mult', 1) == 0
                   for k in ('pos_embed', 'relative_position_bias_table'))
    # tools/train.py --auto-scale-lr needs the batch size the learning rate was set for
    assert cfg.auto_scale_lr['base_batch_size'] > 0
    init_default_scope(cfg.default_scope)
    if cfg.default_scope == 'mmdet':
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    entry = _metafile_entry(path)
    if entry is not None and 'Parameters' in entry['Metadata']:  # as the model zoo states
        full = MODELS.build(cfg.model)
        assert sum(p.numel() for p in full.parameters()) == entry['Metadata']['Parameters']
        del full
    backbone.update(SHRINK[backbone.type], init_cfg=None)
    if cfg.default_scope == 'mmdet':
        from mmdet.structures import DetDataSample
        sample = DetDataSample(metainfo=dict(img_shape=(96, 128), ori_shape=(96, 128),
                                             scale_factor=(1.0, 1.0)))
    else:
        from mmseg.structures import SegDataSample
        sample = SegDataSample(metainfo=dict(img_shape=(96, 128), ori_shape=(96, 128),
                                             pad_shape=(96, 128)))
    model = MODELS.build(cfg.model).eval()
    if 'toy' not in path:
        assert not _decayed_norms(model, cfg.optim_wrapper)
    image = torch.from_numpy(np.random.RandomState(0).randint(0, 255, (3, 96, 128),
                                                              dtype=np.uint8))
    with torch.no_grad():
        results = model.test_step(dict(inputs=[image], data_samples=[sample]))
    assert len(results) == 1
    if cfg.default_scope == 'mmdet':
        assert results[0].pred_instances.bboxes.shape[-1] == 4
    else:
        assert results[0].pred_sem_seg.data.shape[-2:] == (96, 128)


@pytest.mark.parametrize('task', ['det', 'seg'])
def test_model_zoo_metafile_and_readme_agree(task):
    """Every full config has a metafile entry; its FLOPs / params match the README table;
    every toy config has one in the toy folder's metafile."""
    import re

    import yaml
    folder = os.path.join(REPO_ROOT, 'configs', task)
    with open(os.path.join(folder, 'metafile.yml')) as f:
        models = yaml.safe_load(f)['Models']
    with open(os.path.join(folder, 'README.md')) as f:
        readme = f.read()
    full = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, '*.py'))
                  if os.path.basename(p) != 'mask_rcnn_inline_pvt.py')  # an alias of PVT-T
    # the toy configs only in the toy folder's metafile: a model index importing both lists
    # each model once
    assert not [m for m in models if '/toy/' in m['Config']]
    assert sorted(os.path.basename(m['Config']) for m in models) == full
    with open(os.path.join(folder, 'toy', 'metafile.yml')) as f:
        toy = yaml.safe_load(f)['Models']
    assert toy and all(os.path.isfile(os.path.join(REPO_ROOT, m['Config'])) for m in toy)
    toy_configs = sorted(glob.glob(os.path.join(folder, 'toy', '*.py')))
    assert [m['Config'] for m in toy] == [os.path.relpath(p, REPO_ROOT) for p in toy_configs]
    for m in models:
        flops, params = m['Metadata']['FLOPs'], m['Metadata']['Parameters']
        row = next(line for line in readme.splitlines()
                   if line.startswith('| [') and f"({os.path.basename(m['Config'])})" in line)
        cells = [c.strip() for c in row.split('|')]
        assert f'{params / 1e6:.1f}M' in cells, (m['Name'], cells)
        giga = flops / 1e9  # three significant digits, as tools/analysis/get_flops.py prints
        assert (f'{giga:.0f}G' if giga >= 100 else f'{giga:#.3g}G') in cells, (m['Name'], cells)
        assert re.fullmatch(r'\d+', str(flops)) and flops > 1e9
