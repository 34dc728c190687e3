"""Wrong checkpoints and wrong ONNX files are refused with one clear line.

* a backbone checkpoint of another arch or family (the authors' key lists of
  every variant, ``tests/data/official_state_dicts``) is refused, naming the
  arch its keys look like, unless ``strict=False``;
* ``inline2mm.py --family`` must agree with the keys; nothing is written otherwise;
* a whole detector / segmentor checkpoint must fit the model of the config
  (:func:`inline_mm.engine.model_fit.check_checkpoint_fits`), and files that are no
  checkpoint at all (text, HTML, Git LFS pointer, empty, truncated) say what they are;
* ``tools/deployment/infer_onnx.py`` refuses an ONNX file that is not the
  config's whole segmentor.

The state dicts of the authors' variants are built from their key / shape lists
with zeros expanded to each shape (one stored element per tensor), so even the
large variants cost nothing to write and load.
"""
import hashlib
import importlib.util
import logging
import os
import os.path as osp
import re

import pytest
import torch
from conftest import DATA_DIR, REPO_ROOT

from inline_mm import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin
from inline_mm.checkpoint import load_checkpoint_file
from inline_mm.engine.launch import cli_main
from inline_mm.engine.model_fit import check_checkpoint_fits
from inline_mm.errors import CheckpointError, CheckpointMismatchError
from inline_mm.models.pretrained import looks_like, preset_structures
from inline_mm.models.converters import convert, key_structure

TSV_DIR = osp.join(DATA_DIR, 'official_state_dicts')
CLASSES = {'pvt': InLinePVT, 'swin': InLineSwin, 'cswin': InLineCSWin, 'deit': InLineDeiT}
NAMES = {'pvt': 'InLinePVT', 'swin': 'InLineSwin', 'cswin': 'InLineCSWin', 'deit': 'InLineDeiT'}
VARIANTS = [(f, a) for f, archs in [('pvt', ('tiny', 'small', 'medium', 'large')),
                                    ('swin', ('tiny', 'small', 'base')),
                                    ('cswin', ('tiny', 'small', 'base')),
                                    ('deit', ('tiny', 'small', 'base'))] for a in archs]


def official_state(family: str, arch: str) -> dict:
    """The authors' state dict of a variant: its keys and shapes, zeros (no memory)."""
    state = {}
    with open(osp.join(TSV_DIR, f'inline_{family}_{arch}.tsv')) as f:
        for line in f:
            if line.startswith('#') or not line.strip():
                continue
            key, shape, dtype = line.rstrip('\n').split('\t')
            shape = tuple(int(s) for s in shape.split('x'))
            state[key] = torch.zeros(1, dtype=getattr(torch, dtype)).expand(shape)
    return state


def official_file(tmp_path, family: str, arch: str) -> str:
    path = str(tmp_path / f'inline_{family}_{arch}.pth')
    torch.save({'model': official_state(family, arch), 'epoch': 300}, path)
    return path


def depths_from_tsv(family: str, arch: str) -> list:
    """Blocks per stage, counted in the authors' key list (independently of the package)."""
    pattern = {'pvt': r'^block(\d)\.(\d+)\.', 'swin': r'^layers\.(\d)\.blocks\.(\d+)\.',
               'cswin': r'^stage(\d)\.(\d+)\.', 'deit': r'^()blocks\.(\d+)\.'}[family]
    blocks = {}
    for key in official_state(family, arch):
        m = re.match(pattern, key)
        if m:
            stage = m.group(1) or '0'
            blocks[stage] = max(blocks.get(stage, 0), int(m.group(2)) + 1)
    return [blocks[s] for s in sorted(blocks)]


def _digest(path) -> str:
    return hashlib.sha256(open(path, 'rb').read()).hexdigest()


# ------------------------------------------------ 1. another arch or family
@pytest.mark.parametrize('family,arch', VARIANTS, ids=[f'{f}_{a}' for f, a in VARIANTS])
def test_keys_of_each_variant_are_recognised(family, arch):
    """The authors' key list of each variant is told apart from every other preset."""
    state = official_state(family, arch)
    structure = key_structure(state, family)
    assert list(structure.depths) == depths_from_tsv(family, arch)
    assert looks_like(state) == f"{NAMES[family]} arch='{arch}'"
    # the same structure as the preset, and no other preset's
    assert [k for k, p in preset_structures().items() if p == structure] == [(family, arch)]


