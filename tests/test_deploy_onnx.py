"""ONNX export: every backbone family with dynamic H / W, a whole segmentor, a detector's
backbone + neck, and the command-line tools' error lines.

Each export is traced at 64x96 and checked with onnxruntime at that size and at two
others (odd non-square 97x131, and 45x33 where windows clip differently), against
PyTorch eager: max |ort - torch| <= 1e-4 x max |torch|.
"""
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip('onnx', reason='onnx not installed: make install (deploy extra)')
pytest.importorskip('onnxruntime', reason='onnxruntime not installed: make install (deploy extra)')

from inline_mm import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin  # noqa: E402
from inline_mm.deploy import (build_model, export_onnx, onnx_session,  # noqa: E402
                              verify_onnx, wrap_part)
from inline_mm.deploy.onnx_export import TOLERANCE  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
EXPORT_SHAPE = (64, 96)
CHECK_SHAPES = [EXPORT_SHAPE, (97, 131), (45, 33)]

# Reduced depths (as tests/test_backbones.py) keep every kind of block; the
# '*_windows' variants make windows pad, shift and clip differently per size.
BACKBONES = {
    'pvt': (InLinePVT, dict(arch='tiny', depths=[1, 1, 1, 1])),
    'pvt_windows': (InLinePVT, dict(arch='tiny', depths=[1, 1, 1, 1], inline_window=(5, 7))),
    'swin': (InLineSwin, dict(arch='tiny', depths=[1, 1, 2, 2])),
    'swin_windows': (InLineSwin, dict(arch='tiny', depths=[1, 2, 2, 1], attn_type='ISSI',
                                      window_size=3, inline_window=(4, 5))),
    'cswin': (InLineCSWin, dict(arch='tiny', depths=[1, 1, 2, 1])),
    'cswin_windows': (InLineCSWin, dict(arch='tiny', depths=[1, 1, 2, 1], split_size=(1, 2, 3, 3),
                                        inline_window=(5, 4))),
    'deit': (InLineDeiT, dict(arch='tiny', depth=4, out_indices=(0, 1, 2, 3))),
}


def _check(diffs):
    assert set(diffs) == set(CHECK_SHAPES)
    for shape, diff in diffs.items():
        assert diff <= TOLERANCE, f'{shape}: relative difference {diff:.2e}'


# the '*_windows' variants run in the full suite only (make test), the rest in the fast tier
@pytest.mark.parametrize('name', [pytest.param(n, marks=pytest.mark.slow) if 'windows' in n
                                  else n for n in BACKBONES])
def test_backbone_dynamic_parity(name, tmp_path):
    torch.manual_seed(0)
    cls, kwargs = BACKBONES[name]
    module = wrap_part(cls(**kwargs).eval(), 'backbone')
    path = str(tmp_path / f'{name}.onnx')
    outputs = export_onnx(module, EXPORT_SHAPE, path, dynamic=True)
    assert outputs == ['out0', 'out1', 'out2', 'out3']
    session = onnx_session(path)
    assert [d if isinstance(d, str) else None
            for d in session.get_inputs()[0].shape[2:]] == ['height', 'width']
    _check(verify_onnx(module, path, CHECK_SHAPES))


def test_fixed_export_rejects_other_sizes(tmp_path):
    """Without --dynamic the graph is for one size (what the benchmark uses)."""
    module = wrap_part(InLinePVT(**BACKBONES['pvt'][1]).eval(), 'backbone')
    path = str(tmp_path / 'fixed.onnx')
    export_onnx(module, EXPORT_SHAPE, path, dynamic=False)
    assert verify_onnx(module, path, [EXPORT_SHAPE])[EXPORT_SHAPE] <= TOLERANCE
    with pytest.raises(Exception):
        verify_onnx(module, path, [(97, 131)])


