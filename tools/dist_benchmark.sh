#!/usr/bin/env bash
# Multi-process inference benchmark: bash tools/dist_benchmark.sh CONFIG NPROC [args]
# (tools/analysis/benchmark_inference.py). NNODES, NODE_RANK, MASTER_ADDR, PORT as in dist_train.sh.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 CONFIG NPROC_PER_NODE [tools/analysis/benchmark_inference.py arguments]" >&2
  exit 2
fi
CONFIG=$1
GPUS=$2
shift 2
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-$( [[ -x "$ROOT/.venv/bin/python" ]] && echo "$ROOT/.venv/bin/python" || echo python )}
PYTHONPATH="$ROOT:${PYTHONPATH:-}" \
"$PYTHON" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --master_addr="${MASTER_ADDR:-127.0.0.1}" \
    --nproc_per_node="$GPUS" --master_port="${PORT:-29500}" \
    "$ROOT/tools/analysis/benchmark_inference.py" "$CONFIG" --launcher pytorch "$@"
