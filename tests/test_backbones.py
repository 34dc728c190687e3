"""The four backbone families: shapes at any size, the backbone contract, windows."""
import math

import pytest
import torch
from conftest import requires_cpu_fp16

from inline_mm import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin
from inline_mm.errors import ConfigError
from inline_mm.models.layers import blocks as blocks_module
from inline_mm.models.layers.attention_kind import AttentionKind
from inline_mm.models.layers.blocks import TransformerBlock
from inline_mm.models.layers.windows import run_in_windows

# Reduced depths keep CPU tests fast while keeping every kind of block:
# Swin / CSwin get two blocks in their softmax stage (plain and shifted / two branches).
SMALL = {
    InLinePVT: dict(arch='tiny', depths=[1, 1, 1, 1]),
    InLineSwin: dict(arch='tiny', depths=[1, 1, 2, 2]),
    InLineCSWin: dict(arch='tiny', depths=[1, 1, 2, 1]),
    InLineDeiT: dict(arch='tiny', depth=4, out_indices=(0, 1, 2, 3)),
}
CHANNELS = {
    InLinePVT: [64, 128, 320, 512],
    InLineSwin: [96, 192, 384, 768],
    InLineCSWin: [64, 128, 256, 512],
    InLineDeiT: [192] * 4,
}


def expected_sizes(cls, h, w):
    strides = [16] * 4 if cls is InLineDeiT else [4, 8, 16, 32]
    return [(math.ceil(h / s), math.ceil(w / s)) for s in strides]


@pytest.mark.parametrize('cls', list(SMALL))
@pytest.mark.parametrize('hw', [(224, 224), (800, 1333), (97, 131), (45, 33), (32, 32)])
def test_output_shapes_any_size(cls, hw):
    model = cls(**SMALL[cls]).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *hw))
    assert len(outs) == 4
    for out, c, size in zip(outs, CHANNELS[cls], expected_sizes(cls, *hw)):
        assert out.shape == (1, c, *size)
        assert torch.isfinite(out).all()
        # plain NCHW memory: mmcv's compiled ops (RoIAlign) read the raw layout
        assert out.is_contiguous()


ARCHS = [(InLinePVT, a) for a in ('tiny', 'small', 'medium', 'large')] + \
        [(InLineSwin, a) for a in ('tiny', 'small', 'base')] + \
        [(InLineCSWin, a) for a in ('tiny', 'small', 'base')] + \
        [(InLineDeiT, a) for a in ('tiny', 'small', 'base')]


@pytest.mark.slow
@pytest.mark.parametrize('cls,arch', ARCHS)
def test_every_arch_at_224_and_odd_sizes(cls, arch):
    model = cls(arch=arch).eval()
    with torch.no_grad():
        for hw in [(224, 224), (97, 131), (45, 33)]:
            outs = model(torch.randn(1, 3, *hw))
            sizes = expected_sizes(cls, *hw)
            if cls is InLineDeiT:
                assert [o.shape[1] for o in outs] == [model.embed_dims] * 4
            else:
                assert [o.shape[1] for o in outs] == model.embed_dims
            assert [tuple(o.shape[2:]) for o in outs] == sizes
            assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('cls', list(SMALL))
def test_out_indices_subset(cls):
    kwargs = dict(SMALL[cls], out_indices=(1, 3))
    model = cls(**kwargs).eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        outs = model(x)
    assert len(outs) == 2
    # the outputs are those of stages 1 and 3 of the same model returning all four
    # (which has the output norms of stages 0 and 2 too)
    full = cls(**SMALL[cls]).eval()
    assert not full.load_state_dict(model.state_dict(), strict=False).unexpected_keys
    with torch.no_grad():
        all_outs = full(x)
    torch.testing.assert_close(outs[0], all_outs[1])
    torch.testing.assert_close(outs[1], all_outs[3])
    if cls is not InLineDeiT:
        assert [o.shape[1] for o in outs] == [CHANNELS[cls][1], CHANNELS[cls][3]]
        assert [tuple(o.shape[2:]) for o in outs] == [expected_sizes(cls, 64, 96)[i]
                                                     for i in (1, 3)]


