#!/usr/bin/env bash
# Reproduce every model shipped in trtspec/assets, in order: the target and its draft model (two
# stages, docs/EMBEDDED_MODEL.md), then the drafters distilled from that target, all three from one
# regeneration of the target's responses, then DSpark's calibration.
#
#   bash scripts/train_embedded.sh [WORK]     # about 2 h on 2 CPU cores (stage 1: 72 min); WORK defaults to train-work
#   STAGE1=DIR bash scripts/train_embedded.sh  # reuse a finished stage 1 (DIR/tiny-target, DIR/tiny-draft)
#
# Each step is resumable or skipped when its output exists, so a rerun continues where it stopped.
set -euo pipefail
WORK=${1:-train-work}
ASSETS=trtspec/assets
PROMPTS=$ASSETS/prompts/train-drafter.jsonl
TARGET=$ASSETS/tiny-target
T=${TRTSPEC:-.venv/bin/trtspec}
STAGE1=${STAGE1:-$WORK/stage1}
mkdir -p "$WORK"

# done: training.json is written once a run has finished (weights are written at every checkpoint)
done_in() { [ -f "$1/training.json" ]; }
ship() {  # ship SRC NAME: copy a trained model into trtspec/assets/NAME (not its checkpoint/)
  mkdir -p "$ASSETS/$2"
  find "$1" -maxdepth 1 -type f -exec cp {} "$ASSETS/$2/" \;
}

echo "== stage 1: pre-train target and draft model =="
done_in "$STAGE1/tiny-target" || "$T" train target --out "$STAGE1"
echo "== stage 2: overshoot correction =="
done_in "$WORK/stage2/tiny-target" ||
  "$T" train target --init-from "$STAGE1" --out "$WORK/stage2" --steps 600 --lr 1e-3 \
    --overshoot-share 0.2 --overshoot-stop-every --seed 1
ship "$WORK/stage2/tiny-target" tiny-target
ship "$WORK/stage2/tiny-draft" tiny-draft

echo "== DFlash (regenerates the target's responses once) =="
done_in "$WORK/dflash" ||
  "$T" train dflash --target "$TARGET" --prompts "$PROMPTS" --out "$WORK/dflash" --block-size 16 \
    --layers 2 --target-layer-ids 1,3,5 --lr 1e-3 --epochs 6 --response-tokens 192
for d in dspark eagle3; do  # the same regenerated responses
  mkdir -p "$WORK/$d/checkpoint"
  [ -f "$WORK/$d/checkpoint/data.pt" ] || cp "$WORK/dflash/checkpoint/data.pt" "$WORK/$d/checkpoint/"
done
echo "== DSpark, then its STS calibration =="
done_in "$WORK/dspark" ||
  "$T" train dspark --target "$TARGET" --prompts "$PROMPTS" --out "$WORK/dspark" --block-size 15 \
    --layers 2 --target-layer-ids 1,3,5 --epochs 6
"$T" calibrate --drafter "$WORK/dspark" --target "$TARGET"
echo "== EAGLE-3 =="
done_in "$WORK/eagle3" ||
  "$T" train eagle3 --target "$TARGET" --prompts "$PROMPTS" --out "$WORK/eagle3" --epochs 1

ship "$WORK/dflash" tiny-dflash-b16
ship "$WORK/dspark" tiny-dspark-b15
ship "$WORK/eagle3" tiny-eagle3
echo "== shipped; now: python -m trtspec.train.report && make bench =="
