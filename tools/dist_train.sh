#!/usr/bin/env bash
# Multi-process training through torchrun: bash tools/dist_train.sh CONFIG NPROC [train.py args]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT (defaults 1, 0, 127.0.0.1, 29500); run the
# same command on every node with its own NODE_RANK.
# MAX_RESTARTS=N (default 0): torchrun restarts all processes up to N times after a failure or a
# preemption (SIGTERM / SIGUSR1: checkpoint, exit status 75), and --resume is added so each
# restart continues from the newest readable checkpoint of the work dir (docs/reliability.md).
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
MAX_RESTARTS=${MAX_RESTARTS:-0}
EXTRA=()
if [[ "$MAX_RESTARTS" -gt 0 ]]; then
  resume_given=0
  for arg in "$@"; do [[ "$arg" == --resume* ]] && resume_given=1; done
  [[ $resume_given -eq 1 ]] || EXTRA=(--resume)
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-$( [[ -x "$ROOT/.venv/bin/python" ]] && echo "$ROOT/.venv/bin/python" || echo python )}
PYTHONPATH="$ROOT:${PYTHONPATH:-}" \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" --master_port="$PORT" --max-restarts="$MAX_RESTARTS" \
    "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "$@" ${EXTRA[@]+"${EXTRA[@]}"}
