#!/usr/bin/env bash
# Download, on a machine with the package index, the wheels the GPU machine's image lacks
# (trtspec/gpu/wheels.txt: pydantic and each of its requirements the image does not hold) into .whl/
# (git-ignored), for CPython 3.12 on manylinux x86_64, then prove each requirement of each wheel is
# carried or on the image (trtspec/gpu/h200_packages.txt). scripts/gpu_check.sh installs them there
# with no network. Usage, from anywhere:  bash scripts/gpu_wheels.sh   (PYTHON=... picks the pip)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
rm -rf .whl
mkdir -p .whl
# pip matches each manylinux tag exactly, so name every glibc level a wheel may be tagged with
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl -r trtspec/gpu/wheels.txt
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m trtspec.gpu.image check-wheels .whl
