"""tools/analysis/benchmark.py and benchmark_train.py: dtypes, GFLOP/s, whole models."""
import json
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import REPO_ROOT
from mmengine.optim import OptimWrapper

from inline_mm.engine.launch import read_config

sys.path.insert(0, os.path.join(REPO_ROOT, 'tools', 'analysis'))
import benchmark  # noqa: E402
import benchmark_train  # noqa: E402

DET_TOY = os.path.join(REPO_ROOT, 'configs', 'det', 'toy', 'mask_rcnn_inline_pvt_toy.py')
FULL_DET = os.path.join(REPO_ROOT, 'configs', 'det', 'mask-rcnn_inline-pvt-t_fpn_1x_coco.py')
SEG_TOY = os.path.join(REPO_ROOT, 'configs', 'seg', 'toy', 'fpn_inline_pvt_toy.py')
SWIN_T = os.path.join(REPO_ROOT, 'configs', 'det', 'mask-rcnn_inline-swin-t_fpn_1x_coco.py')
CSWIN_T = os.path.join(REPO_ROOT, 'configs', 'det', 'mask-rcnn_inline-cswin-t_fpn_1x_coco.py')
# --device cpu: these rows need mmcv's CPU ops (the tool defaults to cuda where there is one)
FAST = ['--device', 'cpu', '--warmup', '0', '--repeats', '1', '--threads', '1', '--no-memory',
        '--peak-size', '256', '--peak-repeats', '1']


def summary_lines(text: str):
    return [line for line in text.splitlines()
            if line.startswith(('InLine/softmax', 'bf16/fp32', 'log-log slope'))]


def test_benchmark_bf16_rows_gflops_and_named_summaries(tmp_path, capsys):
    results = benchmark.main(['--compare', 'pvt', '--dtypes', 'fp32', 'bf16', '--sizes', '64',
                              '--out', str(tmp_path)] + FAST)
    out = capsys.readouterr().out
    rows = results['rows']
    assert {(r['model'], r['dtype']) for r in rows} == {
        (m, d) for m in ('inline_pvt_t', 'mmdet_pvt_t') for d in ('fp32', 'bf16')}
    peaks = results['matmul_peak_gflop_per_s']
    assert set(peaks) == {'fp32', 'bf16'} and min(peaks.values()) > 0
    for r in rows:
        assert r['gflop'] > 0 and r['gflop_per_s'] > 0
        assert r['peak_fraction'] == pytest.approx(r['gflop_per_s'] / peaks[r['dtype']])
    # FLOPs are counted once per model and size: the same for both dtypes
    for model in ('inline_pvt_t', 'mmdet_pvt_t'):
        assert len({r['gflop'] for r in rows if r['model'] == model}) == 1
    # one size: no slope, said so instead of 'nan'
    assert set(results['slopes'].values()) == {None}
    assert 'nan' not in out and out.count('n/a (one size)') == 4
    # every line of the summaries names its dtype
    lines = summary_lines(out)
    assert len(lines) == 2 + 2 + 4  # InLine/softmax per dtype, bf16/fp32 per model, slopes
    assert all(('fp32' in line) != ('bf16' in line) or line.startswith('bf16/fp32')
               for line in lines)
    assert sum('bf16' in line for line in lines if line.startswith('InLine')) == 1
    assert {r['model'] for r in results['dtype_ratios']} == {'inline_pvt_t', 'mmdet_pvt_t'}
    data = json.loads((tmp_path / 'benchmark.json').read_text())
    assert data['slopes'] == results['slopes'] and data['dtype_ratios']
    # the CPU of the run, with the matmul peaks the rows were measured against
    assert_cpu_record(data['cpu'], threads=1)
    assert data['cpu']['matmul_peak_gflop_per_s'] == peaks


def _cpuinfo_first_processor() -> dict:
    """The first processor's block of /proc/cpuinfo (read here apart from the tools)."""
    with open('/proc/cpuinfo') as f:
        block = f.read().split('\n\n')[0]
    return dict((k.strip(), v.strip()) for k, _, v in
                (line.partition(':') for line in block.splitlines()))


