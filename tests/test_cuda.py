"""The GPU tier: ``pytest -m cuda`` (``make test-gpu`` runs it, then the GPU timing table).

Every test marked ``cuda`` needs a CUDA device and is skipped without one
(``torch.cuda.is_available()`` false); those that run Mask R-CNN also need
mmcv's CUDA ops and are skipped, with the reason, when this mmcv was built
without them.  The tests at the end run on the CPU: the GPU report's tables
from given figures, and the tools' one-line refusal of ``--device cuda``
without a GPU.
"""
import json
import math
import os
import pickle
import subprocess
import sys
from contextlib import contextmanager, nullcontext
from typing import Iterator, List

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import REPO_ROOT, TOY_DET_CONFIG, TRAIN_TOOL, free_port, scalars, tool_env, \
    toy_det_options

from inline_mm.engine.launch import read_config
from inline_mm import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin

sys.path.insert(0, os.path.join(REPO_ROOT, 'tools', 'analysis'))
import benchmark  # noqa: E402
import benchmark_train  # noqa: E402
import gpu_report  # noqa: E402

TEST_TOOL = os.path.join(REPO_ROOT, 'tools', 'test.py')
DDP_WORKER = os.path.join(REPO_ROOT, 'tests', 'ddp_step_worker.py')
NO_CUDA = not torch.cuda.is_available()
DTYPES = {'fp16': torch.float16, 'bf16': torch.bfloat16}
FAMILIES = [InLinePVT, InLineSwin, InLineCSWin, InLineDeiT]


def on_gpu(test):
    """Put ``test`` in the GPU tier: marked ``cuda``, skipped without a CUDA device."""
    skip = pytest.mark.skipif(NO_CUDA, reason='needs a CUDA device (torch.cuda.is_available() '
                              'is False): the GPU tier, make test-gpu')
    return pytest.mark.cuda(skip(test))


def need_dtype(dtype: str) -> None:
    if dtype == 'bf16' and not torch.cuda.is_bf16_supported():
        pytest.skip(f'{torch.cuda.get_device_name()} has no bf16 support')


@pytest.fixture(scope='module')
def mmcv_cuda_ops():
    """Skip (with the reason) where mmcv's RoIAlign / NMS have no CUDA kernels."""
    from _bench_common import mmcv_cuda_ops_missing
    missing = mmcv_cuda_ops_missing()
    if missing:
        pytest.skip(missing)


def first_linear(model: nn.Module) -> nn.Linear:
    return next(m for m in model.modules() if isinstance(m, nn.Linear))


def record_dtypes(module: nn.Module, store: list) -> None:
    module.register_forward_hook(lambda m, args, out: store.append(out.dtype))


def large_kv(model: nn.Module) -> None:
    """K and V of mean ~8, as in trained models: fp16 sums of ``K^T V`` over a stage's
    thousands of tokens exceed 65504 unless the InLine reductions run in fp32."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(getattr(m, 'kv', None), nn.Linear):
                m.kv.bias += 8
            elif isinstance(getattr(m, 'qkv', None), nn.Linear):
                m.qkv.bias[m.qkv.out_features // 3:] += 8


def forward_backward(model: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> List[torch.Tensor]:
    """Training forward under autocast on ``x``'s device, backward of a loss on every output."""
    with torch.autocast(x.device.type, dtype=dtype):
        outs = model(x)
    sum(o.float().square().mean() for o in outs).backward()
    return list(outs)


# ------------------------------------------------------------------- backbones under autocast
@on_gpu
@pytest.mark.parametrize('dtype', list(DTYPES))
@pytest.mark.parametrize('cls', FAMILIES, ids=lambda c: c.__name__)
def test_every_family_trains_under_autocast(cls, dtype):
    need_dtype(dtype)
    model = cls(arch='tiny').cuda().train()
    large_kv(model)
    seen: list = []
    record_dtypes(first_linear(model), seen)
    outs = forward_backward(model, torch.randn(2, 3, 512, 640, device='cuda') * 3, DTYPES[dtype])
    assert seen and set(seen) == {DTYPES[dtype]}  # autocast reached the blocks
    assert all(torch.isfinite(o.float()).all() for o in outs)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert [n for n, p in params if p.grad is None] == []  # the loss reaches every parameter
    assert [n for n, p in params if not torch.isfinite(p.grad).all()] == []
    assert sum(p.grad.double().norm() for _, p in params) > 0


