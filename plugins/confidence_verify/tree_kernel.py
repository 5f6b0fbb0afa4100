"""Triton kernels of `trtspec::confidence_verify_tree_{greedy,sampling}`: draft-tree verification.

One program per request row walks its tree as `trtspec.spec.tree_verify` does: nodes are numbered
parents first, so one pass over node indices meets every child of the current node after it; the
first child that passes is accepted and the walk continues from it. A chain is the tree whose
parents are 0, 1, …, k − 1.

- greedy: a child is accepted iff its token is argmax p of the current node (the first such
  child); the bonus token is argmax p of the last accepted node.
- sampling, deterministic children: child x is accepted iff u · (1 − gone) < r(x) in float64, gone
  the mass of the current node's children rejected so far and r(x) = 0 for a token one of them
  carried; the last token is drawn by inverse CDF with u_last from p of the last node with its
  children's tokens removed (p itself when nothing is left). Reference: `verify_tree_sampling`
  with `q_probs=None`; children sampled from q (recursive rejection sampling) have no kernel.
Inputs: draft_tokens, parents [b, n] (node i + 1; parent 0 = the root), draft_lens [b] (nodes per
row), target logits or processed p [b, n+1, V], uniforms [b, n], u_last [b]. Outputs: num_accepted
[b], path [b, n] (accepted nodes, then −1), tokens [b, n+1] (accepted, then the last token, −1).
Kernel argument order is tensor inputs, int32 scalars, tensor outputs (TensorRT's aot_impl order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from plugins._common import check_launchable, next_pow2
from plugins.confidence_verify.kernel import _row_argmax
from trtspec.errors import TrtspecError
from trtspec.spec.tree_verify import TreeVerdict


@triton.jit
def _store_tree(DRAFT, NUM_ACC, PATH, TOKENS, row, n, num_acc, path, last, BLOCK_N: tl.constexpr):
    j = tl.arange(0, BLOCK_N)  # BLOCK_N >= n + 1
    drafts = tl.load(DRAFT + row * n + path - 1, mask=(j < num_acc) & (path > 0), other=0)
    tokens = tl.where(j < num_acc, drafts, tl.where(j == num_acc, last, -1))
    tl.store(TOKENS + row * (n + 1) + j, tokens.to(TOKENS.dtype.element_ty), mask=j < n + 1)
    tl.store(PATH + row * n + j, path.to(PATH.dtype.element_ty), mask=j < n)
    tl.store(NUM_ACC + row, num_acc.to(NUM_ACC.dtype.element_ty))


@triton.jit
def verify_tree_greedy_kernel(
    DRAFT,  # [b, n] int32/int64
    PARENTS,  # [b, n] int32/int64
    DRAFT_LENS,  # [b] int32
    LOGITS,  # [b, n+1, V] target logits (any float dtype)
    n, vocab,  # int32
    NUM_ACC,  # [b]
    PATH,  # [b, n]
    TOKENS,  # [b, n+1]
    BLOCK_V: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    size = tl.minimum(tl.load(DRAFT_LENS + row).to(tl.int32), n)
    j = tl.arange(0, BLOCK_N)
    path = tl.full([BLOCK_N], -1, tl.int32)
    cur = 0
    num_acc = 0
    target = _row_argmax(LOGITS + row * (n + 1) * vocab, vocab, BLOCK_V)
    for i in range(0, n):
        par = tl.load(PARENTS + row * n + i).to(tl.int32)
        x = tl.load(DRAFT + row * n + i).to(tl.int32)
        if (i < size) & (par == cur) & (x == target):
            path = tl.where(j == num_acc, i + 1, path)
            num_acc += 1
            cur = i + 1
            target = _row_argmax(LOGITS + (row * (n + 1) + cur) * vocab, vocab, BLOCK_V)
    _store_tree(DRAFT, NUM_ACC, PATH, TOKENS, row, n, num_acc, path, target, BLOCK_N)


@triton.jit
def verify_tree_sampling_kernel(
    DRAFT,  # [b, n] int32/int64
    PARENTS,  # [b, n] int32/int64
    DRAFT_LENS,  # [b] int32
    P,  # [b, n+1, V] processed target probabilities
    UNIFORMS,  # [b, n] float32
    U_LAST,  # [b] float32
    n, vocab,  # int32
    NUM_ACC,  # [b]
    PATH,  # [b, n]
    TOKENS,  # [b, n+1]
    BLOCK_V: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    size = tl.minimum(tl.load(DRAFT_LENS + row).to(tl.int32), n)
    j = tl.arange(0, BLOCK_N)
    valid = j < size
    parents = tl.load(PARENTS + row * n + j, mask=valid, other=-1).to(tl.int32)
    toks = tl.load(DRAFT + row * n + j, mask=valid, other=-1).to(tl.int32)
    path = tl.full([BLOCK_N], -1, tl.int32)
    cur = 0
    num_acc = 0
    gone = tl.zeros([], tl.float64)  # r's mass removed at the current node
    # 1. walk: each child of the current node is a point-mass draft tested against what is left
    for i in range(0, n):
        par = tl.load(PARENTS + row * n + i).to(tl.int32)
        if (i < size) & (par == cur):
            x = tl.load(DRAFT + row * n + i).to(tl.int32)
            repeat = tl.sum(((parents == cur) & (toks == x) & (j < i)).to(tl.int32), 0) > 0
            p_x = tl.load(P + (row * (n + 1) + cur) * vocab + x).to(tl.float32).to(tl.float64)
            r_x = tl.where(repeat, 0.0, p_x)
            u = tl.load(UNIFORMS + row * n + i).to(tl.float32).to(tl.float64)
            if u * (1.0 - gone) < r_x:
                path = tl.where(j == num_acc, i + 1, path)
                num_acc += 1
                cur = i + 1
                gone = tl.zeros([], tl.float64)
            else:
                gone += r_x
    # 2. the last token's law: p at the last node without its (all rejected) children's tokens
    kids = tl.where(valid & (parents == cur), toks, -1)  # [BLOCK_N]
    p_row = P + (row * (n + 1) + cur) * vocab
    offs = tl.arange(0, BLOCK_V)
    residual_sum = tl.zeros([], tl.float64)
    p_sum = tl.zeros([], tl.float64)
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        p = tl.load(p_row + idx, mask=idx < vocab, other=0.0).to(tl.float32)
        removed = tl.sum((kids[:, None] == idx[None, :]).to(tl.int32), 0) > 0
        residual_sum += tl.sum(tl.where(removed, 0.0, p).to(tl.float64), 0)
        p_sum += tl.sum(p.to(tl.float64), 0)
    use_residual = residual_sum > 0  # only float rounding rejects all of p's mass
    total = tl.where(use_residual, residual_sum, p_sum)
    strip = use_residual.to(tl.int32)  # as a factor: the interpreter cannot `&` a scalar bool onto a vector
    # 3. inverse CDF: the first token whose running sum exceeds u_last * total
    threshold = tl.load(U_LAST + row).to(tl.float64) * total
    running = tl.zeros([], tl.float64)
    chosen = -1
    last_positive = 0
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        in_range = idx < vocab
        p = tl.load(p_row + idx, mask=in_range, other=0.0).to(tl.float32)
        removed = tl.sum((kids[:, None] == idx[None, :]).to(tl.int32), 0) * strip > 0
        d = tl.where(removed, 0.0, p)
        cdf = running + tl.cumsum(d.to(tl.float64), 0)
        first = tl.min(tl.where(in_range & (cdf > threshold), idx, vocab), 0)
        chosen = tl.where((chosen < 0) & (first < vocab), first, chosen)
        last_positive = tl.maximum(last_positive, tl.max(tl.where(in_range & (d > 0), idx, 0), 0))
        running += tl.sum(d.to(tl.float64), 0)
    last = tl.where(chosen >= 0, chosen, last_positive)
    _store_tree(DRAFT, NUM_ACC, PATH, TOKENS, row, n, num_acc, path, last, BLOCK_N)


def tree_greedy_aot_signature(t: str) -> dict[str, str]:
    """Triton signature for TensorRT's aot_impl: int32 tokens/parents/lengths, t = logits' dtype."""
    return {"DRAFT": "*i32", "PARENTS": "*i32", "DRAFT_LENS": "*i32", "LOGITS": f"*{t}", "n": "i32",
            "vocab": "i32", "NUM_ACC": "*i32", "PATH": "*i32", "TOKENS": "*i32"}


def tree_sampling_aot_signature(t: str) -> dict[str, str]:
    return {"DRAFT": "*i32", "PARENTS": "*i32", "DRAFT_LENS": "*i32", "P": f"*{t}", "UNIFORMS": "*fp32",
            "U_LAST": "*fp32", "n": "i32", "vocab": "i32", "NUM_ACC": "*i32", "PATH": "*i32",
            "TOKENS": "*i32"}


def _prepare(tokens: torch.Tensor, parents: torch.Tensor, sizes, probs: torch.Tensor):
    b, n = tokens.shape
    if n < 1 or parents.shape != (b, n) or probs.shape[:2] != (b, n + 1):
        raise TrtspecError(f"tokens/parents {tuple(tokens.shape)}/{tuple(parents.shape)} and target "
                           f"{tuple(probs.shape)} must be [b, n], [b, n], [b, n+1, V] with n >= 1")
    lens = torch.as_tensor(list(sizes), dtype=torch.int32, device=tokens.device)
    outs = (torch.empty(b, dtype=torch.long, device=tokens.device),
            torch.empty(b, n, dtype=torch.long, device=tokens.device),
            torch.empty(b, n + 1, dtype=torch.long, device=tokens.device))
    return b, n, lens, outs


def verify_tree_greedy(tokens: torch.Tensor, parents: torch.Tensor, sizes, target_logits: torch.Tensor,
                       block_v: int | None = None) -> TreeVerdict:
    """Kernel twin of `trtspec.spec.tree_verify.verify_tree_greedy`."""
    check_launchable(tokens, parents, target_logits)
    b, n, lens, (num_acc, path, out) = _prepare(tokens, parents, sizes, target_logits)
    vocab = target_logits.shape[-1]
    verify_tree_greedy_kernel[(b,)](
        tokens.contiguous(), parents.contiguous(), lens, target_logits.contiguous(), n, vocab,
        num_acc, path, out,
        BLOCK_V=block_v or min(1024, next_pow2(vocab)), BLOCK_N=next_pow2(n + 1))
    return TreeVerdict(num_accepted=num_acc, path=path, tokens=out)


def verify_tree_sampling(tokens: torch.Tensor, parents: torch.Tensor, sizes, p_probs: torch.Tensor,
                         uniforms: torch.Tensor, u_last: torch.Tensor,
                         block_v: int | None = None) -> TreeVerdict:
    """Kernel twin of `trtspec.spec.tree_verify.verify_tree_sampling` (deterministic children)."""
    check_launchable(tokens, parents, p_probs, uniforms, u_last)
    b, n, lens, (num_acc, path, out) = _prepare(tokens, parents, sizes, p_probs)
    if uniforms.shape != (b, n) or u_last.shape != (b,):
        raise TrtspecError(f"uniforms {tuple(uniforms.shape)} / u_last {tuple(u_last.shape)} "
                           "must be [b, n] / [b]")
    vocab = p_probs.shape[-1]
    block_n = next_pow2(n + 1)
    verify_tree_sampling_kernel[(b,)](
        tokens.contiguous(), parents.contiguous(), lens, p_probs.contiguous(), uniforms.float().contiguous(),
        u_last.float().contiguous(), n, vocab, num_acc, path, out,
        BLOCK_V=block_v or min(max(16, 16384 // block_n), next_pow2(vocab)), BLOCK_N=block_n)
    return TreeVerdict(num_accepted=num_acc, path=path, tokens=out)


__all__ = ["verify_tree_greedy", "verify_tree_greedy_kernel", "verify_tree_sampling",
           "verify_tree_sampling_kernel"]