def assert_cpu_record(cpu: dict, threads: int) -> None:
    info = _cpuinfo_first_processor()
    flags = info['flags'].split()
    assert cpu['model'] == info['model name']
    assert cpu['flags'] == {f: f in flags for f in ('avx2', 'avx512f', 'avx512_bf16',
                                                    'amx_bf16', 'amx_tile')}
    assert cpu['threads'] == threads and cpu['cores_visible'] == os.cpu_count()
    assert set(cpu['matmul_peak_gflop_per_s']) == {'fp32', 'bf16'}
    assert min(cpu['matmul_peak_gflop_per_s'].values()) > 0
    assert cpu['allocator']['env'] == {k: v for k, v in os.environ.items()
                                       if _is_allocator_variable(k)}


def _is_allocator_variable(name: str) -> bool:
    """What glibc, jemalloc or tcmalloc read (written here apart from the tools)."""
    return name in ('GLIBC_TUNABLES', 'LD_PRELOAD') or name.startswith(('MALLOC_', 'TCMALLOC_'))


def test_cpu_record_names_the_allocator_settings(monkeypatch):
    """A figure measured with glibc's large buffers kept (or a preloaded allocator) says
    so in its result file and its printed CPU line; other variables stay out."""
    from _bench_common import cpu_record, describe_cpu
    for key in filter(_is_allocator_variable, list(os.environ)):
        monkeypatch.delenv(key)
    peaks, sizes = {'fp32': 1.0, 'bf16': 1.0}, {'fp32': 8, 'bf16': 8}
    assert cpu_record(peaks, sizes)['allocator']['env'] == {}
    assert describe_cpu(cpu_record(peaks, sizes)).endswith('; allocator default')
    monkeypatch.setenv('MALLOC_MMAP_MAX_', '0')
    monkeypatch.setenv('GLIBC_TUNABLES', 'glibc.malloc.trim_threshold=1')
    monkeypatch.setenv('MALLOCATOR', 'not an allocator setting')
    cpu = cpu_record(peaks, sizes)
    assert cpu['allocator']['env'] == {'GLIBC_TUNABLES': 'glibc.malloc.trim_threshold=1',
                                       'MALLOC_MMAP_MAX_': '0'}
    if sys.platform.startswith('linux'):
        assert cpu['allocator']['libc'].startswith('glibc ')
    assert describe_cpu(cpu).endswith(
        '; allocator GLIBC_TUNABLES=glibc.malloc.trim_threshold=1 MALLOC_MMAP_MAX_=0')


def test_cfg_options_change_the_measured_model(tmp_path):
    """--cfg-options reach the timed model and the subprocess that measures its memory
    (which fails when it builds another model than the timed one)."""
    from inline_mm.engine.runner_utils import build_model
    cfg = read_config(DET_TOY)
    cfg.merge_from_dict({'model.backbone.arch': 'small'})
    small = sum(p.numel() for p in build_model(cfg).parameters())
    tiny = sum(p.numel() for p in build_model(read_config(DET_TOY)).parameters())
    results = benchmark.main(['--config', DET_TOY, '--cfg-options', 'model.backbone.arch=small',
                              '--sizes', '64', '--no-flops', '--out', str(tmp_path)] +
                             [a for a in FAST if a != '--no-memory'])
    data = json.loads((tmp_path / 'benchmark.json').read_text())
    (row, ) = data['rows']
    assert row['params'] == small != tiny
    assert row['peak_mem_mb'] > 0
    assert data['cfg_options'] == {'model.backbone.arch': 'small'} == results['cfg_options']


