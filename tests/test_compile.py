"""torch.compile of the four backbone families: one graph, symbolic sizes, eager numbers.

The backbones compile with ``fullgraph=True`` (a graph break is an error) and
``dynamic=True``; the compiled outputs and gradients equal the eager ones, in
fp32 and under bf16 autocast.  Every family compiles at most twice for ten input
sizes (odd, non-square, 1333x800, 2048x1024): the windowed families (Swin,
CSwin) compile a second time for maps of a single window or smaller than a
window (224x224 here), where the window is clipped and the shift dropped.  The
graphs run on dynamo's ``eager`` backend (what is checked is the capture;
inductor's code generation takes minutes on a CPU and is timed by
``tools/analysis/benchmark.py --compile``).
"""
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, TOY_DET_CONFIG, TRAIN_TOOL, tool_env, toy_det_options

from inline_mm import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin
from inline_mm.errors import ConfigError

# on the tests that run dynamo (the option checks run on every torch)
needs_torch_2_2 = pytest.mark.skipif(
    tuple(int(v) for v in torch.__version__.split('+')[0].split('.')[:2]) < (2, 2),
    reason=f'torch {torch.__version__}: dynamo of torch 2.1 specialises the windowed '
    'backbones on their input sizes even with dynamic=True')

# the real channel widths (a conv's CPU kernel choice depends on its input's element
# count, and dynamo guards on it: tiny widths would cross that threshold between sizes),
# one block a stage (two in the softmax stages: plain and shifted / both stripe kinds)
FAMILIES = {
    'pvt': (InLinePVT, dict(arch='tiny', depths=[1, 1, 1, 1])),
    'swin': (InLineSwin, dict(arch='tiny', depths=[1, 1, 2, 2])),
    'cswin': (InLineCSWin, dict(arch='tiny', depths=[1, 1, 2, 1])),
    'deit': (InLineDeiT, dict(arch='tiny', depth=2, out_indices=(0, 1))),
}
# (height, width): non-square first (dynamo's duck sizing would tie a square first
# input's sides together, one compilation more), odd, padded and clipped windows
SIZES = [(333, 517), (224, 224), (800, 1333), (517, 333), (1024, 2048), (257, 383),
         (480, 640), (401, 401), (608, 1088), (321, 225)]
#: training: padded and unpadded windows, and a map of a single window (224x224)
TRAIN_SIZES = [(333, 517), (800, 1333), (224, 224), (517, 333)]


class CountingBackend:
    """A dynamo backend that counts the graphs it is given and runs them eagerly."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs) -> callable:
        self.graphs += 1
        return gm.forward


def build(family: str, **kwargs) -> torch.nn.Module:
    cls, small = FAMILIES[family]
    torch.manual_seed(0)
    return cls(**small, drop_path_rate=0., **kwargs)


def assert_close_rel(got, want, what: str) -> None:
    for i, (a, b) in enumerate(zip(got, want)):
        err = ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()
        assert err <= 1e-5, f'{what} {i}: relative difference {err:.2e} > 1e-5'


def assert_at_most_two_graphs(backend: CountingBackend, sizes: list) -> None:
    assert backend.graphs >= 1, 'the backbone did not go through torch.compile'
    assert backend.graphs <= 2, f'{backend.graphs} compilations for {len(sizes)} sizes'


@needs_torch_2_2
@pytest.mark.slow  # up to two minutes a family: dynamo traces with symbolic sizes
@pytest.mark.parametrize('family', list(FAMILIES))
def test_compiled_eval_one_graph_eager_outputs(family):
    torch._dynamo.reset()
    backend = CountingBackend()
    model = build(family, compile=dict(backend=backend)).eval()
    eager = build(family).eval()
    with torch.no_grad():
        for hw in SIZES:
            x = torch.randn(1, 3, *hw)
            assert_close_rel(model(x), eager(x), f'{family} at {hw}: output')
    torch._dynamo.reset()
    assert_at_most_two_graphs(backend, SIZES)
    if family in ('pvt', 'deit'):  # no windows: nothing that could need a second graph
        assert backend.graphs == 1, f'{backend.graphs} compilations for {len(SIZES)} sizes'


@needs_torch_2_2
@pytest.mark.slow
@pytest.mark.parametrize('family', list(FAMILIES))
def test_compiled_bf16_matches_eager_bf16(family):
    """Under bf16 autocast (what --amp does on the CPU) the compiled backbone gives the
    eager bf16 outputs; the graph is the fp32 one's with the autocast casts."""
    torch._dynamo.reset()
    backend = CountingBackend()
    model = build(family, compile=dict(backend=backend)).eval()
    eager = build(family).eval()
    sizes = [(333, 517), (800, 1333), (517, 333)]
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        for hw in sizes:
            x = torch.randn(1, 3, *hw)
            for i, (a, b) in enumerate(zip(model(x), eager(x))):
                assert a.dtype == b.dtype, (a.dtype, b.dtype)
                err = ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                assert err <= 2e-2, f'{family} at {hw}, output {i}: relative {err:.2e}'
    torch._dynamo.reset()
    assert backend.graphs == 1, f'{backend.graphs} compilations for {len(sizes)} sizes'


