"""Triton kernels of `trtspec::confidence_verify`: the accepted/recovered/bonus verifier.

One program per request row; positions are tested left to right and a row stops at its first
rejection, so only the target rows up to a+1 are read. `draft_lens` [b] caps how many drafts each
row may accept: DSpark's confidence scheduler truncates low-survival suffixes there, and the
truncated row then draws its bonus token from p at its own length, as `verify_greedy` /
`verify_sampling` do.

- greedy: x_i accepted iff x_i == argmax p_i (first index on ties, like torch.argmax); the extra
  token is argmax p_{a+1}. Reference: `trtspec.spec.verify.verify_greedy`.
- sampling: x_i accepted iff u_i · q_i(x_i) < p_i(x_i); the extra token is drawn by inverse CDF
  with u_last from norm(max(0, p_a − q_a)) after a rejection, else from p_a (float64 running
  sum). Randomness is an input; reference: `plugins.confidence_verify.reference`.
Outputs: num_accepted [b], tokens [b, k+1] (accepted, then recovered/bonus, then PAD = -1).
Kernel argument order is tensor inputs, int32 scalars, tensor outputs (TensorRT's aot_impl order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from plugins._common import check_launchable, next_pow2
from trtspec.errors import TrtspecError
from trtspec.spec.verify import PAD, VerifyOutput


@triton.jit
def argmax_step(x, idx, in_range, vocab, best_val, best_idx):
    """One block of a running argmax over a row: x [BLOCK_V] at token ids idx (in_range marks the
    real ones) -> the updated (best value, its first index), ties to the first index as torch.argmax."""
    chunk_max = tl.max(x, 0)
    chunk_idx = tl.min(tl.where(in_range & (x == chunk_max), idx, vocab), 0)
    better = chunk_max > best_val  # strict: an earlier chunk keeps a tie
    return tl.where(better, chunk_max, best_val), tl.where(better, chunk_idx, best_idx)


@triton.jit
def _row_argmax(ptr, vocab, BLOCK_V: tl.constexpr):
    offs = tl.arange(0, BLOCK_V)
    best_val = float("-inf")
    best_idx = 0
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        in_range = idx < vocab
        x = tl.load(ptr + idx, mask=in_range, other=float("-inf")).to(tl.float32)
        best_val, best_idx = argmax_step(x, idx, in_range, vocab, best_val, best_idx)
    return best_idx


@triton.jit
def _store_row(DRAFT, NUM_ACC, TOKENS, row, k, num_acc, last, BLOCK_K: tl.constexpr):
    j = tl.arange(0, BLOCK_K)  # BLOCK_K >= k + 1
    drafts = tl.load(DRAFT + row * k + j, mask=j < k, other=0)
    tokens = tl.where(j < num_acc, drafts, tl.where(j == num_acc, last, -1))
    tl.store(TOKENS + row * (k + 1) + j, tokens.to(TOKENS.dtype.element_ty), mask=j < k + 1)
    tl.store(NUM_ACC + row, num_acc.to(NUM_ACC.dtype.element_ty))


@triton.jit
def verify_greedy_kernel(
    DRAFT,  # [b, k] int32/int64
    LOGITS,  # [b, k+1, V] target logits (any float dtype)
    DRAFT_LENS,  # [b] int32 (read only when HAS_LENS)
    k, vocab,  # int32
    NUM_ACC,  # [b]
    TOKENS,  # [b, k+1]
    HAS_LENS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    n = k
    if HAS_LENS:
        n = tl.minimum(tl.load(DRAFT_LENS + row).to(tl.int32), k)
    num_acc = 0
    last = 0
    done = 0
    for i in range(0, k + 1):
        if done == 0:
            target = _row_argmax(LOGITS + (row * (k + 1) + i) * vocab, vocab, BLOCK_V)
            x = tl.load(DRAFT + row * k + i, mask=i < n, other=-1).to(tl.int32)
            ok = (i < n) & (x == target)
            num_acc = tl.where(ok, num_acc + 1, num_acc)
            last = tl.where(ok, last, target)
            done = tl.where(ok, 0, 1)
    _store_row(DRAFT, NUM_ACC, TOKENS, row, k, num_acc, last, BLOCK_K)


@triton.jit
def verify_sampling_kernel(
    DRAFT,  # [b, k] int32/int64, x_i drawn from q_i
    Q,  # [b, k, V] draft probabilities
    P,  # [b, k+1, V] target probabilities
    DRAFT_LENS,  # [b] int32 (read only when HAS_LENS)
    UNIFORMS,  # [b, k] float32
    U_LAST,  # [b] float32
    k, vocab,  # int32
    NUM_ACC,  # [b]
    TOKENS,  # [b, k+1]
    HAS_LENS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    n = k
    if HAS_LENS:
        n = tl.minimum(tl.load(DRAFT_LENS + row).to(tl.int32), k)
    # 1. accept x_i while u_i * q_i(x_i) < p_i(x_i)
    num_acc = 0
    done = 0
    for i in range(0, k):
        if done == 0:
            x = tl.load(DRAFT + row * k + i).to(tl.int64)
            p_x = tl.load(P + (row * (k + 1) + i) * vocab + x).to(tl.float32)
            q_x = tl.load(Q + (row * k + i) * vocab + x).to(tl.float32)
            u = tl.load(UNIFORMS + row * k + i).to(tl.float32)
            ok = (i < n) & (u * q_x < p_x)
            num_acc = tl.where(ok, num_acc + 1, num_acc)
            done = tl.where(ok, 0, 1)
    # 2. the law of the extra token: residual max(0, p_a - q_a) after a rejection, else p_a.
    # q is read as 0 where it does not apply, so max(0, p - q) is then p itself.
    rejected = num_acc < n
    p_row = P + (row * (k + 1) + num_acc) * vocab
    q_row = Q + (row * k + num_acc) * vocab
    offs = tl.arange(0, BLOCK_V)
    residual_sum = tl.zeros([], tl.float64)
    p_sum = tl.zeros([], tl.float64)
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        in_range = idx < vocab
        p = tl.load(p_row + idx, mask=in_range, other=0.0).to(tl.float32)
        q = tl.load(q_row + idx, mask=in_range & rejected, other=0.0).to(tl.float32)
        residual_sum += tl.sum(tl.maximum(p - q, 0.0).to(tl.float64), 0)
        p_sum += tl.sum(p.to(tl.float64), 0)
    use_residual = rejected & (residual_sum > 0)
    total = tl.where(use_residual, residual_sum, p_sum)
    # 3. inverse CDF: the first token whose running sum exceeds u_last * total
    threshold = tl.load(U_LAST + row).to(tl.float64) * total
    running = tl.zeros([], tl.float64)
    chosen = -1
    last_positive = 0
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        in_range = idx < vocab
        p = tl.load(p_row + idx, mask=in_range, other=0.0).to(tl.float32)
        q = tl.load(q_row + idx, mask=in_range & use_residual, other=0.0).to(tl.float32)
        d = tl.maximum(p - q, 0.0)
        cdf = running + tl.cumsum(d.to(tl.float64), 0)
        first = tl.min(tl.where(in_range & (cdf > threshold), idx, vocab), 0)
        chosen = tl.where((chosen < 0) & (first < vocab), first, chosen)
        last_positive = tl.maximum(last_positive, tl.max(tl.where(in_range & (d > 0), idx, 0), 0))
        running += tl.sum(d.to(tl.float64), 0)
    last = tl.where(chosen >= 0, chosen, last_positive)
    _store_row(DRAFT, NUM_ACC, TOKENS, row, k, num_acc, last, BLOCK_K)


def greedy_aot_signature(t: str) -> dict[str, str]:
    """Triton signature for TensorRT's aot_impl: int32 tokens and lengths, t = logits' fp32/fp16/bf16."""
    return {"DRAFT": "*i32", "LOGITS": f"*{t}", "DRAFT_LENS": "*i32", "k": "i32", "vocab": "i32",
            "NUM_ACC": "*i32", "TOKENS": "*i32"}


def sampling_aot_signature(t: str) -> dict[str, str]:
    """Triton signature for TensorRT's aot_impl: t = the probabilities' fp32/fp16/bf16."""
    return {"DRAFT": "*i32", "Q": f"*{t}", "P": f"*{t}", "DRAFT_LENS": "*i32", "UNIFORMS": "*fp32",
            "U_LAST": "*fp32", "k": "i32", "vocab": "i32", "NUM_ACC": "*i32", "TOKENS": "*i32"}


def _lens(draft_lens: torch.Tensor | None, like: torch.Tensor) -> tuple[torch.Tensor, bool]:
    if draft_lens is None:
        return like, False  # placeholder pointer, never read
    return draft_lens.to(torch.int32).contiguous(), True


def _outputs(draft_tokens: torch.Tensor, out) -> tuple[torch.Tensor, torch.Tensor]:
    b, k = draft_tokens.shape
    if out is not None:
        num_acc, tokens = out
        if num_acc.shape != (b,) or tokens.shape != (b, k + 1) or not tokens.is_contiguous():
            raise TrtspecError(f"out must be ([b], contiguous [b, k+1]) for b={b}, k={k}")
        return num_acc, tokens
    return (torch.empty(b, dtype=torch.long, device=draft_tokens.device),
            torch.empty(b, k + 1, dtype=torch.long, device=draft_tokens.device))


def verify_greedy(
    draft_tokens: torch.Tensor,  # [b, k]
    target_logits: torch.Tensor,  # [b, k+1, V]
    draft_lens: torch.Tensor | None = None,  # [b]
    block_v: int | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,  # ([b], [b, k+1]) integer buffers to fill
) -> VerifyOutput:
    """Kernel twin of `trtspec.spec.verify.verify_greedy` (NaN logits are not ordered like torch)."""
    check_launchable(draft_tokens, target_logits)
    b, k = draft_tokens.shape
    if k < 1 or target_logits.shape[:2] != (b, k + 1):
        raise TrtspecError(f"target_logits {tuple(target_logits.shape)} must be [b, k+1, V] for "
                           f"draft_tokens {tuple(draft_tokens.shape)} with k >= 1")
    vocab = target_logits.shape[-1]
    num_acc, tokens = _outputs(draft_tokens, out)
    lens, has_lens = _lens(draft_lens, draft_tokens)
    verify_greedy_kernel[(b,)](
        draft_tokens.contiguous(), target_logits.contiguous(), lens, k, vocab, num_acc, tokens,
        HAS_LENS=has_lens, BLOCK_V=block_v or min(1024, next_pow2(vocab)), BLOCK_K=next_pow2(k + 1),
    )
    return VerifyOutput(num_accepted=num_acc, tokens=tokens)


def verify_sampling(
    draft_tokens: torch.Tensor,  # [b, k]
    q_probs: torch.Tensor,  # [b, k, V]
    p_probs: torch.Tensor,  # [b, k+1, V]
    uniforms: torch.Tensor,  # [b, k] in [0, 1)
    u_last: torch.Tensor,  # [b] in [0, 1)
    draft_lens: torch.Tensor | None = None,  # [b]
    block_v: int | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,  # ([b], [b, k+1]) integer buffers to fill
) -> VerifyOutput:
    """Kernel twin of `plugins.confidence_verify.reference.verify_sampling_explicit`."""
    check_launchable(draft_tokens, q_probs, p_probs, uniforms, u_last)
    b, k = draft_tokens.shape
    vocab = p_probs.shape[-1]
    if k < 1 or q_probs.shape != (b, k, vocab) or p_probs.shape != (b, k + 1, vocab):
        raise TrtspecError(f"q_probs {tuple(q_probs.shape)} / p_probs {tuple(p_probs.shape)} must be "
                           f"[b, k, V] / [b, k+1, V] for draft_tokens {tuple(draft_tokens.shape)}, k >= 1")
    if uniforms.shape != (b, k) or u_last.shape != (b,):
        raise TrtspecError(f"uniforms {tuple(uniforms.shape)} / u_last {tuple(u_last.shape)} "
                           "must be [b, k] / [b]")
    num_acc, tokens = _outputs(draft_tokens, out)
    lens, has_lens = _lens(draft_lens, draft_tokens)
    verify_sampling_kernel[(b,)](
        draft_tokens.contiguous(), q_probs.contiguous(), p_probs.contiguous(), lens,
        uniforms.float().contiguous(), u_last.float().contiguous(), k, vocab, num_acc, tokens,
        HAS_LENS=has_lens, BLOCK_V=block_v or min(1024, next_pow2(vocab)), BLOCK_K=next_pow2(k + 1),
    )
    return VerifyOutput(num_accepted=num_acc, tokens=tokens)


__all__ = ["PAD", "verify_greedy", "verify_greedy_kernel", "verify_sampling", "verify_sampling_kernel"]