#: parameters frozen by frozen_stages=1: the stem, stage 1 and its output norm (as mmdet's Swin)
FROZEN_BY_STAGE_1 = {
    InLinePVT: ('patch_embed1.', 'pos_embed1', 'block1.'),
    InLineSwin: ('patch_embed.', 'layers.0.', 'norm0.'),
    InLineCSWin: ('stage1_conv_embed.', 'stage1.', 'norm0.'),
    InLineDeiT: ('patch_embed.', 'cls_token', 'pos_embed', 'blocks.0.'),
}


@pytest.mark.parametrize('cls', list(SMALL))
def test_frozen_stages(cls):
    model = cls(**dict(SMALL[cls], frozen_stages=1, drop_path_rate=0.1))
    # exactly the named parameters are frozen (independent of _stage_parts)
    prefixes = FROZEN_BY_STAGE_1[cls]
    names = [n for n, _ in model.named_parameters()]
    assert all(any(n.startswith(p) for n in names) for p in prefixes)
    assert {n for n, p in model.named_parameters() if not p.requires_grad} == \
        {n for n in names if n.startswith(prefixes)}
    frozen = model._stage_parts(0) + model._stage_parts(1)
    later = model._stage_parts(2)
    assert model.train() is model  # train() returns self
    for part in frozen:
        params = [part] if isinstance(part, torch.nn.Parameter) else list(part.parameters())
        assert params and not any(p.requires_grad for p in params)
        if isinstance(part, torch.nn.Module):
            assert not any(m.training for m in part.modules())
    for part in later:
        if isinstance(part, torch.nn.Module):
            assert part.training
            assert all(p.requires_grad for p in part.parameters())
    # gradients do not reach frozen parameters
    model(torch.randn(1, 3, 64, 64))[-1].sum().backward()
    assert all(p.grad is None for part in frozen for p in (
        [part] if isinstance(part, torch.nn.Parameter) else part.parameters()))


@pytest.mark.parametrize('cls', list(SMALL))
def test_with_cp_same_outputs_and_gradients(cls):
    torch.manual_seed(0)
    # no stochastic depth, so both runs are deterministic in train mode
    plain = cls(**dict(SMALL[cls], drop_path_rate=0.))
    ckpt = cls(**dict(SMALL[cls], drop_path_rate=0., with_cp=True))
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 64, 80)
    calls = []
    blocks = [m for m in ckpt.modules() if type(m).__name__ in ('TransformerBlock', 'CSWinBlock')]
    for m in blocks:
        m.register_forward_pre_hook(lambda *_: calls.append(1))
    outs_a, outs_b = plain(x), ckpt(x)
    for a, b in zip(outs_a, outs_b):
        torch.testing.assert_close(a, b)
    assert blocks and len(calls) == len(blocks)
    sum(o.square().mean() for o in outs_a).backward()
    sum(o.square().mean() for o in outs_b).backward()
    assert len(calls) == 2 * len(blocks)  # checkpointed: every block recomputed in backward
    for (name, pa), pb in zip(plain.named_parameters(), ckpt.parameters()):
        if pa.grad is None:
            assert pb.grad is None, name
        else:
            torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_bf16_autocast_finite_at_1333x800():
    model = InLinePVT(arch='tiny', depths=[1, 1, 1, 1]).eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(1, 3, 800, 1333) * 3)
    assert outs[0].shape == (1, 64, 200, 334)
    assert all(torch.isfinite(o.float()).all() for o in outs)