@needs_torch_2_2
@pytest.mark.slow
@pytest.mark.parametrize('family', list(FAMILIES))
def test_compiled_training_matches_eager_gradients(family):
    torch._dynamo.reset()
    backend = CountingBackend()
    model = build(family, compile=dict(backend=backend)).train()
    eager = build(family).train()
    for hw in TRAIN_SIZES:
        x = torch.randn(1, 3, *hw)
        for m in (model, eager):
            m.zero_grad()
            sum((o.float() ** 2).mean() for o in m(x)).backward()
        names = [n for n, p in eager.named_parameters() if p.grad is not None]
        assert len(names) == sum(p.grad is not None for p in model.parameters())
        grads = dict(model.named_parameters())
        assert_close_rel([grads[n].grad for n in names],
                         [p.grad for n, p in eager.named_parameters() if p.grad is not None],
                         f'{family} at {hw}: gradient')
    torch._dynamo.reset()
    assert_at_most_two_graphs(backend, TRAIN_SIZES)


@pytest.mark.parametrize('value', ['yes', 1, ['fullgraph']])
def test_compile_option_rejects_what_is_not_a_switch(value):
    with pytest.raises(ConfigError, match='compile of InLinePVT is True, False or a dict'):
        InLinePVT(arch='tiny', depths=[1, 1, 1, 1], compile=value)


def test_compiled_backbone_copies_without_its_compiled_function():
    """EMA (deepcopy) and pickling copy the module, not the compiled function that holds
    the original: the copy compiles its own on its first forward pass."""
    import copy
    import pickle
    model = InLinePVT(arch='tiny', depths=[1, 1, 1, 1], compile=True)
    model._compiled = lambda x: pytest.fail('the copy ran the original compiled function')
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert twin._compiled is None and twin.compile_options == model.compile_options


