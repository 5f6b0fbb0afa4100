"""Timings of the plugin kernels against their torch references, with the bandwidth floor.

The kernels are memory-bound at serving shapes, so the floor is bytes moved / bandwidth;
`peak_gbps` is measured with a device-to-device copy unless given. On a CUDA device both the
Triton kernel and the torch reference are timed; on the CPU only the reference is (the kernels run
there only inside the Triton interpreter, whose speed says nothing), and `kernel_ms` is None.
Used by `trtspec.gpu_check` and `trtspec profile --synthetic` (at each model's own shapes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch

from trtspec.errors import TrtspecError

ATTENTION_SHAPES = [  # (b, h, kvh, B, c, d): Qwen3-8B-like drafter layers, and a small model
    (1, 32, 8, 16, 2048, 128),
    (8, 32, 8, 16, 4096, 128),
    (4, 16, 4, 8, 512, 64),
]
VERIFY_SHAPES = [(1, 15, 151_936), (16, 7, 151_936)]  # (b, k, V)
KERNEL_GPU_ONLY = "GPU-only: the Triton kernels run on the CPU only in the interpreter, not timed"


def measure_peak_gbps(nbytes: int = 1 << 30) -> float:
    """Device bandwidth from a copy: it reads and writes nbytes."""
    import triton.testing

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _row(kernel: str, shape: str, dtype: torch.dtype, kernel_ms: float | None, torch_ms: float,
         nbytes: int, peak_gbps: float) -> dict:
    floor_ms = nbytes / (peak_gbps * 1e9) * 1e3
    return {"kernel": kernel, "shape": shape, "dtype": str(dtype).removeprefix("torch."),
            "kernel_ms": kernel_ms, "torch_ms": torch_ms, "bytes": nbytes, "floor_ms": floor_ms,
            "of_floor": None if kernel_ms is None else floor_ms / kernel_ms}


def _coupled_reference(weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`coupled_argmax` as torch computes it: the [rows, V] noise written, then added and reduced."""
    from trtspec.spec.coupling import noise_of_keys

    return (weights.float() + noise_of_keys(keys, weights.shape[-1])).argmax(-1)


def bench_kernels(
    peak_gbps: float | None = None,
    dtypes: Sequence[torch.dtype] = (torch.bfloat16, torch.float16),
    attention_shapes: Sequence[tuple[int, ...]] = tuple(ATTENTION_SHAPES),
    verify_shapes: Sequence[tuple[int, int, int]] = tuple(VERIFY_SHAPES),
    device: torch.device | str = "cuda",
    median_ms: Callable[[Callable[[], object]], float] | None = None,
) -> list[dict]:
    """Rows of kernel vs torch-reference milliseconds and the floor. `median_ms(fn)` times a call;
    on CUDA it defaults to triton.testing.do_bench."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise TrtspecError("bench_kernels needs a CUDA device; run it on a GPU node (scripts/gpu_check.sh)")
    if not on_gpu and (median_ms is None or peak_gbps is None):
        raise TrtspecError("bench_kernels off CUDA needs median_ms and peak_gbps (no do_bench there)")
    from plugins.confidence_verify import verify_greedy, verify_sampling, verify_sampling_explicit
    from plugins.coupled_argmax import coupled_argmax
    from plugins.kv_injection_attention import kv_injection_attention, kv_injection_attention_reference
    from trtspec.spec import verify as torch_verify
    from trtspec.spec.coupling import row_keys

    if median_ms is None:
        import triton.testing

        median_ms = triton.testing.do_bench
    peak_gbps = peak_gbps or measure_peak_gbps()

    def both(kernel, reference) -> tuple[float | None, float]:
        return (median_ms(kernel) if on_gpu else None), median_ms(reference)

    rows = []
    gen = torch.Generator(device=device).manual_seed(0)
    for b, h, kvh, block, c, d in attention_shapes:
        for dtype in dtypes:
            q, ck, cv, bk, bv = (torch.randn(*shape, generator=gen, device=device).to(dtype) for shape in
                                 [(b, h, block, d)] + [(b, kvh, c, d)] * 2 + [(b, kvh, block, d)] * 2)
            args = (q, ck, cv, bk, bv)
            nbytes = sum(t.numel() * t.element_size() for t in args) + q.numel() * q.element_size()  # + out
            rows.append(_row("kv_injection_attention", f"b{b} h{h}/{kvh} B{block} c{c} d{d}", dtype,
                             *both(partial(kv_injection_attention, *args),
                                   partial(kv_injection_attention_reference, *args)), nbytes, peak_gbps))
    for b, k, vocab in verify_shapes:
        for dtype in dtypes:
            logits = torch.randn(b, k + 1, vocab, generator=gen, device=device).to(dtype)
            draft = logits.argmax(-1)[:, :k].contiguous()  # all accepted: every row of logits is read
            rows.append(_row("confidence_verify greedy", f"b{b} k{k} V{vocab}", dtype,
                             *both(partial(verify_greedy, draft, logits),
                                   partial(torch_verify.verify_greedy, draft, logits)),
                             logits.numel() * logits.element_size(), peak_gbps))
            p = torch.softmax(logits.float(), -1).to(dtype)
            q = torch.softmax(torch.randn(b, k, vocab, generator=gen, device=device), -1).to(dtype)
            randomness = (torch.rand(b, k, generator=gen, device=device),
                          torch.rand(b, generator=gen, device=device))
            nbytes = 2 * 2 * b * vocab * p.element_size()  # extra token: two passes over a p and a q row
            rows.append(_row("confidence_verify sampling", f"b{b} k{k} V{vocab}", dtype,
                             *both(partial(verify_sampling, draft, q, p, *randomness),
                                   partial(verify_sampling_explicit, draft, q, p, *randomness)),
                             nbytes, peak_gbps))
            # Gumbel coupling: the target's coupled sample at every row (fused vs noise written)
            at = torch.arange(k + 1, device=device) + 1000
            keys = row_keys(list(range(b)), at.expand(b, k + 1)).reshape(-1)  # [b·(k+1)]
            flat = logits.view(-1, vocab)
            timed = both(partial(coupled_argmax, flat, keys), partial(_coupled_reference, flat, keys))
            rows.append(_row("coupled_argmax", f"b{b} k{k} V{vocab}", dtype, *timed,
                             logits.numel() * logits.element_size(), peak_gbps))
    return rows