# ------------------------------------------------------------------- SDPA in the softmax blocks
def softmax_attention_modules(model: nn.Module) -> List[nn.Module]:
    """The softmax attention modules: Swin's window attention, CSwin's stripe attention."""
    from inline_mm.models.backbones.cswin import LePEAttention
    from inline_mm.models.layers.softmax_attention import WindowAttention
    return [m for m in model.modules() if isinstance(m, (WindowAttention, LePEAttention))]


@contextmanager
def counting_sdpa() -> Iterator[list]:
    """Count ``F.scaled_dot_product_attention`` calls (also where a module of the plugin
    imported the function by name); each call appends whether it had an ``attn_mask``."""
    original = F.scaled_dot_product_attention
    calls: list = []

    def counted(*args, **kwargs):
        mask = kwargs.get('attn_mask', args[3] if len(args) > 3 else None)
        calls.append(mask is not None)
        return original(*args, **kwargs)

    targets = [F] + [m for name, m in list(sys.modules.items()) if name.startswith('inline_mm')
                     and getattr(m, 'scaled_dot_product_attention', None) is original]
    for target in targets:
        target.scaled_dot_product_attention = counted
    try:
        yield calls
    finally:
        for target in targets:
            target.scaled_dot_product_attention = original


def sdpa_backends(*names: str):
    """Only the named SDPA kernels (``FLASH_ATTENTION``, ``EFFICIENT_ATTENTION``, ``MATH``)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # torch >= 2.3
    except ImportError:  # torch 2.1 / 2.2
        return torch.backends.cuda.sdp_kernel(
            enable_flash='FLASH_ATTENTION' in names,
            enable_mem_efficient='EFFICIENT_ATTENTION' in names, enable_math='MATH' in names)
    return sdpa_kernel([getattr(SDPBackend, n) for n in names])


def softmax_model(cls):
    """Swin-T / CSwin-T with their softmax stages; fewer InLine blocks (not under test here)."""
    depths = {InLineSwin: [1, 1, 2, 2], InLineCSWin: [1, 1, 4, 1]}[cls]
    return cls(arch='tiny', depths=depths).cuda()


@on_gpu
@pytest.mark.parametrize('cls', [InLineSwin, InLineCSWin], ids=lambda c: c.__name__)
def test_softmax_blocks_call_sdpa(cls):
    """Every softmax attention module calls scaled_dot_product_attention, in training and
    inference, at a size whose windows need padding masks."""
    model = softmax_model(cls).train()
    modules = softmax_attention_modules(model)
    assert modules
    before: dict = {}
    without: list = []
    with counting_sdpa() as calls:
        for m in modules:
            m.register_forward_pre_hook(lambda m, a: before.__setitem__(id(m), len(calls)))
            m.register_forward_hook(
                lambda m, a, o: without.append(m) if len(calls) == before[id(m)] else None)
        x = torch.randn(2, 3, 320, 416, device='cuda')
        forward_backward(model, x, torch.float16)
        model.eval()
        with torch.no_grad(), torch.autocast('cuda', dtype=torch.float16):
            model(x)
    assert calls, f'{cls.__name__}: no scaled_dot_product_attention call at all'
    assert without == [], f'{len(without)} softmax attention calls took another path'


def maybe_autocast(dtype: str):
    """Autocast to ``dtype`` on CUDA; plain fp32 for ``'fp32'``."""
    return nullcontext() if dtype == 'fp32' else torch.autocast('cuda', dtype=DTYPES[dtype])


@on_gpu
@pytest.mark.parametrize('size', [(320, 416), (224, 224)], ids=['padded', 'tiled'])
@pytest.mark.parametrize('dtype', ['fp32'] + list(DTYPES))
@pytest.mark.parametrize('cls', [InLineSwin, InLineCSWin], ids=lambda c: c.__name__)
def test_softmax_blocks_run_the_fused_kernels(cls, dtype, size):
    """With only the fused kernels allowed (memory-efficient, which takes masks, and flash)
    the forward and backward run, and the outputs match the math kernel's.

    At 224x224 Swin's windows tile the maps, so its unshifted blocks pass the position
    bias alone (a mask the fused kernels decline unless its last stride is 1); fp32 is
    where torch 2.1's memory-efficient kernel went wrong with q / k / v views and a mask
    (pytorch#112577; the plugin passes contiguous copies there).
    """
    need_dtype(dtype)
    model = softmax_model(cls).train()
    x = torch.randn(2, 3, *size, device='cuda')
    with counting_sdpa() as calls, sdpa_backends('EFFICIENT_ATTENTION', 'FLASH_ATTENTION'), \
            maybe_autocast(dtype):
        outs = model(x)  # raises 'No available kernel' else
        sum(o.float().square().mean() for o in outs).backward()
    assert calls and all(torch.isfinite(o.float()).all() for o in outs)
    model.eval()
    results = {}
    for kernels in (('EFFICIENT_ATTENTION', 'FLASH_ATTENTION'), ('MATH', )):
        with torch.no_grad(), sdpa_backends(*kernels), maybe_autocast(dtype):
            results[kernels[0]] = [o.float() for o in model(x)]
    tolerance = {'fp32': 1e-4, 'fp16': 1e-2, 'bf16': 5e-2}[dtype]
    for fused, math_ in zip(results['EFFICIENT_ATTENTION'], results['MATH']):
        assert (fused - math_).norm() / math_.norm() < tolerance


@on_gpu
@pytest.mark.parametrize('dtype', list(DTYPES))
def test_cswin_stripes_without_padding_run_flash_attention(dtype):
    """At 224x224 CSwin-T's stripes tile every map: no mask, so flash attention alone runs."""
    need_dtype(dtype)
    model = softmax_model(InLineCSWin).eval()
    x = torch.randn(2, 3, 224, 224, device='cuda')
    with counting_sdpa() as calls, torch.no_grad(), \
            torch.autocast('cuda', dtype=DTYPES[dtype]):
        model(x)
    assert calls
    if any(calls):
        pytest.skip('CSwin passes attention masks at 224x224: flash attention takes none')
    with torch.no_grad(), sdpa_backends('FLASH_ATTENTION'), \
            torch.autocast('cuda', dtype=DTYPES[dtype]):
        outs = model(x)
    assert all(torch.isfinite(o.float()).all() for o in outs)


# ------------------------------------------------------------------- the benchmarks on the GPU
@on_gpu
def test_backbone_benchmark_on_the_gpu(tmp_path, monkeypatch):
    """GPU rows: CUDA allocator memory (no RSS child process), threads left alone."""
    import types

    import _bench_memory

    def cpu_only(*args, **kwargs):
        raise AssertionError('the CPU memory measurement ran on a GPU run')

    # the CPU measurement is a child process: starting one is what must not happen
    monkeypatch.setattr(_bench_memory, 'subprocess', types.SimpleNamespace(run=cpu_only))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = benchmark.main(['--compare', 'pvt', '--sizes', '128', '--device', 'cuda',
                                  '--dtypes', 'fp32', 'fp16', 'bf16', '--warmup', '1',
                                  '--repeats', '2', '--threads', '2', '--peak-size', '1024',
                                  '--peak-repeats', '1', '--out', str(tmp_path)])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert results['device'] == 'cuda' and results['threads'] is None
    assert len(results['rows']) == 6
    for row in results['rows']:
        model = benchmark.build_backbone(row['model']).cuda().eval()
        with torch.inference_mode(), benchmark.autocast(row['dtype'], 'cuda'):
            out_bytes = sum(o.numel() * o.element_size() for o in model(
                torch.randn(1, 3, 128, 128, device='cuda')))
        # the outputs are alive at the end of the forward: a lower bound of its peak
        assert row['peak_mem_mb'] * 2 ** 20 >= out_bytes, row
        assert row['latency_ms']['median'] > 0 and 0 < row['peak_fraction'] < 2


@on_gpu
def test_training_benchmark_precisions_on_the_gpu(mmcv_cuda_ops):
    """fp16: AmpOptimWrapper over the whole model (as --amp on a GPU); bf16: the parts the
    toy config names (backbone, neck, RPN and RoI heads), each part's outputs back in fp32,
    so the RoI extractor between them (mmcv's RoIAlign) gets fp32 features."""
    from mmengine.optim import AmpOptimWrapper
    from mmengine.registry import init_default_scope
    cfg = read_config(TOY_DET_CONFIG)
    init_default_scope('mmdet')
    model = benchmark_train.build(cfg, 'cuda')
    inner, heads_inner, roi_in = [], [], []
    record_dtypes(first_linear(model.backbone), inner)
    record_dtypes(first_linear(model.roi_head.bbox_head), heads_inner)
    model.roi_head.bbox_roi_extractor.register_forward_pre_hook(
        lambda m, args: roi_in.append({f.dtype for f in args[0]}))
    data = benchmark_train.synthetic_batch((128, 160), 2, 3, 3)
    # (a Linear of the backbone, of the box head, the RoI extractor's input features);
    # under fp16 autocast the extractor's input dtype is the neck's last op's (the toy FPN
    # ends in GroupNorm, which CUDA autocast runs in fp32): not checked there
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
    expected = {'fp32': (f32, f32, f32), 'fp16': (f16, f16, None), 'bf16': (bf16, bf16, f32)}
    for dtype, (backbone, box_head, roi_features) in expected.items():
        if dtype == 'bf16' and not torch.cuda.is_bf16_supported():
            continue
        optim = benchmark_train.optim_wrapper_for(model, cfg, dtype, 'cuda')
        assert isinstance(optim, AmpOptimWrapper) == (dtype == 'fp16')
        for store in (inner, heads_inner, roi_in):
            store.clear()
        log = model.train_step(data, optim)
        assert set(inner) == {backbone}, dtype
        assert set(heads_inner) == {box_head}, dtype
        assert roi_in and (roi_features is None or all(d == {roi_features} for d in roi_in)), \
            dtype
        assert all(math.isfinite(float(v)) for v in log.values()), (dtype, log)


@on_gpu
def test_training_benchmark_runs_on_the_gpu(mmcv_cuda_ops, tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = benchmark_train.main([TOY_DET_CONFIG, '--device', 'cuda', '--size', '128',
                                       '--batch-size', '2', '--objects', '2', '--dtypes', 'fp32',
                                       'fp16', 'bf16', '--warmup', '1', '--repeats', '2',
                                       '--out', str(tmp_path / 'train.json')])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert result['device'] == 'cuda' and result['threads'] is None
    assert {(r['backbone'], r['dtype']) for r in result['rows'].values()} == {
        (b, d) for b in ('InLinePVT(tiny)', 'mmdet_pvt_t') for d in ('fp32', 'fp16', 'bf16')}
    for row in result['rows'].values():
        assert row['median_s'] > 0 and row['peak_mem_mb'] > 0
        assert len(row['times_s']) == 2
    assert set(result['ratios']) == {'fp32', 'fp16', 'bf16'}


# ------------------------------------------------------------------- the tools with --amp
@pytest.fixture(scope='module')
def amp_run(mmcv_cuda_ops, toy_root, tmp_path_factory):
    """tools/train.py --amp on the GPU: 4 iterations of the toy Mask R-CNN, batch 2."""
    work = str(tmp_path_factory.mktemp('amp_train'))
    # not deterministic: torch.use_deterministic_algorithms refuses several CUDA kernels
    opts = toy_det_options(toy_root, **{'train_cfg.max_iters': 4, 'randomness.deterministic':
                                        False, 'default_hooks.checkpoint.interval': 4,
                                        'train_dataloader.batch_size': 2})
    run = subprocess.run([sys.executable, TRAIN_TOOL, TOY_DET_CONFIG, '--amp', '--work-dir',
                          work] + opts, capture_output=True, text=True, env=tool_env(),
                         cwd=REPO_ROOT, timeout=900)
    return work, run


@on_gpu
def test_train_tool_amp_fp16_mask_rcnn(amp_run):
    work, run = amp_run
    assert run.returncode == 0, run.stderr[-3000:]
    losses = {r['iter']: r['loss'] for r in scalars(work) if 'loss' in r}
    assert sorted(losses) == [1, 2, 3, 4] and all(math.isfinite(v) for v in losses.values())
    from inline_mm.checkpoint import mmengine_checkpoint_globals
    with mmengine_checkpoint_globals():  # a runner checkpoint (torch >= 2.6 allow-list)
        ckpt = torch.load(os.path.join(work, 'iter_4.pth'), map_location='cpu')
    # AmpOptimWrapper saves its GradScaler: a dynamic scale from 2^16, halved per overflow
    scale = ckpt['optimizer']['loss_scaler']['scale']
    assert 0 < scale <= 2.0 ** 16 and math.log2(scale).is_integer()
    # each halving skipped one step; every other iteration stepped AdamW (none at all, and
    # no optimiser state, when all 4 overflowed: a scale of 2^12)
    steps = max((int(s['step']) for s in ckpt['optimizer']['state'].values()), default=0)
    assert steps == 4 - int(math.log2(2.0 ** 16 / scale))


@on_gpu
def test_test_tool_amp_on_the_fp16_checkpoint(amp_run, toy_root, tmp_path):
    work, run = amp_run
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / 'predictions.pkl'
    test = subprocess.run([sys.executable, TEST_TOOL, TOY_DET_CONFIG,
                           os.path.join(work, 'iter_4.pth'), '--amp', '--out', str(out),
                           '--work-dir', str(tmp_path / 'test')] +
                          toy_det_options(toy_root, **{'randomness.deterministic': False}),
                          capture_output=True, text=True, env=tool_env(), cwd=REPO_ROOT,
                          timeout=600)
    text = test.stdout + test.stderr
    assert test.returncode == 0, text[-3000:]
    assert 'coco/bbox_mAP' in text and 'coco/segm_mAP' in text
    with open(out, 'rb') as f:
        predictions = pickle.load(f)
    assert len(predictions) == 2  # the toy set's validation images
    for p in predictions:
        pred = p['pred_instances']
        assert torch.isfinite(pred['bboxes']).all() and torch.isfinite(pred['scores']).all()


@on_gpu
def test_inference_autocast_on_the_gpu_is_fp16_in_backbone_and_neck(mmcv_cuda_ops):
    from mmdet.structures import DetDataSample
    from mmengine.registry import init_default_scope

    from inline_mm.engine.amp import enable_inference_autocast
    init_default_scope('mmdet')
    model = benchmark_train.build(read_config(TOY_DET_CONFIG), 'cuda').eval()
    inner, roi_in = [], []
    record_dtypes(first_linear(model.backbone), inner)
    model.roi_head.bbox_roi_extractor.register_forward_pre_hook(
        lambda m, args: roi_in.append({f.dtype for f in args[0]}))
    handle = enable_inference_autocast(model, 'mmdet')
    assert handle.dtype == torch.float16 and handle.parts == ('backbone', 'neck')
    sample = DetDataSample(metainfo=dict(img_shape=(128, 160), ori_shape=(128, 160),
                                         scale_factor=(1., 1.)))
    image = torch.randint(0, 256, (3, 128, 160), dtype=torch.uint8)
    with torch.no_grad():
        result = model.test_step(dict(inputs=[image], data_samples=[sample]))[0]
    assert inner == [torch.float16]
    assert roi_in and all(d == {torch.float32} for d in roi_in)
    assert torch.isfinite(result.pred_instances.scores).all()


@on_gpu
def test_nonfinite_hook_leaves_fp16_overflows_to_the_grad_scaler():
    """AMP: overflows of the scaled fp16 gradients while the GradScaler settles (twelve in a
    row here) are skipped by the scaler, not counted as non-finite steps (max_consecutive
    would stop the run); a non-finite loss is counted."""
    from mmengine.optim import AmpOptimWrapper

    from inline_mm.engine.nonfinite import NonFiniteLossError, NonFiniteLossHook
    model = nn.Linear(8, 8).cuda()
    wrapper = AmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=1e-3),
                              loss_scale='dynamic')
    hook = NonFiniteLossHook(max_consecutive=3)
    hook._guard(wrapper)  # what before_train does for the run's wrapper
    x = torch.ones(4, 8, device='cuda')

    def iteration(factor: float) -> None:
        with wrapper.optim_context(model):
            # fp16 output; its gradient, 1e4 x the loss scale, overflows fp16 until the
            # scale has been halved about 14 times
            loss = model(x).float().sum() * factor
        wrapper.update_params(loss)

    for _ in range(12):
        iteration(1e4)
    assert wrapper.loss_scaler.get_scale() == 2.0 ** 4  # twelve skips, each halving it
    assert hook.total == 0
    with pytest.raises(NonFiniteLossError):
        for _ in range(3):
            iteration(float('nan'))


