"""Gumbel coupling (`trtspec.spec.coupling`): each sampled token is argmax(log p + g(seed, position)),
a draw from p, independent across positions and seeds; the hash is exact integer arithmetic."""

from __future__ import annotations

import random

import pytest
import torch

from trtspec.spec.coupling import (
    _VOCAB_SALT,
    MASK32,
    coupled_choice,
    fmix32,
    gumbel_noise,
    noise_of_keys,
    row_keys,
)
from trtspec.spec.sampling import SamplingParams, probs_from_logits

DRAWS = 40_000


def _reference_fmix32(x: int) -> int:
    """murmur3's finaliser on Python's unbounded ints, the plain way."""
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & MASK32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & MASK32
    return x ^ (x >> 16)


def test_the_hash_is_murmur3_s_finaliser_without_int64_overflow():
    rng = random.Random(7)
    values = [0, 1, 0xFFFF, 0x10000, MASK32, MASK32 - 1, 2**31, 2**31 - 1] + \
        [rng.getrandbits(32) for _ in range(2000)]
    got = fmix32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert got == [_reference_fmix32(v) for v in values]
    assert [fmix32(v) for v in values[:50]] == got[:50]  # the same function on Python ints


def _uniforms(g: torch.Tensor) -> torch.Tensor:
    return torch.exp(-torch.exp(-g.double()))  # Gumbel -> its uniform


def test_noise_is_uniform_and_uncorrelated_across_tokens_positions_and_seeds():
    rng = random.Random(3)
    seeds = [rng.getrandbits(64) for _ in range(2)] + list(range(62))
    positions = torch.arange(100)[None].expand(len(seeds), 100)
    u = _uniforms(gumbel_noise(seeds, positions, 64))  # [S, T, V]
    assert torch.isfinite(u).all() and (u > 0).all() and (u < 1).all()
    counts = torch.histc(u.flatten(), bins=20, min=0.0, max=1.0)
    expected = u.numel() / 20
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 60, chi2  # 19 degrees of freedom: 60 is far in the tail

    def corr(a, b):
        return torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].abs().item()

    assert corr(u[:, :, 1:], u[:, :, :-1]) < 0.01  # neighbouring tokens
    assert corr(u[:, 1:], u[:, :-1]) < 0.01  # neighbouring positions
    assert corr(u[1:], u[:-1]) < 0.01  # neighbouring seeds
    again = gumbel_noise(seeds[:3], positions[:3], 64)
    assert torch.equal(again, gumbel_noise(seeds[:3], positions[:3], 64))


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


PARAMS = [SamplingParams(temperature=1.0, coupling="gumbel"),
          SamplingParams(temperature=0.7, top_k=4, coupling="gumbel"),
          SamplingParams(temperature=1.3, top_p=0.8, coupling="gumbel"),
          SamplingParams(temperature=1.0, min_p=0.15, coupling="gumbel")]


