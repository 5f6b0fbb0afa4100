#!/usr/bin/env bash
# The GPU run rehearsed on this CPU at the GPU image's package versions, before device time is spent.
# The suite rehearses scripts/gpu_check.sh --small through the image's import guard, but with this
# machine's packages (transformers, numpy, Triton newer than the image's); this builds a venv of what
# trtspec imports there, at the versions trtspec/gpu/h200_packages.txt pins (transformers 5.17,
# onnx 1.23.1, onnxruntime 1.30, Triton 3.6, ...) plus the carried wheels' pins (trtspec/gpu/wheels.txt),
# and runs the same rehearsal in it. Two stand-ins: torch 2.13.0+cpu for 2.11.0+cu130 (no GPU here),
# and numpy 2.3.5 for 2.5.2 (Triton 3.6's interpreter, which --small runs the kernels in, cannot run
# them under numpy >= 2.4, whatever the Python; on the GPU they are compiled, and 2.5.2 also needs
# Python >= 3.12).
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
requirements=("numpy==2.3.5")
for name in transformers tokenizers safetensors huggingface-hub onnx onnx-ir onnxscript onnxruntime triton; do
  requirements+=("$(pin "$name" "$image")")
done
mapfile -t -O "${#requirements[@]}" requirements < <(grep -E '^[a-z].*==' "$carried")
requirements+=(pyyaml tqdm jinja2 click rich regex matplotlib)  # on the image, any version
if [ "${1:-}" = "--requirements" ]; then printf '%s\n' "${requirements[@]}"; exit 0; fi

# this workplace's pip finds torch 2.13.0+cpu among its local wheels; from PyPI alone the pin is a
# CUDA build (add --index-url https://download.pytorch.org/whl/cpu there)
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q "${requirements[@]}"
"$VENV/bin/pip" list 2>/dev/null | grep -E '^(torch|transformers|numpy|onnx|onnxruntime|triton|pydantic|xgrammar) '

rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
# the guard (tests/image_guard) refuses any import the image could not serve, as in the suite's test
unset TRITON_INTERPRET  # gpu_check --small sets it itself, as it must on a CPU
PYTHONPATH="$PWD/tests/image_guard:$PWD" PYTHON="$VENV/bin/python" \
  TRTSPEC_IMAGE_GUARD_LOG="$OUT_DIR/refused_imports.log" \
  bash scripts/gpu_check.sh --small --models qwen3-8b --budget-s 600 --out "$OUT_DIR"