def test_cfg_options_need_a_config(capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(['--models', 'inline_pvt_t', '--cfg-options', 'model.x=1'])
    assert exit_info.value.code == 2
    assert '--cfg-options changes the configs of --config' in capsys.readouterr().err


def test_slope_printed_with_two_sizes(tmp_path, capsys):
    import math
    results = benchmark.main(['--models', 'inline_pvt_t', '--sizes', '64', '96', '--no-flops',
                              '--out', str(tmp_path)] + FAST)
    lines = summary_lines(capsys.readouterr().out)
    assert len(lines) == 1 and 'inline_pvt_t b1 fp32' in lines[0]
    # the log-log slope of the two rows' medians (its sign is the machine's noise: not asserted)
    (p0, t0), (p1, t1) = sorted((r['pixels'], r['latency_ms']['median'])
                                for r in results['rows'])
    want = (math.log(t1) - math.log(t0)) / (math.log(p1) - math.log(p0))
    assert float(lines[0].rsplit(':', 1)[1]) == pytest.approx(want, abs=0.006)


@pytest.mark.parametrize('config', [DET_TOY, SEG_TOY])
def test_benchmark_runs_whole_models_from_configs(config, tmp_path):
    results = benchmark.main(['--config', config, '--dtypes', 'fp32', 'bf16',
                              '--sizes', '96x64', '--out', str(tmp_path)] + FAST)
    assert [r['dtype'] for r in results['rows']] == ['fp32', 'bf16']
    assert all(r['latency_ms']['median'] > 0 and r['gflop'] > 0 for r in results['rows'])


def test_whole_detector_bf16_autocasts_backbone_and_neck_only():
    model = benchmark.build_from_config(DET_TOY).eval()
    inner, roi_in = [], []
    model.model.backbone.block1[0].attn.q.register_forward_hook(
        lambda m, a, o: inner.append(o.dtype))
    model.model.roi_head.bbox_roi_extractor.register_forward_pre_hook(
        lambda m, args: roi_in.append({f.dtype for f in args[0]}))
    with torch.inference_mode(), benchmark.precision(model, 'bf16', 'cpu'):
        model(torch.randn(1, 3, 64, 96))
    with torch.inference_mode(), benchmark.precision(model, 'fp32', 'cpu'):
        model(torch.randn(1, 3, 64, 96))
    assert inner == [torch.bfloat16, torch.float32]
    assert roi_in == [{torch.float32}, {torch.float32}]


class _Attention(nn.Module):
    def forward(self, x):  # x: (B, heads, N, d)
        return F.scaled_dot_product_attention(x, x, x)


def test_flop_count_includes_fused_attention():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 1, bias=False)
            self.attn = _Attention()

        def forward(self, x):
            y = self.conv(x).flatten(2).transpose(1, 2)  # (1, N, 8)
            return self.attn(y.reshape(1, -1, 2, 4).transpose(1, 2))  # 2 heads of 4

    n = 6 * 5
    macs = benchmark.count_macs('sdpa-test', Net(), (6, 5))
    assert macs == n * 3 * 8 + 2 * n * n * (4 + 4)  # 1x1 conv + q k^T and attn v per head


def test_matmul_peak_is_positive_and_shrinks_to_its_time_budget():
    rate, side = benchmark.matmul_peak_gflops('fp32', 'cpu', n=128, repeats=1)
    assert rate > 0 and side == 128
    rate, side = benchmark.matmul_peak_gflops('bf16', 'cpu', n=8192, repeats=1, budget_s=0.5)
    assert rate > 0 and 512 <= side < 8192


def test_softmax_counterpart_follows_the_backbone():
    name, pvt = benchmark_train.softmax_counterpart(dict(type='InLinePVT', arch='tiny'))
    assert name == 'mmdet_pvt_t'
    expected = dict(benchmark.MMDET_BACKBONES['mmdet_pvt_t'], out_indices=[0, 1, 2, 3])
    assert pvt == expected
    name, pvt_s = benchmark_train.softmax_counterpart(dict(type='InLinePVT', arch='small'))
    assert name == 'mmdet_pvt_s' and pvt_s['num_layers'] == [3, 4, 6, 3]
    name, swin = benchmark_train.softmax_counterpart(read_config(SWIN_T).model.backbone)
    assert name == 'mmdet_swin_t'
    assert swin == dict(benchmark.MMDET_BACKBONES['mmdet_swin_t'], out_indices=[0, 1, 2, 3])
    with pytest.raises(ValueError, match='no softmax counterpart'):
        benchmark_train.softmax_counterpart(read_config(CSWIN_T).model.backbone)


