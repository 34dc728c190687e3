"""Softmax blocks through ``F.scaled_dot_product_attention`` against an explicit reference.

The reference below is written out in full, independently of the package's
windowing code: its own window clipping, padding, roll (by ``(sh, sw)`` per
axis), partition, region labels (Swin's band construction, as the plugin
computed them before), relative position index and
``softmax(s q k^T + bias + mask) v``.  Whole backbones run once as they are and
once with their softmax blocks and windowing replaced by the reference; the
outputs must agree to 1e-5 for every window case: shifted, padded (odd sizes),
clipped (maps smaller than the window), non-square windows, 'M<k>' hybrid
stages, CSwin stripes and its global last stage.
"""
import importlib
import math

import pytest
import torch
import torch.nn.functional as F

from inline_mm import InLineCSWin, InLineSwin
from inline_mm.models.backbones import cswin as cswin_module
from inline_mm.models.backbones.cswin import LePEAttention, apply_lepe
from inline_mm.models.layers import blocks as blocks_module
from inline_mm.models.layers.blocks import TransformerBlock
from inline_mm.models.layers.softmax_attention import WindowAttention

# ----------------------------------------------------------------- the reference


def ref_attention(q, k, v, scale, bias=None, mask=None):
    """softmax(s q k^T + bias + mask) v; q (B * nW, heads, N, d), mask (nW, N, N)."""
    attn = (q * scale) @ k.transpose(-2, -1)
    if bias is not None:
        attn = attn + bias
    if mask is not None:
        bw, heads, n, _ = attn.shape
        attn = (attn.view(bw // mask.shape[0], mask.shape[0], heads, n, n)
                + mask[None, :, None]).view(bw, heads, n, n)
    return attn.softmax(dim=-1) @ v


def ref_relative_index(window, table):
    coords = torch.stack(torch.meshgrid(torch.arange(window[0]), torch.arange(window[1]),
                                        indexing='ij')).flatten(1)
    rel = coords[:, :, None] - coords[:, None, :]
    rel[0] += table[0] - 1
    rel[1] += table[1] - 1
    return rel[0] * (2 * table[1] - 1) + rel[1]


def ref_labels(h, w, hp, wp, window, shift):
    """Swin's region ids of the padded map rolled by -shift; -1 on padding; (hp, wp)."""
    labels = torch.zeros(hp, wp, dtype=torch.long)
    for axis, (size, s, extent) in enumerate(((hp, shift[0], window[0]),
                                              (wp, shift[1], window[1]))):
        if s == 0:
            continue
        band = torch.zeros(size, dtype=torch.long)
        band[size - extent:size - s] = 1
        band[size - s:] = 2
        labels = labels * 3 + (band.view(-1, 1) if axis == 0 else band.view(1, -1))
    padding = torch.ones(hp, wp, dtype=torch.bool)
    padding[:h, :w] = False
    labels[torch.roll(padding, shifts=(-shift[0], -shift[1]), dims=(0, 1))] = -1
    return labels


def ref_run_in_windows(x, window, fn, shift=0, need_bias=True):
    """Pad, roll, partition, attend, reverse, roll back, crop (B, H, W, C)."""
    b, h, w, c = x.shape
    shifts = (shift, shift) if isinstance(shift, int) else tuple(shift)
    win, sft = [], []
    for size, s, extent in zip(window, shifts, (h, w)):
        size = extent if size is None or size >= extent else size
        win.append(size)
        sft.append(s if size < extent else 0)
    (wh, ww), sft = win, tuple(sft)
    hp, wp = math.ceil(h / wh) * wh, math.ceil(w / ww) * ww

    def partition(t):
        d = t.shape[-1]
        return t.view(-1, hp // wh, wh, wp // ww, ww, d).permute(0, 1, 3, 2, 4, 5).reshape(
            -1, wh * ww, d)

    labels = partition(ref_labels(h, w, hp, wp, (wh, ww), sft).view(1, hp, wp, 1))[..., 0]
    padded = (hp, wp) != (h, w)
    valid = (labels >= 0).repeat(b, 1) if padded else None
    mask = None
    if need_bias and (padded or sft != (0, 0)):
        mask = (labels[:, None, :] != labels[:, :, None]).float() * -100.
    x = torch.roll(F.pad(x, (0, 0, 0, wp - w, 0, hp - h)), (-sft[0], -sft[1]), (1, 2))
    out = fn(partition(x), (wh, ww), valid, mask)
    out = out.view(b, hp // wh, wp // ww, wh, ww, -1).permute(0, 1, 3, 2, 4, 5).reshape(
        b, hp, wp, -1)
    return torch.roll(out, sft, (1, 2))[:, :h, :w]


def ref_window_attention(self, x, window, valid=None, bias=None):
    """Swin's WindowAttention with the scores written out (the block interface's
    arguments: ``valid`` unused, ``bias`` the region bias)."""
    mask = bias(torch.float32) if callable(bias) else bias
    b, n, c = x.shape
    qkv = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
    index = ref_relative_index(window, self.table_window)
    bias = self.relative_position_bias_table[index.view(-1)].view(n, n, -1).permute(2, 0, 1)
    out = ref_attention(qkv[0], qkv[1], qkv[2], self.scale, bias, mask)
    return self.proj(out.transpose(1, 2).reshape(b, n, c))


def ref_lepe_attend(self, q, k, v, window, valid, mask):
    out = ref_attention(self._heads(q), self._heads(k), self._heads(v), self.scale, None, mask)
    b, n, c = v.shape
    return out.transpose(1, 2).reshape(b, n, c) + apply_lepe(self.get_v, v, window, valid)


def ref_swin_windows(x, window, fn, shift=0, need_bias=True):
    """Swin's shifted blocks shift by half the window along each axis: (wh // 2, ww // 2)."""
    shifted = shift != 0 and shift != (0, 0)
    return ref_run_in_windows(x, window, fn, (window[0] // 2, window[1] // 2) if shifted else 0,
                              need_bias)


def reference_forward(model, x):
    """The model's forward with its softmax blocks and windowing replaced by the reference."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(blocks_module, 'run_in_windows', ref_swin_windows)
        mp.setattr(cswin_module, 'run_in_windows', ref_run_in_windows)
        mp.setattr(WindowAttention, 'forward', ref_window_attention)
        mp.setattr(LePEAttention, '_attend', ref_lepe_attend)
        return model(x)


# ----------------------------------------------------------------- the tests

# narrow (32 channels in stage 1) to stay fast; the window structure is the presets'
SWIN_CASES = {
    # softmax in every stage: padded + shifted at stride 4, clipped at stride 32
    'softmax_everywhere': dict(depths=[2, 1, 2, 2], attn_type='SSSS'),
    # an 'M1' hybrid stage (InLine, then two softmax blocks: plain, shifted)
    'hybrid': dict(depths=[1, 1, 3, 2], attn_type='IIMS1'),
    'non_square': dict(depths=[2, 1, 2, 2], attn_type='SISS', window_size=(7, 5)),
    'non_square_tall': dict(depths=[2, 1, 2, 2], attn_type='SSIS', window_size=(4, 9)),
}
SWIN_CASES = {k: dict(v, embed_dims=32, num_heads=[1, 2, 4, 8]) for k, v in SWIN_CASES.items()}
CSWIN_CASES = {
    'tiny': dict(embed_dims=32, depths=[1, 1, 2, 1]),
    'softmax_stripes_everywhere': dict(embed_dims=32, depths=[1, 1, 2, 1], attn_type='SSSS',
                                       split_size=(1, 2, 3, 7)),
}
# 224: nothing padded; odd sizes: padded windows and stripes; 45 x 33: stage 4 is
# 2 x 2, smaller than every window (clipped, shift dropped)
SIZES = [(224, 224), (97, 131), (45, 33)]


@pytest.mark.parametrize('cls,kwargs', [(InLineSwin, v) for v in SWIN_CASES.values()]
                         + [(InLineCSWin, v) for v in CSWIN_CASES.values()],
                         ids=[f'swin_{k}' for k in SWIN_CASES]
                         + [f'cswin_{k}' for k in CSWIN_CASES])
def test_backbone_equals_explicit_reference(cls, kwargs):
    torch.manual_seed(0)
    model = cls(**kwargs).eval()
    with torch.no_grad():
        for m in model.modules():  # a bias table far from zero: a wrong index shows
            if isinstance(m, WindowAttention):
                m.relative_position_bias_table.normal_(0, 1)
        for hw in SIZES:
            x = torch.randn(1, 3, *hw)
            got, expected = model(x), reference_forward(model, x)
            for a, b in zip(got, expected):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f'{hw}')


def test_non_square_window_shifts_half_of_each_axis():
    model = InLineSwin(arch='tiny', depths=[2, 2, 2, 2], attn_type='SSSS', window_size=(7, 5))
    shifts = [b.shift for layer in model.layers for b in layer.blocks]
    assert shifts == [(0, 0), (3, 2)] * 4
    assert {b.attn.table_window for layer in model.layers for b in layer.blocks} == {(7, 5)}


@pytest.mark.parametrize('hw', [(14, 10), (10, 16), (5, 16), (16, 3)])
def test_non_square_shifted_block_equals_reference(hw):
    """One (7, 5) block shifted by (3, 2): pad, roll, windowed attention with region mask."""
    torch.manual_seed(0)
    block = TransformerBlock(32, 2, attn_type='S', window=(7, 5), shift=(3, 2),
                             table_window=(7, 5)).eval()
    x = torch.randn(2, hw[0] * hw[1], 32)
    with torch.no_grad():
        block.attn.relative_position_bias_table.normal_(0, 1)
        got = block(x, hw)
        y = block.norm1(x).view(2, *hw, 32)
        y = ref_run_in_windows(y, (7, 5), lambda t, win, valid, mask: ref_window_attention(
            block.attn, t, win, bias=mask), shift=(3, 2)).reshape(x.shape)
        expected = x + y
        expected = expected + block.mlp(block.norm2(expected))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_window_attention_single_call_equals_reference():
    """All four mask cases of one call: bias only, bias + (nW, N, N), bias + (nW, 1, N)."""
    torch.manual_seed(0)
    attn = WindowAttention(32, 4, (7, 7)).eval()
    with torch.no_grad():
        attn.relative_position_bias_table.normal_(0, 1)
        x = torch.randn(6, 49, 32)  # 2 images x 3 windows
        full = (torch.rand(3, 49, 49) < 0.3).float() * -100.
        keys = (torch.rand(3, 1, 49) < 0.3).float() * -100.
        for mask in (None, full, keys):
            expected = ref_window_attention(attn, x, (7, 7),
                                            bias=None if mask is None else mask.expand(3, 49, 49))
            torch.testing.assert_close(attn(x, (7, 7), bias=mask), expected, rtol=1e-5, atol=1e-5)
        # a clipped window indexes the centre of the same table
        x = torch.randn(4, 15, 32)
        torch.testing.assert_close(attn(x, (3, 5)), ref_window_attention(attn, x, (3, 5)),
                                   rtol=1e-5, atol=1e-5)


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Record how the blocks call scaled_dot_product_attention."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0., *args, **kwargs):
        calls.append(dict(q=tuple(q.shape), mask=None if attn_mask is None else attn_mask.dtype,
                          dropout_p=dropout_p, scale=kwargs.get('scale')))
        return real(q, k, v, attn_mask, dropout_p, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention', spy)
    return calls


def test_no_mask_at_all_without_bias_and_padding(sdpa_calls):
    """CSwin at 224 (stripes divide the map, last stage global): attn_mask=None throughout,
    so CUDA can take its flash kernel; padded stripes get a mask."""
    model = InLineCSWin(arch='tiny', depths=[1, 1, 2, 1]).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 224, 224))
        assert sdpa_calls and all(c['mask'] is None for c in sdpa_calls)
        assert all(len(c['q']) == 4 for c in sdpa_calls)
        assert {c['scale'] for c in sdpa_calls} == {32 ** -0.5}  # head_dim 32 in every stage
        sdpa_calls.clear()
        model(torch.randn(1, 3, 97, 131))
        assert any(c['mask'] is not None for c in sdpa_calls)


def test_dropout_only_in_training(sdpa_calls):
    swin = InLineSwin(**SWIN_CASES['hybrid'], attn_drop_rate=0.25, drop_path_rate=0.)
    cswin = InLineCSWin(**CSWIN_CASES['tiny'], attn_drop_rate=0.25, drop_path_rate=0.)
    x = torch.randn(1, 3, 64, 64)
    for model in (swin, cswin):
        model.train()
        model(x)
        assert sdpa_calls and {c['dropout_p'] for c in sdpa_calls} == {0.25}
        sdpa_calls.clear()
        model.eval()
        with torch.no_grad():
            model(x)
        assert sdpa_calls and {c['dropout_p'] for c in sdpa_calls} == {0.}
        sdpa_calls.clear()


def test_gradients_equal_reference():
    """Training: the SDPA path backpropagates the same gradients as the explicit one."""
    torch.manual_seed(0)
    model = InLineSwin(**SWIN_CASES['non_square'], drop_path_rate=0.)
    x = torch.randn(1, 3, 97, 75)
    sum(o.square().mean() for o in model(x)).backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    sum(o.square().mean() for o in reference_forward(model, x)).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_explicit_softmax_switch_for_benchmarks(sdpa_calls):
    """explicit_softmax(): the same outputs through the written-out matmuls, no SDPA call
    inside the context, SDPA again after it."""
    from inline_mm.models.layers.softmax_attention import explicit_softmax
    model = InLineSwin(**SWIN_CASES['hybrid']).eval()
    x = torch.randn(1, 3, 97, 131)
    with torch.no_grad():
        fused = model(x)
        assert sdpa_calls
        sdpa_calls.clear()
        with explicit_softmax():
            explicit = model(x)
        assert not sdpa_calls
        model(x)
        assert sdpa_calls
    for a, b in zip(fused, explicit):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_masks_handed_to_sdpa_have_a_unit_last_stride(monkeypatch):
    """CUDA's fused kernels (flash, memory-efficient) take only masks whose last stride is
    1; with any other they decline and the math kernel runs.  Every mask the softmax blocks
    hand over qualifies: the position bias alone (224: Swin's windows tile the maps, several
    heads per stage), with the region bias (odd sizes), CSwin's padded stripes."""
    strides = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, *args, **kwargs):
        if attn_mask is not None:
            strides.append((attn_mask.shape[1], attn_mask.stride(-1)))
        return real(q, k, v, attn_mask, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention', spy)
    swin = InLineSwin(**SWIN_CASES['softmax_everywhere']).eval()
    cswin = InLineCSWin(**CSWIN_CASES['softmax_stripes_everywhere']).eval()
    with torch.no_grad():
        for model, size in ((swin, (224, 224)), (swin, (97, 131)), (cswin, (97, 131))):
            strides.clear()
            model(torch.randn(1, 3, *size))
            assert strides, f'{type(model).__name__} at {size}: no masked call'
            assert max(rows for rows, _ in strides) > 1  # several heads (or windows)
            assert {stride for _, stride in strides} == {1}, (type(model).__name__, size)


def test_contiguous_qkv_for_masked_cuda_calls_before_torch_2_2(monkeypatch):
    """torch 2.1's memory-efficient CUDA kernel is wrong (fp32) for q / k / v views with a
    mask: the blocks pass contiguous copies there, and the views elsewhere (no copy)."""
    module = importlib.import_module('inline_mm.models.layers.softmax_attention')
    major, minor = (int(v) for v in torch.__version__.split('.')[:2])
    assert module._TORCH_BEFORE_2_2 == ((major, minor) < (2, 2))
    check = module.needs_contiguous_qkv
    assert check('cuda', True, torch_before_2_2=True)
    assert not check('cuda', False, torch_before_2_2=True)
    assert not check('cpu', True, torch_before_2_2=True)
    assert not check('cuda', True, torch_before_2_2=False)

    contiguous = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        contiguous.append(all(t.is_contiguous() for t in (q, k, v)))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention', spy)
    attn = WindowAttention(32, 4, (7, 7)).eval()
    x = torch.randn(2, 49, 32)
    with torch.no_grad():
        expected = attn(x, (7, 7))  # the position bias alone: q / k / v views of qkv
        assert contiguous == [False]
        monkeypatch.setattr(module, 'needs_contiguous_qkv', lambda device, mask: mask)
        torch.testing.assert_close(attn(x, (7, 7)), expected)
    assert contiguous == [False, True]
