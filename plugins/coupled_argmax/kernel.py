"""Triton kernel of Gumbel coupling (`trtspec.spec.coupling`): token = argmax_v(w_v + g(key, v)).

One program per row (a request at one position). It reads the row's log-weights w (log p up to a
constant, −inf where p is 0) once, block by block, hashes each token's Gumbel noise from the row's
32-bit key in registers (murmur3's finaliser in uint32 arithmetic, which wraps as the torch
reference's 16-bit-halves product does) and keeps the running argmax (first index on ties, like
torch.argmax). The [rows, V] noise the torch reference writes and reads back never exists, so the
cost is one read of w: what a plain argmax costs. Bits, uniforms and ties are the reference's;
only `log` may round differently in the last place, which can move a choice only where two tokens
are within a float32 ulp of each other.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from plugins._common import check_launchable
from plugins.confidence_verify.kernel import argmax_step
from trtspec.spec.coupling import _VOCAB_SALT


@triton.jit
def _fmix32(x):
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def coupled_argmax_kernel(
    WEIGHTS,  # [rows, V] log-weights (any float dtype)
    KEYS,  # [rows] int64 holding each row's 32-bit key (`trtspec.spec.coupling.row_keys`)
    vocab,  # int32
    OUT,  # [rows] int64 chosen token
    VOCAB_SALT: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    key = tl.load(KEYS + row).to(tl.uint32)
    offs = tl.arange(0, BLOCK_V)
    best_val = float("-inf")
    best_idx = 0
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        in_range = idx < vocab
        w = tl.load(WEIGHTS + row * vocab + idx, mask=in_range, other=float("-inf")).to(tl.float32)
        token_key = _fmix32(idx.to(tl.uint32) ^ VOCAB_SALT)
        bits = _fmix32(key ^ token_key)
        u = ((bits >> 8) | 1).to(tl.float32) * (1.0 / 16777216.0)  # (2m + 1) / 2^24, exact
        z = tl.where(in_range, w - tl.log(-tl.log(u)), float("-inf"))
        best_val, best_idx = argmax_step(z, idx, in_range, vocab, best_val, best_idx)
    tl.store(OUT + row, best_idx.to(tl.int64))


def coupled_argmax(weights: torch.Tensor, keys: torch.Tensor, block_v: int = 1024) -> torch.Tensor:
    """weights [rows, V] (log p up to a constant per row), keys [rows] int64 -> tokens [rows] int64."""
    check_launchable(weights, keys)
    weights = weights.contiguous()
    rows, vocab = weights.shape
    out = torch.empty(rows, dtype=torch.int64, device=weights.device)
    if rows:
        coupled_argmax_kernel[(rows,)](weights, keys.contiguous(), vocab, out, VOCAB_SALT=_VOCAB_SALT,
                                       BLOCK_V=block_v)
    return out
