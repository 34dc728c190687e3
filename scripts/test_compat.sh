#!/usr/bin/env bash
# The model-level tests on the oldest supported stack (scripts/constraints-oldest.txt),
# in a second virtual environment .venv-compat.  Not part of CI (it downloads and
# builds a second torch / mmcv stack: about 15 minutes the first time on 2 cores).
#
#   make test-compat            # or: bash scripts/test_compat.sh [pytest args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export INLINE_MM_VENV="${INLINE_MM_COMPAT_VENV:-$ROOT/.venv-compat}"
export INLINE_MM_CONSTRAINTS="$ROOT/scripts/constraints-oldest.txt"
export INLINE_MM_EXTRAS="all,tests"
bash "$ROOT/scripts/install.sh"
PY="$INLINE_MM_VENV/bin/python"
"$PY" -c 'import torch, mmengine, mmcv, mmdet, mmseg, timm; print("stack: torch", torch.__version__, "| mmengine", mmengine.__version__, "| mmcv", mmcv.__version__, "| mmdet", mmdet.__version__, "| mmseg", mmseg.__version__, "| timm", timm.__version__)'
cd "$ROOT"
# the model level: attention, backbones, checkpoints (authors' files included),
# configs, the Mask R-CNN step, mmcv's ops, registration
exec "$PY" -m pytest -p no:cacheprovider tests/test_attention.py tests/test_backbones.py \
  tests/test_checkpoints.py tests/test_author_checkpoints.py tests/test_configs.py \
  tests/test_mask_rcnn.py tests/test_ops.py tests/test_registry.py "$@"
