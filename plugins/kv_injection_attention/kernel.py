"""Triton kernel of `trtspec::kv_injection_attention`: DFlash's block attention, one launch per layer.

Block queries attend, non-causally, over [context K/V ; block K/V] with grouped-query heads and
RoPE already applied (the torch reference is `trtspec.models.dflash.kv_injection_attention`, on
the concatenated K/V). The context and block parts come as separate tensors so the cached context
is read in place instead of being copied into a concatenation every layer; an optional per-row
context length lets a static cache of width `c` hold rows of different lengths.

One program handles BLOCK_M query rows of one (batch, kv head): the G = h / kvh query heads of a
group share the kv head, so their G·B rows are consecutive in q and every K/V tile loaded serves
all of them. Online softmax (flash-attention) over BLOCK_N-wide K/V tiles, in base 2.

Kernel argument order is tensor inputs, int32 scalars, tensor outputs: the order TensorRT's
`aot_impl` launches a PTX kernel with (see trt_plugin.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from plugins._common import check_launchable, interpreting, next_pow2
from trtspec.errors import TrtspecError

HEAD_DIMS_TESTED = (16, 32, 64, 128)


@triton.jit
def _attend_tiles(acc, m_i, l_i, q, k_ptr, v_ptr, n_valid, rows_d, d_mask,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, QK_SCALE: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    # k_ptr/v_ptr: first row of this (batch, kv head) slice, rows HEAD_DIM apart; n_valid rows
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, n_valid, BLOCK_N):
        n = start + offs_n
        n_mask = n < n_valid
        kv_off = n[:, None] * HEAD_DIM + rows_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
        if UPCAST_DOT:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * QK_SCALE  # [M, N], log2 units
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def kv_injection_attention_kernel(
    Q,  # [b, h, B, d]
    CTX_K, CTX_V,  # [b, kvh, c, d]
    BLK_K, BLK_V,  # [b, kvh, B, d]
    CTX_LENS,  # [b] int32, valid context rows per batch row (read only when HAS_CTX_LENS)
    num_heads, num_kv_heads, ctx_width, block_len,  # int32
    ctx_stride, blk_stride,  # int32, elements between consecutive (batch, kv head) slices
    OUT,  # [b, h, B, d]
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    QK_SCALE: tl.constexpr, HAS_CTX_LENS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bk = tl.program_id(1)  # batch * num_kv_heads + kv head
    batch = pid_bk // num_kv_heads
    group = num_heads // num_kv_heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row r = (head g in group) * B + query i
    row_mask = rows < group * block_len
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM

    # the group's heads are consecutive in h, so its G*B query rows are consecutive in memory
    q_base = pid_bk.to(tl.int64) * group * block_len * HEAD_DIM
    qo_off = q_base + rows[:, None] * HEAD_DIM + offs_d[None, :]
    qo_mask = row_mask[:, None] & d_mask[None, :]
    q = tl.load(Q + qo_off, mask=qo_mask, other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if HAS_CTX_LENS:
        n_ctx = tl.minimum(tl.load(CTX_LENS + batch).to(tl.int32), ctx_width)
    else:
        n_ctx = ctx_width
    ctx_base = pid_bk.to(tl.int64) * ctx_stride
    acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, CTX_K + ctx_base, CTX_V + ctx_base, n_ctx,
                                  offs_d, d_mask, HEAD_DIM, BLOCK_N, QK_SCALE, DOT_PRECISION, UPCAST_DOT)
    blk_base = pid_bk.to(tl.int64) * blk_stride
    acc, m_i, l_i = _attend_tiles(acc, m_i, l_i, q, BLK_K + blk_base, BLK_V + blk_base, block_len,
                                  offs_d, d_mask, HEAD_DIM, BLOCK_N, QK_SCALE, DOT_PRECISION, UPCAST_DOT)
    out = acc / l_i[:, None]
    tl.store(OUT + qo_off, out.to(OUT.dtype.element_ty), mask=qo_mask)


def kernel_constexprs(head_dim: int, block_m: int, block_n: int, has_ctx_lens: bool,
                      upcast_dot: bool = False) -> dict:
    """The compile-time constants of one specialisation (shared by the launcher and aot_impl).

    `upcast_dot` feeds tl.dot float32 operands: only for bfloat16 under the Triton interpreter,
    whose tl.dot multiplies bfloat16 bit patterns (triton-lang/triton#11584, unsupported there)."""
    return dict(HEAD_DIM=head_dim, BLOCK_D=next_pow2(head_dim), BLOCK_M=block_m, BLOCK_N=block_n,
                QK_SCALE=1.0 / math.sqrt(head_dim) * 1.4426950408889634,  # log2(e): exp2 softmax
                HAS_CTX_LENS=has_ctx_lens, DOT_PRECISION="ieee", UPCAST_DOT=upcast_dot)


def aot_signature(t: str) -> dict[str, str]:
    """Triton signature for TensorRT's aot_impl, t in fp32/fp16/bf16; ctx_lens is always passed."""
    return {"Q": f"*{t}", "CTX_K": f"*{t}", "CTX_V": f"*{t}", "BLK_K": f"*{t}", "BLK_V": f"*{t}",
            "CTX_LENS": "*i32", "num_heads": "i32", "num_kv_heads": "i32", "ctx_width": "i32",
            "block_len": "i32", "ctx_stride": "i32", "blk_stride": "i32", "OUT": f"*{t}"}


def _check(q, ctx_k, ctx_v, blk_k, blk_v) -> None:
    b, h, block, d = q.shape
    kvh = ctx_k.shape[1]
    if ctx_k.shape != ctx_v.shape or blk_k.shape != blk_v.shape:
        raise TrtspecError(f"K and V shapes differ: {tuple(ctx_k.shape)}/{tuple(ctx_v.shape)}, "
                           f"{tuple(blk_k.shape)}/{tuple(blk_v.shape)}")
    if (ctx_k.shape[0], ctx_k.shape[3]) != (b, d) or tuple(blk_k.shape) != (b, kvh, block, d):
        raise TrtspecError(f"q {tuple(q.shape)} does not fit context K {tuple(ctx_k.shape)} and "
                           f"block K {tuple(blk_k.shape)} ([b, kvh, c, d] and [b, kvh, B, d])")
    if h % kvh:
        raise TrtspecError(f"num_heads {h} is not a multiple of num_kv_heads {kvh}")
    if len({t.dtype for t in (q, ctx_k, ctx_v, blk_k, blk_v)}) != 1:
        raise TrtspecError("q, K and V must share one dtype (float32, float16 or bfloat16)")


def _slice_stride(t: torch.Tensor) -> int | None:
    """Elements between consecutive (batch, kv head) slices of t [b, kvh, s, d] when each slice is
    s·d contiguous rows and one stride steps through them all (a [ctx ; block] view qualifies);
    None when not. One kv head: the batch's stride (a size-1 dimension's own stride is arbitrary,
    `.view(b, s, 1, d).transpose(1, 2)` leaves it at d)."""
    b, kvh, s, d = t.shape
    if not ((t.stride(3) == 1 or d == 1) and (t.stride(2) == d or s <= 1)):
        return None
    if b * kvh == 1:
        return 0  # one slice: nothing to step over
    if kvh == 1:
        return t.stride(0)
    return t.stride(1) if b == 1 or t.stride(0) == kvh * t.stride(1) else None


def _kv_slices(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """k, v [b, kvh, s, d] as the kernel reads them, with the one slice stride it reads both at:
    copied to the canonical layout unless both already qualify at the same stride."""
    stride = _slice_stride(k)
    if stride is None or _slice_stride(v) != stride:
        k, v = (torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t) for t in (k, v))
        stride = _slice_stride(k)
    return k, v, stride


def kv_injection_attention(
    q: torch.Tensor,  # [b, h, B, d], RoPE applied
    ctx_k: torch.Tensor,  # [b, kvh, c, d], c may be 0
    ctx_v: torch.Tensor,  # [b, kvh, c, d]
    blk_k: torch.Tensor,  # [b, kvh, B, d]
    blk_v: torch.Tensor,  # [b, kvh, B, d]
    ctx_lens: torch.Tensor | None = None,  # [b] int32/int64, valid context rows (<= c); None = all c
    block_m: int | None = None,
    block_n: int = 64,
    out: torch.Tensor | None = None,  # [b, h, B, d] contiguous, written in place when given
) -> torch.Tensor:  # [b, h, B, d]
    """Launch the Triton kernel: softmax(q·[ctx_k; blk_k]ᵀ/√d)·[ctx_v; blk_v] per head."""
    check_launchable(q, ctx_k, ctx_v, blk_k, blk_v)
    _check(q, ctx_k, ctx_v, blk_k, blk_v)
    b, h, block, d = q.shape
    kvh, c = ctx_k.shape[1], ctx_k.shape[2]
    q = q.contiguous()
    ctx_k, ctx_v, ctx_stride = _kv_slices(ctx_k, ctx_v)
    blk_k, blk_v, blk_stride = _kv_slices(blk_k, blk_v)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise TrtspecError(f"out must be a contiguous {tuple(q.shape)} {q.dtype} tensor")
    rows = (h // kvh) * block
    if block_m is None:
        # few (batch, kv head) pairs cannot fill a GPU: smaller row blocks give more programs, and
        # the K/V tiles they share come from L2
        block_m = min(64, next_pow2(rows)) if b * kvh >= 64 else 16
    lens = ctx_lens.to(torch.int32).contiguous() if ctx_lens is not None else q  # unread placeholder
    grid = (triton.cdiv(rows, block_m), b * kvh)
    kv_injection_attention_kernel[grid](
        q, ctx_k, ctx_v, blk_k, blk_v, lens, h, kvh, c, block,
        ctx_stride, blk_stride, out,
        **kernel_constexprs(d, block_m, block_n, ctx_lens is not None,
                            upcast_dot=interpreting() and q.dtype == torch.bfloat16),
    )
    return out


def kv_injection_attention_concat(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The reference's signature: k, v [b, kvh, c+B, d] already concatenated; no copy is made."""
    block = q.shape[2]
    c = k.shape[2] - block
    if c < 0:
        raise TrtspecError(f"K has {k.shape[2]} rows, fewer than the block's {block} queries")
    k, v = k.contiguous(), v.contiguous()
    return kv_injection_attention(q, k[:, :, :c], v[:, :, :c], k[:, :, c:], v[:, :, c:])
