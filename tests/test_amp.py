"""Mixed precision: autocast of chosen parts, the CPU optimiser wrapper, --amp set-up."""
import math
import os
import warnings
from collections import namedtuple

import pytest
import torch
import torch.nn as nn
from conftest import REPO_ROOT, cpu_autocast_enabled, requires_cpu_fp16
from mmengine.optim import build_optim_wrapper

from inline_mm.engine.launch import read_config
import inline_mm.engine  # noqa: F401  (registers CPUAutocastOptimWrapper)
from inline_mm.datasets import make_coco_toy
from inline_mm.engine.amp import (autocast_parts, cast_to_fp32, configure_amp,
                                  enable_inference_autocast, remove_autocast_parts)

DET_CONFIG = os.path.join(REPO_ROOT, 'configs', 'det', 'toy', 'mask_rcnn_inline_pvt_toy.py')
SEG_CONFIG = os.path.join(REPO_ROOT, 'configs', 'seg', 'toy', 'fpn_inline_pvt_toy.py')
FULL_DET_CONFIG = os.path.join(REPO_ROOT, 'configs', 'det', 'mask-rcnn_inline-pvt-t_fpn_1x_coco.py')

Pair = namedtuple('Pair', 'a b')


class Inner(nn.Module):
    """A 'backbone' returning a tuple, a list and a dict, plus an integer tensor."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return (y, [y * 2, {'z': y, 'idx': torch.arange(3)}], Pair(y, y))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = Inner()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        feats = self.backbone(x)
        return self.head(feats[0])


def record_dtypes(module: nn.Module, store: list):
    return module.register_forward_hook(lambda m, a, out: store.append(out.dtype))


def test_autocast_parts_runs_inside_in_bf16_and_hands_out_fp32():
    net, x = Net(), torch.randn(4, 8)
    inner, head = [], []
    record_dtypes(net.backbone.fc, inner)
    record_dtypes(net.head, head)
    handle = autocast_parts(net, ('backbone', ))
    out = net.backbone(x)
    assert inner == [torch.bfloat16]
    # every floating tensor of the nested output is fp32, integers untouched
    y, (y2, d), pair = out
    assert y.dtype == y2.dtype == d['z'].dtype == torch.float32
    assert d['idx'].dtype == torch.int64
    assert isinstance(pair, Pair) and pair.a.dtype == pair.b.dtype == torch.float32
    # the head is outside the part: no autocast, fp32 all along
    assert net(x).dtype == torch.float32 and head == [torch.float32]
    assert not cpu_autocast_enabled()
    handle.remove()
    inner.clear()
    net(x)
    assert inner == [torch.float32]
    assert not hasattr(net.backbone, '_inline_mm_autocast')


def _installed_once():
    net, x = Net(), torch.randn(4, 8)
    inner = []
    record_dtypes(net.backbone.fc, inner)
    first = autocast_parts(net, ('backbone', ))
    hooks = len(net.backbone._forward_hooks), len(net.backbone._forward_pre_hooks)
    assert autocast_parts(net, ('backbone', )) is first
    assert (len(net.backbone._forward_hooks), len(net.backbone._forward_pre_hooks)) == hooks
    net(x)
    assert inner == [torch.bfloat16]  # entered once, left once
    return net, x, inner, first, hooks


def test_autocast_parts_is_idempotent():
    net = _installed_once()[0]
    remove_autocast_parts(net)
    assert not net.backbone._forward_hooks and not net.backbone._forward_pre_hooks


@requires_cpu_fp16
def test_autocast_parts_is_switchable():
    net, x, inner, first, hooks = _installed_once()
    # another dtype replaces the hooks rather than stacking a second set
    second = autocast_parts(net, ('backbone', ), dtype='float16')
    assert second is not first and not first.installed
    assert (len(net.backbone._forward_hooks), len(net.backbone._forward_pre_hooks)) == hooks
    inner.clear()
    with second.enable(False):
        net(x)
    net(x)
    assert inner == [torch.float32, torch.float16]
    remove_autocast_parts(net)
    assert not second.installed and not net.backbone._forward_hooks


def test_autocast_parts_leaves_autocast_when_the_forward_raises():
    net = Net()
    autocast_parts(net, ('backbone', ))
    with pytest.raises(RuntimeError):
        net(torch.randn(4, 5))  # wrong width
    assert not cpu_autocast_enabled()
    assert net(torch.randn(4, 8)).dtype == torch.float32


def test_autocast_parts_rejects_missing_parts_and_bad_dtypes():
    net = Net()
    with pytest.raises(ValueError, match='no submodule'):
        autocast_parts(net, ('trunk', ))
    with pytest.raises(ValueError, match='no submodule'):
        autocast_parts(net, ('backbone', 'neck'), strict=True)
    assert autocast_parts(net, ('backbone', 'neck')).parts == ('backbone', )  # no neck: skipped
    with pytest.raises(ValueError, match="'bfloat16' or 'float16'"):
        autocast_parts(net, ('backbone', ), dtype=torch.int8)


def test_whole_model_autocast_casts_its_output():
    net = Net()
    head = []
    record_dtypes(net.head, head)
    autocast_parts(net, None)
    assert net(torch.randn(2, 8)).dtype == torch.float32 and head == [torch.bfloat16]
    assert cast_to_fp32(torch.ones(2, dtype=torch.float64)).dtype == torch.float64


def test_optim_wrapper_autocasts_its_parts_inside_the_training_context_only():
    net, x = Net(), torch.randn(4, 8)
    inner, head = [], []
    record_dtypes(net.backbone.fc, inner)
    record_dtypes(net.head, head)
    wrapper = build_optim_wrapper(net, dict(
        type='CPUAutocastOptimWrapper', parts=['backbone'],
        optimizer=dict(type='SGD', lr=0.1)))
    with wrapper.optim_context(net):
        loss = net(x).square().mean()
    assert inner == [torch.bfloat16] and head == [torch.float32] and loss.dtype == torch.float32
    wrapper.update_params(loss)
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in net.parameters())
    net(x)  # outside the context (validation): fp32
    assert inner[-1] == torch.float32
    with wrapper.optim_context(net):  # hooks installed once, not once per iteration
        net(x)
    assert len(net.backbone._forward_pre_hooks) == 1 and inner[-1] == torch.bfloat16
    # without parts: the whole forward, as before
    whole = build_optim_wrapper(net, dict(type='CPUAutocastOptimWrapper',
                                          optimizer=dict(type='SGD', lr=0.1)))
    with whole.optim_context(net):
        assert net(x).dtype == torch.bfloat16
    assert head[-1] == torch.bfloat16


def test_configure_amp_on_the_cpu_and_on_a_gpu():
    det = read_config(FULL_DET_CONFIG)  # mmengine's plain OptimWrapper
    configure_amp(det, 'mmdet', device='cpu')
    assert det.optim_wrapper.type == 'CPUAutocastOptimWrapper'
    assert list(det.optim_wrapper.parts) == ['backbone', 'neck']
    assert det.optim_wrapper.dtype == 'bfloat16' and 'loss_scale' not in det.optim_wrapper
    # the toy detector names its own parts (the RoI heads too): kept; its "bf16 only
    # with bf16 units" yields to --amp
    toy = read_config(DET_CONFIG)
    own_parts = list(toy.optim_wrapper.parts)
    assert 'roi_head.bbox_head' in own_parts and toy.optim_wrapper.only_with_bf16_units
    configure_amp(toy, 'mmdet', device='cpu')
    assert list(toy.optim_wrapper.parts) == own_parts
    assert 'only_with_bf16_units' not in toy.optim_wrapper
    seg = read_config(SEG_CONFIG)
    configure_amp(seg, 'mmseg', device='cpu')
    assert seg.optim_wrapper.type == 'CPUAutocastOptimWrapper'
    assert seg.optim_wrapper.parts is None
    for cfg, task in ((read_config(DET_CONFIG), 'mmdet'), (read_config(FULL_DET_CONFIG), 'mmdet'),
                      (read_config(SEG_CONFIG), 'mmseg')):
        configure_amp(cfg, task, device='cuda')
        assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
        assert cfg.optim_wrapper.loss_scale == 'dynamic'
        # none of the CPU wrapper's own arguments reaches mmengine's AmpOptimWrapper
        assert not {'parts', 'dtype', 'only_with_bf16_units'} & set(cfg.optim_wrapper)
    with pytest.raises(ValueError, match="'mmdet' or 'mmseg'"):
        configure_amp(read_config(DET_CONFIG), 'cls', device='cpu')


def test_bf16_only_with_units_leaves_a_model_off_the_cpu_alone(monkeypatch):
    """``only_with_bf16_units`` is about CPU speed: a model on another device (here the
    meta device, standing in for a GPU) trains as without the wrapper."""
    from inline_mm.engine import amp
    monkeypatch.setattr(amp, 'cpu_has_fast_bf16', lambda: True)
    inner = []
    for device, expected in (('cpu', torch.bfloat16), ('meta', torch.float32)):
        net = Net().to(device)
        record_dtypes(net.backbone.fc, inner)
        wrapper = build_optim_wrapper(net, dict(
            type='CPUAutocastOptimWrapper', parts=['backbone'], only_with_bf16_units=True,
            optimizer=dict(type='SGD', lr=0.1)))
        with wrapper.optim_context(net):
            net(torch.randn(4, 8, device=device))
        assert inner[-1] == expected, device


def test_bf16_on_a_cpu_without_bf16_units_warns(monkeypatch):
    from inline_mm.engine import amp
    monkeypatch.setattr(amp, 'cpu_has_fast_bf16', lambda: False)
    with pytest.warns(RuntimeWarning, match='slower than fp32'):
        configure_amp(read_config(DET_CONFIG), 'mmdet', device='cpu')
    monkeypatch.setattr(amp, 'cpu_has_fast_bf16', lambda: True)
    cfg = read_config(DET_CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter('error', RuntimeWarning)
        configure_amp(cfg, 'mmdet', device='cpu')


def _build(config: str):
    from mmengine.registry import init_default_scope
    cfg = read_config(config)
    init_default_scope(cfg.default_scope)
    registry = __import__(f'{cfg.default_scope}.registry', fromlist=['MODELS']).MODELS
    return registry.build(cfg.model).eval()


def test_detector_inference_autocast_keeps_the_heads_fp32():
    from mmdet.structures import DetDataSample
    model = _build(DET_CONFIG)
    inner, roi_in = [], []
    record_dtypes(model.backbone.block1[0].attn.q, inner)
    model.roi_head.bbox_roi_extractor.register_forward_pre_hook(
        lambda m, args: roi_in.append({f.dtype for f in args[0]}))
    handle = enable_inference_autocast(model, 'mmdet')
    assert handle.parts == ('backbone', 'neck') and handle.dtype == torch.bfloat16
    sample = DetDataSample(metainfo=dict(img_shape=(128, 128), ori_shape=(128, 128),
                                         scale_factor=(1., 1.)))
    image = torch.randint(0, 256, (3, 128, 128), dtype=torch.uint8)
    with torch.no_grad():
        result = model.test_step(dict(inputs=[image], data_samples=[sample]))[0]
    assert inner == [torch.bfloat16]
    assert roi_in and all(d == {torch.float32} for d in roi_in)
    assert result.pred_instances.bboxes.dtype == torch.float32
    assert torch.isfinite(result.pred_instances.scores).all()


@pytest.mark.slow
def test_segmentor_inference_autocast_covers_the_whole_model():
    from mmseg.structures import SegDataSample
    model = _build(SEG_CONFIG)
    inner, head = [], []
    record_dtypes(model.backbone.block1[0].attn.q, inner)
    record_dtypes(model.decode_head.conv_seg, head)
    enable_inference_autocast(model, 'mmseg')
    sample = SegDataSample(metainfo=dict(img_shape=(64, 64), ori_shape=(64, 64)))
    image = torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)
    with torch.no_grad():
        result = model.test_step(dict(inputs=[image], data_samples=[sample]))[0]
    assert inner == [torch.bfloat16] and head == [torch.bfloat16]
    assert result.seg_logits.data.dtype == torch.float32
    assert result.pred_sem_seg.data.shape[-2:] == (64, 64)


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('data') / 'coco_toy')
    make_coco_toy(root, num_train=8, num_val=2, image_size=128, seed=1)
    return root


@pytest.mark.slow
def test_detector_trains_with_a_bf16_backbone_and_neck_on_the_cpu(toy_root, tmp_path):
    from mmengine.runner import Runner
    cfg = read_config(DET_CONFIG)
    cfg.merge_from_dict({
        'work_dir': str(tmp_path),
        'train_dataloader.dataset.data_root': toy_root + '/',
        'train_dataloader.batch_size': 2,
        'val_dataloader.dataset.data_root': toy_root + '/',
        'test_dataloader.dataset.data_root': toy_root + '/',
        'val_evaluator.ann_file': toy_root + '/annotations/instances_val.json',
        'test_evaluator.ann_file': toy_root + '/annotations/instances_val.json',
        # 64 px: bf16 runs on slow fallback kernels on CPUs without bf16 units
        'train_dataloader.dataset.pipeline.2.scale': (64, 64),
        'train_cfg.max_iters': 2, 'train_cfg.val_interval': 1000, 'train_cfg.val_begin': 1000,
        'default_hooks.logger.interval': 1,
        'default_hooks.checkpoint.interval': 1000,
    })
    configure_amp(cfg, 'mmdet', device='cpu')
    runner = Runner.from_cfg(cfg)
    model = runner.model
    backbone_linear, roi_in, rpn_in = [], [], []
    record_dtypes(model.backbone.block4[1].mlp.fc2, backbone_linear)
    model.rpn_head.register_forward_pre_hook(
        lambda m, args: rpn_in.append({f.dtype for f in args[0]}))
    for extractor in (model.roi_head.bbox_roi_extractor, model.roi_head.mask_roi_extractor):
        extractor.register_forward_pre_hook(
            lambda m, args: roi_in.append({f.dtype for f in args[0]}))
    runner.train()
    assert type(runner.optim_wrapper).__name__ == 'CPUAutocastOptimWrapper'
    # the backbone really ran in bf16 (both iterations) ...
    assert backbone_linear and set(backbone_linear) == {torch.bfloat16}
    # ... and the heads after the neck got fp32 features
    assert rpn_in and all(d == {torch.float32} for d in rpn_in)
    assert roi_in and all(d == {torch.float32} for d in roi_in)
    losses = runner.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize('flags, expected', [
    ('fpu sse4_2 avx2 fma', False),            # AVX2 only (a later processor's flags ignored)
    ('avx2 avx512f avx512_bf16', True),        # AVX512-BF16
    ('avx2 avx512f amx_bf16 amx_tile', True),  # AMX
])
def test_bf16_units_are_read_from_the_cpu_flags(tmp_path, flags, expected):
    from inline_mm.engine.amp import cpu_has_fast_bf16
    info = tmp_path / 'cpuinfo'
    info.write_text(f'processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\n'
                    'processor\t: 1\nmodel name\t: Some CPU\nflags\t\t: avx512_bf16\n')
    assert cpu_has_fast_bf16(str(info)) is expected
    assert cpu_has_fast_bf16(str(tmp_path / 'missing')) is None  # no flags to read


def test_bf16_units_agree_with_torchs_own_detection():
    """torch's private queries, where this torch has them, as the independent check."""
    from inline_mm.engine.amp import cpu_has_fast_bf16
    checks = [getattr(torch.cpu, name, None)
              for name in ('_is_avx512_bf16_supported', '_is_amx_tile_supported')]
    checks = [c for c in checks if c is not None]
    if not checks or not os.path.exists('/proc/cpuinfo'):
        pytest.skip(f'torch {torch.__version__} has no bf16-unit query, or no /proc/cpuinfo')
    assert cpu_has_fast_bf16() == any(c() for c in checks)


def test_cswin_windows_hold_the_autocast_dtype(monkeypatch):
    """Under bf16 autocast InLine-CSwin partitions its windows in bf16: the fp32 residual
    stream beside the bf16 projections does not make every window copy fp32."""
    from inline_mm import InLineCSWin
    from inline_mm.models.backbones import cswin as cswin_module
    dtypes = []
    real = cswin_module.run_in_windows

    def spy(grid, *args, **kwargs):
        dtypes.append(grid.dtype)
        return real(grid, *args, **kwargs)

    monkeypatch.setattr(cswin_module, 'run_in_windows', spy)
    model = InLineCSWin(arch='tiny', embed_dims=32, depths=[2, 2, 2, 1]).eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(1, 3, 97, 131))
    assert len(dtypes) > 4 and set(dtypes) == {torch.bfloat16}, dtypes
    assert all(torch.isfinite(o.float()).all() for o in outs)
