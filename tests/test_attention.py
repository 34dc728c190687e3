"""The shared InLine attention against a direct transcription of the formula."""
import importlib
import math

import pytest
import torch
from conftest import requires_cpu_fp16

from inline_mm.models.layers.inline_attention import (InLineAttention, InLineCore,
                                                       inline_attention)
from inline_mm.models.layers.windows import run_in_windows, window_token_means


def dense_inline(q, k, v, scale):
    """O_i = sum_j InL(Q_i)_j V_j with the N x N weights written out (paper, eq. 5)."""
    n = k.shape[-2]
    logits = (scale / n) * q @ k.transpose(-2, -1)             # phi(Q_i)^T phi(K_j), s/N folded
    weights = logits - logits.mean(dim=-1, keepdim=True) + 1.0 / n
    return weights @ v, weights


def authors_form(q, k, v, scale):
    """The reference's arrangement: kv with sqrt(s/N) on both sides, plus the mean term."""
    n = k.shape[-2]
    kv = (k.transpose(-2, -1) * (scale / n) ** 0.5) @ (v * (scale / n) ** 0.5)
    return q @ kv + (1 - q @ k.mean(dim=2, keepdim=True).transpose(-2, -1) * scale) \
        * v.mean(dim=2, keepdim=True)


@pytest.mark.parametrize('n', [1, 7, 196])
def test_centred_form_matches_dense_and_authors(n):
    torch.manual_seed(n)
    q, k, v = (torch.randn(2, 3, n, 16) * 2 + 0.5 for _ in range(3))
    scale = 16 ** -0.5
    ours = inline_attention(q, k, v, scale)
    dense, weights = dense_inline(q.double(), k.double(), v.double(), scale)
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))
    torch.testing.assert_close(ours.double(), dense, rtol=1e-5, atol=1e-5)
    ref = authors_form(q, k, v, scale)
    rel = (ours - ref).abs().max() / ref.abs().max()
    assert rel < 1e-5


def test_masked_tokens_do_not_contribute():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8) for _ in range(3))
    valid = torch.tensor([[True] * 6 + [False] * 4])
    ours = inline_attention(q, k, v, 8 ** -0.5, valid)
    ref = inline_attention(q[:, :, :6], k[:, :, :6], v[:, :, :6], 8 ** -0.5)
    torch.testing.assert_close(ours[:, :, :6], ref)
    # changing padded tokens changes nothing for real ones
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 6:] += 100
    v2[:, :, 6:] -= 50
    torch.testing.assert_close(inline_attention(q, k2, v2, 8 ** -0.5, valid)[:, :, :6], ref)


@requires_cpu_fp16
def test_fp16_reductions_do_not_overflow():
    """60k tokens of magnitude ~8: fp16 sums of K^T V overflow (>65504); ours stay in fp32."""
    torch.manual_seed(0)
    n = 60000
    q = torch.randn(1, 1, n, 8)
    k = torch.randn(1, 1, n, 8) + 8
    v = torch.randn(1, 1, n, 8) + 8
    naive = (k.half().transpose(-2, -1) @ v.half())
    assert not torch.isfinite(naive).all()  # the failure mode this guards against
    out = inline_attention(q.half(), k.half(), v.half(), 8 ** -0.5)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    ref = inline_attention(q, k, v, 8 ** -0.5)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize('kernel', ['identity', 'relu', 'leakyrelu', 'exp'])