def test_cswin_counterpart_is_cswin_t_with_softmax_everywhere():
    from inline_mm.models.backbones.cswin import CSWinInLineAttention, LePEAttention
    cswin = benchmark.build_backbone('cswin_t')
    assert benchmark.COUNTERPARTS['cswin'] == ('inline_cswin_t', 'cswin_t')
    kinds = {type(m) for m in cswin.modules()}
    assert LePEAttention in kinds and CSWinInLineAttention not in kinds
    assert [len(getattr(cswin, f'stage{i}')) for i in range(1, 5)] == [1, 2, 21, 1]
    # the CSWin paper's CSWin-T: 23M parameters with its 1000-class head (768 x 1000 + 1000)
    backbone_params = sum(p.numel() for p in cswin.parameters())
    assert 21.5e6 < backbone_params + 769_000 < 23.5e6
    feats = cswin(torch.randn(1, 3, 97, 131))  # any size, as the InLine family
    assert [f.shape[1] for f in feats] == [64, 128, 256, 512]


def test_training_runs_take_the_precision_they_name():
    """fp32 rows run fp32 even where the config autocasts (the toy detector's bf16 where
    the CPU has bf16 units); bf16 rows autocast what --amp does: the config's parts, else
    backbone + neck."""
    model = nn.Linear(2, 2)
    toy = read_config(DET_TOY)
    assert toy.optim_wrapper.type == 'CPUAutocastOptimWrapper'
    for cfg, parts in ((toy, tuple(toy.optim_wrapper.parts)),
                       (read_config(FULL_DET), ('backbone', 'neck'))):
        before = cfg.optim_wrapper.to_dict()
        fp32 = benchmark_train.optim_wrapper_for(model, cfg, 'fp32')
        bf16 = benchmark_train.optim_wrapper_for(model, cfg, 'bf16')
        assert type(fp32) is OptimWrapper  # mmengine's own: no autocast at all
        assert type(bf16).__name__ == 'CPUAutocastOptimWrapper'
        assert bf16.parts == parts and bf16.cast_dtype == torch.bfloat16
        assert bf16.autocast_enabled  # --amp: bf16 on any CPU (slow ones warn)
        assert cfg.optim_wrapper.to_dict() == before  # the caller's config not changed


def test_training_benchmark_fp32_and_bf16(tmp_path):
    out = tmp_path / 'train.json'
    result = benchmark_train.main([DET_TOY, '--size', '96x64', '--batch-size', '1',
                                   '--objects', '2', '--dtypes', 'fp32', 'bf16',
                                   '--warmup', '0', '--repeats', '1', '--threads', '1',
                                   '--peak-size', '256', '--peak-repeats', '1',
                                   '--out', str(out)])
    assert set(result['rows']) == {'InLinePVT(tiny)', 'InLinePVT(tiny) (bf16)', 'mmdet_pvt_t',
                                   'mmdet_pvt_t (bf16)'}
    assert set(result['ratios']) == {'fp32', 'bf16'} and result['ratio'] == result['ratios']['fp32']
    assert set(result['dtype_ratios']) == {'InLinePVT(tiny) bf16/fp32', 'mmdet_pvt_t bf16/fp32'}
    data = json.loads(out.read_text())
    assert data['softmax_backbone'] == 'mmdet_pvt_t'
    assert data['size'] == [64, 96] and data['size_wxh'] == '96x64'
    assert_cpu_record(data['cpu'], threads=1)


@pytest.mark.slow
def test_training_benchmark_of_a_swin_config_uses_mmdet_swin():
    result = benchmark_train.main([SWIN_T, '--size', '128', '--batch-size', '1',
                                   '--objects', '1', '--warmup', '0', '--repeats', '1',
                                   '--threads', '1'])
    assert set(result['rows']) == {'InLineSwin(tiny)', 'mmdet_swin_t'}
    assert result['ratio'] > 0