def test_pos_embed_resized_bilinear_and_cached():
    model = InLinePVT(arch='tiny', depths=[1, 1, 1, 1]).eval()
    resizer = model._pos_resizer
    with torch.no_grad():
        a = resizer(model.pos_embed1, (20, 30), model.pos_grids[0])
        b = resizer(model.pos_embed1, (20, 30), model.pos_grids[0])
    assert a is b and a.shape == (1, 600, 64)
    grid = model.pos_embed1.detach().reshape(1, 56, 56, 64).permute(0, 3, 1, 2)
    ref = torch.nn.functional.interpolate(grid, size=(20, 30), mode='bilinear',
                                          align_corners=False)
    torch.testing.assert_close(a, ref.flatten(2).transpose(1, 2))
    with torch.no_grad():
        model.pos_embed1.add_(1.0)  # an update invalidates the cache
        c = resizer(model.pos_embed1, (20, 30), model.pos_grids[0])
    torch.testing.assert_close(c, a + 1.0)


def test_swin_windows_clip_and_shift_masks():
    """A shifted softmax block on a padded map equals the unshifted computation with masks."""
    torch.manual_seed(0)
    block = TransformerBlock(32, 2, attn_type='S', window=(7, 7), shift=3,
                             table_window=(7, 7)).eval()
    # map smaller than the window along H: clipped to 5 rows, shift dropped on that axis
    x = torch.randn(1, 5 * 16, 32)
    with torch.no_grad():
        y = block(x, (5, 16))
        assert y.shape == x.shape and torch.isfinite(y).all()
        # the same as a (5, 7) window shifted along W only; the W shift is kept
        block.window, block.shift = (5, 7), (0, 3)
        torch.testing.assert_close(y, block(x, (5, 16)))
        block.shift = 0
        assert not torch.allclose(y, block(x, (5, 16)), atol=1e-3)
    # the window partition a shifted block sees: one (7, 7) window size, 6 windows
    calls = []

    def spy(win, wsz, valid, bias):  # bias: the region bias in the dtype asked for
        calls.append((wsz, None if bias is None else bias(torch.float32).shape))
        return win

    run_in_windows(torch.randn(1, 10, 16, 8), (7, 7), spy, shift=3)
    assert calls == [((7, 7), (6, 49, 49))]
    # on the 5 x 16 map: (5, 7) windows, 16 columns padded to 21, 3 windows
    calls.clear()
    run_in_windows(torch.randn(1, 5, 16, 8), (7, 7), spy, shift=3)
    assert calls == [((5, 7), (3, 35, 35))]


def _noisy_padding(monkeypatch):
    """Make the window padding random instead of zero: masked padding must not matter."""
    from inline_mm.models.layers import windows
    zero_pad = windows.pad_to_multiple

    def noisy_pad(x, multiple):
        out = zero_pad(x, multiple)
        # as large as real tokens: softmax masks with -100 (Swin), which must hide them
        noise = torch.randn_like(out) * 3
        noise[:, :x.shape[1], :x.shape[2]] = 0
        return out + noise

    monkeypatch.setattr(windows, 'pad_to_multiple', noisy_pad)