@on_gpu
def test_rng_states_of_the_training_device_restore_where_fewer_gpus_are_visible():
    """RNGStateHook saves the CUDA state of the process's own device: it restores the same
    draws; a checkpoint of an earlier version with one state per visible GPU (8 here)
    restores on a job that sees one GPU (set_rng_state_all raised IndexError there)."""
    from inline_mm.engine.hooks.rng_state import _capture_rng, _restore_rng
    torch.cuda.init()
    state = _capture_rng()
    assert 'cuda' not in state and state['cuda_device'].dtype == torch.uint8
    first = torch.rand(4, device='cuda')
    _restore_rng(state)
    assert torch.equal(torch.rand(4, device='cuda'), first)
    older = dict(state, cuda=[state.pop('cuda_device')] * 8)
    _restore_rng(older)
    assert torch.equal(torch.rand(4, device='cuda'), first)


@on_gpu
def test_cpu_autocast_wrapper_autocasts_a_gpu_model_on_its_device():
    """CPUAutocastOptimWrapper(only_with_bf16_units=False) on a GPU model: the forward runs
    under CUDA autocast (a CPU autocast left it in fp32)."""
    need_dtype('bf16')
    from inline_mm.engine.amp import CPUAutocastOptimWrapper
    model = nn.Linear(8, 8).cuda()
    wrapper = CPUAutocastOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                      only_with_bf16_units=False)
    with wrapper.optim_context(model):
        out = model(torch.ones(2, 8, device='cuda'))
    assert out.dtype == torch.bfloat16


