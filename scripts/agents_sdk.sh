#!/usr/bin/env bash
# docs/AGENT_CLIENTS.md's OpenAI Agents SDK run, again: openai-agents in a venv of its own (it wants
# newer openai and pydantic than trtspec's), against `trtspec serve` of the embedded DFlash
# deployment whose chat template writes tool calls and results (tests/test_api_fuzz.py's
# TOOL_TEMPLATE: hermes' <tool_call> blocks), with --tool-call-parser hermes and --compact-json.
# Prints scripts/agents_sdk_run.py's summary: how each of the SDK's ways to run ended.
#
#   bash scripts/agents_sdk.sh [WORK]     # under a minute on 2 CPU cores, the wheels downloaded; WORK defaults to agents-sdk
set -euo pipefail
WORK=$(realpath -m "${1:-agents-sdk}")
T=${TRTSPEC:-.venv/bin/trtspec}
PY=${PYTHON:-.venv/bin/python}
VERSION=${AGENTS_VERSION:-0.24.0}
rm -rf "$WORK" && mkdir -p "$WORK"

cp -r trtspec/assets/tiny-target "$WORK/target"
"$PY" -c "import sys; from tests.test_api_fuzz import TOOL_TEMPLATE; open(sys.argv[1], 'w').write(TOOL_TEMPLATE)" \
  "$WORK/target/chat_template.jinja"
printf 'name: trtspec\nflavour: torch\ntarget:\n  path: %s\ndrafter:\n  method: dflash\n  path: %s\n' \
  "$WORK/target" "$(realpath trtspec/assets/tiny-dflash-b16)" > "$WORK/config.yaml"
"$T" build "$WORK/config.yaml" --out "$WORK/build" > "$WORK/build.log"
python3 -m venv "$WORK/venv" && "$WORK/venv/bin/pip" install -q "openai-agents==$VERSION" > "$WORK/pip.log" 2>&1

source "$(dirname "${BASH_SOURCE[0]}")/wait_serving.sh"  # wait_serving PID LOG
"$T" serve "$WORK/build" --http-port 18310 --grpc-port 18311 --metrics-port 18312 --openai-port 19310 \
  --api-key agents --tool-call-parser hermes --compact-json > "$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
wait_serving $SERVER "$WORK/serve.log"
"$WORK/venv/bin/python" "$(dirname "${BASH_SOURCE[0]}")/agents_sdk_run.py" http://127.0.0.1:19310 agents