@pytest.mark.parametrize('attn_type,shift', [('S', 0), ('S', 3), ('I', 0)])
def test_padded_tokens_never_reach_real_ones(monkeypatch, attn_type, shift):
    """Windows cut by the map border: whatever the padding holds, real tokens get the same."""
    torch.manual_seed(0)
    block = TransformerBlock(32, 2, attn_type=attn_type, window=(7, 7), shift=shift,
                             table_window=(7, 7)).eval()
    x = torch.randn(2, 10 * 16, 32)  # 10 x 16 map: padded to 14 x 21
    with torch.no_grad():
        expected = block(x, (10, 16))
        _noisy_padding(monkeypatch)
        got = block(x, (10, 16))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_padded_tokens_never_reach_real_ones_in_cswin_stripes(monkeypatch):
    """CSwin's stripes and InLine windows (LePE and the local branch included)."""
    torch.manual_seed(0)
    model = InLineCSWin(arch='tiny', depths=[1, 1, 2, 1], inline_window=(5, 6)).eval()
    x = torch.randn(1, 3, 75, 101)
    with torch.no_grad():
        expected = model(x)
        _noisy_padding(monkeypatch)
        got = model(x)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_cswin_inline_branch_equals_each_window_on_its_own():
    """InLine-CSwin's InLine branch over a map its windows do not divide: every window as
    the branch on that window's real tokens alone (attention, the local kernel from the
    window's mean of the block input, LePE, the projection)."""
    from inline_mm.models.backbones.cswin import CSWinInLineAttention
    torch.manual_seed(0)
    dim, b, (h, w) = 16, 2, (6, 7)  # 4 x 5 windows: real extents 4 x 5, 4 x 2, 2 x 5, 2 x 2
    attn = CSWinInLineAttention(dim, 2, (4, 5)).eval()
    proj = torch.nn.Linear(dim, dim)
    qkv, x = torch.randn(b, h * w, 3 * dim), torch.randn(b, h * w, dim) * 2 + 1
    with torch.no_grad():
        out = attn(qkv, x, (h, w), proj).view(b, h, w, dim)
        for rows in (slice(0, 4), slice(4, 6)):
            for cols in (slice(0, 5), slice(5, 7)):
                part = [t.view(b, h, w, -1)[:, rows, cols] for t in (qkv, x)]
                sub = part[0].shape[1:3]  # the window clipped to this map: one window
                ref = attn(*(t.reshape(b, sub[0] * sub[1], -1) for t in part), sub, proj)
                torch.testing.assert_close(out[:, rows, cols], ref.view(b, *sub, dim),
                                           rtol=1e-5, atol=1e-5)


@requires_cpu_fp16
@pytest.mark.parametrize('cls', list(SMALL))
def test_fp16_autocast_outputs_finite(cls):
    """Under fp16 autocast (the GPU AMP dtype) every output stays finite at a large size."""
    model = cls(**SMALL[cls]).eval()
    # K and V of mean ~8, as in trained models: fp16 sums of K^T V over the thousands of tokens
    # of a stage / window exceed 65504; the InLine reductions must run in fp32
    with torch.no_grad():
        for m in model.modules():
            if isinstance(getattr(m, 'kv', None), torch.nn.Linear):
                m.kv.bias += 8
            elif isinstance(getattr(m, 'qkv', None), torch.nn.Linear):
                m.qkv.bias[m.qkv.out_features // 3:] += 8
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.float16):
        outs = model(torch.randn(1, 3, 512, 640) * 3)
    assert all(torch.isfinite(o.float()).all() for o in outs)


def test_inline_window_options():
    base = dict(arch='tiny', depths=[1, 1, 1, 1])
    m_global = InLineSwin(**base, attn_type='IIII', inline_window='global').eval()
    m_auto = InLineSwin(**base, attn_type='IIII').eval()
    m_auto.load_state_dict(m_global.state_dict())
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        # at the pretraining size 'auto' windows cover the whole map: identical
        for a, b in zip(m_global(x), m_auto(x)):
            torch.testing.assert_close(a, b)
        x = torch.randn(1, 3, 320, 288)
        differs = [not torch.allclose(a, b) for a, b in zip(m_global(x), m_auto(x))]
    assert differs[0]
    m_rect = InLineSwin(**base, attn_type='IIII', inline_window=(8, 24)).eval()
    with torch.no_grad():
        assert m_rect(x)[0].shape == (1, 96, 80, 72)
    # (h, w) = (8, 24): 8 rows, 24 columns, in every InLine block
    assert {b.window for layer in m_rect.layers for b in layer.blocks} == {(8, 24)}


