#!/usr/bin/env bash
# lm-evaluation-harness against `trtspec serve`, as a user runs it (docs/EVAL.md): the same tasks on
# the speculative build (tiny-dflash) and on its target alone. A lossless deployment scores exactly
# what its target scores, on generation (greedy) and on loglikelihood (the target's own
# log-probabilities). Then the servers' own time on the same requests, without lm-eval.
#
#   LM_EVAL=/tmp/lmeval/bin/lm_eval bash scripts/lm_eval_check.sh [WORK]
#
# LM_EVAL: lm_eval of a venv of its own (python3 -m venv V && V/bin/pip install torch==2.13.0 &&
# V/bin/pip install "lm-eval[api]==0.4.13"). About 6 minutes on 2 CPU cores.
# COUNT: problems per task (default 100; COUNT=5 runs the whole check in about 2 minutes).
set -euo pipefail
WORK=${1:-lm-eval-check}
T=${TRTSPEC:-.venv/bin/trtspec}
PY=${PY:-.venv/bin/python}
LM_EVAL=${LM_EVAL:?set LM_EVAL to the lm_eval of an lm-evaluation-harness venv}
if ! command -v "$LM_EVAL" > /dev/null; then
  echo "LM_EVAL=$LM_EVAL is not an executable lm_eval: install lm-eval in a venv (docs/EVAL.md)" >&2
  exit 2
fi
COUNT=${COUNT:-100}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1  # local data only; nothing to download
rm -rf "$WORK" && mkdir -p "$WORK"
"$PY" scripts/lm_eval_tasks.py --out "$WORK/tasks" --count "$COUNT"
grep -v -E '^(drafter:|  method:|  path: builtin:tiny-dflash)' build_configs/tiny-dflash.yaml \
  > "$WORK/target-alone.yaml"

source "$(dirname "${BASH_SOURCE[0]}")/wait_serving.sh"  # wait_serving PID LOG

# both servers up at once (an idle one only polls its queue), each on ports of its own
declare -A OPENAI=([tiny-dflash]=19100 [target-alone]=19200)
PIDS=()
trap 'kill -TERM "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null || true' EXIT
for name in tiny-dflash target-alone; do
  config=build_configs/tiny-dflash.yaml
  [ "$name" = target-alone ] && config="$WORK/target-alone.yaml"
  base=$(( ${OPENAI[$name]} - 1000 ))
  "$T" build "$config" --out "$WORK/build-$name" > /dev/null
  "$T" serve "$WORK/build-$name" --http-port $base --grpc-port $((base + 1)) --metrics-port $((base + 2)) \
    --openai-port "${OPENAI[$name]}" > "$WORK/serve-$name.log" 2>&1 &
  PIDS+=($!)
  wait_serving $! "$WORK/serve-$name.log"
  "$T" generate --url grpc://127.0.0.1:$((base + 1)) --prompt "Q: 1 + 2" --max-tokens 8 > /dev/null
done

for name in tiny-dflash target-alone; do
  for task in trtspec_arith_gen trtspec_arith_mc; do
    start=$(date +%s.%N)
    if ! "$LM_EVAL" run --model local-completions \
      --model_args "model=trtspec,base_url=http://127.0.0.1:${OPENAI[$name]}/v1/completions,num_concurrent=1" \
      --tasks "$task" --include_path "$WORK/tasks" --output_path "$WORK/$name" --log_samples \
      > "$WORK/$name-$task.log" 2>&1; then
      tail -n 5 "$WORK/$name-$task.log" >&2
      echo "lm_eval failed on $task against $name: see $WORK/$name-$task.log" >&2
      exit 1
    fi
    echo "$name $task $(echo "$(date +%s.%N) - $start" | bc)" >> "$WORK/seconds.txt"
  done
done
"$PY" scripts/lm_eval_report.py ab "$WORK" "${OPENAI[tiny-dflash]}" "${OPENAI[target-alone]}" > "$WORK/ab.md"
kill -TERM "${PIDS[@]}"; wait || true; trap - EXIT
"$PY" scripts/lm_eval_report.py report "$WORK"
cat "$WORK/ab.md"
