#!/usr/bin/env bash
# The GPU run rehearsed on this CPU at the GPU image's package versions, before device time is spent.
# The suite rehearses scripts/gpu_check.sh --small through the image's import guard, but with this
# machine's packages (transformers, numpy, Triton newer than the image's); this builds a venv of what
# trtspec imports there, at the versions trtspec/gpu/h200_packages.txt pins (transformers 5.17,
# onnx 1.23.1, onnxruntime 1.30, Triton 3.6, ...) plus the carried wheels' pins (trtspec/gpu/wheels.txt),
# and runs the same rehearsal in it. Stand-ins where the image's own cannot install here: torch
# 2.13.0+cpu for 2.11.0+cu130, and, under a Python older than 3.12, numpy 2.3.5 for 2.5.2 (Triton
# 3.6's interpreter cannot run the kernels under numpy >= 2.4; on the GPU they are compiled).
#   bash scripts/image_rehearsal.sh [--out DIR]   (VENV=DIR keeps the venv, BASE_PYTHON picks its Python)
#   bash scripts/image_rehearsal.sh --requirements   (what it would install besides torch; nothing else)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-/tmp/trtspec-image-venv}
BASE_PYTHON=${BASE_PYTHON:-python3}
OUT_DIR=/tmp/trtspec-image-rehearsal
if [ "${1:-}" = "--out" ] && [ -n "${2:-}" ]; then OUT_DIR=$2; fi

pin() {  # NAME==VERSION as a pins file lists it
  grep -E "^$1==" "$2" || { echo "image_rehearsal: no pin for $1 in $2" >&2; exit 2; }
}
image=trtspec/gpu/h200_packages.txt
carried=trtspec/gpu/wheels.txt
[ -x "$VENV/bin/python" ] || [ "${1:-}" = "--requirements" ] || "$BASE_PYTHON" -m venv "$VENV"
python=$([ -x "$VENV/bin/python" ] && echo "$VENV/bin/python" || echo "$BASE_PYTHON")
if [ "$("$python" -c 'import sys; print(sys.version_info >= (3, 12))')" = "True" ]; then
  requirements=("$(pin numpy "$image")")
else
  requirements=("numpy==2.3.5")
fi
for name in transformers tokenizers safetensors huggingface-hub onnx onnx-ir onnxscript onnxruntime triton; do
  requirements+=("$(pin "$name" "$image")")
done
mapfile -t -O "${#requirements[@]}" requirements < <(grep -E '^[a-z].*==' "$carried")
requirements+=(pyyaml tqdm jinja2 click rich regex matplotlib)  # on the image, any version
if [ "${1:-}" = "--requirements" ]; then printf '%s\n' "${requirements[@]}"; exit 0; fi

"$VENV/bin/pip" install -q torch==2.13.0  # the CPU wheel; an unpinned torch pulls a CUDA build
"$VENV/bin/pip" install -q "${requirements[@]}"
"$VENV/bin/pip" list 2>/dev/null | grep -E '^(torch|transformers|numpy|onnx|onnxruntime|triton|pydantic|xgrammar) '

rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
# the guard (tests/image_guard) refuses any import the image could not serve, as in the suite's test
PYTHONPATH="$PWD/tests/image_guard:$PWD" PYTHON="$VENV/bin/python" \
  TRTSPEC_IMAGE_GUARD_LOG="$OUT_DIR/refused_imports.log" \
  bash scripts/gpu_check.sh --small --models qwen3-8b --budget-s 600 --out "$OUT_DIR"
