#!/usr/bin/env bash
# docs/AGENT_CLIENTS.md, again: the coding agents as their users install them (npm), each run once
# against `trtspec serve` on a copy of the embedded model whose context is 131,072 positions (the
# agents' first requests are 20-45 kB). Prints each agent's exit code and the tail of its output.
#
#   bash scripts/agent_clients.sh [WORK]     # about 4-5 min on 2 CPU cores; WORK defaults to agent-clients
#
# Needs node/npm and the package registry. Versions as the doc's run; AGENTS_LATEST=1 takes the newest.
set -euo pipefail
WORK=$(realpath -m "${1:-agent-clients}")
T=${TRTSPEC:-.venv/bin/trtspec}
PORT=19300
URL=http://127.0.0.1:$PORT
PROMPT="What is 482 + 356?"
if [ "${AGENTS_LATEST:-0}" = 1 ]; then
  PACKAGES=(@openai/codex @anthropic-ai/claude-code opencode-ai @qwen-code/qwen-code)
else
  PACKAGES=(@openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332 opencode-ai@1.18.33 @qwen-code/qwen-code@0.24.4)
fi
rm -rf "$WORK" && mkdir -p "$WORK/run"

# the embedded target and drafter, their positions raised: RoPE takes any, the text past 4,096 is noise
cp -r trtspec/assets/tiny-target "$WORK/target" && cp -r trtspec/assets/tiny-dflash-b16 "$WORK/dflash"
sed -i 's/"max_position_embeddings": 4096/"max_position_embeddings": 131072/' "$WORK"/target/config.json \
  "$WORK"/dflash/config.json
printf 'name: trtspec\nflavour: torch\ntarget:\n  path: %s\ndrafter:\n  method: dflash\n  path: %s\nlimits:\n  max_tokens: 256\n' \
  "$WORK/target" "$WORK/dflash" > "$WORK/config.yaml"
"$T" build "$WORK/config.yaml" --out "$WORK/build" > "$WORK/build.log"
npm install --prefix "$WORK/npm" --no-audit --no-fund "${PACKAGES[@]}" > "$WORK/npm.log" 2>&1
BIN=$WORK/npm/node_modules/.bin

source "$(dirname "${BASH_SOURCE[0]}")/wait_serving.sh"  # wait_serving PID LOG
"$T" serve "$WORK/build" --http-port 18300 --grpc-port 18301 --metrics-port 18302 --openai-port $PORT \
  --tool-call-parser hermes > "$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
wait_serving $SERVER "$WORK/serve.log"

agent() {  # agent NAME COMMAND...: run one agent in $WORK/run, its output in $WORK/NAME.log
  local name=$1; shift
  local rc=0
  (cd "$WORK/run" && timeout 600 "$@") > "$WORK/$name.log" 2>&1 || rc=$?
  echo "== $name: exit $rc"
  tail -n 3 "$WORK/$name.log" | cut -c1-300
}

mkdir -p "$WORK/codex-home"
printf 'model = "trtspec"\nmodel_provider = "trtspec"\n\n[model_providers.trtspec]\nname = "trtspec"\nbase_url = "%s/v1"\nwire_api = "responses"\n' \
  "$URL" > "$WORK/codex-home/config.toml"
agent codex env CODEX_HOME="$WORK/codex-home" "$BIN/codex" exec --skip-git-repo-check "$PROMPT"

mkdir -p "$WORK/claude-home"
agent claude-code env HOME="$WORK/claude-home" ANTHROPIC_BASE_URL="$URL" ANTHROPIC_API_KEY=none \
  CLAUDE_CODE_MAX_OUTPUT_TOKENS=256 "$BIN/claude" -p "$PROMPT" --model trtspec

mkdir -p "$WORK/opencode-home/.config/opencode"
cat > "$WORK/opencode-home/.config/opencode/opencode.json" <<EOF
{"provider": {"trtspec": {"npm": "@ai-sdk/openai-compatible", "name": "trtspec",
  "options": {"baseURL": "$URL/v1", "apiKey": "none"},
  "models": {"trtspec": {"name": "trtspec", "limit": {"context": 131072, "output": 256}}}}}}
EOF
agent opencode env HOME="$WORK/opencode-home" "$BIN/opencode" run -m trtspec/trtspec "$PROMPT"

mkdir -p "$WORK/qwen-home"
agent qwen-code env HOME="$WORK/qwen-home" OPENAI_BASE_URL="$URL/v1" OPENAI_API_KEY=none OPENAI_MODEL=trtspec \
  QWEN_CODE_MAX_OUTPUT_TOKENS=256 "$BIN/qwen" -p "$PROMPT" --auth-type openai
