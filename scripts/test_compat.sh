#!/usr/bin/env bash
# The whole test suite (what CI runs: plain pytest with setup.cfg's settings) on the
# oldest supported stack (scripts/constraints-oldest.txt), in a second virtual
# environment .venv-compat.  Not part of CI: it downloads and builds a second
# torch / mmcv stack (about 15 minutes the first time on 2 cores), and the run
# itself takes as long as `make test`.
#
#   make test-compat            # or: bash scripts/test_compat.sh [pytest args]
#   bash scripts/test_compat.sh --co -q         # build the environment, list the tests
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export INLINE_MM_VENV="${INLINE_MM_COMPAT_VENV:-$ROOT/.venv-compat}"
export INLINE_MM_CONSTRAINTS="$ROOT/scripts/constraints-oldest.txt"
# the deploy extra too (onnx / onnxruntime floors), so the ONNX tests run here as well
export INLINE_MM_EXTRAS="all,tests,deploy"
bash "$ROOT/scripts/install.sh"
PY="$INLINE_MM_VENV/bin/python"
"$PY" -c 'import torch, mmengine, mmcv, mmdet, mmseg, timm, onnx, onnxruntime; print("stack: torch", torch.__version__, "| mmengine", mmengine.__version__, "| mmcv", mmcv.__version__, "| mmdet", mmdet.__version__, "| mmseg", mmseg.__version__, "| timm", timm.__version__, "| onnx", onnx.__version__, "| onnxruntime", onnxruntime.__version__)'
cd "$ROOT"
# setup.cfg's -ra lists every skip with its reason (each names what this stack lacks)
exec "$PY" -m pytest "$@"
