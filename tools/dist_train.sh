#!/usr/bin/env bash
# Multi-process training through torchrun: bash tools/dist_train.sh CONFIG NPROC [train.py args]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT (defaults 1, 0, 127.0.0.1, 29500).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 CONFIG NPROC_PER_NODE [tools/train.py arguments]" >&2
  exit 2
fi
CONFIG=$1
GPUS=$2
shift 2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-$( [[ -x "$ROOT/.venv/bin/python" ]] && echo "$ROOT/.venv/bin/python" || echo python )}
PYTHONPATH="$ROOT:${PYTHONPATH:-}" \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" --master_port="$PORT" \
    "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "$@"
