#!/usr/bin/env bash
# lm-evaluation-harness against `trtspec serve`, as a user runs it (docs/EVAL.md): the same tasks on
# the speculative build (tiny-dflash) and on its target alone, one server after the other. A
# lossless deployment scores exactly what its target scores, on generation (greedy) and on
# loglikelihood (the target's own log-probabilities); the wall time of the generation task is the
# speedup an eval run sees.
#
#   LM_EVAL=/tmp/lmeval/bin/lm_eval bash scripts/lm_eval_check.sh [WORK]
#
# LM_EVAL: lm_eval of a venv of its own (python3 -m venv V && V/bin/pip install torch==2.13.0 &&
# V/bin/pip install lm-eval==0.4.13). About 5 minutes on 2 CPU cores.
set -euo pipefail
WORK=${1:-lm-eval-check}
T=${TRTSPEC:-.venv/bin/trtspec}
PY=${PY:-.venv/bin/python}
LM_EVAL=${LM_EVAL:?set LM_EVAL to the lm_eval of an lm-evaluation-harness venv}
COUNT=${COUNT:-100}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1  # local data only; nothing to download
PORTS=(--http-port 18100 --grpc-port 18101 --metrics-port 18102 --openai-port 19100)
rm -rf "$WORK" && mkdir -p "$WORK"
"$PY" scripts/lm_eval_tasks.py --out "$WORK/tasks" --count "$COUNT"

grep -v -E '^(drafter:|  method:|  path: builtin:tiny-dflash)' build_configs/tiny-dflash.yaml > "$WORK/target-alone.yaml"
for name in tiny-dflash target-alone; do
  config=build_configs/tiny-dflash.yaml
  [ "$name" = target-alone ] && config="$WORK/target-alone.yaml"
  "$T" build "$config" --out "$WORK/build-$name" > /dev/null
  "$T" serve "$WORK/build-$name" "${PORTS[@]}" > "$WORK/serve-$name.log" 2>&1 &
  SERVER=$!
  trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
  "$T" generate --url grpc://127.0.0.1:18101 --wait 300 --prompt "Q: 1 + 2" --max-tokens 8 > /dev/null
  for task in trtspec_arith_gen trtspec_arith_mc; do
    start=$(date +%s.%N)
    "$LM_EVAL" run --model local-completions \
      --model_args "model=trtspec,base_url=http://127.0.0.1:19100/v1/completions,num_concurrent=1" \
      --tasks "$task" --include_path "$WORK/tasks" --output_path "$WORK/$name" --log_samples \
      > "$WORK/$name-$task.log" 2>&1
    echo "$name $task $(echo "$(date +%s.%N) - $start" | bc)" >> "$WORK/seconds.txt"
  done
  kill -TERM "$SERVER"; wait "$SERVER" || true; trap - EXIT
done
"$PY" - "$WORK" <<'EOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
seconds = {tuple(line.split()[:2]): float(line.split()[2]) for line in open(work / "seconds.txt")}
print("| server | task | metric | score | seconds |")
print("|---|---|---|---:|---:|")
for name in ("tiny-dflash", "target-alone"):
    for path in sorted((work / name).rglob("results_*.json")):
        for task, scores in json.loads(path.read_text())["results"].items():
            for metric, value in scores.items():
                if isinstance(value, float) and "stderr" not in metric:
                    print(f"| {name} | {task} | {metric} | {value:.3f} | {seconds[(name, task)]:.1f} |")
# per sample: the same answers and the same loglikelihoods on both servers
def samples(name, task):
    found = sorted((work / name).rglob(f"samples_{task}_*.jsonl"))
    return [json.loads(line) for line in open(found[-1])]
for task in ("trtspec_arith_gen", "trtspec_arith_mc"):
    a, b = samples("tiny-dflash", task), samples("target-alone", task)
    same = sum(x["resps"] == y["resps"] for x, y in zip(a, b, strict=True))
    print(f"{task}: {same}/{len(a)} samples with identical responses on both servers")
    if task.endswith("mc"):
        gap = max(abs(float(r[0][0]) - float(s[0][0])) for x, y in zip(a, b) for r, s in zip(x["resps"], y["resps"]))
        print(f"{task}: largest loglikelihood difference {gap:.2e}")
EOF
