#!/usr/bin/env bash
# One short GPU run (< 8 minutes): parity of the GPU path with the CPU reference, and timings.
# On the GPU node, from the repo root:  bash scripts/gpu_check.sh   (PYTHON=... to pick an interpreter)
# Uses the machine's own torch (no install); writes gpu_check.json to $OUT or the repo root.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'PYCHECK'
import sys
try:
    import torch
except ImportError:
    sys.exit("gpu_check: torch is not installed for this interpreter; set PYTHON=/path/to/python")
if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible; run this on a GPU node")
PYCHECK
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv || true
timeout 480 "$PY" -m trtspec.gpu_check