@pytest.mark.parametrize('kwargs,match', [
    (dict(cls=InLinePVT, arch='tiniest'), "unknown arch 'tiniest' for InLinePVT"),
    (dict(cls=InLineSwin, attn_type='III'), "attn_type 'III' does not fit InLineSwin"),
    (dict(cls=InLineSwin, attn_type='IIXS'), "stage 2 has 'X'"),
    (dict(cls=InLineSwin, attn_type='IIMS'), "'M' needs its block count"),
    # Swin-T's stage 2 has 6 blocks: 'M9' and 'M0' would silently be 'I' and 'S'
    (dict(cls=InLineSwin, attn_type='IIMS9'),
     "the 'M' stage 2 has 6 blocks, so its InLine block count is 1 to 6, got 9"),
    (dict(cls=InLineSwin, attn_type='IIMS0'), 'InLine block count is 1 to 6, got 0'),
    (dict(cls=InLinePVT, attn_type='IISS'), "InLinePVT supports 'I'"),
    (dict(cls=InLineCSWin, split_size=(1, 2, 7)), 'split_size of InLineCSWin has 3 entries'),
    (dict(cls=InLineSwin, inline_window='huge'), "inline_window is 'auto', 'global'"),
    (dict(cls=InLinePVT, out_indices=(0, 4)), 'out_indices'),
    (dict(cls=InLineSwin, kernel_func='gelu'), "unknown kernel_func 'gelu'"),
])
def test_bad_arguments_raise_clear_errors(kwargs, match):
    cls = kwargs.pop('cls')
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize('cls', [InLineSwin, InLineCSWin, InLinePVT])
def test_caches_filled_during_inference_serve_training(cls):
    """Masks / index / position caches built under inference_mode work in training."""
    model = cls(**dict(SMALL[cls], frozen_stages=1))
    x = torch.randn(1, 3, 75, 101)  # padded, clipped and shifted windows
    with torch.inference_mode():
        model.eval()
        model(x)
    model.train()
    sum(o.mean() for o in model(x)).backward()
    assert any(p.grad is not None for p in model.parameters())


def test_init_cfg_as_a_list_converts_and_resizes(tmp_path):
    """[dict(type='Pretrained', ...)] (mmdet's list form) takes the plugin's loader too."""
    src = InLineDeiT(arch='tiny', depth=2, out_indices=(1,))  # a 14 x 14 position table
    path = tmp_path / 'deit.pth'
    state = {k: v for k, v in src.state_dict().items() if not k.startswith('blocks.1.norm1.')}
    torch.save({'model': {**state, 'head.weight': torch.zeros(1000, 192)}}, path)
    dst = InLineDeiT(arch='tiny', depth=2, out_indices=(1,), pretrain_img_size=320,
                     init_cfg=[dict(type='Constant', layer='LayerNorm', val=3.0),
                               dict(type='Pretrained', checkpoint=str(path))])
    dst.init_weights()
    assert dst.pos_embed.shape == (1, 1 + 20 * 20, 192)  # resized, not skipped
    torch.testing.assert_close(dst.blocks[0].attn.proj.weight, src.blocks[0].attn.proj.weight)
    # the Pretrained entry runs last: the LayerNorms hold the checkpoint's values
    torch.testing.assert_close(dst.norm.weight, src.norm.weight)
    # the other entries ran too: the LayerNorm the checkpoint lacks holds the Constant
    torch.testing.assert_close(dst.blocks[1].norm1.weight, torch.full((192,), 3.0))
    assert isinstance(dst.init_cfg, list)  # the config is left as it was given


def test_attn_drop_rate_reaches_the_softmax_blocks():
    # no stochastic depth: only the attention dropout can make two passes differ
    swin = InLineSwin(arch='tiny', depths=[1, 1, 1, 2], attn_drop_rate=0.25, drop_path_rate=0.)
    assert swin.layers[3].blocks[1].attn.attn_drop.p == 0.25
    cswin = InLineCSWin(arch='tiny', depths=[1, 1, 2, 1], attn_drop_rate=0.25,
                        drop_path_rate=0.)
    assert cswin.stage3[0].attns[0].attn_drop.p == 0.25
    # in training the attention weights are dropped: two passes differ
    for block, x, hw in [(swin.layers[3].blocks[1], torch.randn(1, 49, 768), (7, 7)),
                         (cswin.stage3[0], torch.randn(1, 49, 256), (7, 7))]:
        block.train()
        assert not torch.allclose(block(x, hw), block(x, hw))
        block.eval()
        torch.testing.assert_close(block(x, hw), block(x, hw))
    InLinePVT(arch='tiny', depths=[1, 1, 1, 1], attn_drop_rate=0.1)  # accepted (no matrix)
    InLineDeiT(arch='tiny', depth=2, out_indices=(1,), attn_drop_rate=0.1)


