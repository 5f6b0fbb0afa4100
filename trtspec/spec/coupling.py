"""Gumbel coupling: sampled tokens fixed in advance by (seed, position), whatever the schedule.

Rejection sampling (`spec.verify`) keeps the law of the text exact, but its random draws follow
each step's draft length, which the batch and the adaptive schedule pick: a seed repeats a text
only under the same schedule. With Gumbel coupling every random choice is made in advance. The
token at position t of a request with seed s is

    x_t = argmax_v ( log p_t(v) + g(s, t, v) ),   g = −log(−log u),  u = hash(s, t, v) in (0, 1)

(the Gumbel-max trick: with u i.i.d. uniform, x_t is a draw from p_t, independent of the earlier
positions). The drafter proposes with the same noise, argmax_v(log q_t(v) + g(s, t, v)), and the
verifier is the greedy rule with the target's coupled sample in place of its argmax: a draft is
accepted iff it equals the token the target samples there. So the emitted text is, token for
token, what the target alone samples with seed s, under any batch, schedule, drafter, tree or
flavour: lossless holds the way it holds for greedy decoding, and it can be checked the same way,
by equality.

The price is acceptance: a draft matches with probability P(argmax(log q + g) = argmax(log p + g)),
at least (1 − TV) / (1 + TV) where rejection sampling accepts 1 − TV (TV: total variation between
p and q); `scripts/coupling_bench.py` measures both (docs/SAMPLING.md).

The hash is murmur3's 32-bit finaliser (`fmix32`) in int64 arithmetic that never overflows, so
CPU and CUDA give the same bits; u takes 23 of them, exactly representable in float32. The keys of
(seed, position) are hashed on the host, the V per-token hashes where the logits are (on CUDA in
the fused kernel `plugins.coupled_argmax`).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence

import torch

from trtspec.spec.sampling import SamplingParams, row_probs, tempered

MASK32 = 0xFFFFFFFF
_SEED_SALT, _POSITION_SALT, _VOCAB_SALT = 0x243F6A88, 0x85A308D3, 0x13198A2E


def _mul32(x, m: int):
    """(x · m) mod 2^32 for x in [0, 2^32) (int or int64 tensor) and m in [2^31, 2^32), with no int64
    overflow: x · m = x · (m − 2^31) + x · 2^31, the first below 2^63, the second (x & 1) · 2^31 mod 2^32."""
    return (x * (m - 2**31) + ((x & 1) << 31)) & MASK32


def fmix32(x):
    """murmur3's finaliser: a bijection of [0, 2^32) whose every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


@functools.lru_cache(maxsize=4096)
def seed_key(seed: int) -> int:
    """A request's 64-bit seed folded into 32 bits of key."""
    return fmix32(fmix32((seed & MASK32) ^ _SEED_SALT) ^ (seed >> 32))


@functools.lru_cache(maxsize=1 << 16)
def _position_key(position: int) -> int:
    return fmix32((position & MASK32) ^ _POSITION_SALT)


def fresh_seed() -> int:
    """A seed for a sampled request that gave none (reported, so that its text can be sampled again)."""
    return secrets.randbits(63)


@functools.cache
def _vocab_keys(vocab: int, device: torch.device) -> torch.Tensor:
    """Every token's own key (the same for every row: hashed once per vocabulary and device)."""
    return fmix32(torch.arange(vocab, dtype=torch.int64, device=device) ^ _VOCAB_SALT)


Positions = torch.Tensor | Sequence[Sequence[int]]  # [R, n]: host lists spare a device its round trip