# ------------------------------------------------------------------- NCCL
def run_ddp_step_worker(out, backend: str, *args: str, **env: str):
    """Two ranks of tests/ddp_step_worker.py under torchrun, writing their result to ``out``."""
    return subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
                           '--master_addr', '127.0.0.1', '--master_port', str(free_port()),
                           DDP_WORKER, '--backend', backend, *args, '--out', str(out)],
                          capture_output=True, text=True, env=dict(tool_env(), **env),
                          cwd=REPO_ROOT, timeout=300)


def check_ddp_step(out, backend: str, grad_tolerance: float) -> None:
    """DDP's gradients equal the mean of the ranks' own, the weights stay equal."""
    result = json.loads(out.read_text())
    assert result['world_size'] == 2 and result['backend'] == backend
    assert result['local_grads_differ'] > 0  # the ranks had batches of their own
    assert result['grad_rel_err'] < grad_tolerance
    assert result['weight_diff'] == 0.0


@on_gpu
def test_two_process_nccl_ddp_step(tmp_path):
    """Two NCCL ranks: DDP's gradients equal the mean of the ranks' own, weights stay equal."""
    if not torch.distributed.is_nccl_available():
        pytest.skip('this torch has no NCCL backend')
    run = run_ddp_step_worker(tmp_path / 'ddp.json', 'nccl', NCCL_DEBUG='WARN')
    text = run.stdout + run.stderr
    if run.returncode and torch.cuda.device_count() < 2 and 'Duplicate GPU' in text:
        pytest.skip('NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): the '
                    'two-process NCCL step needs 2 GPUs')
    assert run.returncode == 0, text[-3000:]
    check_ddp_step(tmp_path / 'ddp.json', 'nccl', grad_tolerance=1e-3)