def test_symbolic_sizes_on_inductor_turn_its_layout_optimisation_off():
    """Without it torch 2.14's inductor stops on a training graph's saved channels-last
    activations ("cannot determine truth value of Relational"); torch.compile takes
    ``mode`` or ``options``, not both, and an explicit option wins."""
    from inline_mm.models.backbones.base import compile_options
    off = {'layout_optimization': False}
    assert compile_options(True, 'X') == dict(fullgraph=True, dynamic=True, options=off)
    assert compile_options(dict(options={'freezing': True}), 'X')['options'] == \
        {'layout_optimization': False, 'freezing': True}
    assert compile_options(dict(options={'layout_optimization': True}), 'X')['options'] == \
        {'layout_optimization': True}
    for kept in (dict(backend='aot_eager'), dict(dynamic=False)):
        assert 'options' not in compile_options(kept, 'X')
    # dynamic=None: torch makes the sizes symbolic after a second size
    assert compile_options(dict(dynamic=None), 'X')['options'] == off
    # a mode becomes the inductor options torch.compile gives it, with the optimisation off
    autotune = compile_options(dict(mode='max-autotune-no-cudagraphs'), 'X')
    from torch._inductor import list_mode_options
    assert 'mode' not in autotune and autotune['options'] == {
        **list_mode_options('max-autotune-no-cudagraphs', True), 'layout_optimization': False}
    assert autotune['options']['max_autotune'] is True
    assert compile_options(dict(mode='default'), 'X') == compile_options(True, 'X')
    assert compile_options(dict(mode='max-autotune', dynamic=False), 'X')['mode'] == \
        'max-autotune'  # static sizes: left to torch.compile
    torch.compile(torch.nn.Linear(2, 2), **autotune)  # accepted as one set of options
    with pytest.raises(ConfigError, match=r"compile of X: unknown mode 'fast'; torch.compile's "
                                          r"modes: default, .*max-autotune"):
        compile_options(dict(mode='fast'), 'X')
    with pytest.raises(ConfigError, match=r"compile of X: unknown mode \['max-autotune'\]"):
        compile_options(dict(mode=['max-autotune']), 'X')
    assert compile_options(dict(mode=''), 'X') == compile_options(True, 'X')  # torch's default
    for backend in ('inductor', 'aot_eager'):
        with pytest.raises(ConfigError, match='compile of X sets both mode and options, which '
                                              'torch.compile refuses: give one of them'):
            compile_options(dict(mode='max-autotune', options={'freezing': True},
                                 backend=backend), 'X')


@needs_torch_2_2
@pytest.mark.slow  # inductor writes and builds C++ kernels: about half a minute
@pytest.mark.parametrize('compile', [True, dict(mode='max-autotune-no-cudagraphs')])
def test_inductor_compiles_the_training_graph_of_a_padded_patch_embedding(compile):
    """The pattern of every family's stem under ``compile_options(True)``: a padded image,
    a strided convolution, tokens, a per-sample depthwise convolution on their grid
    (sizes ceil(H / 4), symbolic), forward and backward on inductor."""
    from inline_mm.models.backbones.base import compile_options
    from inline_mm.models.layers.token_grid import depthwise_conv3x3_per_sample, grid_to_tokens
    from inline_mm.models.layers.windows import pad_image
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 4, 4)
    kernels = torch.randn(2 * 16, 1, 3, 3, requires_grad=True)

    def stem(img):
        x = conv(pad_image(img, 4))
        return depthwise_conv3x3_per_sample(grid_to_tokens(x), tuple(x.shape[2:]), kernels)

    # with compile=dict(options=dict(layout_optimization=True)) torch 2.14's inductor
    # stops here: "cannot determine truth value of Relational"
    compiled = torch.compile(stem, **compile_options(compile, 'X'))
    img = torch.randn(2, 3, 62, 45)
    out = compiled(img)
    grads = torch.autograd.grad(out.square().sum(), [kernels, conv.weight])
    expected = stem(img)
    expected_grads = torch.autograd.grad(expected.square().sum(), [kernels, conv.weight])
    assert out.shape == (2, 16 * 12, 16)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@needs_torch_2_2