def row_keys(seeds: Sequence[int | None], positions: Positions, device=None) -> torch.Tensor:
    """The 32-bit key of every (request, position), hashed on the host (a handful of ints: a device
    would spend a kernel launch per operation on them).  seeds [R], positions [R, n] -> [R, n] int64"""
    if any(s is None for s in seeds):
        raise ValueError("a Gumbel-coupled request needs a seed (SpeculativeDecoder.add gives one)")
    if isinstance(positions, torch.Tensor):
        device = device or positions.device
        positions = positions.tolist()
    keys = [[fmix32(seed_key(s) ^ _position_key(t)) for t in row]
            for s, row in zip(seeds, positions, strict=True)]
    return torch.tensor(keys, dtype=torch.int64, device=device)


def noise_of_keys(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise of every token under each key.  keys [...] -> [..., V] float32"""
    bits = fmix32(keys[..., None] ^ _vocab_keys(vocab, keys.device))  # [..., V]
    # the top 23 bits m: u = (2m + 1) / 2^24 (= (bits >> 8) | 1 over 2^24) is exact in float32 and
    # never 0 or 1, so g stays finite
    u = ((bits >> 8) | 1).float() * 2.0**-24
    return -torch.log(-torch.log(u))


def gumbel_noise(seeds: Sequence[int | None], positions: Positions, vocab: int, device=None) -> torch.Tensor:
    """g(seed_r, position, v) for every row's positions and every token.
    seeds [R], positions [R, n] (int) -> [R, n, V] float32 standard Gumbel."""
    return noise_of_keys(row_keys(seeds, positions, device), vocab)


def log_weights(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """log p up to a constant per row under each row's temperature/top-k/min-p/top-p (−inf where p is 0):
    logits / T (`tempered`) for a row that cuts nothing, log of the processed probabilities for one
    that does. Each row's own parameters decide, never the batch's: the two differ by rounding,
    which can move the argmax of a near-tie, and a coupled sample must not depend on what else is
    batched with it.  [R, ..., V]"""
    temps = torch.tensor([p.temperature for p in params], device=logits.device)
    weights = tempered(logits, temps.view(-1, *[1] * (logits.dim() - 1)))
    cut = [r for r, p in enumerate(params) if p.top_k != 0 or p.top_p != 1.0 or p.min_p != 0.0]
    if cut:
        idx = torch.tensor(cut, device=logits.device)
        weights[idx] = row_probs(logits[idx], [params[r] for r in cut]).log()
    return weights


def coupled_scores(logits: torch.Tensor, params: Sequence[SamplingParams],
                   positions: Positions) -> torch.Tensor:
    """log p + g (up to a constant per row), written out: its argmax is the coupled sample.
    logits [R, n, V], positions [R, n] -> [R, n, V] float32"""
    seeds = [p.seed for p in params]
    return log_weights(logits, params) + gumbel_noise(seeds, positions, logits.shape[-1], logits.device)


def coupled_choice(logits: torch.Tensor, params: Sequence[SamplingParams],
                   positions: Positions) -> torch.Tensor:
    """The coupled sample of every row and position: argmax_v(log p(v) + g(seed, position, v)).
    logits [R, n, V], positions [R, n] -> tokens [R, n]. On CUDA one fused OpenAI Triton kernel
    (`plugins.coupled_argmax`) hashes, adds and reduces without writing the [R, n, V] noise;
    elsewhere the argmax of `coupled_scores`."""
    kernel = _fused_kernel() if logits.is_cuda else None
    if kernel is None:
        return coupled_scores(logits, params, positions).argmax(-1)
    weights = log_weights(logits, params)  # [R, n, V]
    keys = row_keys([p.seed for p in params], positions, logits.device)  # [R, n]
    return kernel(weights.reshape(-1, weights.shape[-1]), keys.reshape(-1)).view(keys.shape)


@functools.cache
def _fused_kernel():
    try:
        from plugins.coupled_argmax import coupled_argmax
    except ImportError:  # no OpenAI Triton (or no plugins folder): the torch reference
        return None
    return coupled_argmax


def coupled_rows(params: Sequence[SamplingParams]) -> list[int]:
    return [r for r, p in enumerate(params) if p.gumbel]
