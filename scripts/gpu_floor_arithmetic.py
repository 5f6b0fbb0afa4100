"""The arithmetic of docs/GPU.md "Arithmetic before any run": the bytes each forward must move at
full size in bfloat16 (the models built on the meta device, no memory), their floors over the
copy bandwidth seen on this workplace's H200s, and the speedup τ · T_AR / (T_draft + T_verify)
over those floors at the published τ. Not a measurement: what `trtspec profile --synthetic`
compares its GPU timings with.

    .venv/bin/python scripts/gpu_floor_arithmetic.py
"""

from __future__ import annotations

import torch

from trtspec.bench.synthetic import SYNTHETIC_MODELS, ForwardBytes, build_drafter, build_target
from trtspec.bench.synthetic_report import PUBLISHED
from trtspec.plan.gpus import GPUS
from trtspec.plan.models import DRAFTERS, TARGETS

CONTEXT = 1024


def main() -> None:
    h200 = GPUS["H200"]
    gbs = h200.copy_tb_s * 1e3
    print(f"bfloat16, context {CONTEXT}, floors over {h200.copy_tb_s} TB/s (copy seen on {h200.name})\n")
    print("| model | forward | GB | floor ms |\n|---|---|---:|---:|")
    for m in SYNTHETIC_MODELS.values():
        arch, meta = TARGETS[m.target_id], torch.device("meta")
        target = build_target(arch, m.model_type, meta, torch.bfloat16, CONTEXT + 64, seed=0)
        drafter = build_drafter(DRAFTERS[m.drafter_id], arch, m.block_size, meta, torch.bfloat16,
                                CONTEXT + 64)
        nbytes = ForwardBytes.of(arch, target, drafter)
        ar, verify = nbytes.target_forward(1, CONTEXT, 1), nbytes.target_forward(1, CONTEXT, m.block_size)
        draft = nbytes.draft_step(1, CONTEXT, m.block_size)
        ms = {k: v / (gbs * 1e9) * 1e3 for k, v in {"ar": ar, "verify": verify, "draft": draft}.items()}
        print(f"| {m.key} | target, 1 token | {ar / 1e9:.2f} | {ms['ar']:.2f} |")
        print(f"| {m.key} | target, {m.block_size} tokens | {verify / 1e9:.2f} | {ms['verify']:.2f} |")
        print(f"| {m.key} | DFlash draft step, B = {m.block_size} (drafter "
              f"{nbytes.drafter_weights / 1e9:.2f} GB + LM head {nbytes.lm_head / 1e9:.2f} GB) | "
              f"{draft / 1e9:.2f} | {ms['draft']:.2f} ({ms['draft'] / ms['verify']:.0%} of the verify) |")
        for task, tau, published in PUBLISHED.get(m.key, []):
            floor = tau * ms["ar"] / (ms["draft"] + ms["verify"])
            print(f"|   {task} τ {tau} | speedup at the floors {floor:.2f}x | published {published}x | |")


if __name__ == "__main__":
    main()