@pytest.mark.slow
def test_segmentor_whole_parity_and_label_map(tmp_path):
    """Semantic FPN (toy config): logits at the input size, and the drawn label map
    of onnxruntime inference equals PyTorch's."""
    import mmcv
    from mmseg.apis import inference_model

    from inline_mm.deploy.segmentor import draw_images, predict_images
    torch.manual_seed(0)
    model, cfg, task = build_model(osp.join(ROOT, 'configs/seg/toy/fpn_inline_pvt_toy.py'))
    assert task == 'mmseg'
    module = wrap_part(model, 'model', task)
    path = str(tmp_path / 'fpn.onnx')
    export_onnx(module, EXPORT_SHAPE, path, dynamic=True)
    diffs = verify_onnx(module, path, CHECK_SHAPES)
    _check(diffs)

    rng = np.random.default_rng(0)
    image = (rng.random((150, 110, 3)) * 255).astype(np.uint8)
    image[40:90, 30:80] = (200, 30, 30)
    img_path = str(tmp_path / 'toy.png')
    mmcv.imwrite(image, img_path)
    result = predict_images(model, onnx_session(path), [img_path])[0]
    reference = inference_model(model, img_path)
    assert result.pred_sem_seg.data.shape == reference.pred_sem_seg.data.shape == (1, 150, 110)
    agree = (result.pred_sem_seg.data == reference.pred_sem_seg.data).float().mean().item()
    assert agree >= 0.999
    written = draw_images(model, cfg, [img_path], [result], str(tmp_path / 'vis'))
    assert osp.isfile(written[0])


def test_parity_measure_fails_on_nan_and_shape():
    """A NaN in the onnxruntime output or a wrong shape is never within tolerance."""
    from inline_mm.deploy import compare_outputs
    ref = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    assert compare_outputs([ref], [ref + 1e-3]) == pytest.approx(1e-3 / 2, rel=1e-3)
    bad = ref.copy()
    bad[1, 2] = np.nan
    assert compare_outputs([ref], [bad]) == float('inf')
    assert compare_outputs([bad], [ref]) == float('inf')
    assert compare_outputs([ref], [ref[:, :3]]) == float('inf')
    assert compare_outputs([ref], [ref, ref]) == float('inf')


@pytest.mark.parametrize('hw', [(12, 12), (13, 7), (5, 29), (2, 3)])
def test_traced_adaptive_avg_pool_equals_torch(hw):
    """The exportable pyramid pooling computes PyTorch's bins, divisible or not,
    including maps smaller than the output (overlapping bins)."""
    from inline_mm.deploy.traced_ops import adaptive_avg_pool2d
    x = torch.randn(2, 3, *hw)
    for size in (1, 2, 3, 6, (2, 5)):
        torch.testing.assert_close(adaptive_avg_pool2d(x, size),
                                   torch.nn.functional.adaptive_avg_pool2d(x, size),
                                   rtol=1e-5, atol=1e-6)


#: UperNet configs with the InLine backbone made shallow and the heads narrow (same
#: graph structure: PPM, lateral / FPN convs, fusion; DeiT with mmseg's MultiLevelNeck)
UPERNETS = {
    'swin': ('upernet_inline-swin-t_8xb2-160k_ade20k-512x512.py',
             dict(backbone=dict(depths=[1, 1, 2, 1]))),
    'deit_mln': ('upernet_inline-deit-s_mln_8xb2-160k_ade20k-512x512.py',
                 dict(backbone=dict(depth=4, out_indices=(0, 1, 2, 3)))),
}


