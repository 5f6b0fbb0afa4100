#!/usr/bin/env bash
# The served figures of README.md, on the embedded default (tiny-dflash, adaptive schedule):
#   1. continuous batching: the same build with limits.max_concurrency 1, then 8, served by
#      `trtspec serve` and measured with `trtspec bench --url --concurrency 1,4,8`;
#   2. one client through the server (gRPC stream) against the in-process loop on the same prompt,
#      RUNS alternating pairs after one warm-up request (decode tokens/s of each, and the ratio).
#
#   bash scripts/serve_bench.sh [WORK]     # about 6 min on 2 idle CPU cores; WORK defaults to serve-bench
set -euo pipefail
WORK=${1:-serve-bench}
RUNS=${RUNS:-7}
T=${TRTSPEC:-.venv/bin/trtspec}
PY=${PY:-.venv/bin/python}
PROMPT="$(printf 'Q: 482 + 356\nA:')"
PORTS=(--http-port 18000 --grpc-port 18001 --metrics-port 18002 --openai-port 19000)
URL=grpc://127.0.0.1:18001
rm -rf "$WORK" && mkdir -p "$WORK"

source "$(dirname "${BASH_SOURCE[0]}")/wait_serving.sh"  # wait_serving PID LOG
serve() {  # serve BUILD: start the server in the background (stopped by stop or on exit)
  "$T" serve "$1" "${PORTS[@]}" > "$WORK/serve.log" 2>&1 &
  SERVER=$!
  trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
  wait_serving $SERVER "$WORK/serve.log"
  "$T" generate --url $URL --prompt "$PROMPT" --max-tokens 16 > /dev/null  # warm
}
stop() { kill -TERM "$SERVER"; wait "$SERVER" || true; trap - EXIT; }
decode_tps() { "$PY" -c "import json, sys; print(json.load(sys.stdin)['decode_tokens_per_s'])"; }

for conc in 1 8; do
  sed "s/^limits:/limits:\n  max_concurrency: $conc/" build_configs/tiny-dflash.yaml > "$WORK/c$conc.yaml"
  "$T" build "$WORK/c$conc.yaml" --out "$WORK/build-c$conc" > /dev/null
  serve "$WORK/build-c$conc"
  "$T" bench --url $URL --concurrency 1,4,8 --prompts 4 --max-tokens 128 --out "$WORK/bench-c$conc"
  curl -s http://127.0.0.1:18002/metrics | grep -E '^trtspec_(batch_steps|target_forwards)_total' \
    > "$WORK/metrics-c$conc.txt" || true
  if [ "$conc" = 8 ]; then  # the default build: one client served vs in process
    for i in $(seq "$RUNS"); do
      a=$("$T" generate --config build_configs/tiny-dflash.yaml --prompt "$PROMPT" --max-tokens 120 --json | decode_tps)
      b=$("$T" generate --url $URL --stream --prompt "$PROMPT" --max-tokens 120 --json | decode_tps)
      echo "$a $b" >> "$WORK/served_vs_inprocess.txt"
    done
  fi
  stop
done
for conc in 1 8; do echo "== max_concurrency $conc"; cat "$WORK/bench-c$conc/results.md"; cat "$WORK/metrics-c$conc.txt"; done
"$PY" - "$WORK/served_vs_inprocess.txt" <<'EOF'
import statistics, sys
pairs = [tuple(map(float, line.split())) for line in open(sys.argv[1])]
ratios = [b / a for a, b in pairs]
print("== one client, decode tokens/s: served / in-process")
for (a, b), r in zip(pairs, ratios):
    print(f"{b:8.1f} / {a:8.1f} = {r:.2f}")
print(f"median {statistics.median(ratios):.2f} (range {min(ratios):.2f}–{max(ratios):.2f})")
EOF