@pytest.mark.slow
def test_two_process_gloo_ddp_step_on_the_cpu(tmp_path):
    """The NCCL test's worker with gloo on the CPU: what it checks holds where CI can run it."""
    run = run_ddp_step_worker(tmp_path / 'ddp.json', 'gloo', '--device', 'cpu')
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    check_ddp_step(tmp_path / 'ddp.json', 'gloo', grad_tolerance=1e-5)


# ------------------------------------------------------------------- on the CPU
def fake_backbone_result() -> dict:
    """benchmark.main's result layout with given figures (two models, two batches)."""
    rows = []
    figures = {('inline_pvt_t', 1): (10.0, 100.0), ('mmdet_pvt_t', 1): (40.0, 400.0),
               ('inline_pvt_t', 8): (60.0, 800.0), ('mmdet_pvt_t', 8): (300.0, 3000.0)}
    for (model, batch), (ms, mb) in figures.items():
        for i, dtype in enumerate(('fp32', 'fp16')):
            rows.append(dict(model=model, batch=batch, dtype=dtype, runtime='torch',
                             latency_ms=dict(median=ms / (i + 1)), peak_mem_mb=mb / (i + 1)))
    ratios = [dict(family='pvt', batch=b, dtype=d, runtime='torch',
                   latency=figures[('inline_pvt_t', b)][0] / figures[('mmdet_pvt_t', b)][0])
              for b in (1, 8) for d in ('fp32', 'fp16')]
    return dict(rows=rows, ratios=ratios, warmup=2, repeats=5)


