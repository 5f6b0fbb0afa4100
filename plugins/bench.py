"""GPU timings of the plugin kernels against their torch references, with the bandwidth floor.

Both kernels are memory-bound at serving shapes, so the floor is bytes moved / peak bandwidth;
`peak_gbps` is measured with a device-to-device copy unless given. Used by `trtspec.gpu_check`.
"""

from __future__ import annotations

from functools import partial

import torch

from trtspec.errors import TrtspecError

ATTENTION_SHAPES = [  # (b, h, kvh, B, c, d): Qwen3-8B-like drafter layers, and a small model
    (1, 32, 8, 16, 2048, 128),
    (8, 32, 8, 16, 4096, 128),
    (4, 16, 4, 8, 512, 64),
]
VERIFY_SHAPES = [(1, 15, 151_936), (16, 7, 151_936)]  # (b, k, V)


def measure_peak_gbps(nbytes: int = 1 << 30) -> float:
    """Device bandwidth from a copy: it reads and writes nbytes."""
    import triton.testing

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _row(kernel: str, shape: str, dtype: torch.dtype, kernel_ms: float, torch_ms: float, nbytes: int,
         peak_gbps: float) -> dict:
    floor_ms = nbytes / (peak_gbps * 1e9) * 1e3
    return {"kernel": kernel, "shape": shape, "dtype": str(dtype).removeprefix("torch."),
            "kernel_ms": kernel_ms, "torch_ms": torch_ms, "bytes": nbytes, "floor_ms": floor_ms,
            "of_floor": floor_ms / kernel_ms}


def bench_kernels(peak_gbps: float | None = None, dtypes=(torch.bfloat16, torch.float16)) -> list[dict]:
    """Rows of kernel vs torch-reference milliseconds (triton.testing.do_bench) and the floor."""
    if not torch.cuda.is_available():
        raise TrtspecError("bench_kernels needs a CUDA device; run it on a GPU node (scripts/gpu_check.sh)")
    import triton.testing

    from plugins.confidence_verify import verify_greedy, verify_sampling, verify_sampling_explicit
    from plugins.kv_injection_attention import kv_injection_attention, kv_injection_attention_reference
    from trtspec.spec import verify as torch_verify

    peak_gbps = peak_gbps or measure_peak_gbps()
    bench = triton.testing.do_bench
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for b, h, kvh, block, c, d in ATTENTION_SHAPES:
        for dtype in dtypes:
            q, ck, cv, bk, bv = (torch.randn(*shape, generator=gen, device="cuda").to(dtype) for shape in
                                 [(b, h, block, d)] + [(b, kvh, c, d)] * 2 + [(b, kvh, block, d)] * 2)
            args = (q, ck, cv, bk, bv)
            nbytes = sum(t.numel() * t.element_size() for t in args) + q.numel() * q.element_size()  # + out
            rows.append(_row("kv_injection_attention", f"b{b} h{h}/{kvh} B{block} c{c} d{d}", dtype,
                             bench(partial(kv_injection_attention, *args)),
                             bench(partial(kv_injection_attention_reference, *args)), nbytes, peak_gbps))
    for b, k, vocab in VERIFY_SHAPES:
        for dtype in dtypes:
            logits = torch.randn(b, k + 1, vocab, generator=gen, device="cuda").to(dtype)
            draft = logits.argmax(-1)[:, :k].contiguous()  # all accepted: every row of logits is read
            rows.append(_row("confidence_verify greedy", f"b{b} k{k} V{vocab}", dtype,
                             bench(partial(verify_greedy, draft, logits)),
                             bench(partial(torch_verify.verify_greedy, draft, logits)),
                             logits.numel() * logits.element_size(), peak_gbps))
            p = torch.softmax(logits.float(), -1).to(dtype)
            q = torch.softmax(torch.randn(b, k, vocab, generator=gen, device="cuda"), -1).to(dtype)
            randomness = (torch.rand(b, k, generator=gen, device="cuda"),
                          torch.rand(b, generator=gen, device="cuda"))
            nbytes = 2 * 2 * b * vocab * p.element_size()  # extra token: two passes over a p and a q row
            rows.append(_row("confidence_verify sampling", f"b{b} k{k} V{vocab}", dtype,
                             bench(partial(verify_sampling, draft, q, p, *randomness)),
                             bench(partial(verify_sampling_explicit, draft, q, p, *randomness)),
                             nbytes, peak_gbps))
    return rows
