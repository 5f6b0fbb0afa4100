#!/usr/bin/env bash
# The limits.stream_interval table of README.md: one build per config, copied with the interval
# changed in its build_config.yaml, each copy served afresh (an empty lookup pool) and measured with
# `trtspec bench --url`, the intervals alternated ROUNDS times.
#
#   bash scripts/stream_interval_ab.sh [WORK]   # about 10 min on 2 idle CPU cores; WORK: stream-interval
#   CONFIG=build_configs/tiny-lookup-pool.yaml R=8 INTERVALS="1 2 4" SCHEME=openai ROUNDS=2 bash …
#   CONFIG=alone …: the embedded target alone (no drafter, no lookup)
set -euo pipefail
WORK=${1:-stream-interval}
CONFIG=${CONFIG:-build_configs/tiny-lookup-pool.yaml}
INTERVALS=${INTERVALS:-1 2 4}
R=${R:-8}
ROUNDS=${ROUNDS:-3}
SCHEME=${SCHEME:-grpc}  # grpc: Triton's stream; openai: the OpenAI frontend
T=${TRTSPEC:-.venv/bin/trtspec}
refuse() { echo "$1" >&2; exit 2; }  # before anything is built or served
case "$SCHEME" in grpc|openai) ;; *) refuse "SCHEME=$SCHEME: expected grpc or openai";; esac
[ "$CONFIG" = alone ] || [ -f "$CONFIG" ] || refuse "CONFIG=$CONFIG: no such file (or CONFIG=alone)"
for n in $INTERVALS; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || refuse "INTERVALS: $n is not a stream_interval (an integer >= 1)"
done
PORTS=(--http-port 18000 --grpc-port 18001 --metrics-port 18002 --openai-port 19000)
URL=$([ "$SCHEME" = openai ] && echo openai://127.0.0.1:19000 || echo grpc://127.0.0.1:18001)
rm -rf "$WORK" && mkdir -p "$WORK"
if [ "$CONFIG" = alone ]; then
  printf 'name: trtspec-alone\ntarget:\n  path: builtin:tiny-target\n' > "$WORK/alone.yaml"
  CONFIG="$WORK/alone.yaml"
fi
MODEL=$(sed -n 's/^name: *//p' "$CONFIG")
source "$(dirname "${BASH_SOURCE[0]}")/wait_serving.sh"  # wait_serving PID LOG

"$T" build "$CONFIG" --out "$WORK/build" > /dev/null
for n in $INTERVALS; do
  cp -r "$WORK/build" "$WORK/build-$n"
  sed -i "s/^  stream_interval: .*/  stream_interval: $n/" "$WORK"/build-$n/model_repository/*/1/build_config.yaml
  grep -q "stream_interval: $n$" "$WORK"/build-$n/model_repository/*/1/build_config.yaml
done
for round in $(seq "$ROUNDS"); do
  for n in $INTERVALS; do
    "$T" serve "$WORK/build-$n" "${PORTS[@]}" > "$WORK/serve.log" 2>&1 &
    server=$!
    trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
    wait_serving $server "$WORK/serve.log"
    out="$WORK/r$n-$round"
    "$T" bench --url "$URL" --model "$MODEL" --tasks math,chat,code --prompts 8 --max-tokens 256 \
      --concurrency "$R" --warmup 1 --out "$out" > "$out.log" 2>&1
    echo "interval $n round $round: $(tail -1 "$out.log")"
    kill -TERM $server; wait $server || true; trap - EXIT
  done
done