def fake_train_result(batch: int) -> dict:
    rows = {'InLinePVT(tiny)': dict(backbone='InLinePVT(tiny)', dtype='fp32', median_s=0.25,
                                    peak_mem_mb=5000.0),
            'InLinePVT(tiny) (fp16)': dict(backbone='InLinePVT(tiny)', dtype='fp16',
                                           median_s=0.125, peak_mem_mb=3000.0),
            'mmdet_pvt_t': dict(backbone='mmdet_pvt_t', dtype='fp32', median_s=0.5,
                                peak_mem_mb=9000.0),
            'mmdet_pvt_t (fp16)': dict(backbone='mmdet_pvt_t', dtype='fp16', median_s=0.4,
                                       peak_mem_mb=6000.0)}
    return dict(rows=rows, batch_size=batch, warmup=1, repeats=3,
                ratios={'fp32': 0.5, 'fp16': 0.3125})


def test_report_tables_from_given_figures():
    report = dict(
        meta=dict(device_name='NVIDIA H200', torch='2.14.1', cuda='13.0', date='2026-12-01',
                  load='0.10 0.20 0.30', size='1333x800', dtypes=['fp32', 'fp16', 'bf16']),
        backbone=dict(command='python tools/analysis/benchmark.py X',
                      result=fake_backbone_result()),
        train=dict(parts=[
            dict(config='c.py', batch=1, command='python tools/analysis/benchmark_train.py A',
                 result=fake_train_result(1)),
            dict(config='c.py', batch=8, command='python tools/analysis/benchmark_train.py B',
                 error='OutOfMemoryError: CUDA out of memory')]))
    lines = gpu_report.render(report).splitlines()
    # one row per model and batch: latency per dtype (bf16 not given: '-'), then memory
    assert '| InLine-PVT-T | 1 | 10.0 | 5.0 | - | 100 | 50 | - |' in lines
    assert '| mmdet PVT-T | 8 | 300.0 | 150.0 | - | 3000 | 1500 | - |' in lines
    assert '| InLine-PVT-T / mmdet PVT-T | 1 | 0.25 | 0.25 | - |' in lines
    assert '| InLine-PVT-T / mmdet PVT-T | 8 | 0.20 | 0.20 | - |' in lines
    assert '| InLine-PVT-T | 1 | 0.250 | 0.125 | - | 5000 | 3000 | - |' in lines
    assert '| mmdet PVT-T | 1 | 0.500 | 0.400 | - | 9000 | 6000 | - |' in lines
    assert '| InLine-PVT-T / mmdet PVT-T | 1 | 0.50 | 0.31 | - |' in lines
    assert '- c.py batch 8: failed: OutOfMemoryError: CUDA out of memory' in lines
    text = '\n'.join(lines)
    assert 'NVIDIA H200, torch 2.14.1 (CUDA 13.0), 2026-12-01' in text
    assert '`python tools/analysis/benchmark_train.py B`' in text
    # every table row has as many cells as its header
    for block in text.split('\n\n'):
        rows = [line for line in block.splitlines() if line.startswith('|')]
        assert len({line.count('|') for line in rows}) <= 1, block


