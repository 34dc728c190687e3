"""benchmark.py's report: the summaries of its rows (ratios, log-log slopes), the printed
table and the plot of latency against pixels."""
from typing import Dict, List, Optional, Tuple

from _bench_common import COUNTERPARTS, describe_cpu, slope

from inline_mm.engine.cli_sizes import format_size


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 5))
    series: Dict[Tuple[str, int, str], List[Tuple[int, float]]] = {}
    for row in results['rows']:
        series.setdefault((row['model'], row['batch'], row['dtype'], row['runtime']),
                          []).append((row['pixels'], row['latency_ms']['median']))
    for (model, batch, dtype, runtime), pts in sorted(series.items()):
        pts.sort()
        where = ', onnxruntime' if runtime == 'onnxruntime' else ''
        ax.plot([p for p, _ in pts], [t for _, t in pts], marker='o',
                linestyle='--' if where else '-', label=f'{model} (b{batch}, {dtype}{where})')
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('pixels per image (H x W)')
    ax.set_ylabel('latency per batch (ms)')
    threads = f", {results['threads']} threads" if results.get('threads') else ''
    ax.set_title(f"forward latency, {results['device_name']}{threads}")
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _twin(rows: List[dict], row: dict, **change) -> Optional[dict]:
    """The row of the same model, size, batch, dtype and runtime, with ``change`` applied."""
    want = {k: row[k] for k in ('model', 'pixels', 'batch', 'dtype', 'runtime')}
    want.update(change)
    return next((x for x in rows if all(x[k] == v for k, v in want.items())), None)


def _series(r: dict) -> tuple:
    return r['model'], r['batch'], r['dtype'] + ('' if r['runtime'] == 'torch' else
                                                 ' ' + r['runtime'])


def summarise(rows: List[dict], compare: List[str]) -> dict:
    """Slopes of latency against pixels, InLine / softmax, reduced precision / fp32 and
    onnxruntime / PyTorch ratios."""
    out = dict(slopes={}, ratios=[], dtype_ratios=[], runtime_ratios=[])
    # slopes over the sizes >= 512x512 when there are two; None with one size
    for key in sorted({_series(r) for r in rows}):
        pts = [(r['pixels'], r['latency_ms']['median']) for r in rows if _series(r) == key]
        big = [p for p in pts if p[0] >= 512 * 512]
        pts = big if len(big) >= 2 else pts
        value = slope(pts) if len({p for p, _ in pts}) >= 2 else None
        out['slopes']['/'.join(map(str, key))] = value

    def latency(r: dict, base: dict) -> float:
        return r['latency_ms']['median'] / base['latency_ms']['median']

    for fam in compare:
        inline, softmax = COUNTERPARTS[fam]
        for r in rows:
            s = _twin(rows, r, model=softmax) if softmax and r['model'] == inline else None
            if s is None:
                continue
            ratio = dict(family=fam, size=format_size((r['height'], r['width'])),
                         batch=r['batch'], dtype=r['dtype'], runtime=r['runtime'],
                         latency=latency(r, s))
            if 'peak_mem_mb' in r and 'peak_mem_mb' in s:
                ratio['memory'] = r['peak_mem_mb'] / max(s['peak_mem_mb'], 1e-9)
            out['ratios'].append(ratio)
    for r in rows:
        size = format_size((r['height'], r['width']))
        base = _twin(rows, r, dtype='fp32') if r['dtype'] != 'fp32' else None
        if base is not None:  # reduced precision against fp32, same model, size and batch
            out['dtype_ratios'].append(dict(model=r['model'], size=size, batch=r['batch'],
                                            dtype=r['dtype'], latency=latency(r, base)))
        # onnxruntime and compiled rows against PyTorch eager (same dtype); not for a
        # detector's backbone + neck in onnxruntime, whose PyTorch row is the whole detector
        base = _twin(rows, r, runtime='torch') if r['runtime'] != 'torch' and \
            r.get('part') != 'backbone_neck' else None
        if base is not None:
            out['runtime_ratios'].append(dict(
                model=r['model'], runtime=r['runtime'], part=r.get('part', 'whole'),
                size=size, batch=r['batch'], dtype=r['dtype'], latency=latency(r, base)))
    return out


def _cell(value: Optional[float], width: int, scale: float = 1.0) -> str:
    return f'{value * scale:{width}.1f}' if value is not None else f'{"-":>{width}s}'


def print_table(results: dict) -> None:
    print(describe_cpu(results['cpu']))
    peaks, threads = results['matmul_peak_gflop_per_s'], results['threads']
    if peaks:
        where = f'{threads} threads' if threads else results['device_name']
        print(f'matmul peak ({where}): ' + ', '.join(
            f"{d} {v:.1f} GFLOP/s ({results['matmul_peak_size'][d]}^3)"
            for d, v in peaks.items()))
    print(f"{'model':18s} {'size':>10s} {'b':>2s} {'dtype':>5s} {'runtime':>11s} "
          f"{'median ms':>10s} {'p25-p75 ms':>15s} {'img/s':>8s} {'GFLOP':>7s} {'GFLOP/s':>8s} "
          f"{'% peak':>6s} {'peak MB':>8s}")
    for r in results['rows']:
        lat = r['latency_ms']
        print(f"{r['model']:18s} {r['width']:>5d}x{r['height']:<4d} {r['batch']:>2d} "
              f"{r['dtype']:>5s} {r['runtime']:>11s} {lat['median']:10.1f} "
              f"{lat['p25']:7.1f}-{lat['p75']:<7.1f} "
              f"{r['throughput_img_s']:8.2f} {_cell(r.get('gflop'), 7)} "
              f"{_cell(r.get('gflop_per_s'), 8)} {_cell(r.get('peak_fraction'), 6, 100)} "
              f"{_cell(r.get('peak_mem_mb'), 8)}")
    for ratio in results['ratios']:
        mem = f", memory {ratio['memory']:.2f}x" if 'memory' in ratio else ''
        print(f"InLine/softmax {ratio['family']:5s} {ratio['size']:>10s} b{ratio['batch']} "
              f"{ratio['dtype']} {ratio['runtime']}: latency {ratio['latency']:.2f}x{mem}")
    for ratio in results['dtype_ratios']:
        print(f"{ratio['dtype']}/fp32 {ratio['model']:18s} {ratio['size']:>10s} "
              f"b{ratio['batch']}: latency {ratio['latency']:.2f}x")
    for ratio in results['runtime_ratios']:
        label = 'onnxruntime/PyTorch' if ratio['runtime'] == 'onnxruntime' else 'compiled/eager'
        print(f"{label} {ratio['model']:18s} ({ratio['part']}) "
              f"{ratio['size']:>10s} b{ratio['batch']} {ratio['dtype']}: "
              f"latency {ratio['latency']:.2f}x")
    for row in results['failed_rows']:
        what = 'not exported' if row['runtime'] == 'onnxruntime' else 'failed'
        print(f"{row['runtime']} {row['model']} at {row['width']}x{row['height']}: {what} "
              f"({row['error'][:200]})")
    for key, value in results['slopes'].items():
        model, batch, dtype = key.rsplit('/', 2)  # config paths contain '/'
        print(f'log-log slope of latency vs pixels, {model} b{batch} {dtype}: '
              f"{'n/a (one size)' if value is None else f'{value:.2f}'}")
