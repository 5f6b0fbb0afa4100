"""`trtspec.spec.sampling` at its edges: the bounds SamplingParams accepts, top-k = 1, top-p = 1,
rows of two different laws, and the positions and tokens a Gumbel-coupled row's slots get. Each
case was a change to the module that every other fast test passed (scripts/mutants.py)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from trtspec.spec.coupling import coupled_choice
from trtspec.spec.sampling import SamplingParams, choose_tokens, probs_from_logits, row_probs


def test_the_bounds_of_seed_and_logit_bias_are_accepted_and_one_past_them_refused():
    """A seed is a UINT64 (Triton's random_seed): 2^64 - 1 is one, 2^64 is refused. A logit bias
    of exactly ±100 (OpenAI's bound, which both frontends let through) is accepted: refusing +100
    here would fail a request the frontend had accepted."""
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1
    with pytest.raises(ValidationError, match="seed"):
        SamplingParams(seed=2**64)
    assert SamplingParams(logit_bias=((3, 100.0), (4, -100.0))).logit_bias == ((3, 100.0), (4, -100.0))
    for bias in (100.5, -100.5):
        with pytest.raises(ValidationError, match="outside"):
            SamplingParams(logit_bias=((3, bias),))


def test_top_k_1_keeps_the_most_likely_token_alone():
    """top_k = 1 at any temperature is the argmax's one-hot (not the whole softmax)."""
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.5], [3.0, 0.0, 2.9, -2.0]])
    got = probs_from_logits(logits, SamplingParams(temperature=1.3, top_k=1))
    torch.testing.assert_close(got, torch.nn.functional.one_hot(logits.argmax(-1), 4).float())


def test_top_p_1_keeps_every_token_however_unlikely():
    """top_p = 1 is off: a token far below the most likely one (e^-20, which float32's cumulative
    sum cannot tell from nothing: 1.0 is reached at the first token) keeps its probability."""
    logits = torch.tensor([[0.0, -20.0, -20.0, -20.0]])
    want = torch.softmax(logits, -1)
    got = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=1.0))
    assert (got > 0).all()
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("top_p", [1e-30, 1e-46, 5e-324])
def test_a_vanishing_top_p_keeps_the_most_likely_token(top_p):
    """top_p > 0 under float32's smallest (5e-324, which a local SamplingParams keeps) compared as 0
    with the mass before the most likely token, so every token was dropped and the row was 0 / 0 =
    NaN (torch.multinomial then failed the whole step); the most likely token always stays."""
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.5], [3.0, 0.0, 2.9, -2.0]])
    params = SamplingParams(temperature=1.0, top_p=top_p)
    got = probs_from_logits(logits, params)
    torch.testing.assert_close(got, torch.nn.functional.one_hot(logits.argmax(-1), 4).float())
    tokens, _ = choose_tokens(logits, [params, SamplingParams()], [params.generator()] * 2)
    assert torch.equal(tokens, logits.argmax(-1))


def test_two_rows_of_two_laws_each_follow_their_own():
    """`row_probs` over two rows whose parameters differ gives each row its own law (not the first
    row's for both)."""
    logits = 2 * torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(4))  # [R, n, V]
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=2)]
    got = row_probs(logits, params)
    for r, p in enumerate(params):
        torch.testing.assert_close(got[r], probs_from_logits(logits[r], p))


def test_a_coupled_blocks_slots_are_the_coupled_samples_at_their_own_positions():
    """A Gumbel-coupled row's DFlash block (slots j at positions[r] + j) is exactly what choosing one
    slot at a time at those positions gives, `coupled_choice` at each position, and does not depend
    on the row's generator (a coupled token is never redrawn from q)."""
    gen = torch.Generator().manual_seed(6)
    r, n, vocab = 2, 4, 32
    logits = torch.randn(r, n, vocab, generator=gen)  # nearly flat: the noise decides
    params = [SamplingParams(temperature=1.0, seed=11, coupling="gumbel"),
              SamplingParams(temperature=0.9, top_k=20, seed=12, coupling="gumbel")]
    positions = [30, 7]
    block, _ = choose_tokens(logits, params, [torch.Generator().manual_seed(0) for _ in params], positions)
    other, _ = choose_tokens(logits, params, [torch.Generator().manual_seed(1) for _ in params], positions)
    assert torch.equal(block, other)
    want = coupled_choice(logits, params, [[p + j for j in range(n)] for p in positions])
    assert torch.equal(block, want)
    for j in range(n):
        alone, _ = choose_tokens(logits[:, j], params, [p.generator() for p in params],
                                 [p + j for p in positions])
        assert torch.equal(alone, block[:, j]), j