@pytest.mark.slow
def test_benchmark_onnxruntime_rows(tmp_path, capsys):
    """--onnxruntime: one onnxruntime row per model and size for fp32 only, the exported
    part per model kind, fixed-shape files, and the onnxruntime / PyTorch ratios."""
    pytest.importorskip('onnxruntime', reason='onnxruntime not installed: make install')
    import onnx
    results = benchmark.main(['--models', 'inline_pvt_t', '--config', SEG_TOY, DET_TOY,
                              '--sizes', '64', '--dtypes', 'fp32', 'bf16', '--onnxruntime',
                              '--out', str(tmp_path)] + FAST)
    out = capsys.readouterr().out
    rows = results['rows']
    assert not results['failed_rows']
    ort = {r['model']: r for r in rows if r['runtime'] == 'onnxruntime'}
    assert {m: r['part'] for m, r in ort.items()} == {
        'inline_pvt_t': 'backbone', SEG_TOY: 'model', DET_TOY: 'backbone_neck'}
    assert {r['dtype'] for r in ort.values()} == {'fp32'}
    assert len([r for r in rows if r['runtime'] == 'torch']) == 3 * 2  # 3 models x 2 dtypes
    # the timed files: fixed 1x3x64x64 inputs
    files = sorted(os.listdir(tmp_path / 'onnx'))
    assert len(files) == 3
    for name in files:
        graph = onnx.load(str(tmp_path / 'onnx' / name)).graph
        assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == [1, 3, 64, 64]
    # the backbone's exported graph is the PyTorch one: same FLOPs
    torch_row = next(r for r in rows if r['model'] == 'inline_pvt_t' and r['dtype'] == 'fp32'
                     and r['runtime'] == 'torch')
    assert ort['inline_pvt_t']['gflop'] == torch_row['gflop'] > 0
    # ratios only where both rows compute the same thing (not backbone + neck vs detector)
    ratios = {r['model']: r['latency'] for r in results['runtime_ratios']}
    assert set(ratios) == {'inline_pvt_t', SEG_TOY}
    assert ratios['inline_pvt_t'] == pytest.approx(
        ort['inline_pvt_t']['latency_ms']['median'] / torch_row['latency_ms']['median'])
    assert out.count('onnxruntime/PyTorch') == 2


def test_inference_benchmark_records_the_cpu(toy_root, tmp_path):
    import benchmark_inference
    from conftest import toy_det_options
    out = tmp_path / 'inference.json'
    opts = [o for o in toy_det_options(toy_root) if 'pipeline.3' not in o]
    result = benchmark_inference.main([DET_TOY, '--max-iter', '1', '--warmup', '0',
                                       '--num-workers', '0', '--peak-size', '256',
                                       '--peak-repeats', '1', '--out', str(out)] + opts)
    data = json.loads(out.read_text())
    assert data['per_process'][0]['images'] == 1 and data['cpu'] == result['cpu']
    assert_cpu_record(data['cpu'], threads=torch.get_num_threads())


def test_startup_benchmark_resize_scale_is_width_height():
    """--size WxH of the startup benchmark becomes mmdet's Resize scale, (width, height)."""
    import benchmark_startup
    args = benchmark_startup.parse_args(['--size', '96x64'])
    options = benchmark_startup.cfg_options('/data', args.size, 1)
    assert 'train_dataloader.dataset.pipeline.2.scale=(96,64)' in options
    cfg = read_config(benchmark_startup.DEFAULT_CONFIG)
    assert cfg.train_dataloader.dataset.pipeline[2].type == 'Resize'  # what pipeline.2 is


@pytest.mark.slow  # dynamo traces InLine-PVT-T once (symbolic sizes serve both)
@pytest.mark.skipif(
    tuple(int(v) for v in torch.__version__.split('+')[0].split('.')[:2]) < (2, 2),
    reason=f'torch {torch.__version__}: dynamo of torch 2.1 specialises on input sizes')
def test_benchmark_compiled_rows_beside_eager(tmp_path, capsys):
    torch._dynamo.reset()
    results = benchmark.main(['--models', 'inline_pvt_t', '--sizes', '96x64', '64', '--compile',
                    '--compile-backend', 'eager', '--no-memory', '--no-flops', '--warmup', '1',
                    '--repeats', '2', '--out', str(tmp_path)])
    out = capsys.readouterr().out
    torch._dynamo.reset()
    rows = {(r['runtime'], r['width'], r['height']): r for r in results['rows']}
    assert set(rows) == {(rt, w, h) for rt in ('torch', 'compiled') for w, h in
                         ((96, 64), (64, 64))}
    assert all(rows[('compiled', w, h)]['compile_s'] > 0 for w, h in ((96, 64), (64, 64)))
    ratios = [r for r in results['runtime_ratios'] if r['runtime'] == 'compiled']
    assert len(ratios) == 2
    eager, compiled = rows[('torch', 96, 64)], rows[('compiled', 96, 64)]
    want = compiled['latency_ms']['median'] / eager['latency_ms']['median']
    assert next(r for r in ratios if r['size'] == '96x64')['latency'] == pytest.approx(want)
    assert out.count('compiled/eager') == 2 and results['compile_backend'] == 'eager'