@pytest.mark.slow  # inductor builds C++ kernels: under a minute
def test_inductor_convolutions_of_a_one_sample_token_grid_see_a_channels_last_map():
    """Inductor writes the stride of a size-1 dimension as 0; a zero batch stride fails
    the CPU convolution's channels-last test, and oneDNN then copies the map to NCHW
    and convolves there.  The token grids of the backbones' convolutions (a
    one-sample image's grid, every per-sample depthwise convolution) keep a real batch
    stride in inductor's code, forward and backward, with eager numbers."""
    import re

    import torch.nn.functional as F
    from torch._inductor.utils import run_and_get_code

    from inline_mm.models.layers.token_grid import (depthwise_conv3x3_per_sample,
                                                    grid_to_tokens, tokens_to_grid)
    torch.manual_seed(0)
    hw, c = (9, 13), 8
    merge = torch.randn(2 * c, c, 3, 3, requires_grad=True)  # a strided merge / embedding
    kernels = torch.randn(3 * c, 1, 3, 3, requires_grad=True)  # 3 windows' own kernels

    def grids(tokens):
        merged = F.conv2d(tokens_to_grid(tokens * 2, hw), merge, stride=2, padding=1)
        windows = torch.cat([tokens, tokens + 1, tokens * 3]) * 0.5  # (3, N, C)
        local = depthwise_conv3x3_per_sample(windows, hw, kernels)
        return grid_to_tokens(merged), local

    tokens = torch.randn(1, hw[0] * hw[1], c, requires_grad=True)
    compiled = torch.compile(grids, dynamic=False, fullgraph=True)
    (merged, local), codes = run_and_get_code(compiled, tokens)
    calls = [line for code in codes for line in code.splitlines()
             if 'extern_kernels.convolution(' in line]
    assert len(calls) == 2, f'expected the two convolutions in inductor code, got {calls}'
    for call in calls:  # the input: reinterpret_tensor(buf, (1, C, h, w), (N-stride, ...
        strides = re.search(r'convolution\(reinterpret_tensor\(\w+, \(1, [^)]*\), \((\d+),', call)
        assert strides, f'the input is not a (1, C, h, w) view of a buffer: {call}'
        assert int(strides.group(1)) > 0, f'zero batch stride: {call}'
    want = grids(tokens)
    for got, expected in zip((merged, local), want):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad((merged.square().sum() + local.square().sum()),
                                [tokens, merge, kernels])
    want_grads = torch.autograd.grad(want[0].square().sum() + want[1].square().sum(),
                                     [tokens, merge, kernels])
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(torch.__version__ < '2.4',
                    reason=f'torch {torch.__version__}: compiled graphs chunk the MLP from '
                    'torch 2.4 on; before, they run it in one pass')
