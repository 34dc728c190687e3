#!/usr/bin/env bash
# OpenMMLab's line against OneDL's continuation, on this machine: the backbone forward
# (tools/analysis/benchmark.py: InLine-PVT-T and mmdet's PVT-T at 1333x800) and one Mask
# R-CNN training iteration (tools/analysis/benchmark_train.py: batch 2 at 800x800, InLine
# and softmax backbone), in fp32 and bf16.  Each line runs in its own environment (.venv
# from make install, .venv-onedl from make test-compat STACK=onedl); the two lines take
# turns round by round, so that machine noise hits both alike.  torch is the same on both
# lines; what differs is the toolkits' code and mmcv's compiled ops (RoIAlign, NMS).
#
#   bash scripts/compare_lines.sh            # 2 rounds; figures in work_dirs/compare_lines/
#   ROUNDS=3 DTYPES=fp32 bash scripts/compare_lines.sh   # e.g. on a CPU without bf16 units
#   FORWARD_SIZE=512 TRAIN_SIZE=512 REPEATS=5 bash scripts/compare_lines.sh
#
# Prints, per figure, the median over the rounds of each round's median on each line and
# OneDL / OpenMMLab; writes summary.json beside the rounds' result files.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${ROUNDS:-2}"
DTYPES="${DTYPES:-fp32 bf16}"
FORWARD_SIZE="${FORWARD_SIZE:-1333x800}"   # WIDTHxHEIGHT or N, as the tools take it
TRAIN_SIZE="${TRAIN_SIZE:-800x800}"
REPEATS="${REPEATS:-3}"                    # timed training iterations per round
OUT="${OUT:-$ROOT/work_dirs/compare_lines}"
declare -A VENV=([openmmlab]="${INLINE_MM_VENV:-$ROOT/.venv}"
                 [onedl]="${INLINE_MM_ONEDL_VENV:-$ROOT/.venv-onedl}")
declare -A MAKE=([openmmlab]="make install" [onedl]="make test-compat STACK=onedl")
for line in openmmlab onedl; do
  if ! "${VENV[$line]}/bin/python" -c 'import inline_mm, mmdet' 2>/dev/null; then
    echo "compare_lines.sh: no working environment of the $line line at ${VENV[$line]}" \
         "(\`${MAKE[$line]}\` builds it)" >&2
    exit 2
  fi
done
cd "$ROOT"
mkdir -p "$OUT"
for ((r = 1; r <= ROUNDS; r++)); do
  for line in openmmlab onedl; do
    py="${VENV[$line]}/bin/python"
    dir="$OUT/$line/round$r"
    echo "== round $r/$ROUNDS, $line ($py)"
    # shellcheck disable=SC2086  # DTYPES is a list of words
    "$py" tools/analysis/benchmark.py --compare pvt --sizes "$FORWARD_SIZE" --dtypes $DTYPES \
      --no-memory --out "$dir"
    # shellcheck disable=SC2086
    "$py" tools/analysis/benchmark_train.py --size "$TRAIN_SIZE" --batch-size 2 \
      --dtypes $DTYPES --repeats "$REPEATS" --out "$dir/train.json"
    "$py" -c 'import importlib.metadata as m, json, sys
from inline_mm.stack import COMPONENTS, check_stack
line = check_stack()
names = ["torch"] + [line.requirements[c][0] for c in COMPONENTS]
json.dump({n: m.version(n) for n in names}, open(sys.argv[1], "w"), indent=2)' \
      "$dir/versions.json"
  done
done
"${VENV[openmmlab]}/bin/python" - "$OUT" "$ROUNDS" "$FORWARD_SIZE" "$TRAIN_SIZE" <<'PYEOF'
import json, os.path as osp, statistics, sys

out, rounds, fwd_size, train_size = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lines = ('openmmlab', 'onedl')


def figures(line: str, r: int) -> dict:
    """{figure name: value} of one line's round: ms per forward, s per iteration."""
    d = osp.join(out, line, f'round{r}')
    fwd = json.load(open(osp.join(d, 'benchmark.json')))
    train = json.load(open(osp.join(d, 'train.json')))
    got = {f"forward {x['model']} {x['dtype']} {fwd_size} (ms)": x['latency_ms']['median']
           for x in fwd['rows'] if x['runtime'] == 'torch'}
    got.update({f"train iteration {x['backbone']} {x['dtype']} 2x{train_size} (s)": x['median_s']
                for x in train['rows'].values()})
    return got


per = {line: [figures(line, r) for r in range(1, rounds + 1)] for line in lines}
versions = {line: json.load(open(osp.join(out, line, 'round1', 'versions.json')))
            for line in lines}
cpu = json.load(open(osp.join(out, 'openmmlab', 'round1', 'train.json')))['cpu']
summary = dict(rounds=rounds, versions=versions, cpu=cpu, figures={})
print('\nmedian over', rounds, 'rounds;', ', '.join(
    f'{line}: ' + ' '.join(f'{k} {v}' for k, v in versions[line].items()) for line in lines))
flags = ' '.join(f for f, on in (cpu['flags'] or {}).items() if on)
print(f"CPU: {cpu['model']} ({flags}), matmul peak fp32 "
      f"{cpu['matmul_peak_gflop_per_s']['fp32']:.0f}, bf16 "
      f"{cpu['matmul_peak_gflop_per_s']['bf16']:.0f} GFLOP/s")
print(f"{'figure':<62} {'OpenMMLab':>10} {'OneDL':>10} {'OneDL/OpenMMLab':>16}")
for name in per['openmmlab'][0]:
    a = statistics.median(f[name] for f in per['openmmlab'])
    b = statistics.median(f[name] for f in per['onedl'])
    summary['figures'][name] = dict(openmmlab=a, onedl=b, ratio=b / a)
    print(f'{name:<62} {a:>10.3f} {b:>10.3f} {b / a:>16.2f}')
json.dump(summary, open(osp.join(out, 'summary.json'), 'w'), indent=2)
print('written:', osp.join(out, 'summary.json'))
PYEOF
