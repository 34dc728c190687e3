"""The byte-bounded mask / index cache, torch.compile without recompiles, CPU-only chunking."""
import ast
import os
import subprocess
import sys

import pytest
import torch

from inline_mm import InLineSwin
from inline_mm.models.layers import cache as cache_module
from inline_mm.models.layers import symbolic
from inline_mm.models.layers.token_mlp import TokenMlp
from inline_mm.models.layers.cache import CACHE, TensorCache, nbytes
from inline_mm.models.layers.softmax_attention import WindowAttention
from inline_mm.models.layers.windows import region_bias, valid_mask


@pytest.fixture
def empty_cache():
    CACHE.clear()
    budget = cache_module._BUDGET_MB
    yield CACHE
    cache_module.set_budget_mb(budget)
    CACHE.clear()


def test_lru_keeps_to_its_byte_budget():
    cache = TensorCache(budget_mb=1.)  # 1 MiB: four 256 KiB entries
    entry = 2 ** 16  # fp32 values of 256 KiB
    for i in range(4):
        cache.get(i, lambda: torch.zeros(entry))
    assert len(cache) == 4 and cache.nbytes == 2 ** 20
    cache.get(0, lambda: pytest.fail('a hit must not rebuild'))  # 0 is now the newest
    cache.get(4, lambda: torch.zeros(entry))  # evicts 1, the least recently used
    assert cache.nbytes <= cache.budget
    assert 1 not in cache and all(k in cache for k in (0, 2, 3, 4))
    # an entry larger than the whole budget is returned, not kept
    big = cache.get('big', lambda: torch.zeros(2 * entry * 4))
    assert big.numel() == 8 * entry and 'big' not in cache and len(cache) == 4
    # tuples count all their tensors
    assert nbytes((torch.zeros(3), None, torch.zeros(2, dtype=torch.bool))) == 14


def test_module_cache_bounded_while_masks_fill_it(empty_cache):
    cache_module.set_budget_mb(0.5)
    budget = empty_cache.budget
    for h in range(20, 60, 3):  # shifted, padded 7 x 7 windows: (nW, 49, 49) fp32 biases
        bias = region_bias((h, 10), (7, 7), (3, 3), torch.device('cpu'), torch.float32)
        assert bias.shape[1:] == (49, 49)
        assert empty_cache.nbytes <= budget
    assert len(empty_cache) > 1  # it did cache, and evicted to stay within the budget
    cache_module.set_budget_mb(0)  # off: nothing is kept, lowering the budget evicts now
    assert len(empty_cache) == 0
    region_bias((20, 31), (7, 7), (3, 3), torch.device('cpu'), torch.float32)
    assert len(empty_cache) == 0


def test_entries_are_per_device_and_dtype(empty_cache):
    args = ((10, 16), (7, 7), (3, 3))
    fp32 = region_bias(*args, torch.device('cpu'), torch.float32)
    bf16 = region_bias(*args, torch.device('cpu'), torch.bfloat16)
    meta = region_bias(*args, torch.device('meta'), torch.float32)
    assert (fp32.dtype, bf16.dtype, meta.device.type) == (torch.float32, torch.bfloat16, 'meta')
    torch.testing.assert_close(bf16.float(), fp32)  # 0 and -100 are exact in bf16
    assert len(empty_cache) == 3
    assert region_bias(*args, torch.device('cpu'), torch.bfloat16) is bf16  # a hit
    valid = valid_mask((10, 16), (7, 7), (3, 3), torch.device('meta'))
    assert valid.device.type == 'meta' and valid.dtype == torch.bool
    assert valid_mask((14, 21), (7, 7), (3, 3), torch.device('cpu')) is None  # not padded