@pytest.mark.parametrize("params", PARAMS, ids=["t1", "t0.7-k4", "t1.3-p0.8", "t1-m0.15"])
def test_coupled_samples_follow_the_processed_target_jointly_over_positions(params):
    """Over 40k seeds, (x_t, x_t+1) is distributed as p_t ⊗ p_t+1 under the request's temperature,
    top-k and top-p: each a draw from p, and the two independent."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(2, 6, generator=gen) * 1.5  # [positions, V]
    seeds = [random.Random(5).getrandbits(64)] + list(range(1, DRAWS))
    rows = [params.model_copy(update={"seed": s}) for s in seeds]
    positions = torch.tensor([[40, 41]]).expand(DRAWS, 2)
    tokens = coupled_choice(logits.expand(DRAWS, 2, 6), rows, positions)  # [N, 2]
    p = probs_from_logits(logits, params)  # [2, V]
    joint = torch.bincount(tokens[:, 0] * 6 + tokens[:, 1], minlength=36).double() / DRAWS
    assert tv(joint, (p[0][:, None] * p[1][None, :]).flatten().double()) < 0.03
    for t in range(2):
        assert tv(torch.bincount(tokens[:, t], minlength=6).double() / DRAWS, p[t].double()) < 0.015


def test_a_draft_matches_at_least_as_often_as_the_coupling_bound_says():
    """P(argmax(log q + g) = argmax(log p + g)) ≥ (1 − TV)/(1 + TV), the acceptance the docs promise."""
    gen = torch.Generator().manual_seed(2)
    for _ in range(4):
        p_logits, q_logits = torch.randn(2, 8, generator=gen) * 2
        rows = [SamplingParams(temperature=1.0, coupling="gumbel", seed=s) for s in range(DRAWS)]
        positions = torch.full((DRAWS, 1), 9)
        both = torch.stack([p_logits, q_logits])[:, None, None].expand(2, DRAWS, 1, 8)
        x_p = coupled_choice(both[0], rows, positions)
        x_q = coupled_choice(both[1], rows, positions)
        distance = tv(torch.softmax(p_logits, -1), torch.softmax(q_logits, -1))
        assert (x_p == x_q).double().mean().item() >= (1 - distance) / (1 + distance) - 0.01


@pytest.mark.parametrize("coupling", ["gumbel", "rejection"])
def test_an_unseeded_request_reports_the_seed_that_samples_it_again(coupling):
    """The decoder draws a seed for a sampled request that gave none and reports it
    (`GenerationResult.seed`, `trtspec generate --json`): sent again alone, it samples the same
    text. Greedy requests report none."""
    from trtspec.bench.loop_overhead import tiny_pipeline
    from trtspec.prompts import load_prompts

    pipeline = tiny_pipeline(torch.device("cpu"), cuda_graphs=False)
    ids = pipeline.tokenizer.encode(load_prompts("chat")[2])
    unseeded = SamplingParams(temperature=1.0, coupling=coupling)
    first, second = (pipeline.decoder.generate(ids, 32, unseeded) for _ in range(2))
    assert first.seed is not None and first.seed != second.seed and first.token_ids != second.token_ids
    again = pipeline.decoder.generate(ids, 32, unseeded.model_copy(update={"seed": first.seed}))
    assert again.token_ids == first.token_ids and again.seed == first.seed
    assert first.to_dict()["seed"] == first.seed
    assert pipeline.decoder.generate(ids, 8).seed is None


def test_a_coupled_sample_does_not_depend_on_what_is_batched_with_it():
    """Near-ties of log p + g, made on purpose: a row that cuts nothing must pick the same token
    alone and beside a top-k row. log_weights took logits / T for a batch that cut nothing and
    log(softmax) for one that did, for every row: the rounding apart moved such ties (the 16th
    made here sampled token 55 alone and 10 batched)."""
    vocab, position = 64, 5
    alone = SamplingParams(temperature=0.7, seed=11, coupling="gumbel")
    beside = SamplingParams(temperature=0.7, top_k=5, seed=12, coupling="gumbel")
    g = gumbel_noise([alone.seed], [[position]], vocab)[0, 0]  # [V]
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        logits = 3 * torch.randn(vocab, generator=gen)
        i, j = (logits / alone.temperature + g).topk(2).indices.tolist()
        # j's score within a few float32 steps of i's
        nudge = int(torch.randint(-8, 9, (1,), generator=gen)) * 2e-7
        logits[j] = alone.temperature * (logits[i] / alone.temperature + g[i] - g[j]) + nudge
        row = logits[None, None]  # [1, 1, V]
        solo = coupled_choice(row, [alone], [[position]])
        batched = coupled_choice(torch.cat([row, row]), [alone, beside], [[position], [position]])
        assert int(solo[0, 0]) == int(batched[0, 0])


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_a_coupled_sample_under_top_k_1_is_the_argmax(temperature):
    """top_k = 1 leaves p a point mass on the most likely token: whatever the seed, position and
    noise, the coupled sample is that token, as greedy decoding's."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(64, 3, 32, generator=gen) * 2  # [R, n, V]
    rows = [SamplingParams(temperature=temperature, top_k=1, seed=s, coupling="gumbel") for s in range(64)]
    positions = torch.arange(3)[None].expand(64, 3) + 17
    assert torch.equal(coupled_choice(logits, rows, positions), logits.argmax(-1))


def test_row_keys_go_where_they_are_asked_whatever_the_positions_device():
    """Keys are hashed on the host and sent to the device asked for, else to the positions'."""
    positions = torch.tensor([[3, 4], [5, 6]])
    assert row_keys([1, 2], positions).device == positions.device
    assert row_keys([1, 2], positions, torch.device("meta")).device.type == "meta"
    assert torch.equal(row_keys([1, 2], positions), row_keys([1, 2], positions.tolist()))


def test_noise_is_the_docstring_s_hash_spelt_out():
    """g = −log(−log u), u = (2m + 1) / 2^24 with m the top 23 bits of fmix32(key ^ the token's own
    key): odd multiples of 2^-24, never 0 or 1, checked against the plain-int hash."""
    rng = random.Random(9)
    keys = [rng.getrandbits(32) for _ in range(8)] + [0, MASK32]
    vocab = 50
    tokens = [_reference_fmix32(v ^ _VOCAB_SALT) for v in range(vocab)]
    u = torch.tensor([[(2 * (_reference_fmix32(k ^ t) >> 9) + 1) / 2**24 for t in tokens] for k in keys],
                     dtype=torch.float32)
    assert torch.equal(noise_of_keys(torch.tensor(keys), vocab), -torch.log(-torch.log(u)))


def test_row_keys_want_a_seed_per_row_of_positions():
    with pytest.raises(ValueError):
        row_keys([1, 2], [[3, 4]])