def test_report_names_what_was_not_measured():
    report = dict(meta=dict(device_name='GPU', torch='2.1.2', cuda='12.1', date='2026-12-01',
                            load='0.00 0.00 0.00', size='1333x800', dtypes=['fp32']),
                  backbone=dict(command='python x', error='RuntimeError: boom'),
                  train=dict(skipped='mmcv 2.1.0 has no usable CUDA ops here'))
    text = gpu_report.render(report)
    assert 'failed: RuntimeError: boom' in text
    assert 'not measured: mmcv 2.1.0 has no usable CUDA ops here' in text


def test_report_arguments_are_the_benchmarks_own(tmp_path):
    """The parts' arguments: the sizes and batches asked for, accepted by the tools' parsers."""
    args = gpu_report.parse_args(['--batch-sizes', '1', '8', '--out', str(tmp_path)])
    argv = gpu_report.backbone_argv(args, str(tmp_path))
    assert argv[argv.index('--sizes') + 1] == '1333x800'
    assert argv[argv.index('--batch-sizes') + 1:argv.index('--batch-sizes') + 3] == ['1', '8']
    targs = benchmark_train.parse_args(gpu_report.train_argv(
        args, gpu_report.DETECTORS['swin'], 8, str(tmp_path / 't.json')))
    assert (targs.device, targs.size, targs.batch_size, targs.dtypes) == \
        ('cuda', (800, 1333), 8, ['fp32', 'fp16', 'bf16'])
    for config in gpu_report.DETECTORS.values():
        assert os.path.isfile(os.path.join(REPO_ROOT, config))