def test_backbone_neck_of_a_segmentor_without_neck_loads_its_backbone(tmp_path):
    """UperNet has no neck: --part backbone_neck exports its backbone (extract_feat), and
    the weights load from a checkpoint the fit check accepts, also one that lacks a
    tensor of the backbone (loaded with a warning, as the whole-model path does)."""
    from inline_mm.deploy.onnx_export import build_model as build_for_export
    from inline_mm.engine.launch import read_config
    from inline_mm.engine.runner_utils import build_model as build_plain
    config, change = UPERNETS['swin']
    cfg = read_config(osp.join(ROOT, 'configs', 'seg', config))
    cfg.merge_from_dict(dict(model=dict(
        change, decode_head=dict(channels=32), auxiliary_head=dict(channels=16))))
    cfg.model.backbone.init_cfg = None
    path = str(tmp_path / 'upernet.py')
    cfg.dump(path)
    torch.manual_seed(1)
    state = build_plain(cfg).state_dict()
    dropped = next(k for k in state if k.startswith('backbone.') and k.endswith('.bias'))
    for name, weights in (('whole', state),
                          ('lacking', {k: v for k, v in state.items() if k != dropped})):
        ckpt = str(tmp_path / f'{name}.pth')
        torch.save({'state_dict': weights}, ckpt)
        model = build_for_export(path, ckpt, part='backbone_neck')[0]
        assert getattr(model, 'neck', None) is None
        loaded = model.backbone.state_dict()
        assert all(torch.equal(v, state['backbone.' + k])
                   for k, v in loaded.items() if 'backbone.' + k != dropped)


@pytest.mark.slow
@pytest.mark.parametrize('name', list(UPERNETS))
def test_upernet_whole_parity(name, tmp_path):
    """UperNet (InLine-Swin-T; InLine-DeiT-S with MultiLevelNeck) exports whole with
    dynamic H / W: logits at the input size, onnxruntime equal to PyTorch."""
    from inline_mm.engine.launch import read_config
    config, change = UPERNETS[name]
    cfg = read_config(osp.join(ROOT, 'configs', 'seg', config))
    cfg.merge_from_dict(dict(model=dict(
        change, decode_head=dict(channels=32), auxiliary_head=dict(channels=16))))
    path = str(tmp_path / 'upernet.py')
    cfg.dump(path)
    torch.manual_seed(0)
    model, _, task = build_model(path)
    module = wrap_part(model, 'model', task)
    onnx_path = str(tmp_path / f'{name}.onnx')
    export_onnx(module, EXPORT_SHAPE, onnx_path, dynamic=True)
    num_classes = model.decode_head.num_classes
    with torch.no_grad():
        assert module(torch.zeros(1, 3, 97, 131)).shape == (1, num_classes, 97, 131)
    _check(verify_onnx(module, onnx_path, CHECK_SHAPES))


@pytest.mark.slow
def test_detector_backbone_neck_fallback(tmp_path):
    """Mask R-CNN (toy config): backbone + neck in onnxruntime, heads in PyTorch."""
    from inline_mm.deploy.detector import predict_with_features
    from inline_mm.deploy import example_input, run_onnxruntime
    torch.manual_seed(0)
    model, _, task = build_model(osp.join(ROOT, 'configs/det/toy/mask_rcnn_inline_pvt_toy.py'))
    module = wrap_part(model, 'backbone_neck', task)
    path = str(tmp_path / 'det.onnx')
    outputs = export_onnx(module, EXPORT_SHAPE, path, dynamic=True)
    assert len(outputs) == 5  # FPN levels P2-P6
    _check(verify_onnx(module, path, CHECK_SHAPES))

    with pytest.raises(Exception, match='backbone_neck'):
        wrap_part(model, 'model', task)

    # the PyTorch heads run on the onnxruntime maps (a 96x128 padded batch)
    from mmdet.structures import DetDataSample
    x = example_input((96, 128))
    meta = dict(img_shape=(96, 128), ori_shape=(96, 128), pad_shape=(96, 128),
                batch_input_shape=(96, 128), scale_factor=(1., 1.))
    feats = run_onnxruntime(onnx_session(path), x)
    ort = predict_with_features(model, feats, [DetDataSample(metainfo=meta)])[0]
    with torch.no_grad():
        ref = model.predict(x, [DetDataSample(metainfo=meta)])[0]
    assert len(ort.pred_instances) == len(ref.pred_instances) > 0
    torch.testing.assert_close(ort.pred_instances.bboxes, ref.pred_instances.bboxes,
                               atol=1e-2, rtol=1e-3)