@pytest.mark.parametrize('cls,kwargs,channels', [
    (InLinePVT, dict(embed_dims=[32, 64, 128], depths=[1, 1, 1], num_heads=[1, 2, 4],
                     mlp_ratios=[4, 4, 4], attn_type='III', out_indices=(0, 1, 2)),
     [32, 64, 128]),
    (InLineSwin, dict(embed_dims=32, depths=[1, 1, 2], num_heads=[1, 2, 4], attn_type='IIS',
                      out_indices=(0, 1, 2)), [32, 64, 128]),
    (InLineCSWin, dict(embed_dims=32, depths=[1, 1, 1], num_heads=[2, 2, 4],
                       attn_type='IIS', split_size=(1, 2, 7), out_indices=(0, 1, 2)),
     [32, 64, 128]),
])
def test_three_stage_models_build_run_and_convert(cls, kwargs, channels, tmp_path):
    """num_stages comes from depths everywhere, the converters find the last stage."""
    model = cls(arch='tiny', **kwargs).eval()
    assert model.num_stages == 3
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 96))
    assert [o.shape[1] for o in outs] == channels
    assert [tuple(o.shape[2:]) for o in outs] == expected_sizes(cls, 64, 96)[:3]
    if cls is not InLinePVT:  # the authors' final `norm` is the norm of the third output
        state = {('norm.' + k[6:] if k.startswith('norm2.') else k): v
                 for k, v in model.state_dict().items()}
        assert 'norm.weight' in state and 'norm2.weight' not in state
        assert set(model.convert_checkpoint(state)) == set(model.state_dict())


def test_a_new_attention_kind_gets_its_window_from_the_kind_in_swin(monkeypatch):
    """InLine-Swin takes every letter of ATTENTION_KINDS and gives a kind the InLine window
    or the softmax window by its ``wide_windows``, not by its letter; CSwin's own blocks
    refuse a kind they do not have."""
    from inline_mm.models.layers.inline_attention import InLineAttention
    from inline_mm.models.layers.softmax_attention import WindowAttention

    class ScaledInLine(InLineAttention):  # wide_windows inherited (True)
        pass

    class NarrowSoftmax(WindowAttention):  # wide_windows False
        pass

    monkeypatch.setitem(blocks_module.ATTENTION_KINDS, 'L', ScaledInLine)
    monkeypatch.setitem(blocks_module.ATTENTION_KINDS, 'N', NarrowSoftmax)
    model = InLineSwin(arch='tiny', depths=[2, 2, 1, 1], attn_type='LNIS',
                       inline_window=(8, 24)).eval()
    blocks = [b for layer in model.layers for b in layer.blocks]
    assert [type(b.attn).__name__ for b in blocks] == [
        'ScaledInLine', 'ScaledInLine', 'NarrowSoftmax', 'NarrowSoftmax', 'InLineAttention',
        'WindowAttention']
    assert [b.window for b in blocks] == [(8, 24), (8, 24), (7, 7), (7, 7), (8, 24), (7, 7)]
    assert [b.shift for b in blocks] == [0, 0, (0, 0), (3, 3), 0, (0, 0)]
    with torch.no_grad():
        assert model(torch.randn(1, 3, 96, 64))[0].shape == (1, 96, 24, 16)
    with pytest.raises(ConfigError, match="stage 0 has 'X'; InLineSwin supports 'I', 'S', "
                                          "'L', 'N', 'M'"):
        InLineSwin(arch='tiny', depths=[1, 1, 1, 1], attn_type='XSSS')
    with pytest.raises(ConfigError, match="stage 0 has 'L'; InLineCSWin supports 'I', 'S', "
                                          "'M'"):
        InLineCSWin(arch='tiny', depths=[1, 1, 1, 1], attn_type='LSSS')
    from inline_mm.models.backbones.cswin import CSWinBlock
    with pytest.raises(ConfigError, match="attn_type of a CSWin block is 'I' or 'S', got 'L'"):
        CSWinBlock(64, 2, 4., True, 'L', 7, True, (56, 56))

    class ShiftedWide(ScaledInLine):
        shifted_windows = True

    monkeypatch.setitem(blocks_module.ATTENTION_KINDS, 'W', ShiftedWide)
    with pytest.raises(ConfigError, match="attention kind 'W' asks for wide windows and a "
                                          "shift: InLine-Swin shifts by half its softmax window"):
        InLineSwin(arch='tiny', depths=[1, 1, 1, 1], attn_type='SWSS')