@pytest.mark.skipif(not NO_CUDA, reason='the refusal without a GPU')
def test_gpu_report_without_cuda_stops_with_one_line(tmp_path):
    out = tmp_path / 'report'
    run = subprocess.run([sys.executable, os.path.join(REPO_ROOT, 'tools', 'analysis',
                                                       'gpu_report.py'), '--out', str(out)],
                         capture_output=True, text=True, env=tool_env(), cwd=REPO_ROOT)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: no CUDA device'), run.stderr
    assert 'torch.cuda.is_available() is False' in lines[0]
    assert not out.exists()  # nothing written


@pytest.mark.skipif(not NO_CUDA, reason='the refusal without a GPU')
@pytest.mark.parametrize('tool', ['benchmark', 'benchmark_train'])
def test_benchmarks_refuse_cuda_without_a_gpu(tool, tmp_path, capsys):
    argv = {'benchmark': ['--models', 'inline_pvt_t', '--device', 'cuda', '--out',
                          str(tmp_path)],
            'benchmark_train': [TOY_DET_CONFIG, '--device', 'cuda']}[tool]
    with pytest.raises(SystemExit) as exit_info:
        {'benchmark': benchmark, 'benchmark_train': benchmark_train}[tool].main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: no CUDA device'), err
    assert not os.listdir(tmp_path)