def _tool(name, *args):
    return subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'deployment', name), *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_build_model_names_the_parts():
    from inline_mm.deploy import DeployError
    with pytest.raises(DeployError, match="part 'head' is not one of backbone, backbone_neck, "
                                          'model'):
        build_model(osp.join(ROOT, 'configs/seg/toy/fpn_inline_pvt_toy.py'), 'x.pth',
                    part='head')


@pytest.mark.slow
def test_tool_errors_are_one_line(tmp_path):
    out = _tool('export_onnx.py', str(tmp_path / 'missing.py'), '--out',
                str(tmp_path / 'x.onnx'))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: config file {str(tmp_path / 'missing.py')!r} not found"]
    out = _tool('export_onnx.py', osp.join(ROOT, 'configs/seg/toy/fpn_inline_pvt_toy.py'),
                str(tmp_path / 'missing.pth'), '--out', str(tmp_path / 'x.onnx'))
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and 'checkpoint' in out.stderr
    # a text file, and a detector's checkpoint on the segmentor's config for the whole
    # model (loaded with strict=False it would export random heads that pass the parity
    # check)
    from mmengine.config import Config

    from inline_mm.engine.runner_utils import build_model
    text, detector = tmp_path / 'notes.pth', tmp_path / 'detector.pth'
    text.write_text('not a checkpoint')
    det_cfg = Config.fromfile(osp.join(ROOT, 'configs/det/toy/mask_rcnn_inline_pvt_toy.py'))
    torch.save({'state_dict': build_model(det_cfg).state_dict()}, detector)
    seg_config = osp.join(ROOT, 'configs/seg/toy/fpn_inline_pvt_toy.py')
    for ckpt, part, fragment in ((text, 'backbone', 'it is a text file, not a PyTorch '
                                  'checkpoint'),
                                 (detector, 'model', 'does not fit the model of the config')):
        out = _tool('export_onnx.py', seg_config, str(ckpt), '--part', part, '--out',
                    str(tmp_path / 'x.onnx'))
        assert out.returncode == 2, out.stderr[-2000:]
        last = out.stderr.strip().splitlines()[-1]  # after the toolkits' import warnings
        assert 'Traceback' not in out.stderr and last.startswith('error: '), out.stderr[-2000:]
        assert fragment in last, last
        assert not (tmp_path / 'x.onnx').exists()
    # the backbone alone is the detector's: it exports, with the detector's backbone weights
    # (mmseg's init_model failed on a checkpoint without meta with a KeyError)
    out = _tool('export_onnx.py', seg_config, str(detector), '--part', 'backbone', '--size',
                '64', '--out', str(tmp_path / 'x.onnx'), '--verify')
    assert out.returncode == 0, out.stderr[-2000:]
    # only the exported part is loaded: no warnings about the detector's other parts
    assert 'do not match exactly' not in out.stdout + out.stderr, out.stdout + out.stderr
    from inline_mm.deploy.onnx_export import build_model as build_for_export
    model = build_for_export(seg_config, str(detector), part='backbone')[0]
    expected = torch.load(str(detector))['state_dict']
    assert all(torch.equal(v, expected['backbone.' + k])
               for k, v in model.backbone.state_dict().items())


@pytest.mark.slow
def test_export_tool_verify(tmp_path):
    """The command line: toy segmentor backbone, dynamic, verified at 3 sizes."""
    out = _tool('export_onnx.py', osp.join(ROOT, 'configs/seg/toy/fpn_inline_pvt_toy.py'),
                '--size', '96x64', '--dynamic', '--out', str(tmp_path / 'b.onnx'),
                '--verify', '--verify-sizes', '131x97', '33x45')
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if 'max |onnxruntime' in line]
    assert len(lines) == 3 and all(line.endswith('ok') for line in lines)
