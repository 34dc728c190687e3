"""Authors' checkpoints (every key of every variant) and OpenMMLab checkpoints load."""
import glob
import hashlib
import os

import pytest
import torch
from conftest import DATA_DIR

from inline_mm import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin, load_pretrained
from inline_mm.errors import CheckpointError
from inline_mm.models.converters import REGENERATED_BUFFERS, convert, detect_family

FAMILIES = {'pvt': InLinePVT, 'swin': InLineSwin, 'cswin': InLineCSWin, 'deit': InLineDeiT}
TSV_DIR = os.path.join(DATA_DIR, 'official_state_dicts')
TSVS = sorted(glob.glob(os.path.join(TSV_DIR, '*.tsv')))


def read_tsv(path):
    shapes = {}
    with open(path) as f:
        for line in f:
            if line.startswith('#') or not line.strip():
                continue
            key, shape, dtype = line.rstrip('\n').split('\t')
            shapes[key] = (tuple(int(s) for s in shape.split('x')), getattr(torch, dtype))
    return shapes


def random_state_dict(shapes):
    g = torch.Generator().manual_seed(0)
    return {k: (torch.randn(s, generator=g).to(dt) if dt.is_floating_point
                else torch.randint(0, 10, s, generator=g).to(dt))
            for k, (s, dt) in shapes.items()}


def test_reference_key_lists_are_present():
    names = sorted(os.path.basename(t)[:-4] for t in TSVS)
    assert names == sorted(f'inline_{f}_{a}' for f, archs in [
        ('pvt', ('tiny', 'small', 'medium', 'large')), ('swin', ('tiny', 'small', 'base')),
        ('cswin', ('tiny', 'small', 'base')), ('deit', ('tiny', 'small', 'base'))]
        for a in archs), f'expected the 13 official key lists in {TSV_DIR}'


