#!/usr/bin/env bash
# Training on a Slurm cluster:
#   GPUS=16 bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args]
# GPUS (total, default 8), GPUS_PER_NODE (8), CPUS_PER_TASK (5), SRUN_ARGS (''),
# MAX_RESTARTS (10).
#
# Preemption (docs/reliability.md): the job asks Slurm for SIGUSR1 two minutes before its time
# limit (--signal=USR1@120); on SIGUSR1 or SIGTERM every process finishes its iteration, rank 0
# writes a checkpoint and all exit with status 75.  --resume is always passed, so a new start
# continues from the newest readable checkpoint of WORK_DIR (or from scratch if there is none).
# On status 75 the script requeues the job when it runs inside an sbatch allocation
# (scontrol requeue $SLURM_JOB_ID; submit with --requeue), and otherwise starts srun again,
# at most MAX_RESTARTS times.  With --kill-on-bad-exit, Slurm kills the other tasks once
# the first exits with 75, and srun may then return 128 + the signal: the file
# WORK_DIR/preempted (inline_mm.engine.PREEMPTED_MARKER), which rank 0 writes before
# any process exits, counts as status 75 (a relative WORK_DIR is read below srun's --chdir / -D
# when SRUN_ARGS has one, as the tasks resolve it).
set -uo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [tools/train.py arguments]" >&2
  exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
if [[ -z "$WORK_DIR" ]]; then  # train.py would fall back to the config's work dir
  echo "error: WORK_DIR is empty: name the folder the run writes its checkpoints to" >&2
  exit 2
fi
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
MAX_RESTARTS=${MAX_RESTARTS:-10}
PREEMPTED=75  # inline_mm.engine.PREEMPTED_EXIT_CODE
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-$( [[ -x "$ROOT/.venv/bin/python" ]] && echo "$ROOT/.venv/bin/python" || echo python )}
RESUME=(--resume)
for arg in "$@"; do [[ "$arg" == --resume* ]] && RESUME=(); done
RUN_DIR=$WORK_DIR  # a --work-dir among the train.py arguments comes last and wins
prev=""
for arg in "$@"; do
  [[ "$prev" == --work-dir ]] && RUN_DIR=$arg
  [[ "$arg" == --work-dir=* ]] && RUN_DIR=${arg#--work-dir=}
  prev=$arg
done
# srun's --chdir / -D in SRUN_ARGS moves the tasks: a relative work dir is below it
prev=""
TASK_DIR=""  # from SRUN_ARGS only, never from the environment
for arg in ${SRUN_ARGS}; do
  [[ "$prev" == --chdir || "$prev" == -D ]] && TASK_DIR=$arg
  [[ "$arg" == --chdir=* ]] && TASK_DIR=${arg#--chdir=}
  [[ "$arg" == -D?* ]] && TASK_DIR=${arg#-D}
  prev=$arg
done
[[ -n "${TASK_DIR:-}" && "$RUN_DIR" != /* ]] && RUN_DIR="$TASK_DIR/$RUN_DIR"
MARKER="$RUN_DIR/preempted"  # inline_mm.engine.PREEMPTED_MARKER
restarts=0
while true; do
  rm -f -- "$MARKER"  # a marker of an earlier start must not requeue a failed one
  PYTHONPATH="$ROOT:${PYTHONPATH:-}" \
  srun -p "$PARTITION" --job-name="$JOB_NAME" --gres=gpu:"$GPUS_PER_NODE" \
      --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" \
      --kill-on-bad-exit=1 --signal=USR1@120 ${SRUN_ARGS} \
      "$PYTHON" -u "$ROOT/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher slurm \
      "$@" ${RESUME[@]+"${RESUME[@]}"}
  status=$?
  if [[ $status -ne $PREEMPTED && -f "$MARKER" ]]; then
    echo "srun returned $status; the run had stopped for a preemption: $(cat "$MARKER")" >&2
    status=$PREEMPTED
  fi
  [[ $status -eq $PREEMPTED ]] || exit $status
  if [[ -n "${SLURM_JOB_ID:-}" ]]; then
    echo "preempted: checkpoint written, requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID"
    exit $status
  fi
  restarts=$((restarts + 1))
  if [[ $restarts -gt $MAX_RESTARTS ]]; then
    echo "preempted $restarts times, giving up (MAX_RESTARTS=$MAX_RESTARTS)" >&2
    exit $status
  fi
  echo "preempted: checkpoint written, starting again with --resume ($restarts/$MAX_RESTARTS)" >&2
done