def test_module_matches_reference_module(kernel):
    """InLineAttention == the reference's Swin InLineAttention written out inline."""
    torch.manual_seed(0)
    dim, heads, h, w = 32, 4, 5, 7
    attn = InLineAttention(dim, heads, kernel_func=kernel).eval()
    x = torch.randn(3, h * w, dim)
    phi = {'identity': lambda t: t, 'relu': torch.relu,
           'leakyrelu': torch.nn.functional.leaky_relu,
           'exp': lambda t: torch.exp(0.2 * t)}[kernel]
    b, n, c = x.shape
    q, k, v = attn.qkv(x).reshape(b, n, 3, c).permute(2, 0, 1, 3)
    q, k = phi(q), phi(k)
    split = lambda t: t.reshape(b, n, heads, c // heads).permute(0, 2, 1, 3)  # noqa: E731
    out = authors_form(split(q), split(k), split(v), (c // heads) ** -0.5)
    out = out.transpose(1, 2).reshape(b, n, c)
    res_w = attn.residual(x.mean(dim=1).unsqueeze(-1)).reshape(b * c, 1, 3, 3)
    vg = v.reshape(b, h, w, c).permute(0, 3, 1, 2).reshape(1, b * c, h, w)
    local = torch.nn.functional.conv2d(vg, res_w, None, padding=1, groups=b * c)
    ref = attn.proj(out + local.reshape(b, c, n).permute(0, 2, 1))
    torch.testing.assert_close(attn(x, (h, w)), ref, rtol=1e-5, atol=1e-5)


def test_padding_invariance_in_windows():
    """Tokens of a window cut by the map border equal the attention on the real part alone."""
    torch.manual_seed(0)
    dim, heads = 16, 2
    attn = InLineAttention(dim, heads).eval()
    x = torch.randn(1, 10, 11, dim)

    def inline_fn(win, wsz, valid, bias):
        assert bias is None  # InLine windows never build an N x N mask
        assert valid is not None and valid.shape == (4, 64)
        return attn(win, wsz, valid)

    out = run_in_windows(x, (8, 8), inline_fn, need_bias=False)
    # bottom-right window: rows 8..9, cols 8..10 are real, the rest is padding
    corner = x[:, 8:, 8:].reshape(1, -1, dim)
    ref = attn(corner, (2, 3)).reshape(1, 2, 3, dim)
    torch.testing.assert_close(out[:, 8:, 8:], ref, rtol=1e-5, atol=1e-6)
    # right edge window: rows 0..7, cols 8..10
    edge = x[:, :8, 8:].reshape(1, -1, dim)
    torch.testing.assert_close(out[:, :8, 8:], attn(edge, (8, 3)).reshape(1, 8, 3, dim),
                               rtol=1e-5, atol=1e-6)


def test_prefix_token_takes_part_but_gets_no_local_term():
    torch.manual_seed(0)
    core = InLineCore(16, 2, num_prefix_tokens=1)
    q, k, v = (torch.randn(2, 1 + 12, 16) for _ in range(3))
    out, v_mean = core.attend(q, k, v, q, (3, 4))
    # the value mean comes apart (fp32), the same for every token: the mean of V itself
    assert v_mean.shape == (2, 1, 16) and v_mean.dtype == torch.float32
    torch.testing.assert_close(v_mean, v.mean(dim=1, keepdim=True))
    out = out + v_mean
    heads = lambda t: t.view(2, 13, 2, 8).transpose(1, 2)  # noqa: E731
    global_part = inline_attention(heads(q), heads(k), heads(v), 8 ** -0.5)
    global_part = global_part.transpose(1, 2).reshape(2, 13, 16)
    torch.testing.assert_close(out[:, 0], global_part[:, 0])
    # grid tokens: plus the per-sample 3x3 depthwise conv of V on the 3 x 4 grid, its kernel
    # predicted from the mean of kernel_src over all 13 tokens (cls included, as the reference)
    for b in range(2):
        kern = core.residual(q[b].mean(dim=0)[None, :, None]).reshape(16, 1, 3, 3)
        grid = v[b, 1:].reshape(3, 4, 16).permute(2, 0, 1)[None]
        local = torch.nn.functional.conv2d(grid, kern, padding=1, groups=16)
        local = local[0].permute(1, 2, 0).reshape(12, 16)
        torch.testing.assert_close(out[b, 1:], global_part[b, 1:] + local)
    assert math.isclose(core.scale, 8 ** -0.5)


@pytest.mark.parametrize('bias', [True, False])
def test_token_mlp_inference_chunks_match_timm_mlp(bias):
    from timm.layers import Mlp

    from inline_mm.models.layers.token_mlp import TokenMlp
    torch.manual_seed(0)
    mlp = TokenMlp(16, 64, bias=bias).eval()
    mlp.chunk_tokens = 7  # 2 x 50 tokens: 15 chunks, the last one partial
    x = torch.randn(2, 50, 16)
    chunk_rows = []
    hook = mlp.fc1.register_forward_hook(lambda m, i, o: chunk_rows.append(i[0].shape[0]))
    with torch.no_grad():
        expected = Mlp.forward(mlp, x)
        chunk_rows.clear()
        got = mlp(x)
    hook.remove()
    assert chunk_rows == [7] * 14 + [2]  # it did run in chunks
    assert got.shape == (2, 50, 16)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    # with autograd (training) it is timm's forward: gradients reach both layers
    mlp.train()
    mlp(x.requires_grad_()).sum().backward()
    assert mlp.fc1.weight.grad is not None and x.grad.abs().sum() > 0


def test_the_value_mean_goes_through_the_projection_apart():
    """proj(tokens + mean) == proj(tokens) + mean @ W^T (fp32), and under bf16 autocast the
    token-dependent part of InLine's output keeps its own precision: with a value mean 14x
    the per-token part, the error of that part is 0.7 % here, where rounding the sum to
    bf16 before the projection leaves 2.3 %."""
    from inline_mm.models.layers.inline_attention import project_with_mean
    torch.manual_seed(0)
    proj = torch.nn.Linear(32, 32)
    tokens, mean = torch.randn(2, 10, 32), torch.randn(2, 1, 32)
    torch.testing.assert_close(project_with_mean(proj, tokens, mean), proj(tokens + mean))

    attn = InLineAttention(64, 2).eval()
    with torch.no_grad():  # v = x W_v + b_v: a large shared offset in v, small q / k
        attn.qkv.bias[128:] = 4.0
        attn.qkv.weight[:128] *= 0.1
    x = torch.randn(2, 49, 64)
    with torch.no_grad():
        ref = attn(x, (7, 7))
        with torch.autocast('cpu', dtype=torch.bfloat16):
            low = attn(x, (7, 7))
    assert low.dtype == torch.float32  # the mean term came in fp32
    per_token = ref - ref.mean(dim=1, keepdim=True)  # what differs between tokens
    assert (ref.mean(dim=1).norm() / per_token.norm(dim=-1).mean()) > 10  # the setting
    error = (low - ref) - (low - ref).mean(dim=1, keepdim=True)
    assert error.norm() / per_token.norm() < 0.012


@pytest.mark.parametrize('autocast', [False, True])
@pytest.mark.parametrize('masked', [False, True])
def test_per_head_path_equals_the_folded_heads(monkeypatch, autocast, masked):
    """Eager CPU passes with several samples / windows over large tensors run one head at a
    time on its channel slice (no copies of q, k, v); the values, value means and
    gradients are the folded heads' form, which B == 1, small tensors and recorded graphs
    keep."""
    ia = importlib.import_module('inline_mm.models.layers.inline_attention')
    symbolic = importlib.import_module('inline_mm.models.layers.symbolic')
    torch.manual_seed(0)
    core = InLineCore(24, 3)
    qkv = torch.randn(4, 50, 72, requires_grad=True)
    valid = (torch.rand(4, 50) > 0.3) if masked else None
    monkeypatch.setattr(ia, 'PER_HEAD_MIN_VALUES', 4 * 50 * 24)
    calls = []
    split = ia.inline_attention_split
    monkeypatch.setattr(ia, 'inline_attention_split',
                        lambda q, *a: calls.append(q.dim()) or split(q, *a))

    def run(eager):
        monkeypatch.setattr(symbolic, 'eager_on_cpu', lambda x: eager)
        calls.clear()
        qkv.grad = None
        with torch.autocast('cpu', torch.bfloat16, enabled=autocast):
            out, v_mean = core.attention(*qkv.chunk(3, dim=-1), valid)
        (out.float().sum() + v_mean.sum()).backward()
        return out, v_mean, qkv.grad.clone(), list(calls)

    out, v_mean, grad, dims = run(eager=True)
    ref, ref_mean, ref_grad, ref_dims = run(eager=False)
    assert dims == [3] * 3 and ref_dims == [4]  # one call per head against one folded call
    assert out.shape == (4, 50, 24) and v_mean.shape == (4, 1, 24)
    assert out.dtype == ref.dtype == (torch.bfloat16 if autocast else torch.float32)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(v_mean, ref_mean, rtol=0, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)
    # one sample keeps the folded form (a view there: nothing to save), and so do
    # tensors under the size from which the copies cost more than the per-head calls
    monkeypatch.setattr(symbolic, 'eager_on_cpu', lambda x: True)
    calls.clear()
    core.attention(*qkv[:1].chunk(3, dim=-1), None if valid is None else valid[:1])
    assert calls == [4]
    calls.clear()
    core.attention(*qkv[:, :49].chunk(3, dim=-1), None if valid is None else valid[:, :49])
    assert calls == [4]


@pytest.mark.parametrize('hw, window', [((10, 11), (4, 8)), ((8, 8), (4, 4)), ((5, 7), (5, 7))])
def test_window_token_means_equal_the_means_of_the_partitioned_windows(hw, window):
    """InLine-CSwin's local-kernel source: each window's mean over its real tokens, summed
    from the map, against partitioned windows (padding left out) in run_in_windows' order."""
    torch.manual_seed(0)
    x = torch.randn(2, *hw, 6)
    seen = []

    def record(windows, win, valid, bias):
        assert win == window
        seen.append(window_token_means(x, win, valid))
        expected = windows.mean(dim=1) if valid is None else \
            (windows * valid.unsqueeze(-1)).sum(dim=1) / valid.sum(dim=1, keepdim=True)
        torch.testing.assert_close(seen[-1], expected, rtol=1e-5, atol=1e-6)
        return windows

    run_in_windows(x, window, record, need_bias=False)
    nh, nw = -(-hw[0] // window[0]), -(-hw[1] // window[1])
    assert seen[0].shape == (2 * nh * nw, 6)
    # the last window of the second sample by hand: its real rows and columns only
    last = x[1, (nh - 1) * window[0]:, (nw - 1) * window[1]:].reshape(-1, 6).mean(dim=0)
    torch.testing.assert_close(seen[0][-1], last, rtol=1e-5, atol=1e-6)
