#!/usr/bin/env bash
# Entrypoint of deploy/docker/gpu.Dockerfile: plan and write the TensorRT-LLM deployment of
# $TRTSPEC_CONFIG (exit 1 with the reason if it cannot fit), then run its launcher with the
# container's arguments: `serve` (trtllm-serve) or `triton` (tritonserver; needs
# TRTLLM_LLMAPI_MODEL_DIR, see README "Real-model deployments").
set -euo pipefail
trtspec build "$TRTSPEC_CONFIG" --out "$TRTSPEC_OUT" --flavour trtllm
exec "$TRTSPEC_OUT/deploy/launch.sh" "$@"