def test_compile_static_needs_compile(capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(['--models', 'inline_pvt_t', '--compile-static'])
    assert exit_info.value.code == 2
    assert '--compile-static says how --compile compiles: add --compile' in \
        capsys.readouterr().err


@pytest.mark.slow  # dynamo traces InLine-PVT-T once per size (static shapes)
def test_compile_static_compiles_with_static_shapes(tmp_path, monkeypatch):
    """--compile-static reaches torch.compile as dynamic=False (the default is dynamic=True)
    and the result file says which it was."""
    calls, real_compile = [], torch.compile

    def recording_compile(model, **kwargs):
        calls.append(kwargs)
        return real_compile(model, **kwargs)

    monkeypatch.setattr(torch, 'compile', recording_compile)
    args = ['--models', 'inline_pvt_t', '--sizes', '64', '--compile', '--compile-backend',
            'eager', '--no-memory', '--no-flops', '--warmup', '0', '--repeats', '1']
    for extra, dynamic in (([], True), (['--compile-static'], False)):
        torch._dynamo.reset()
        out = tmp_path / str(dynamic)
        results = benchmark.main(args + extra + ['--out', str(out)])
        torch._dynamo.reset()
        assert calls.pop() == dict(dynamic=dynamic, backend='eager') and not calls
        assert {r['runtime'] for r in results['rows']} == {'torch', 'compiled'}
        assert json.loads((out / 'benchmark.json').read_text())['compile_dynamic'] is dynamic


class _Raises(nn.Module):
    def forward(self, x):
        raise RuntimeError('Guard failed on the same frame it was created')


class _GradMode(nn.Module):
    """Records the autograd mode its forward ran in."""

    def __init__(self):
        super().__init__()
        self.modes = set()

    def forward(self, x):
        self.modes.add((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        return x


def test_a_compiled_twin_that_fails_is_dropped_and_the_rest_timed():
    eager = _GradMode()
    models = {'m': eager, 'm' + benchmark.COMPILED: _Raises()}
    times, first, errors = benchmark.time_models(models, (8, 8), 1, 'fp32', 'cpu', 1, 2,
                                                 lambda msg: None)
    assert set(times) == {'m'} and len(times['m']) == 2 and set(first) == {'m'}
    assert errors == {'m+compiled': 'RuntimeError: Guard failed on the same frame it was '
                      'created'}
    assert set(models) == {'m'}  # the next sizes do not try it again
    # beside a compiled twin, eager passes run under no_grad too (not inference_mode)
    assert eager.modes == {(False, False)}
    alone = _GradMode()
    benchmark.time_models({'m': alone}, (8, 8), 1, 'fp32', 'cpu', 1, 1, lambda msg: None)
    assert alone.modes == {(False, True)}
    # an eager model that fails is the run's error, not a row
    with pytest.raises(RuntimeError, match='Guard failed'):
        benchmark.time_models({'m': _Raises()}, (8, 8), 1, 'fp32', 'cpu', 1, 1,
                              lambda msg: None)


def test_profile_writes_the_top_operators_of_each_model(tmp_path, capsys):
    benchmark.main(['--models', 'inline_pvt_t', 'mmdet_pvt_t', '--sizes', '64', '--profile',
                    '--no-flops', '--out', str(tmp_path)] + FAST)
    files = sorted(p.name for p in (tmp_path / 'profile').iterdir())
    assert files == ['inline_pvt_t_64x64_b1_fp32.txt', 'mmdet_pvt_t_64x64_b1_fp32.txt']
    table = (tmp_path / 'profile' / 'inline_pvt_t_64x64_b1_fp32.txt').read_text()
    assert 'Self CPU' in table and 'aten::' in table  # torch.profiler's operator table
    assert 'profile: ' in capsys.readouterr().err
