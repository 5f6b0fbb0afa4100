"""Gumbel coupling: sampled tokens fixed in advance by (seed, position), whatever the schedule.

Rejection sampling (`spec.verify`) keeps the law of the text exact, but its random draws follow
each step's draft length, which the batch and the adaptive schedule pick: a seed repeats a text
only under the same schedule. With Gumbel coupling every random choice is made in advance. The
token at position t of a request with seed s is

    x_t = argmax_v ( log p_t(v) + g(s, t, v) ),   g = −log(−log u),  u = hash(s, t, v) in (0, 1)

(the Gumbel-max trick: with u i.i.d. uniform, x_t is a draw from p_t, independent of the earlier
positions). The drafter proposes with the same noise, argmax_v(log q_t(v) + g(s, t, v)), and the
verifier is the greedy rule on the perturbed target logits: a draft is accepted iff it equals the
token the target would sample there. So the emitted text is, token for token, what the target
alone samples with seed s, under any batch, schedule, drafter, tree or flavour: lossless holds
the way it holds for greedy decoding, and it can be checked the same way, by equality.

The price is acceptance: a draft matches with probability P(argmax(log q + g) = argmax(log p + g)),
at least (1 − TV) / (1 + TV) where rejection sampling accepts 1 − TV (TV: total variation between
p and q); `trtspec bench --temperature` measures both.

The hash is murmur3's 32-bit finaliser (`fmix32`) in int64 arithmetic that never overflows, so
CPU and CUDA give the same bits; u takes 23 of them, exactly representable in float32.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import torch

from trtspec.spec.sampling import SamplingParams, row_probs

MASK32 = 0xFFFFFFFF
_SEED_SALT, _POSITION_SALT, _VOCAB_SALT, _FINAL_SALT = 0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344


def _mul32(x, m: int):
    """(x · m) mod 2^32 for x in [0, 2^32) (int or int64 tensor), in 16-bit halves: no int64 overflow."""
    low = (x & 0xFFFF) * m  # < 2^48
    high = ((x >> 16) * m) & 0xFFFF  # (high half · m) mod 2^16
    return (low + (high << 16)) & MASK32


def fmix32(x):
    """murmur3's finaliser: a bijection of [0, 2^32) whose every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def seed_key(seed: int) -> int:
    """A request's 64-bit seed folded into 32 bits of key."""
    return fmix32(fmix32((seed & MASK32) ^ _SEED_SALT) ^ (seed >> 32))


def fresh_seed() -> int:
    """A seed for a coupled request that gave none (its text is then reproducible from this seed)."""
    return secrets.randbits(63)


_VOCAB_KEYS: dict[tuple[int, str], torch.Tensor] = {}


def _vocab_keys(vocab: int, device: torch.device) -> torch.Tensor:
    key = (vocab, str(device))
    if key not in _VOCAB_KEYS:
        _VOCAB_KEYS[key] = fmix32(torch.arange(vocab, dtype=torch.int64, device=device) ^ _VOCAB_SALT)
    return _VOCAB_KEYS[key]


def gumbel_noise(seeds: Sequence[int], positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """g(seed_r, position, v) for every row's positions and every token.
    seeds [R], positions [R, n] (int) -> [R, n, V] float32 standard Gumbel."""
    if any(s is None for s in seeds):
        raise ValueError("a Gumbel-coupled request needs a seed (SpeculativeDecoder.add gives one)")
    device = positions.device
    keys = torch.tensor([seed_key(s) for s in seeds], dtype=torch.int64, device=device)  # [R]
    at = fmix32(keys[:, None] ^ fmix32((positions.long() & MASK32) ^ _POSITION_SALT))  # [R, n]
    bits = fmix32(at[..., None] ^ _vocab_keys(vocab, device))  # [R, n, V]
    # 23 bits: u = (2m + 1) / 2^24 is exact in float32 and never 0 or 1, so g stays finite
    u = ((bits >> 9) * 2 + 1).float() * 2.0**-24
    return -torch.log(-torch.log(u))


def coupled_logits(logits: torch.Tensor, params: Sequence[SamplingParams],
                   positions: torch.Tensor) -> torch.Tensor:
    """log p + g under each row's temperature/top-k/top-p: its argmax is the coupled sample.
    logits [R, n, V], positions [R, n] -> [R, n, V] (−inf where p is 0)."""
    noise = gumbel_noise([p.seed for p in params], positions, logits.shape[-1])
    return row_probs(logits, params).log() + noise


def coupled_rows(params: Sequence[SamplingParams]) -> list[int]:
    return [r for r, p in enumerate(params) if p.gumbel]


def perturb(logits: torch.Tensor, params: Sequence[SamplingParams],
            positions: torch.Tensor | None) -> torch.Tensor:
    """`logits` [R, n, V] with every Gumbel-coupled row replaced by its `coupled_logits` (positions
    [R, n] of the tokens each row predicts); other rows as they are. The greedy rules on the result
    pick the argmax of greedy rows and the coupled sample of coupled rows."""
    rows = coupled_rows(params)
    if not rows:
        return logits
    if positions is None:
        raise ValueError("Gumbel-coupled rows need the positions of the tokens they choose")
    idx = torch.tensor(rows, device=logits.device)
    out = logits.float().clone()
    out[idx] = coupled_logits(logits[idx], [params[r] for r in rows], positions[idx])
    return out
