#!/usr/bin/env bash
# One GPU run, at most 8 minutes on an H200: parity of the GPU path with the CPU reference and the
# real-size cost curve (python -m trtspec.gpu_check; docs/GPU.md says what it measures).
#   bash scripts/gpu_check.sh [--out DIR] [--small] [--models qwen3-8b,llama3.1-8b] [--budget-s S]
# Writes gpu_check.json, gpu_check.md and gpu_check.log to --out (default $OUT, else the repo root).
# The machine's python3 runs it (PYTHON=... picks another). Packages its image lacks travel as wheels
# in .whl/ (scripts/gpu_wheels.sh); they are installed here with no network, into a private folder.
# --small is the CPU rehearsal the tests run (tests/test_gpu_image.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-$PWD}
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [ "${args[$i]}" = "--out" ] && [ $((i + 1)) -lt ${#args[@]} ]; then OUT_DIR=${args[$((i + 1))]}; fi
done
mkdir -p "$OUT_DIR"

if compgen -G ".whl/*.whl" >/dev/null; then
  # the wheels are built for CPython 3.12 (the image's); another interpreter keeps its own packages
  if [ "$("$PY" -I -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "3.12" ]; then
    SITE=${GPU_CHECK_SITE:-/tmp/trtspec-gpu-site}
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: installed $(ls .whl/*.whl | wc -l) wheels from .whl/ into $SITE"
  else
    echo "gpu_check: .whl/ holds CPython 3.12 wheels and $PY is not 3.12: using its own packages"
  fi
else
  echo "gpu_check: no .whl/ (run scripts/gpu_wheels.sh where the package index is reachable): using $PY's packages"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv 2>/dev/null || true; } \
  | tee "$OUT_DIR/gpu_check.log"
# at 470 s SIGTERM: gpu_check then writes what it measured and exits (the files are also rewritten
# after each measurement); a process stuck in a device call that ignores it is killed 20 s later
timeout -k 20 470 "$PY" -m trtspec.gpu_check --out "$OUT_DIR" "$@" 2>&1 | tee -a "$OUT_DIR/gpu_check.log"