def test_pvt_small_into_tiny_is_refused_naming_small(tmp_path):
    """The user's case: the authors' PVT-S loaded into arch='tiny' (all 164 tensors of
    tiny are there, with the same shapes)."""
    path = official_file(tmp_path, 'pvt', 'small')
    model = InLinePVT(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(CheckpointMismatchError) as info:
        model.init_weights()
    message = str(info.value)
    assert "looks like InLinePVT arch='small'" in message and "arch='tiny'" in message
    assert "Build the model with arch='small'" in message and 'strict=False' in message
    # the blocks PVT-S has beyond PVT-T's two per stage, counted from the key list
    for stage, depth in enumerate(depths_from_tsv('pvt', 'small'), start=1):
        extra = '2' if depth == 3 else f'2-{depth - 1}'
        assert f'block{stage}.{{{extra}}} are in the checkpoint, not in the model' in message
    assert '\n' not in message
    # nothing was loaded: the LayerNorms keep their initial ones (the checkpoint has zeros)
    assert torch.equal(model.block1[0].norm1.weight, torch.ones(64))


def test_strict_false_loads_what_fits(tmp_path, caplog):
    path = official_file(tmp_path, 'pvt', 'small')
    model = InLinePVT(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=path,
                                                 strict=False))
    model.init_weights()
    # the checkpoint's zeros reached every tensor of the model
    assert all(not v.any() for k, v in model.state_dict().items()), 'not everything loaded'
    from inline_mm import load_pretrained
    with caplog.at_level(logging.WARNING):
        report = load_pretrained(model, path, strict=False)
    assert report['missing'] == [] and len(report['unexpected']) > 0
    assert any('block3.{2-5}' in p for p in report['mismatched'])
    assert any("strict=False" in r.getMessage() for r in caplog.records)


