#!/usr/bin/env bash
# One install path for every command of the project (make demo, make test, CI).
#
# Creates .venv in the checkout with Python 3.11 and installs the pinned
# OpenMMLab stack in the order the toolkits need, then inline-mm in editable
# mode.  mmcv 2.1.0 has no wheel for torch 2.14: it is built once from its sdist
# with the compiled ops (C++20, as torch 2.14's headers require) and the wheel
# is cached outside the checkout so later installs reuse it.
#
# Idempotent: a second run checks a stamp and returns in seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${INLINE_MM_VENV:-$ROOT/.venv}"
PYTHON_BIN="${PYTHON:-python3.11}"

# The exact stack: scripts/constraints.txt (setup.cfg declares ranges only).
CONSTRAINTS="${INLINE_MM_CONSTRAINTS:-$ROOT/scripts/constraints.txt}"
pin() { sed -n "s/^$1==\([^ ]*\).*/\1/p" "$CONSTRAINTS"; }
TORCH_VERSION="$(pin torch)"
# the line of the toolkits the constraints pin: OpenMMLab's (mmengine, mmcv) or OneDL's
# continuation (onedl-mmengine, onedl-mmcv: scripts/constraints-onedl.txt), same import names
if grep -q '^onedl-mmcv==' "$CONSTRAINTS"; then
  MMENGINE_DIST=onedl-mmengine MMCV_DIST=onedl-mmcv
else
  MMENGINE_DIST=mmengine MMCV_DIST=mmcv
fi
MMCV_VERSION="$(pin "$MMCV_DIST")"
# the file-name form of the distribution name (sdists and wheels: onedl_mmcv-2.3.6...)
MMCV_STEM="${MMCV_DIST//-/_}"
# extras of inline-mm installed by this script; INLINE_MM_EXTRAS overrides (e.g. "mmdet,tests")
EXTRAS="${INLINE_MM_EXTRAS:-all,tests,deploy}"

CACHE_DIR="${INLINE_MM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/inline-mm}"
WHEEL_DIR="$CACHE_DIR/wheels/$MMCV_DIST-$MMCV_VERSION-torch$TORCH_VERSION-py311"

say() { printf '\033[1m[install]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[install] ERROR:\033[0m %s\n' "$*" >&2; exit 1; }
step() {  # step "description" command...
  local what="$1"; shift
  say "$what"
  "$@" || die "step failed: $what (command: $*)"
}

# The stamp records everything that decides the environment's content; when it
# matches, the environment is complete and nothing is reinstalled.
STAMP_CONTENT="extras=$EXTRAS constraints=$(sha1sum "$CONSTRAINTS" | cut -c1-12) setup=$(sha1sum "$ROOT/setup.cfg" | cut -c1-12)"
STAMP="$VENV/.inline-mm-installed"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]] \
   && "$VENV/bin/python" -c 'import inline_mm' 2>/dev/null; then
  say "environment up to date: $VENV"
  exit 0
fi

command -v "$PYTHON_BIN" >/dev/null || die "$PYTHON_BIN not found: inline-mm needs CPython 3.11 (set PYTHON=/path/to/python3.11)"
"$PYTHON_BIN" -c 'import sys; assert sys.version_info[:2] == (3, 11)' \
  || die "$PYTHON_BIN is not Python 3.11 (the pinned torch / mmcv builds are for 3.11)"

# torch's x86_64 wheel on PyPI is the CUDA build: the environment takes about
# 6.5 GB.  Check the disk first, so a full disk stops here with a clear message
# instead of in the middle of pip.
NEED_GB="${INLINE_MM_NEED_GB:-8}"
if ! { [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c 'import torch' 2>/dev/null; }; then
  mkdir -p "$(dirname "$VENV")"
  free_kb="$(df -Pk "$(dirname "$VENV")" | awk 'NR == 2 {print $4}')"
  if [[ -n "$free_kb" ]] && (( free_kb < NEED_GB * 1024 * 1024 )); then
    die "only $(( free_kb / 1024 / 1024 )) GB free on the disk of $(dirname "$VENV"); the environment needs about $NEED_GB GB (torch's CUDA build alone is 5.5 GB). Free some space, or set INLINE_MM_VENV to a folder on a larger disk."
  fi
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  step "creating virtual environment $VENV" "$PYTHON_BIN" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check -c "$CONSTRAINTS")

step "upgrading pip and wheel" "${PIP[@]}" -q --upgrade pip wheel
step "installing torch $TORCH_VERSION + torchvision (large: a few minutes the first time)" \
  "${PIP[@]}" torch torchvision
step "installing setuptools (mmengine imports pkg_resources)" "${PIP[@]}" -q setuptools
step "installing $MMENGINE_DIST" "${PIP[@]}" -q "$MMENGINE_DIST" numpy

# On a machine with a GPU and the CUDA compiler, mmcv's ops are built for CUDA as well
# (Mask R-CNN's RoIAlign / NMS on the GPU: make test-gpu); INLINE_MM_MMCV_CUDA=0 / 1
# overrides.  The CUDA build is cached apart from the CPU-only one.
if [[ -z "${INLINE_MM_MMCV_CUDA:-}" ]]; then
  INLINE_MM_MMCV_CUDA=0
  if command -v nvcc >/dev/null \
     && "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    INLINE_MM_MMCV_CUDA=1
  fi
fi
if [[ "$INLINE_MM_MMCV_CUDA" == 1 ]]; then
  WHEEL_DIR="$WHEEL_DIR-cuda"
fi

