"""One short GPU run (`scripts/gpu_check.sh`): parity with the CPU reference and timings.

Checks on the GPU, against the same code on the CPU:
- the embedded target + DFlash drafter, greedy, token-identical to the target alone (fp32);
- the `kv_injection_attention` torch reference and its Triton kernel (plugins/), fp32/bf16/fp16 on
  the GPU vs fp32 on the CPU; the `confidence_verify` kernels vs their torch references;
and times a target forward (1 and 16 tokens) and one DFlash block (B = 4 and 16) with CUDA events,
and each plugin kernel against its torch reference and the bandwidth floor (`plugins.bench`).
Where TensorRT is installed it also builds the engine flavour's engines from the exported ONNX
graphs and checks DFlash decoding through them against the same graphs on onnxruntime.
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
    from plugins.kv_injection_attention import kv_injection_attention_concat as triton_attention

    gen = torch.Generator().manual_seed(0)
    for b, h, kvh, block, ctx, d in [(1, 32, 8, 16, 2048, 128), (4, 16, 4, 8, 512, 64), (2, 8, 2, 7, 37, 64)]:
        q = torch.randn(b, h, block, d, generator=gen)
        k = torch.randn(b, kvh, ctx + block, d, generator=gen)
        v = torch.randn(b, kvh, ctx + block, d, generator=gen)
        ref = kv_injection_attention(q, k, v)
        for dtype, tol in TOLERANCE.items():
            args = [t.cuda().to(dtype) for t in (q, k, v)]
            for name, fn in [("kv_injection_attention[torch]", kv_injection_attention),
                             ("kv_injection_attention[triton]", triton_attention)]:
                out = fn(*args).float().cpu()
                err = ((out - ref).norm() / ref.norm()).item()
                ms = cuda_time(lambda a=args, f=fn: f(*a))
                rows.append({"check": f"{name} b{b} h{h}/{kvh} B{block} ctx{ctx}",
                             "dtype": str(dtype).removeprefix("torch."), "rel_err": err,
                             "ok": err < tol, "ms": ms})


def check_verify(rows: list[dict]) -> None:
    """The verify kernels on the GPU against the torch references on the CPU: token-identical."""
    from plugins.confidence_verify import (
        draw_uniforms,
        verify_greedy,
        verify_sampling,
        verify_sampling_explicit,
    )
    from trtspec.spec.verify import verify_greedy as torch_greedy

    gen = torch.Generator().manual_seed(0)
    b, k, vocab = 16, 15, 151_936
    logits = torch.randn(b, k + 1, vocab, generator=gen)
    draft = logits.argmax(-1)[:, :k]
    flip = torch.rand(b, k, generator=gen) < 0.1
    draft[flip] = (draft[flip] + 1) % vocab
    lens = torch.randint(0, k + 1, (b,), generator=gen)
    for dtype in (torch.float32, torch.bfloat16):
        want = torch_greedy(draft, logits.to(dtype).float(), lens)
        got = verify_greedy(draft.cuda(), logits.to(dtype).cuda(), lens.cuda())
        same = torch.equal(got.tokens.cpu(), want.tokens)
        rows.append({"check": f"confidence_verify greedy b{b} k{k} V{vocab}", "dtype": str(dtype)[6:],
                     "ok": same, "detail": "tokens equal" if same else "TOKENS DIFFER"})
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + torch.randn(b, k + 1, vocab, generator=gen), -1)[:, :k]
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(b, k)
    u, u_last = draw_uniforms(b, k, gen)
    want = verify_sampling_explicit(draft, q, p, u, u_last, lens)
    got = verify_sampling(*(t.cuda() for t in (draft, q, p, u, u_last, lens)))
    same = torch.equal(got.tokens.cpu(), want.tokens)
    rows.append({"check": f"confidence_verify sampling b{b} k{k} V{vocab}", "dtype": "float32",
                 "ok": same, "detail": "tokens equal" if same else "TOKENS DIFFER"})


def bench_plugins(rows: list[dict]) -> None:
    from plugins.bench import bench_kernels

    for r in bench_kernels():
        rows.append({"check": f"{r['kernel']} {r['shape']}", "dtype": r["dtype"], "ok": True,
                     "ms": r["kernel_ms"], "detail": f"torch {r['torch_ms']:.3f}, floor {r['floor_ms']:.3f}",
                     **{key: r[key] for key in ("torch_ms", "floor_ms", "bytes")}})


def check_decoding(rows: list[dict]) -> None:
    config = load_build_config(Path(__file__).parents[1] / "build_configs" / "tiny-dflash.yaml")
    config = config.model_copy(update={"target": config.target.model_copy(update={"device": "cuda"}),
                                        "drafter": config.drafter.model_copy(update={"device": "cuda"})})
    spec = load_pipeline(config)
    plain = load_pipeline(config, use_drafter=False)
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


ENGINE_CHECKS = (("tiny-dflash", "float32"), ("tiny-dspark", "float32"), ("tiny-dflash", "float16"))


def check_engines(rows: list[dict]) -> None:
    """Where TensorRT exists: build the engine flavour's engines (plugins AOT) from the exported
    ONNX graphs and decode with them, greedy. float32: token-identical to the same graphs on
    onnxruntime. float16 (different kernels may round differently): speculation on TensorRT equals
    TensorRT decoding alone, and agreement with onnxruntime is reported."""
    from trtspec.engine.trt import tensorrt_available

    if not tensorrt_available():
        rows.append({"check": "TensorRT engines (engine flavour)", "dtype": "-", "ok": True,
                     "detail": "skipped: tensorrt is not installed here"})
        return
    for name, dtype in ENGINE_CHECKS:
        _check_engine_config(rows, name, dtype)


def _check_engine_config(rows: list[dict], name: str, dtype: str) -> None:
    import tempfile
    import time

    from trtspec.engine.build import build_engines
    from trtspec.engine.load import load_engine_models
    from trtspec.export.bundle import export_bundle
    from trtspec.spec.decoder import SpeculativeDecoder
    from trtspec.tokenizer import ByteTokenizer

    config = load_build_config(Path(__file__).parents[1] / "build_configs" / f"{name}.yaml")
    config = config.model_copy(update={"flavour": "engine",
                                        "target": config.target.model_copy(update={"dtype": dtype})})
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "engine"
        manifest = export_bundle(config, folder)
        t0 = time.perf_counter()
        build_engines(folder)
        rows.append({"check": f"TensorRT engine build ({name}, {len(manifest['graphs'])} graphs)",
                     "dtype": dtype, "ok": True, "ms": 1000 * (time.perf_counter() - t0)})
        decoders = {}
        for backend in ("onnxruntime", "tensorrt"):
            target, drafter, verifier = load_engine_models(config, folder=folder, backend=backend)
            tok = ByteTokenizer.from_config(target.config)
            decoders[backend] = SpeculativeDecoder(target, drafter, tok.eos_id, verifier)
        trt_decoder = decoders["tensorrt"]
        plain = SpeculativeDecoder(trt_decoder.target, None, tok.eos_id, trt_decoder.verifier)
        prompts = load_prompts("code")[:4] + load_prompts("math")[:4]
        same = lossless = 0
        tps: dict[str, list[float]] = {}
        for prompt in prompts:
            ids = tok.encode(prompt)
            out = {b: d.generate(ids, 96) for b, d in decoders.items()}
            same += out["onnxruntime"].token_ids == out["tensorrt"].token_ids
            lossless += out["tensorrt"].token_ids == plain.generate(ids, 96).token_ids
            for b, r in out.items():
                tps.setdefault(b, []).append(r.decode_tokens_per_s)
        ok = lossless == len(prompts) and (dtype != "float32" or same == len(prompts))
        rows.append({"check": f"engine flavour on TensorRT ({name} greedy)", "dtype": dtype, "ok": ok,
                     "detail": f"== onnxruntime {same}/{len(prompts)}, == TensorRT target alone "
                     f"{lossless}/{len(prompts)}; decode tok/s "
                     + ", ".join(f"{b} {sum(v) / len(v):.0f}" for b, v in tps.items())})


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible; run this on a GPU node", file=sys.stderr)
        return 2
    rows: list[dict] = []
    check_attention(rows)
    check_verify(rows)
    check_decoding(rows)
    bench_plugins(rows)
    try:
        check_engines(rows)
    except Exception as exc:  # report and keep the table: the other checks already ran
        rows.append({"check": "TensorRT engines (engine flavour)", "dtype": "-", "ok": False,
                     "detail": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"})
    out = Path(os.environ.get("OUT", ".")) / "gpu_check.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"\n{'check':<60} {'dtype':<9} {'rel_err':>9} {'ms':>9}  ok   detail")
    for r in rows:
        err = f"{r['rel_err']:.2e}" if "rel_err" in r else ""
        ms = f"{r['ms']:.3f}" if "ms" in r else ""
        ok = "yes" if r["ok"] else "NO "
        print(f"{r['check']:<60} {r['dtype']:<9} {err:>9} {ms:>9}  {ok}  {r.get('detail', '')}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