def test_pvt_tiny_into_small_names_the_missing_blocks(tmp_path):
    path = official_file(tmp_path, 'pvt', 'tiny')
    model = InLinePVT(arch='small', init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(CheckpointMismatchError,
                       match=r"block3\.\{2-5\} of the model are not in the checkpoint.*"
                             r"looks like InLinePVT arch='tiny'"):
        model.init_weights()


def test_swin_small_into_tiny_is_refused(tmp_path):
    """Same widths; stage 2 has 18 softmax blocks in Swin-S, 6 InLine blocks in Swin-T."""
    path = official_file(tmp_path, 'swin', 'small')
    model = InLineSwin(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(CheckpointMismatchError) as info:
        model.init_weights()
    message = str(info.value)
    assert "InLineSwin arch='small'" in message
    assert 'layers.2.blocks.{6-17} are in the checkpoint' in message
    assert 'layers.2.blocks.{0-5} are softmax in the checkpoint, InLine in the model' in message


def test_checkpoint_of_another_family_with_matching_keys_is_refused(tmp_path):
    """An inline-mm InLine-CSWin-B checkpoint has the last output norm of an InLine-Swin-T
    (norm3, width 768): before the check it loaded and the rest was ignored."""
    path = str(tmp_path / 'cswin_b_mm.pth')
    torch.save({'state_dict': convert(official_state('cswin', 'base'), 'cswin'), 'meta': {}},
               path)
    model = InLineSwin(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(CheckpointMismatchError,
                       match=r"keys are those of InLineCSWin, not InLineSwin.*"
                             r"looks like InLineCSWin arch='base'.*strict=False"):
        model.init_weights()


def test_shape_conflict_names_the_arch_it_looks_like(tmp_path):
    path = official_file(tmp_path, 'deit', 'small')
    model = InLineDeiT(arch='tiny', init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(CheckpointMismatchError,
                       match=r"has shape \(1, .*320\) but the model expects \(1, .*192\).*"
                             r"InLineDeiT arch='small'"):
        model.init_weights()


# ------------------------------------------------ 2. the converter's --family
def _converter():
    path = osp.join(REPO_ROOT, 'tools', 'model_converters', 'inline2mm.py')
    spec = importlib.util.spec_from_file_location('inline2mm_tool', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_converter_refuses_a_family_the_keys_contradict(tmp_path, capsys):
    tool = _converter()
    src = str(tmp_path / 'swin.pth')
    torch.save({'model': official_state('swin', 'tiny')}, src)
    dst = tmp_path / 'out.pth'
    assert cli_main(tool.main, [src, str(dst), '--family', 'pvt']) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith('error: --family pvt contradicts')
    assert "they are those of InLineSwin arch='tiny'" in err and '--family swin' in err
    assert not dst.exists() and os.listdir(tmp_path) == ['swin.pth']  # no temp file left
    # an existing output is left as it was, --overwrite or not
    dst.write_bytes(b'previous')
    assert cli_main(tool.main, [src, str(dst), '--family', 'pvt', '--overwrite']) == 2
    assert dst.read_bytes() == b'previous'
    capsys.readouterr()
    # the right family (or none: detected) converts
    assert cli_main(tool.main, [src, str(dst), '--family', 'swin', '--overwrite']) == 0
    assert "swin (InLineSwin arch='tiny')" in capsys.readouterr().out
    assert 'layers.0.blocks.0.attn.qkv.weight' in torch.load(str(dst))['state_dict']


def test_converter_refuses_an_output_it_cannot_write_before_converting(tmp_path, capsys):
    tool = _converter()
    src = str(tmp_path / 'swin.pth')
    torch.save({'model': official_state('swin', 'tiny')}, src)
    a_file = tmp_path / 'a_file'
    a_file.write_text('kept')
    assert cli_main(tool.main, [src, str(a_file / 'out.pth')]) == 2
    err = capsys.readouterr().err
    assert err == f'error: {a_file / "out.pth"} cannot be written: {a_file} is a file, not a ' \
        'folder; name a file in a writable folder\n'
    for folder in (str(tmp_path), str(tmp_path / 'new') + os.sep):
        assert cli_main(tool.main, [src, folder]) == 2
        assert capsys.readouterr().err.startswith(f'error: {folder} is a folder: name the '
                                                  'output file')
    assert a_file.read_text() == 'kept' and sorted(os.listdir(tmp_path)) == ['a_file', 'swin.pth']


# ------------------------------------------------ 3. whole-model checkpoints, unreadable files
TOY_DET = osp.join(REPO_ROOT, 'configs', 'det', 'toy', 'mask_rcnn_inline_pvt_toy.py')
TOY_SEG = osp.join(REPO_ROOT, 'configs', 'seg', 'toy', 'fpn_inline_pvt_toy.py')


def _build(config, tmp=None, **backbone):
    """The model of a config (random weights); ``backbone`` overrides via a copy in ``tmp``."""
    from inline_mm.engine.launch import read_config

    from inline_mm.deploy.onnx_export import build_model
    if backbone:
        cfg = read_config(config)
        cfg.merge_from_dict(dict(model=dict(backbone=backbone)))
        config = osp.join(str(tmp), osp.basename(config))
        cfg.dump(config)
    return build_model(config)[0]


@pytest.fixture(scope='module')
def toy_models():
    return dict(det=_build(TOY_DET), seg=_build(TOY_SEG))


def _runner_file(path, model, name):
    """A checkpoint as mmengine's runner writes it (state_dict, meta, message hub)."""
    from mmengine.logging import HistoryBuffer
    torch.save({'state_dict': model.state_dict(),
                'meta': {'experiment_name': name, 'epoch': 1, 'iter': 10},
                'message_hub': {'log_scalars': {'train/loss': HistoryBuffer([1.0, 0.5], [1, 1])}}},
               path)
    return str(path)


def test_checkpoint_of_the_config_fits(toy_models, tmp_path):
    check_checkpoint_fits(toy_models['det'], _runner_file(tmp_path / 'det.pth',
                                                          toy_models['det'], 'det'))


def test_segmentor_checkpoint_on_detector_config_is_refused(toy_models, tmp_path):
    path = _runner_file(tmp_path / 'seg.pth', toy_models['seg'], 'fpn_inline_pvt_toy_2026')
    with pytest.raises(CheckpointMismatchError) as info:
        check_checkpoint_fits(toy_models['det'], path)
    message = str(info.value)
    assert '\n' not in message and 'does not fit the model of the config' in message
    own, theirs = toy_models['det'].state_dict(), toy_models['seg'].state_dict()
    missing = len(set(own) - set(theirs))
    assert missing > 0.1 * len(own)
    assert f"{missing} of the model's {len(own)} tensors are not in it; it has no roi_head, " \
           'rpn_head; it has decode_head, which the model has not' in message
    assert "looks like a segmentor (backbone, decode_head, neck) with an " \
           "InLinePVT arch='tiny' backbone, saved by the run 'fpn_inline_pvt_toy_2026'" in message
    assert 'the config builds MaskRCNN, a two-stage detector' in message


@pytest.mark.slow
def test_detector_checkpoint_of_another_backbone_arch_is_refused(toy_models, tmp_path):
    """PVT-S Mask R-CNN on the PVT-T config: every tensor of the model is there."""
    small = _build(TOY_DET, tmp_path, arch='small')
    path = _runner_file(tmp_path / 'small.pth', small, 'small')
    with pytest.raises(CheckpointMismatchError,
                       match=r"backbone: block1\.\{2\} are in the checkpoint, not in the model.*"
                             r"InLinePVT arch='small' backbone"):
        check_checkpoint_fits(toy_models['det'], path)


def test_heads_of_other_shapes_are_refused(toy_models, tmp_path):
    state = dict(toy_models['det'].state_dict())
    key = 'roi_head.bbox_head.fc_cls.weight'
    state[key] = torch.zeros(state[key].shape[0] + 5, *state[key].shape[1:])
    path = tmp_path / 'classes.pth'
    torch.save({'state_dict': state, 'meta': {}}, path)
    with pytest.raises(CheckpointMismatchError,
                       match=r'1 tensor\(s\) with other shapes \(e\.g\. roi_head\.bbox_head\.'
                             r'fc_cls\.weight: \(9, '):
        check_checkpoint_fits(toy_models['det'], str(path))


@pytest.mark.parametrize('task', ['det', 'seg'])
def test_trained_weights_load_for_inference_with_or_without_meta(toy_models, tmp_path, task):
    """load_trained_model (infer.py, the ONNX tools): the checkpoint's weights, its
    dataset_meta when saved, else the config's classes and palette (the toolkits fall back
    to COCO / Cityscapes, and mmseg's init_model failed on a file without meta)."""
    from inline_mm.engine.launch import read_config
    from inline_mm.engine.runner_utils import dataset_metainfo, load_trained_model
    config = TOY_DET if task == 'det' else TOY_SEG
    cfg = read_config(config)
    own = dataset_metainfo(cfg)
    state = {k: torch.randn_like(v) if v.is_floating_point() else v
             for k, v in toy_models[task].state_dict().items()}
    saved = dict(classes=('a', 'b', 'c'), palette=[(1, 2, 3)] * 3)
    for meta, classes in ((None, own['classes']), ({'dataset_meta': saved}, ('a', 'b', 'c'))):
        path = tmp_path / 'weights.pth'
        torch.save({'state_dict': state, **({'meta': meta} if meta else {})}, path)
        model = load_trained_model(read_config(config), str(path))
        assert tuple(model.dataset_meta['classes']) == tuple(classes)
        assert 'palette' in model.dataset_meta and not model.training
        assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    key = next(k for k in state if k.startswith('backbone.') and k.endswith('.weight'))
    state[key] = torch.zeros(3)
    torch.save({'state_dict': state}, path)
    with pytest.raises(CheckpointMismatchError, match='does not fit the model of the config'):
        load_trained_model(read_config(config), str(path), parts=('backbone',))
    load_trained_model(read_config(config), str(path), parts=('neck',))


def test_inference_palette_and_classes_in_the_toolkits_order():
    """Detectors: the config's palette before the checkpoint's (init_detector); segmentors:
    the checkpoint's first (init_model); the 2.x CLASSES / PALETTE meta; a fixed palette of
    the right length where none is known (the toolkits fell back to COCO / Cityscapes)."""
    from inline_mm.engine.launch import read_config
    from inline_mm.engine.runner_utils import _inference_dataset_meta, dataset_metainfo
    det, seg = read_config(TOY_DET), read_config(TOY_SEG)
    saved = {'dataset_meta': {'classes': ('a', 'b'), 'palette': [(1, 1, 1), (2, 2, 2)]}}
    meta = _inference_dataset_meta(det, saved)
    assert meta['classes'] == ('a', 'b') and meta['palette'] == dataset_metainfo(det)['palette']
    assert _inference_dataset_meta(seg, saved) == saved['dataset_meta']
    old = _inference_dataset_meta(seg, {'CLASSES': ('x',), 'PALETTE': [(9, 9, 9)]})
    assert old == {'classes': ('x',), 'palette': [(9, 9, 9)]}
    seg.test_dataloader.dataset.metainfo = dict(classes=('p', 'q', 'r'))  # no palette
    seg.test_dataloader.dataset.type = 'BaseSegDataset'
    meta = _inference_dataset_meta(seg, None)
    assert meta['classes'] == ('p', 'q', 'r') and len(meta['palette']) == 3
    assert meta == _inference_dataset_meta(seg, {})  # the same colours each time


def _good_file(tmp_path):
    path = tmp_path / 'good.pth'
    torch.save({'state_dict': {'backbone.w': torch.zeros(1000)}}, path)
    return path


@pytest.mark.parametrize('kind,expected', [
    ('text', 'is a text file, not a PyTorch checkpoint: pass the .pth file'),
    ('html', 'is an HTML page, not a PyTorch checkpoint'),
    ('lfs', 'is a Git LFS pointer, not a PyTorch checkpoint: fetch the weights (`git lfs pull`)'),
    ('empty', 'is empty (0 bytes)'),
    ('truncated', 'is truncated or corrupt: a zip archive (the PyTorch format) of 900 bytes '
                  'without its end'),
    ('legacy', 'is truncated or corrupt (a legacy-format PyTorch file'),
])
def test_unreadable_files_say_what_they_are(tmp_path, kind, expected):
    path = tmp_path / f'{kind}.pth'
    if kind == 'text':
        path.write_text('model weights: see the release page\n')
    elif kind == 'html':
        path.write_text('<!DOCTYPE html>\n<html><body>Sign in</body></html>\n')
    elif kind == 'lfs':
        path.write_text('version https://git-lfs.github.com/spec/v1\noid sha256:'
                        + '0' * 64 + '\nsize 123456\n')
    elif kind == 'empty':
        path.write_bytes(b'')
    elif kind == 'truncated':
        path.write_bytes(_good_file(tmp_path).read_bytes()[:900])
    else:
        full = tmp_path / 'legacy_full.pth'
        torch.save({'w': torch.zeros(1000)}, full, _use_new_zipfile_serialization=False)
        path.write_bytes(full.read_bytes()[:600])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint_file(str(path))
    message = str(info.value)
    assert message.startswith(f'cannot read checkpoint {str(path)!r}: it {expected}'), message
    assert 'weights_only=False' not in message and '\n' not in message


def test_runner_checkpoints_read_without_named_safe_globals(tmp_path, monkeypatch):
    """torch < 2.6 reads through the restricted unpickler: mmengine's message hub
    (HistoryBuffer, numpy) is allowed there too, anything else still refused."""
    import numpy as np
    from mmengine.logging import HistoryBuffer

    import inline_mm.checkpoint.safe_load as ckpt
    monkeypatch.setattr(ckpt, '_TORCH_NAMED_SAFE_GLOBALS', False)
    path = tmp_path / 'runner.pth'
    torch.save({'state_dict': {'w': torch.ones(2)},
                'message_hub': {'log_scalars': {'loss': HistoryBuffer([1.0, 2.0], [1, 1])},
                                'runtime_info': {'seed': np.int64(3), 'a': np.zeros(2)}}},
               path)
    loaded = ckpt.load_checkpoint_file(str(path))
    assert loaded['message_hub']['log_scalars']['loss'].mean() == 1.5
    path = tmp_path / 'other.pth'
    torch.save({'w': torch.ones(1), 'x': logging.Formatter()}, path)
    with pytest.raises(CheckpointError, match='logging.Formatter'):
        ckpt.load_checkpoint_file(str(path))
    # bytes come as _codecs.encode(text, 'latin1'); no other codec is allowed
    torch.save({'w': torch.ones(1), 'x': _Rot13('abc')}, path)
    with pytest.raises(CheckpointError, match='cannot read checkpoint'):
        ckpt.load_checkpoint_file(str(path))


class _Rot13:
    """Unpickles as codecs.encode(text, 'rot13'): a codec other than latin-1."""

    def __init__(self, text):
        self.text = text

    def __reduce__(self):
        import codecs
        return (codecs.encode, (self.text, 'rot13'))


# ------------------------------------------------ 4. the ONNX file infer_onnx.py is given
@pytest.fixture(scope='module')
def toy_exports(tmp_path_factory, toy_models):
    pytest.importorskip('onnxruntime')
    from inline_mm.deploy import export_onnx, wrap_part
    root = tmp_path_factory.mktemp('onnx')
    files = {}
    for part, batch in (('backbone', 1), ('model', 1), ('model', 2)):
        path = str(root / f'{part}_{batch}.onnx')
        export_onnx(wrap_part(toy_models['seg'], part, 'mmseg'), (64, 64), path,
                    dynamic=True, batch=batch)
        files[part, batch] = path
    return files


def _infer(args):
    path = osp.join(REPO_ROOT, 'tools', 'deployment', 'infer_onnx.py')
    spec = importlib.util.spec_from_file_location('infer_onnx_tool', path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return cli_main(tool.main, args)


@pytest.fixture
def image(tmp_path):
    import mmcv
    import numpy as np
    path = str(tmp_path / 'img.png')
    mmcv.imwrite((np.random.default_rng(0).random((70, 90, 3)) * 255).astype(np.uint8), path)
    return path


@pytest.mark.slow
def test_infer_onnx_refuses_a_backbone_export(toy_exports, image, tmp_path, capsys):
    out_dir = tmp_path / 'vis'
    code = _infer([image, '--config', TOY_SEG, '--onnx', toy_exports['backbone', 1],
                   '--out-dir', str(out_dir)])
    err = capsys.readouterr().err
    assert code == 2 and err.count('\n') == 1, err
    assert err.startswith(f"error: {toy_exports['backbone', 1]} does not fit {TOY_SEG}: on a "
                          '64x64 input it gives 4 output(s) (1x64x16x16, 1x128x8x8, 1x320x4x4, '
                          f'1x512x2x2), what `export_onnx.py {TOY_SEG} --part backbone` '
                          'writes'), err
    assert 'needs --part model, one output with 4 channels (one per class)' in err
    assert not out_dir.exists()  # nothing drawn
    # the whole segmentor is accepted and draws
    assert _infer([image, '--config', TOY_SEG, '--onnx', toy_exports['model', 1],
                   '--out-dir', str(out_dir)]) == 0
    assert os.listdir(out_dir) == ['img.png']


@pytest.mark.slow
def test_infer_onnx_refuses_other_batches(toy_exports, image, tmp_path, capsys):
    code = _infer([image, '--config', TOY_SEG, '--onnx', toy_exports['model', 2],
                   '--out-dir', str(tmp_path / 'vis')])
    err = capsys.readouterr().err
    assert code == 2 and err.count('\n') == 1
    assert 'was exported for batches of 2 images' in err and '--batch 1' in err, err


def test_infer_onnx_refuses_a_file_that_is_no_onnx_model(image, tmp_path, capsys):
    pytest.importorskip('onnxruntime')
    text = tmp_path / 'model.onnx'
    text.write_text('not a model')
    code = _infer([image, '--config', TOY_SEG, '--onnx', str(text),
                   '--out-dir', str(tmp_path / 'vis')])
    err = capsys.readouterr().err
    assert code == 2 and err.count('\n') == 1
    assert err.startswith(f'error: cannot load ONNX file {str(text)!r}: it is not an ONNX '
                          'model or it is corrupt'), err
