"""One short GPU run (`scripts/gpu_check.sh`): parity with the CPU reference and timings.

Checks on the GPU, against the same code on the CPU:
- the embedded target + DFlash drafter, greedy, token-identical to the target alone (fp32);
- the `kv_injection_attention` torch reference, fp32/bf16/fp16 on the GPU vs fp32 on the CPU;
and times a target forward (1 and 16 tokens) and one DFlash block (B = 4 and 16) with CUDA events.
Prints a table last and writes `gpu_check.json` to $OUT (or the working directory).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from trtspec.config import load_build_config
from trtspec.models.dflash import kv_injection_attention
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def cuda_time(fn, reps: int = 50) -> float:
    """Median milliseconds of `fn()` over `reps` runs, after warm-up."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def check_attention(rows: list[dict]) -> None:
    gen = torch.Generator().manual_seed(0)
    for b, h, kvh, block, ctx, d in [(1, 32, 8, 16, 2048, 128), (4, 16, 4, 8, 512, 64)]:
        q = torch.randn(b, h, block, d, generator=gen)
        k = torch.randn(b, kvh, ctx + block, d, generator=gen)
        v = torch.randn(b, kvh, ctx + block, d, generator=gen)
        ref = kv_injection_attention(q, k, v)
        for dtype, tol in TOLERANCE.items():
            args = [t.cuda().to(dtype) for t in (q, k, v)]
            out = kv_injection_attention(*args).float().cpu()
            err = ((out - ref).norm() / ref.norm()).item()
            ms = cuda_time(lambda a=args: kv_injection_attention(*a))
            rows.append({"check": f"kv_injection_attention b{b} h{h}/{kvh} B{block} ctx{ctx}",
                         "dtype": str(dtype).removeprefix("torch."), "rel_err": err,
                         "ok": err < tol, "ms": ms})


def check_decoding(rows: list[dict]) -> None:
    config = load_build_config(Path(__file__).parents[1] / "build_configs" / "tiny-dflash.yaml")
    spec = load_pipeline(config)
    plain = load_pipeline(config, use_drafter=False)
    for p in (spec, plain):
        p.target.model.cuda()
    spec.drafter.model.cuda()
    same = 0
    prompts = load_prompts("code")[:6] + load_prompts("math")[:6]
    for prompt in prompts:
        ids = spec.tokenizer.encode(prompt)
        same += spec.decoder.generate(ids, 128).token_ids == plain.decoder.generate(ids, 128).token_ids
    rows.append({"check": "DFlash greedy == target alone (cuda fp32)", "dtype": "float32",
                 "ok": same == len(prompts), "detail": f"{same}/{len(prompts)} prompts"})
    target = spec.target.model
    for n in (1, 16):
        ids = torch.randint(0, 256, (1, n), device="cuda")
        rows.append({"check": f"target forward, {n} tokens", "dtype": "float32", "ok": True,
                     "ms": cuda_time(lambda i=ids: target(i))})


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible; run this on a GPU node", file=sys.stderr)
        return 2
    rows: list[dict] = []
    check_attention(rows)
    check_decoding(rows)
    out = Path(os.environ.get("OUT", ".")) / "gpu_check.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"\n{'check':<60} {'dtype':<9} {'rel_err':>9} {'ms':>9}  ok")
    for r in rows:
        err = f"{r['rel_err']:.2e}" if "rel_err" in r else r.get("detail", "")
        ms = f"{r['ms']:.3f}" if "ms" in r else ""
        print(f"{r['check']:<60} {r['dtype']:<9} {err:>9} {ms:>9}  {'yes' if r['ok'] else 'NO'}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