@pytest.mark.parametrize('dynamic', [False, True, None])
@pytest.mark.parametrize('autocast', [False, True])
def test_a_compiled_graph_runs_the_mlp_in_token_chunks(dynamic, autocast):
    """Compiled for static sizes (``dynamic=False``), the inference MLP unrolls its loop
    over token chunks at each size (each chunk's hidden tensor stays in cache, as in
    eager); where sizes may be symbolic (``dynamic=True``, and the default, which turns
    a size symbolic on a recompile) it runs in ``graph_chunks`` chunks whatever the size,
    so a new size needs no new graph.  Eager numbers (and dtype under bf16 autocast)."""
    from inline_mm.models.layers.token_mlp import TokenMlp

    torch.manual_seed(0)
    mlp = TokenMlp(8, 32).eval()
    mlp.chunk_tokens = 4  # 2 x 11 tokens: 6 chunks, the last one partial; 2 x 13: 7; 2 x 15: 8
    # 22 tokens: 3 x 8 rows, 2 of them padding; 26: 3 x 9, 1; 30 (a multiple of 3): 3 x 11,
    # 3 (torch 2.4 guards on a pad of 0: a second graph)
    mlp.graph_chunks = 3
    graphs = []

    def capture(gm: torch.fx.GraphModule, example_inputs) -> callable:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()  # dynamo remembers sizes it saw turn dynamic, per code object
    compiled = torch.compile(mlp, backend=capture, dynamic=dynamic, fullgraph=True)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        for n in (11, 13, 15):
            x = torch.randn(2, n, 8)
            got, want = compiled(x), mlp(x)
            assert got.dtype == want.dtype
            # bf16: torch's default tolerance (one-pass and chunked matmuls may round
            # differently on another CPU's kernels)
            tolerance = {} if autocast else dict(rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(got, want, **tolerance)
    # a graph per size when static; torch's default turns sizes symbolic on the second
    assert len(graphs) == {False: 3, True: 1, None: 2}[dynamic], f'{len(graphs)} graphs'
    # the linear layers: inlined calls (recent torch) or module calls (torch 2.4)
    linears = [sum(node.op == 'call_function' and 'linear' in str(node.target)
                   or node.op == 'call_module' and str(node.target).endswith(('fc1', 'fc2'))
                   for node in graph.graph.nodes) for graph in graphs]
    assert linears == ([2 * 6, 2 * 7, 2 * 8] if dynamic is False
                       else [2 * 3] * len(graphs)), linears


def test_backbones_chunk_the_mlps_of_their_large_stages_in_graphs():
    """The chunks of graphs with symbolic sizes come from each stage's stride: as many
    as 1333x800 has 4096 tokens where eager would chunk at that size."""
    from inline_mm.models.layers.token_mlp import TokenMlp, graph_chunk_count

    # 334 x 200 = 66,800 tokens at stride 4; 167 x 100 = 16,700 at 8; 84 x 50 = 4,200 at 16
    assert [graph_chunk_count(s) for s in (4, 8, 16, 32)] == [17, 5, 1, 1]
    for family in FAMILIES:
        model = build(family)
        stages = [[m for part in model._stage_parts(i) if isinstance(part, torch.nn.Module)
                   for m in part.modules() if isinstance(m, TokenMlp)]
                  for i in range(1, model.num_stages + 1)]
        # every MLP of the model belongs to a stage
        assert sum(map(len, stages)) == sum(isinstance(m, TokenMlp) for m in model.modules())
        chunks = [{m.graph_chunks for m in stage} for stage in stages]
        if family == 'deit':  # stride 16 throughout
            assert chunks == [{1}] * model.num_stages, chunks
        else:
            assert chunks == [{17}, {5}, {1}, {1}], (family, chunks)


def _ops_of_one_graph(block: torch.nn.Module, sizes) -> set:
    """The operators of the one graph ``block(x, hw)`` compiles to with symbolic sizes
    over maps of ``sizes`` (2 samples, 16 channels), each output equal to eager's."""
    graphs = []

    def capture(gm: torch.fx.GraphModule, example_inputs) -> callable:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(block, backend=capture, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for hw in sizes:
            x = torch.randn(2, hw[0] * hw[1], 16)
            torch.testing.assert_close(compiled(x, hw), block(x, hw), rtol=1e-5, atol=1e-5)
    assert len(graphs) == 1, f'{len(graphs)} graphs for {type(block).__name__}'
    return {str(node.target) for node in graphs[0].graph.nodes
            if node.op in ('call_function', 'call_method')}


@needs_torch_2_2
@pytest.mark.parametrize('attn_type', ['I', 'S'])
def test_a_window_that_spans_the_map_compiles_without_padding_or_masks(attn_type):
    """Global attention (PVT's blocks, CSwin's last stage) and a window no smaller than
    the map (Swin's last stage) record no padding, no mask and no crop with symbolic
    sizes (a compiled graph cannot see that the padding is empty: it computed the mask
    on every token, ~40 % of InLine-PVT-T's compiled time at 1333x800 on a CPU); a
    window smaller than the map still records them.  Eager numbers either way."""
    from inline_mm.models.layers.blocks import TransformerBlock

    def graph_ops(window, sizes, shift=0):
        torch.manual_seed(0)
        return _ops_of_one_graph(TransformerBlock(16, 2, attn_type=attn_type, window=window,
                                                  shift=shift).eval(), sizes)

    def padded_or_masked(ops):  # F.pad, the mask's % and where, the crop's clone
        return {op for op in ops if any(word in op for word in ('pad', 'remainder', 'mod',
                                                                    'where', 'clone'))}

    # global (InLine only: softmax windows index a position table); a 7x7 window over
    # maps of at most 6x7
    for window in [(None, None), (7, 7)] if attn_type == 'I' else [(7, 7)]:
        ops = graph_ops(window, [(5, 7), (6, 4), (3, 5)])
        assert not padded_or_masked(ops), (window, padded_or_masked(ops))
    ops = graph_ops((3, 3), [(5, 7), (6, 4), (4, 5)])  # windows: padded, masked, cropped
    assert padded_or_masked(ops), ops
    # unshifted windows (InLine's; a softmax block without shift): the mask compares
    # token positions with the map's size, no modulo by a symbolic size (the cyclic
    # roll's, inlined into every kernel that reads the mask)
    def modulo(ops):
        return {op for op in ops if 'mod' in op or 'remainder' in op}

    assert not modulo(ops), ops
    if attn_type == 'S':  # shifted softmax windows still roll, by a modulo
        assert modulo(graph_ops((3, 3), [(5, 7), (6, 4), (4, 5)], shift=1)), ops


@needs_torch_2_2
def test_cswin_inline_window_that_spans_the_map_compiles_without_padding():
    """InLine-CSwin's branch over a window that spans the map: its token means (summed
    from the map) record no padding either, not even a pad by a symbolic zero."""
    from inline_mm.models.backbones.cswin import CSWinBlock

    def graph_ops(window, sizes):
        torch.manual_seed(0)
        block = CSWinBlock(16, 2, 4., True, attn_type='I', split_size=1, two_branches=False,
                           inline_window=window).eval()
        ops = _ops_of_one_graph(block, sizes)
        # the MLP's fixed chunks pad too (graph_chunks > 1, set by the backbones): 1 here
        assert block.mlp.graph_chunks == 1
        return {op for op in ops if any(word in op for word in ('pad', 'remainder', 'mod',
                                                                  'where'))}

    assert not graph_ops((7, 7), [(5, 7), (6, 4), (3, 5)])
    # a window smaller than the map: padded
    assert 'pad' in str(graph_ops((3, 3), [(5, 7), (6, 4), (4, 5)]))


@pytest.mark.skipif(not hasattr(getattr(torch, 'compiler', None), 'is_exporting'),
                    reason=f'torch {torch.__version__} has no torch.compiler.is_exporting')
def test_an_exported_graph_keeps_the_one_pass_mlp():
    """``torch.export`` sets the compiling flag too, but an exported program is no place
    for a CPU cache tuning: it records timm's plain MLP (one pair of linear layers)."""
    from inline_mm.models.layers.token_mlp import TokenMlp

    mlp = TokenMlp(8, 32).eval()
    mlp.graph_chunks = 3
    x = torch.randn(2, 11, 8)
    with torch.no_grad():
        program = torch.export.export(mlp, (x,))
        torch.testing.assert_close(program.module()(x), mlp(x))
    linears = sum(node.op == 'call_function' and 'linear' in str(node.target)
                  for node in program.graph.nodes)
    assert linears == 2, f'{linears} linear layers in the exported graph'


@needs_torch_2_2
@pytest.mark.slow  # about two minutes: AOT autograd traces the toy detector's backbone
def test_toy_detector_trains_with_a_compiled_backbone(toy_root, tmp_path):
    work_dir = str(tmp_path / 'work')
    cmd = [sys.executable, TRAIN_TOOL, TOY_DET_CONFIG, '--work-dir', work_dir,
           *toy_det_options(toy_root, **{
               'train_cfg.max_iters': 2, 'model.backbone.compile.backend': 'aot_eager',
               'default_hooks.checkpoint.interval': 2})]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=tool_env(), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert os.path.isfile(os.path.join(work_dir, 'iter_2.pth'))
    assert 'Iter(train) [2/2]' in proc.stdout + proc.stderr