def test_bf16_forward_builds_its_mask_in_bf16(empty_cache, monkeypatch):
    """Under bf16 autocast the region bias is built (and kept) in bf16: no fp32 copy, no cast."""
    masks = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, *args, **kwargs):
        masks.append((q.dtype, None if attn_mask is None else attn_mask.dtype))
        return real(q, k, v, attn_mask, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention', spy)
    from inline_mm.models.layers.blocks import TransformerBlock
    block = TransformerBlock(32, 2, attn_type='S', window=(7, 7), shift=3,
                             table_window=(7, 7)).eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        block(torch.randn(1, 10 * 16, 32), (10, 16))
    assert masks == [(torch.bfloat16, torch.bfloat16)]
    kept = [(key[-1], value.dtype) for key, (value, _) in empty_cache._entries.items()
            if key[0] == 'bias']
    assert kept == [(torch.bfloat16, torch.bfloat16)]


def test_clipped_relative_index_cached_per_window_and_device(empty_cache):
    attn = WindowAttention(16, 2, (7, 7))
    assert attn._index((7, 7)) is attn.relative_position_index  # the full window: the buffer
    index = attn._index((3, 5))
    assert attn._index((3, 5)) is index and len(empty_cache) == 1
    # a second module with the same table shares the entry
    assert WindowAttention(16, 4, (7, 7))._index((3, 5)) is index
    attn.to('meta')
    assert attn._index((3, 5)).device.type == 'meta' and len(empty_cache) == 2


@pytest.mark.slow  # about a minute: dynamo traces the backbone twice with symbolic sizes
@pytest.mark.skipif(
    tuple(int(v) for v in torch.__version__.split('+')[0].split('.')[:2]) < (2, 2),
    reason=f'torch {torch.__version__}: dynamo of torch 2.1 specialises the windowed '
    'backbone on its input sizes even with dynamic=True (8 recompiles for sizes seen before, '
    'measured on 2.1.2); the cache under test no longer adds guards on later torch')
def test_compiled_swin_does_not_recompile_for_sizes_seen_before():
    """torch.compile(dynamic=True): masks and indices are built in the graph, so a size seen
    before finds its compiled code; a cache read would make dynamo guard on the cache."""
    torch._dynamo.reset()
    compiles = []

    def counting_backend(gm, example_inputs):
        compiles.append(len(gm.graph.nodes))
        return gm.forward  # run the captured graph eagerly: no inductor

    torch.manual_seed(0)
    # windows of 3: stage 3 (4 x 6 or 6 x 4 tokens) pads and shifts, stage 4 (2 x 3 / 3 x 2)
    # clips one axis and keeps the shift on the other; stages 1-2 run InLine windows
    model = InLineSwin(embed_dims=16, depths=[1, 1, 2, 2], num_heads=[1, 2, 2, 4],
                       attn_type='IISS', window_size=3, drop_path_rate=0.).eval()
    compiled = torch.compile(model, dynamic=True, backend=counting_backend)
    sizes = [(64, 96), (96, 64)]
    inputs = {hw: torch.randn(1, 3, *hw) for hw in sizes}
    CACHE.clear()
    with torch.no_grad():
        for hw in sizes:
            compiled(inputs[hw])
        first = len(compiles)
        for hw in sizes[::-1] + sizes:
            got = compiled(inputs[hw])
            for a, b in zip(got, model(inputs[hw])):  # eager calls fill the cache meanwhile
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
    assert first > 0
    assert len(compiles) == first, f'{len(compiles) - first} recompiles for sizes seen before'


def test_graph_mode_reads_no_cache(empty_cache, monkeypatch):
    monkeypatch.setattr(symbolic, 'in_graph', lambda: True)
    monkeypatch.setattr(symbolic, 'is_onnx_export', lambda: False)
    bias = region_bias((10, 16), (7, 7), (3, 3), torch.device('cpu'), torch.float32)
    assert bias.shape == (6, 49, 49) and len(empty_cache) == 0


def test_token_mlp_chunks_only_cpu_tensors():
    assert symbolic.loops_over_sizes(torch.empty(2, 3))
    assert not symbolic.loops_over_sizes(torch.empty(2, 3, device='meta'))
    mlp = TokenMlp(8, 16).eval()
    mlp.chunk_tokens = 4
    rows = []
    mlp.fc1.register_forward_hook(lambda m, i, o: rows.append(i[0].numel() // 8))
    with torch.no_grad():
        mlp(torch.randn(1, 20, 8))
        assert rows == [4] * 5  # CPU: chunks
        rows.clear()
        mlp.to('meta')(torch.randn(1, 20, 8, device='meta'))
    assert rows == [20]  # another device: one plain pass


def test_symbolic_does_not_import_windows():
    """The builders import the partition helpers, not the windowing module: no circle."""
    tree = ast.parse(open(symbolic.__file__).read())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert 'partition' in imported and 'windows' not in imported


def test_bad_budget_is_one_clear_line():
    res = subprocess.run([sys.executable, '-c', 'import inline_mm'], capture_output=True,
                         text=True, env=dict(os.environ, INLINE_MM_CACHE_MB='lots'))
    assert res.returncode != 0
    assert "INLINE_MM_CACHE_MB='lots' is not a size in MB" in res.stderr


def test_a_jit_trace_leaves_the_cache_alone():
    """mmengine's FLOP counter traces with torch.jit: sizes are traced tensors then, and an
    entry built from them made the cache's byte count a tensor (a host read on every later
    lookup)."""
    from mmengine.analysis import get_model_complexity_info

    from inline_mm import InLineSwin
    from inline_mm.models.layers.cache import CACHE
    CACHE.clear()
    model = InLineSwin(arch='tiny', depths=[1, 1, 2, 2]).eval()
    get_model_complexity_info(model, inputs=(torch.randn(1, 3, 97, 131),), show_table=False,
                              show_arch=False)
    assert isinstance(CACHE.nbytes, int) and len(CACHE) == 0
    with torch.no_grad():
        model(torch.randn(1, 3, 97, 131))
    assert isinstance(CACHE.nbytes, int) and len(CACHE) > 0


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('blocked', [True, False])
def test_tokens_to_nchw_equals_the_permuted_copy(monkeypatch, dtype, blocked):
    """Both paths of the backbones' output copy (the per-sample blocked transpose of large
    eager CPU maps, the strided copy otherwise) give the permuted tokens, values and
    gradients, as a contiguous NCHW map."""
    from inline_mm.models.layers import token_grid
    monkeypatch.setattr(token_grid, 'BLOCKED_TRANSPOSE_MIN_VALUES', 1 if blocked else 1 << 30)
    monkeypatch.setattr(symbolic, 'in_graph', lambda: False)
    hw = (5, 7)
    x = torch.randn(3, hw[0] * hw[1], 6, dtype=dtype, requires_grad=True)
    got = token_grid.tokens_to_nchw(x, hw)
    ref = x.detach().view(3, *hw, 6).permute(0, 3, 1, 2)
    assert got.is_contiguous() and got.dtype == dtype
    assert torch.equal(got.detach(), ref)
    grad = torch.randn_like(got)
    got.backward(grad)
    assert torch.equal(x.grad, grad.permute(0, 2, 3, 1).reshape(x.shape))
    # in a recorded graph the copy of the view, whatever the size (no loop over samples)
    monkeypatch.setattr(symbolic, 'in_graph', lambda: True)
    copies = []
    monkeypatch.setattr(torch.Tensor, 'copy_', lambda *a: copies.append(a) or None)
    assert torch.equal(token_grid.tokens_to_nchw(x.detach(), hw), ref)
    assert not copies