mmcv_ops_ok() {
  MMCV_VERSION="$MMCV_VERSION" OPS_DEVICES="cpu$([[ $INLINE_MM_MMCV_CUDA == 1 ]] && echo ' cuda')" \
    "$PY" - <<'PYEOF' 2>/dev/null
import os, torch, mmcv
from mmcv.ops import RoIAlign, nms, batched_nms
assert mmcv.__version__ == os.environ['MMCV_VERSION']
for device in os.environ['OPS_DEVICES'].split():
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.]],
                         device=device)
    scores = torch.tensor([0.9, 0.8, 0.7], device=device)
    keep = nms(boxes, scores, 0.5)[1]
    assert keep.tolist() == [0, 2], keep
    # per class: the overlapping box of another class stays
    keep = batched_nms(boxes[[0, 1, 2, 1]], torch.cat([scores, scores[-1:] - 0.1]),
                       torch.tensor([0, 0, 0, 1], device=device), dict(iou_threshold=0.5))[1]
    assert keep.tolist() == [0, 2, 3], keep
    feat = torch.arange(64., device=device).view(1, 1, 8, 8)
    rois = torch.tensor([[0., 0., 0., 4., 4.]], device=device)
    assert RoIAlign((2, 2), 1.0, 2)(feat, rois).shape == (1, 1, 2, 2)
PYEOF
}

if mmcv_ops_ok; then
  say "mmcv $MMCV_VERSION with ops already installed"
else
  shopt -s nullglob
  wheels=("$WHEEL_DIR"/"$MMCV_STEM"-"$MMCV_VERSION"-*.whl)
  if (( ${#wheels[@]} == 0 )); then
    say "no cached $MMCV_DIST wheel in $WHEEL_DIR: building $MMCV_DIST $MMCV_VERSION with ops from its sdist (about 15 minutes on 2 cores)"
    BUILD="$(mktemp -d)"
    trap 'rm -rf "$BUILD"' EXIT
    step "downloading the $MMCV_DIST $MMCV_VERSION sdist" \
      "$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$BUILD" "$MMCV_DIST==$MMCV_VERSION"
    # mmcv-2.1.0.tar.gz, onedl_mmcv-2.3.6.tar.gz: the one sdist downloaded
    sdists=("$BUILD"/*.tar.gz)
    (( ${#sdists[@]} == 1 )) || die "expected one $MMCV_DIST sdist in $BUILD"
    step "unpacking the sdist" tar -xzf "${sdists[0]}" -C "$BUILD"
    SRC="${sdists[0]%.tar.gz}"
    # Recent torch headers stop with '#error C++20 or later compatible compiler
    # is required': mmcv's setup.py pins c++14 / c++17, so raise it to c++20 there
    # (older torch, e.g. 2.1, builds with mmcv's own standard).
    if "$PY" -c 'import sys, torch; v = tuple(map(int, torch.__version__.split("+")[0].split(".")[:2])); sys.exit(v < (2, 10))'; then
      sed -i -E 's/-std=c\+\+1[47]/-std=c++20/g; s#/std:c\+\+1[47]#/std:c++20#g' "$SRC/setup.py"
      grep -q 'std=c++20' "$SRC/setup.py" || die "could not rewrite the C++ standard in mmcv's setup.py"
    fi
    step "installing mmcv's build requirements" "${PIP[@]}" -q ninja packaging addict yapf pyyaml
    mkdir -p "$WHEEL_DIR"
    (
      cd "$SRC"
      export MMCV_WITH_OPS=1 FORCE_CUDA="$INLINE_MM_MMCV_CUDA" MAX_JOBS="${MAX_JOBS:-$(nproc)}"
      step "compiling mmcv $MMCV_VERSION ops (MMCV_WITH_OPS=1, FORCE_CUDA=$FORCE_CUDA, $MAX_JOBS jobs)" \
        "$PY" -m pip wheel --no-build-isolation --no-deps -w "$BUILD/dist" .
    )
    wheels=("$BUILD"/dist/"$MMCV_STEM"-"$MMCV_VERSION"-*.whl)
    (( ${#wheels[@]} == 1 )) || die "mmcv build produced no wheel"
    # Copy then rename so a half-written wheel never sits in the cache.
    cp "${wheels[0]}" "$WHEEL_DIR/.partial" && mv "$WHEEL_DIR/.partial" "$WHEEL_DIR/$(basename "${wheels[0]}")"
    wheels=("$WHEEL_DIR/$(basename "${wheels[0]}")")
    say "cached the mmcv wheel at ${wheels[0]}"
  else
    say "reusing cached mmcv wheel ${wheels[0]}"
  fi
  step "installing mmcv $MMCV_VERSION" "${PIP[@]}" -q --no-deps "${wheels[0]}"
  step "installing mmcv's runtime requirements" "${PIP[@]}" -q addict packaging pillow pyyaml yapf opencv-python numpy
  mmcv_ops_ok || die "mmcv $MMCV_VERSION is installed but its compiled ops do not run (RoIAlign / nms); remove $WHEEL_DIR to force a rebuild"
fi

step "installing inline-mm (editable) with the extras $EXTRAS (mmdet, mmsegmentation, timm, ...)" \
  "${PIP[@]}" -q --no-build-isolation -e "$ROOT[$EXTRAS]"
step "checking the stack imports" "$PY" -c 'import mmcv, timm, inline_mm; from mmcv.ops import RoIAlign, nms'
echo "$STAMP_CONTENT" > "$STAMP"
say "done: $VENV"
