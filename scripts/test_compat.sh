#!/usr/bin/env bash
# The whole test suite (what CI runs: plain pytest with setup.cfg's settings) on one of the
# supported stacks, each in a virtual environment of its own.  Not part of CI: a stack other
# than the current one downloads and builds a second torch / mmcv (15 minutes to 2 hours
# the first time on 2 cores), and the run itself takes as long as `make test`.
#
#   STACK         constraints                      environment   inline-mm extras
#   current       scripts/constraints.txt          .venv         all,tests,deploy (OpenMMLab's line,
#                                                                 what make install / make test use)
#   oldest        scripts/constraints-oldest.txt   .venv-compat  all,tests,deploy (OpenMMLab's line)
#   onedl         scripts/constraints-onedl.txt    .venv-onedl   onedl,tests,deploy (OneDL's
#   (continuation)                                                continuation of the toolkits)
#
#   make test-compat                 # STACK=oldest; or: bash scripts/test_compat.sh [STACK] [pytest args]
#   make test-compat STACK=onedl
#   bash scripts/test_compat.sh --co -q          # oldest: build the environment, list the tests
#   bash scripts/test_compat.sh current -m "not slow"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="${STACK:-oldest}"
case "${1:-}" in
  current|oldest|onedl|continuation) STACK="$1"; shift ;;
esac
case "$STACK" in
  current)
    export INLINE_MM_VENV="${INLINE_MM_VENV:-$ROOT/.venv}"
    export INLINE_MM_CONSTRAINTS="$ROOT/scripts/constraints.txt"
    export INLINE_MM_EXTRAS="all,tests,deploy" ;;
  oldest)
    export INLINE_MM_VENV="${INLINE_MM_COMPAT_VENV:-$ROOT/.venv-compat}"
    export INLINE_MM_CONSTRAINTS="$ROOT/scripts/constraints-oldest.txt"
    # the deploy extra too (onnx / onnxruntime floors), so the ONNX tests run here as well
    export INLINE_MM_EXTRAS="all,tests,deploy" ;;
  onedl|continuation)
    export INLINE_MM_VENV="${INLINE_MM_ONEDL_VENV:-$ROOT/.venv-onedl}"
    export INLINE_MM_CONSTRAINTS="$ROOT/scripts/constraints-onedl.txt"
    export INLINE_MM_EXTRAS="onedl,tests,deploy" ;;
  *)
    echo "test_compat.sh: unknown stack '$STACK' (current, oldest, onedl / continuation)" >&2; exit 2 ;;
esac
bash "$ROOT/scripts/install.sh"
PY="$INLINE_MM_VENV/bin/python"
cd "$ROOT"
"$PY" - <<'PYEOF'
import importlib.metadata as metadata

# inline_mm first: its stack check names a wrong or mixed stack before a toolkit fails
from inline_mm.stack import COMPONENTS, check_stack
import mmcv, mmdet, mmengine, mmseg, onnx, onnxruntime, timm, torch  # noqa: F401

line = check_stack()
dists = {c: line.requirements[c][0] for c in COMPONENTS}
print(f'stack ({line.name}): torch', torch.__version__, '|',
      ' | '.join(f'{d} {metadata.version(d)}' for d in dists.values()),
      '| timm', timm.__version__, '| onnx', onnx.__version__, '| onnxruntime',
      onnxruntime.__version__)
PYEOF
# setup.cfg's -ra lists every skip with its reason (each names what this stack lacks)
exec "$PY" -m pytest "$@"