def test_attention_kind_letters_fit_attn_type():
    """Every kind's key is one capital letter other than 'M' (attn_type's mixed stage)."""
    import re
    assert all(re.fullmatch(r'[A-LN-Z]', k) for k in blocks_module.ATTENTION_KINDS)


def test_stage_lists_must_match_depths():
    with pytest.raises(ValueError, match=r'num_heads of InLinePVT has 4 entries but depths '
                                         r'\[1, 1, 1\] has 3 stages'):
        InLinePVT(arch='tiny', depths=[1, 1, 1], embed_dims=[64, 128, 320],
                  mlp_ratios=[8, 8, 4], attn_type='III')


def test_a_new_attention_kind_plugs_into_the_block(monkeypatch):
    """The block asks the kind, not its letter: a kind registered in ATTENTION_KINDS
    (here: every token takes the mean of the real tokens of its window) gets the block's
    windows, its padding mask and no shift, with no change to the block."""
    class WindowMean(torch.nn.Module, AttentionKind):
        @classmethod
        def for_block(cls, args):
            assert (args.dim, args.num_heads, args.window) == (8, 2, (2, 2))
            return cls()

        def forward(self, x, window, valid=None, bias=None):
            assert bias is None  # no region bias asked for
            w = torch.ones(x.shape[:2]) if valid is None else valid.to(x.dtype)
            mean = (x * w[..., None]).sum(1, keepdim=True) / w.sum(1)[:, None, None]
            return mean.expand_as(x)

    monkeypatch.setitem(blocks_module.ATTENTION_KINDS, 'A', WindowMean)
    block = TransformerBlock(8, 2, attn_type='A', window=(2, 2), shift=1).eval()
    assert block.shift == 0
    x = torch.randn(1, 4 * 6, 8)
    with torch.no_grad():
        got = block(x, (4, 6))
        # (r, c) -> window (r // 2, c // 2): the mean over each 2x2 window
        y = block.norm1(x).view(1, 2, 2, 3, 2, 8).mean((2, 4), keepdim=True)
        y = y.expand(1, 2, 2, 3, 2, 8).reshape(1, 24, 8)
        expected = x + y
        expected = expected + block.mlp(block.norm2(expected))
    torch.testing.assert_close(got, expected)
    # a 5x6 grid pads one row: the padded tokens do not count in the means
    x = torch.randn(1, 5 * 6, 8)
    with torch.no_grad():
        got = block(x, (5, 6))
        y = torch.nn.functional.pad(block.norm1(x).view(1, 5, 6, 8), (0, 0, 0, 0, 0, 1))
        counts = torch.ones(1, 6, 6, 1)
        counts[:, 5:] = 0
        sums = (y * counts).view(1, 3, 2, 3, 2, 8).sum((2, 4), keepdim=True)
        n = counts.view(1, 3, 2, 3, 2, 1).sum((2, 4), keepdim=True)
        y = (sums / n).expand(1, 3, 2, 3, 2, 8).reshape(1, 6, 6, 8)[:, :5].reshape(1, 30, 8)
        expected = x + y
        expected = expected + block.mlp(block.norm2(expected))
    torch.testing.assert_close(got, expected)
    with pytest.raises(ConfigError, match="attn_type of a block is one of 'I', 'S', 'A', "
                                          "got 'X'"):
        TransformerBlock(8, 2, attn_type='X')

