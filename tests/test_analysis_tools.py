"""tools/analysis: FLOPs against a hand count, the benchmark, attention maps."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT
from mmengine.analysis import get_model_complexity_info

from inline_mm.models.layers.inline_attention import InLineAttention, inline_attention

sys.path.insert(0, os.path.join(REPO_ROOT, 'tools', 'analysis'))
import benchmark  # noqa: E402
import benchmark_train  # noqa: E402
import get_flops  # noqa: E402
import vis_attention  # noqa: E402


def hand_count(n, c, heads):
    """Multiply-adds of one InLineAttention forward on n tokens (identity kernel)."""
    d = c // heads
    return (n * c * 3 * c            # qkv projection
            + heads * d * n * d      # K^T V per head
            + heads * n * d * d      # Q @ Cov per head
            + c * (c // heads)       # kernel predictor, first grouped 1x1 conv (one token)
            + 9 * c * (c // heads)   # second grouped 1x1 conv
            + 9 * c * n              # 3x3 depthwise local branch over the grid
            + n * c * c              # output projection of the per-token term
            + c * c)                 # output projection of the value mean (once)


class _Attn(torch.nn.Module):
    def __init__(self, attn, hw):
        super().__init__()
        self.attn, self.hw = attn, hw

    def forward(self, x):
        return self.attn(x, self.hw)


@pytest.mark.parametrize('hw', [(8, 8), (16, 8)])
def test_flops_of_one_block_match_a_hand_count(hw):
    c, heads = 64, 2
    n = hw[0] * hw[1]
    info = get_model_complexity_info(_Attn(InLineAttention(c, heads), hw),
                                     inputs=(torch.randn(1, n, c),), show_table=False,
                                     show_arch=False)
    assert info['flops'] == hand_count(n, c, heads)


def test_flops_scale_linearly_with_tokens():
    def flops(hw):
        return get_model_complexity_info(_Attn(InLineAttention(64, 2), hw),
                                         inputs=(torch.randn(1, hw[0] * hw[1], 64),),
                                         show_table=False, show_arch=False)['flops']
    f1, f2, f4 = flops((16, 16)), flops((32, 16)), flops((32, 32))
    # linear in N up to the tiny per-sample kernel predictor
    assert (f4 - f2) == pytest.approx(2 * (f2 - f1), rel=1e-9)
    assert f4 / f1 == pytest.approx(4, rel=0.01)


@pytest.mark.slow
def test_get_flops_tool_on_a_config(tmp_path):
    from inline_mm.engine.launch import read_config
    cfg = read_config(os.path.join(REPO_ROOT, 'configs', 'det', 'mask_rcnn_inline_pvt.py'))
    info = get_flops.complexity(cfg, (224, 224), backbone_only=True)
    assert info['flops'] / 1e9 == pytest.approx(1.98, abs=0.03)  # InLine-PVT-T: 2.0G (paper)
    assert info['params'] == info['backbone_params']
    out = subprocess.run([sys.executable, os.path.join(REPO_ROOT, 'tools', 'analysis',
                                                       'get_flops.py'),
                          os.path.join(REPO_ROOT, 'configs', 'seg', 'toy', 'fpn_inline_pvt_toy.py'),
                          os.path.join(REPO_ROOT, 'configs', 'det', 'toy',
                                       'mask_rcnn_inline_pvt_toy.py'),
                          '--size', '96x64', '--out', str(tmp_path / 'flops.json')],
                         capture_output=True, text=True, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count('FLOPs:') == 2 and '| fpn_inline_pvt_toy.py |' in out.stdout
    rows = json.loads((tmp_path / 'flops.json').read_text())
    assert [os.path.basename(r['config']) for r in rows] == ['fpn_inline_pvt_toy.py',
                                                             'mask_rcnn_inline_pvt_toy.py']
    for row in rows:  # same backbone, different heads: the whole-model figures differ
        assert row['shape'] == [64, 96] and row['flops'] > 0
        assert row['params'] == row['model_params'] > row['backbone_params']
    assert rows[0]['backbone_params'] == rows[1]['backbone_params']
    assert rows[0]['flops'] != rows[1]['flops']


@pytest.mark.slow
def test_benchmark_writes_json_and_png(tmp_path):
    results = benchmark.main(['--compare', 'pvt', 'swin', '--sizes', '64', '96x64', '--warmup', '1',
                              '--repeats', '2', '--threads', '1', '--peak-size', '512',
                              '--peak-repeats', '1', '--out', str(tmp_path)])
    data = json.loads((tmp_path / 'benchmark.json').read_text())
    assert data['rows'] == json.loads(json.dumps(results['rows']))
    assert {r['model'] for r in data['rows']} == {'inline_pvt_t', 'mmdet_pvt_t', 'inline_swin_t',
                                                  'mmdet_swin_t'}
    for row in data['rows']:
        assert row['latency_ms']['median'] > 0 and row['peak_mem_mb'] >= 0
        assert row['latency_ms']['p25'] <= row['latency_ms']['p75']
    assert len(data['ratios']) == 4 and all(r['latency'] > 0 for r in data['ratios'])
    assert set(data['slopes']) == {f'{m}/1/fp32' for m in ('inline_pvt_t', 'mmdet_pvt_t',
                                                         'inline_swin_t', 'mmdet_swin_t')}
    png = (tmp_path / 'benchmark.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n'


def test_slope_of_a_power_law():
    pts = [(p, 3.0 * p ** 1.5) for p in (1e4, 4e4, 1.6e5)]
    assert benchmark.slope(pts) == pytest.approx(1.5)
    # measured (noisy) latencies: the least-squares slope in log-log, as numpy fits it
    noisy = [(1e4, 2.0), (4e4, 9.0), (1.6e5, 24.0), (6.4e5, 130.0)]
    fit = np.polyfit(np.log([p for p, _ in noisy]), np.log([t for _, t in noisy]), 1)[0]
    assert benchmark.slope(noisy) == pytest.approx(fit)


def test_inline_rows_match_the_dense_matrix():
    torch.manual_seed(0)
    heads, n, d = 1, 20, 8
    q, k = torch.randn(heads, n, d), torch.randn(heads, n, d)
    # the production attention applied to V = I returns the full N x N matrix
    dense = inline_attention(q[None], k[None], torch.eye(n)[None, None].expand(1, heads, n, n),
                             d ** -0.5)[0, 0]
    idx = torch.tensor([0, 7, 19])
    rows = vis_attention.inline_rows(q, k, idx, d ** -0.5)
    torch.testing.assert_close(rows, dense[idx], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rows.sum(-1), torch.ones(3))


def test_injectivity_check_finds_linear_attention_collisions():
    torch.manual_seed(0)
    q, k = torch.rand(1, 7, 4), torch.rand(1, 30, 4)
    q[0, 1] = 3 * q[0, 0]  # parallel queries: identical linear attention, not InLine
    q[0, 6] = q[0, 5] + 1e-6  # a near-duplicate query: not a distinct pair
    idx = torch.arange(7)
    pairs = vis_attention.distinct_pairs(q)
    assert len(pairs) == 7 * 6 // 2 - 1 and [5, 6] not in pairs.tolist()
    assert vis_attention.collisions(vis_attention.linear_rows(q, k, idx), pairs) == 1
    assert vis_attention.collisions(vis_attention.inline_rows(q, k, idx, 0.5), pairs) == 0


def test_scaled_queries_separate_inline_from_linear_attention():
    torch.manual_seed(0)
    q, k = torch.randn(2, 40, 8), torch.randn(2, 40, 8)
    change = vis_attention.scaled_query_change(q, k, torch.arange(10), 8 ** -0.5, None)
    assert change['linear']['unchanged_rows'] == change['linear']['rows'] == 20
    assert change['linear']['max_relative_change'] < 1e-5
    assert change['inline']['unchanged_rows'] == 0
    assert change['inline']['min_relative_change'] > 1e-3


@pytest.mark.slow
def test_vis_attention_writes_an_image(tmp_path):
    import cv2
    image = tmp_path / 'img.png'
    cv2.imwrite(str(image), (np.random.RandomState(0).rand(64, 80, 3) * 255).astype(np.uint8))
    out = tmp_path / 'attn.png'
    report = vis_attention.main([str(image), '--backbone', 'inline_pvt_t', '--block', '2.1',
                                 '--queries', '0.2,0.3', '0.8,0.5', '--size', '64',
                                 '--sample', '32', '--out', str(out)])
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert report['grid'] == [8, 8]
    assert report['row_sums_inline'] == pytest.approx([1.0, 1.0], abs=1e-4)
    assert report['collisions_inline'] == 0
    assert report['distinct_pairs'] + report['near_duplicate_query_pairs'] == 32 * 31 // 2
    assert report['scaled_queries']['inline']['unchanged_rows'] == 0
    assert report['scaled_queries']['linear']['unchanged_rows'] == 64


@pytest.mark.slow
def test_training_iteration_benchmark(tmp_path):
    out = tmp_path / 'train.json'
    result = benchmark_train.main(['--size', '96x64', '--batch-size', '1', '--objects', '2',
                                   '--warmup', '0', '--repeats', '2', '--threads', '1',
                                   '--peak-size', '256', '--out', str(out)])
    data = json.loads(out.read_text())
    assert set(data['rows']) == {'InLinePVT(tiny)', 'mmdet_pvt_t'}
    for row in data['rows'].values():
        assert len(row['times_s']) == 2 and row['median_s'] > 0
    assert data['ratio'] == pytest.approx(data['rows']['InLinePVT(tiny)']['median_s']
                                          / data['rows']['mmdet_pvt_t']['median_s'])
    assert data['size'] == [64, 96] and result['batch_size'] == 1


@pytest.mark.slow
def test_training_iteration_breakdown():
    toy = os.path.join(REPO_ROOT, 'configs', 'det', 'toy', 'mask_rcnn_inline_pvt_toy.py')
    result = benchmark_train.main([toy, '--softmax-backbone', 'none', '--size', '96x64',
                                   '--batch-size', '1', '--objects', '2', '--warmup', '1',
                                   '--repeats', '1', '--threads', '1', '--breakdown',
                                   '--peak-size', '256'])
    (row, ) = result['rows'].values()
    b = row['breakdown']
    assert set(b['forward_s']) == set(benchmark_train.DETECTOR_PARTS)
    assert all(0 < sec < b['step_s'] for sec in b['forward_s'].values())
    assert b['rest_s'] > 0
    assert b['rest_s'] + sum(b['forward_s'].values()) == pytest.approx(b['step_s'])
    # the backbone's patch embedding and the box head's convolutions run, forward and back
    names = [op['name'] for op in b['top_ops']]
    assert 'aten::convolution_backward' in names and len(names) == 12
    assert [op['self_ms'] for op in b['top_ops']] == \
        sorted((op['self_ms'] for op in b['top_ops']), reverse=True)


def test_training_iteration_benchmark_refuses_a_segmentation_config():
    from inline_mm.errors import ConfigError
    with pytest.raises(ConfigError, match='is a mmseg config: this benchmark times detector'):
        benchmark_train.main([os.path.join(REPO_ROOT, 'configs', 'seg', 'toy',
                                           'fpn_inline_pvt_toy.py'), '--repeats', '1'])


def test_vis_attention_names_the_blocks_a_backbone_has():
    from _bench_common import build_backbone

    from inline_mm.errors import ConfigError
    pvt, deit = build_backbone('inline_pvt_t'), build_backbone('inline_deit_t')
    assert vis_attention.pick_block(pvt, '2.1') is pvt.block2[1]
    assert vis_attention.pick_block(deit, '1.11') is deit.blocks[11]
    # PVT-T: depths (2, 2, 2, 2); DeiT: one stage of 12
    for model, spec, match in ((pvt, '0.0', r"has 4 stage\(s\) of \[2, 2, 2, 2\] blocks"),
                               (pvt, '1.9', 'STAGE from 1, INDEX from 0'),
                               (deit, '9.0', r'has 1 stage\(s\) of \[12\] blocks'),
                               (pvt, '1', 'STAGE.INDEX')):
        with pytest.raises(ConfigError, match=match):
            vis_attention.pick_block(model, spec)