@pytest.mark.slow
@pytest.mark.parametrize('tsv', TSVS, ids=[os.path.basename(t)[:-4] for t in TSVS])
def test_converter_consumes_every_official_key(tsv, tmp_path):
    _, family, arch = os.path.basename(tsv)[:-4].split('_')
    state = random_state_dict(read_tsv(tsv))
    assert detect_family(state) == family
    path = tmp_path / 'official.pth'
    torch.save({'model': state, 'epoch': 300}, path)
    model = FAMILIES[family](arch=arch, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    own = model.state_dict()
    loaded = set()
    for key, value in state.items():
        if key.startswith('head.') or key.rsplit('.', 1)[-1] in REGENERATED_BUFFERS:
            continue  # the classifier and the buffers rebuilt per input size
        # the authors' final norm is the norm of the last output of Swin / CSwin
        target = 'norm3' + key[4:] if family in ('swin', 'cswin') and key.startswith('norm.') \
            else key
        assert target in own, f'official key {key} has no place in the model'
        assert torch.equal(own[target], value), key
        loaded.add(target)
    # nothing but the documented keys is missing
    assert set(own) - loaded == set(model.documented_missing()), sorted(set(own) - loaded)
    # what load_pretrained reports (and logs): only the documented keys missing, nothing
    # unexpected, nothing resized at the training size
    report = load_pretrained(model, str(path))
    assert set(report['missing']) == set(model.documented_missing())
    assert report['unexpected'] == [] and report['resized'] == []
    assert len(report['loaded']) == len(loaded)
    assert convert(convert(state, family), family).keys() == convert(state, family).keys()


def test_round_trip_through_init_cfg(tmp_path):
    src = InLineSwin(arch='tiny', depths=[1, 1, 2, 1])
    path = tmp_path / 'swin.pth'
    torch.save({'state_dict': src.state_dict(), 'meta': {'epoch': 1}}, path)
    dst = InLineSwin(arch='tiny', depths=[1, 1, 2, 1],
                     init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    dst.init_weights()
    for (name, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert torch.equal(a, b), name


def test_detector_checkpoint_with_backbone_prefix(tmp_path):
    src = InLinePVT(arch='tiny', depths=[1, 1, 1, 1])
    detector = {f'backbone.{k}': v for k, v in src.state_dict().items()}
    detector['neck.lateral_convs.0.conv.weight'] = torch.zeros(256, 64, 1, 1)
    path = tmp_path / 'mask_rcnn.pth'
    torch.save({'state_dict': detector, 'meta': {}}, path)
    dst = InLinePVT(arch='tiny', depths=[1, 1, 1, 1],
                    init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    dst.init_weights()
    for (name, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert torch.equal(a, b), name


def test_ema_weights_on_request(tmp_path):
    src = InLineCSWin(arch='tiny', depths=[1, 1, 1, 1])
    ema = {k: v + 1 for k, v in src.state_dict().items()}
    path = tmp_path / 'cswin.pth'
    torch.save({'model': src.state_dict(), 'state_dict_ema': ema}, path)
    dst = InLineCSWin(arch='tiny', depths=[1, 1, 1, 1], init_cfg=dict(
        type='Pretrained', checkpoint=str(path), state_dict_key='state_dict_ema'))
    dst.init_weights()
    torch.testing.assert_close(dst.merge1.conv.weight, src.merge1.conv.weight + 1)


def test_position_tables_resized_on_load(tmp_path):
    src = InLineDeiT(arch='tiny', depth=2, out_indices=(1,))  # 14x14 table
    path = tmp_path / 'deit.pth'
    torch.save({'model': src.state_dict()}, path)
    dst = InLineDeiT(arch='tiny', depth=2, out_indices=(1,), pretrain_img_size=320,
                     init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    dst.init_weights()
    assert dst.pos_embed.shape == (1, 1 + 20 * 20, 192)
    torch.testing.assert_close(dst.pos_embed[:, :1], src.pos_embed[:, :1])
    # the grid part: the checkpoint's 14 x 14 table resized bilinearly (the authors' way)
    grid = src.pos_embed.detach()[:, 1:].reshape(1, 14, 14, 192).permute(0, 3, 1, 2)
    grid = torch.nn.functional.interpolate(grid, size=(20, 20), mode='bilinear',
                                           align_corners=False)
    torch.testing.assert_close(dst.pos_embed[:, 1:], grid.flatten(2).transpose(1, 2))
    swin_src = InLineSwin(arch='tiny', depths=[1, 1, 1, 2], attn_type='IIIS')
    path = tmp_path / 'swin.pth'
    torch.save({'model': swin_src.state_dict()}, path)
    swin = InLineSwin(arch='tiny', depths=[1, 1, 1, 2], attn_type='IIIS', window_size=12,
                      init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    report = __import__('inline_mm').load_pretrained(swin, str(path))
    assert any('relative_position_bias_table' in r for r in report['resized'])
    table = swin.layers[3].blocks[0].attn.relative_position_bias_table
    assert table.shape == (23 * 23, 24)
    # the checkpoint's 13 x 13 table resized by timm, not the model's own initial table
    from timm.layers import resize_rel_pos_bias_table
    src_table = swin_src.layers[3].blocks[0].attn.relative_position_bias_table.detach()
    torch.testing.assert_close(table.detach(), resize_rel_pos_bias_table(
        src_table, new_window_size=(12, 12), new_bias_shape=(23 * 23, 24)))


def _digest(path):
    return hashlib.sha256(open(path, 'rb').read()).hexdigest()


def test_conflicting_shapes_raise_naming_key_and_shapes(tmp_path):
    path = tmp_path / 'small_dims.pth'
    torch.save({'model': InLinePVT(arch='tiny', depths=[1, 1, 1, 1],
                                   embed_dims=[32, 64, 160, 256]).state_dict()}, path)
    before = _digest(path)
    model = InLinePVT(arch='tiny', depths=[1, 1, 1, 1],
                      init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match=r"'pos_embed1' has shape \(1, 3136, 32\) "
                                         r'but the model expects \(1, 3136, 64\)'):
        model.init_weights()
    assert _digest(path) == before


def test_missing_and_corrupt_files_name_the_path(tmp_path):
    model = InLinePVT(arch='tiny', depths=[1, 1, 1, 1],
                      init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'nope.pth')))
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        model.init_weights()
    bad = tmp_path / 'truncated.pth'
    good = tmp_path / 'good.pth'
    torch.save({'model': InLinePVT(arch='tiny', depths=[1, 1, 1, 1]).state_dict()}, good)
    bad.write_bytes(good.read_bytes()[:1000])
    model.init_cfg['checkpoint'] = str(bad)
    with pytest.raises(RuntimeError, match='truncated.pth.*corrupt'):
        model.init_weights()


def test_checkpoint_of_another_family_is_refused(tmp_path):
    path = tmp_path / 'swin.pth'
    torch.save({'model': InLineSwin(arch='tiny', depths=[1, 1, 1, 1]).state_dict()}, path)
    model = InLinePVT(arch='tiny', depths=[1, 1, 1, 1],
                      init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match='none of the .* tensors .* InLinePVT'):
        model.init_weights()
