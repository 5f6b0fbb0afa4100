"""The verifier: greedy prefix rule, and rejection sampling that reproduces p exactly."""

from __future__ import annotations

import math

import pytest
import torch

from trtspec.spec.sampling import SamplingParams, choose_tokens, probs_from_logits
from trtspec.spec.verify import PAD, Verifier, draw_uniforms, verify_greedy
from trtspec.spec.verify import verify_sampling as verify_explicit

V = 6
DRAWS = 40_000
TV_BOUND = 0.015  # TV of 40k draws over 6 outcomes is ~0.005 when the rule is right


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


def verify_sampling(draft, q, p, generator, draft_lens=None):
    """The rule with its randomness drawn from `generator` (as `Verifier.verify` draws it)."""
    return verify_explicit(draft, q, p, *draw_uniforms(*draft.shape, generator), draft_lens)


def broken_accept_q_over_p(draft, q, p, generator):
    """A wrong rule on purpose: accept with min(1, q/p) instead of min(1, p/q)."""
    return verify_sampling(draft, p[:, : draft.shape[1]], torch.cat([q, p[:, -1:]], 1), generator)


def _emitted_distribution(p, q, rule, position: int, seed: int) -> torch.Tensor:
    """Empirical law of the emitted token at `position` (0-based) given it is emitted."""
    gen = torch.Generator().manual_seed(seed)
    k = q.shape[0]
    pb = p.expand(DRAWS, k + 1, V)
    qb = q.expand(DRAWS, k, V)
    draft = torch.multinomial(qb.reshape(-1, V), 1, generator=gen).reshape(DRAWS, k)
    out = rule(draft, qb, pb, gen)
    tokens = out.tokens[:, position]
    tokens = tokens[tokens != PAD]
    return torch.bincount(tokens, minlength=V).float() / len(tokens)


CASES = {
    # name: (p rows [k+1, V], q rows [k, V])
    "overlapping": (
        torch.tensor([[0.4, 0.3, 0.1, 0.1, 0.05, 0.05], [0.1, 0.1, 0.2, 0.2, 0.2, 0.2],
                      [0.05, 0.05, 0.1, 0.1, 0.3, 0.4]]),
        torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.1, 0.1], [0.3, 0.3, 0.1, 0.1, 0.1, 0.1]]),
    ),
    "disjoint": (
        torch.tensor([[0.5, 0.5, 0, 0, 0, 0], [0, 0, 0, 0, 0.5, 0.5], [0.2, 0.2, 0.2, 0.2, 0.1, 0.1]]),
        torch.tensor([[0, 0, 0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0, 0, 0]]),
    ),
    "identical": (
        torch.tensor([[0.3, 0.3, 0.1, 0.1, 0.1, 0.1]] * 3),
        torch.tensor([[0.3, 0.3, 0.1, 0.1, 0.1, 0.1]] * 2),
    ),
}


@pytest.mark.parametrize(
    "case,position",
    # with disjoint support x_1 is always rejected, so no second token is ever emitted
    [("overlapping", 0), ("overlapping", 1), ("disjoint", 0), ("identical", 0), ("identical", 1)],
)
def test_sampling_reproduces_target(case, position):
    p, q = CASES[case]
    emp = _emitted_distribution(p, q, verify_sampling, position, seed=11 + position)
    assert tv(emp, p[position]) < TV_BOUND, (emp, p[position])


def test_broken_rule_is_caught():
    p, q = CASES["overlapping"]
    emp = _emitted_distribution(p, q, broken_accept_q_over_p, 0, seed=5)
    assert tv(emp, p[0]) > 5 * TV_BOUND


def test_disjoint_support_never_accepts():
    p, q = CASES["disjoint"]
    gen = torch.Generator().manual_seed(1)
    draft = torch.multinomial(q.expand(200, 2, V).reshape(-1, V), 1, generator=gen).reshape(200, 2)
    out = verify_sampling(draft, q.expand(200, 2, V), p.expand(200, 3, V), gen)
    assert (out.num_accepted == 0).all()


def test_all_accepted_gives_bonus_from_last_row():
    # q == p everywhere: nothing is ever rejected, so every row emits k + 1 tokens
    p, q = CASES["identical"]
    gen = torch.Generator().manual_seed(0)
    draft = torch.multinomial(q.expand(500, 2, V).reshape(-1, V), 1, generator=gen).reshape(500, 2)
    out = verify_sampling(draft, q.expand(500, 2, V), p.expand(500, 3, V), gen)
    assert (out.num_accepted == 2).all()
    assert (out.tokens[:, :2] == draft).all()


def test_sampling_deterministic_given_seed():
    p, q = CASES["overlapping"]
    draft = torch.tensor([[2, 0]])
    runs = [
        verify_sampling(draft, q[None], p[None], torch.Generator().manual_seed(3)).tokens
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])


def test_greedy_longest_prefix_and_bonus():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 20)  # [b, k+1, V]
    argmax = logits.argmax(-1)
    draft = argmax[:, :4].clone()
    draft[0, 2] = (draft[0, 2] + 1) % 20  # row 0 rejects at position 3
    draft[1, 0] = (draft[1, 0] + 1) % 20  # row 1 rejects at once
    out = verify_greedy(draft, logits)  # row 2 accepts all
    assert out.num_accepted.tolist() == [2, 0, 4]
    assert out.row(0) == argmax[0, :3].tolist()
    assert out.row(1) == [argmax[1, 0].item()]
    assert out.row(2) == argmax[2].tolist()
    assert out.tokens[1, 1:].eq(PAD).all()


def test_greedy_respects_draft_lens():
    logits = torch.randn(2, 4, 10)
    draft = logits.argmax(-1)[:, :3]
    out = verify_greedy(draft, logits, draft_lens=torch.tensor([1, 3]))
    assert out.num_accepted.tolist() == [1, 3]
    assert out.row(0) == logits.argmax(-1)[0, :2].tolist()


def test_probs_from_logits_filters():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    top_k = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (top_k[0, 2:] == 0).all() and top_k.sum().item() == pytest.approx(1.0)
    full = torch.softmax(logits, -1)[0]
    top_p = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.8))
    kept = (top_p[0] > 0).sum().item()
    assert full[: kept - 1].sum() < 0.8 <= full[:kept].sum()
    greedy = probs_from_logits(logits, SamplingParams())
    assert greedy.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    hot = probs_from_logits(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(hot[0], torch.softmax(logits[0] / 0.5, -1))



@pytest.mark.parametrize("coupling", ["rejection", "gumbel"])
def test_a_temperature_near_zero_samples_the_argmax_instead_of_failing(coupling):
    """1e-45 is a positive float32 and a valid request: logits / T overflowed to ±inf and gave NaN
    probabilities (a served request at it failed every request decoding beside it); as T → 0 the
    processed distribution is one-hot on the argmax."""
    logits = torch.randn(3, 2, 40, generator=torch.Generator().manual_seed(5)) * 8  # [R, n, V]
    for temperature in (1e-45, 1e-38, 1e-20):
        params = [SamplingParams(temperature=temperature, seed=r, coupling=coupling) for r in range(3)]
        probs = probs_from_logits(logits, params[0])
        assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 40).float())
        generators = [p.generator() for p in params]
        tokens, _ = choose_tokens(logits, params, generators, positions=[0, 4, 9])
        assert torch.equal(tokens, logits.argmax(-1))

def _reference_probs(row: list[float], params: SamplingParams) -> list[float]:
    """The processed distribution the plain way: the top_k largest logits / T, softmax, then the
    most likely tokens until their mass reaches top_p, renormalised."""
    z = [v / params.temperature for v in row]
    order = sorted(range(len(z)), key=lambda i: -z[i])
    kept = order[:params.top_k] if params.top_k else order
    top = max(z[i] for i in kept)
    weight = {i: math.exp(z[i] - top) for i in kept}
    total = sum(weight.values())
    mass, nucleus = 0.0, []
    for i in kept:  # already in descending order
        nucleus.append(i)
        mass += weight[i] / total
        if mass >= params.top_p:
            break
    kept_total = sum(weight[i] for i in nucleus)
    return [weight[i] / kept_total if i in nucleus else 0.0 for i in range(len(z))]


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=5),
                                    SamplingParams(temperature=0.9, top_p=0.6),
                                    SamplingParams(temperature=1.1, top_k=7, top_p=0.75)],
                         ids=["t0.7", "t1.3-k5", "t0.9-p0.6", "t1.1-k7-p0.75"])
def test_processed_probabilities_match_a_plain_reference(params):
    """p and q, and the references of the distribution tests (test_coupling, test_lossless), all come
    from `probs_from_logits`: here it is checked against the definition itself, on unsorted [2, 3, V]
    logits (the test above has sorted ones, where top-p's sort order is the identity)."""
    logits = torch.randn(2, 3, 24, generator=torch.Generator().manual_seed(17)) * 2  # [2, 3, V]
    got = probs_from_logits(logits, params)
    expected = torch.tensor([[_reference_probs(row, params) for row in block] for block in logits.tolist()])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert ((got > 0).sum(-1) <= (params.top_k or 24)).all()
    greedy = probs_from_logits(logits, SamplingParams())
    assert torch.equal(greedy, torch.nn.functional.one_hot(logits.argmax(-1), 24).float())


def test_batched_verify_gives_each_row_its_own_rule_and_randomness():
    """One call over greedy and sampling rows (different temperatures, ragged draft_lens): greedy
    rows get the greedy verdict, and each sampling row the verdict it gets alone with its own
    generator, whatever the other rows are."""
    gen = torch.Generator().manual_seed(0)
    r, k, vocab = 5, 4, 12
    logits = 3 * torch.randn(r, k + 1, vocab, generator=gen)
    params = [SamplingParams(), SamplingParams(temperature=0.8, seed=1), SamplingParams(),
              SamplingParams(temperature=1.5, top_k=4, seed=2),
              SamplingParams(temperature=1.0, top_p=0.7, seed=3)]
    q = torch.softmax(torch.randn(r, k, vocab, generator=gen), -1)
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(r, k)
    draft[0] = logits[0, :k].argmax(-1)  # a greedy row that accepts everything
    lens = torch.tensor([4, 3, 2, 4, 1])
    verifier = Verifier()
    got = verifier.verify(draft, lens, q, logits, params, [p.generator() for p in params])
    greedy = verify_greedy(draft, logits, lens)
    for row in (0, 2):
        assert got.row(row) == greedy.row(row)
    assert got.num_accepted[0] == 4
    for row in (1, 3, 4):
        alone = verifier.verify(draft[row : row + 1], lens[row : row + 1], q[row : row + 1],
                                logits[row : row + 1], [params[row]], [params[row].generator()])
        assert got.row(row) == alone.row(0)


def test_a_step_without_greedy_rows_computes_no_greedy_verdict():
    """Rejection-sampled and Gumbel-coupled rows in one step, none greedy: each row gets the
    verdict it gets alone, and no greedy verdict of all rows is computed only to be overwritten."""

    class NoGreedy(Verifier):
        def greedy(self, *args, **kwargs):
            raise AssertionError("a greedy verdict was computed for a step without greedy rows")

    gen = torch.Generator().manual_seed(5)
    r, k, vocab = 4, 3, 10
    logits = 3 * torch.randn(r, k + 1, vocab, generator=gen)
    params = [SamplingParams(temperature=0.9, seed=4, coupling="gumbel"),
              SamplingParams(temperature=0.8, seed=1),
              SamplingParams(temperature=1.2, top_k=5, seed=9, coupling="gumbel"),
              SamplingParams(temperature=1.0, seed=2)]
    q = torch.softmax(torch.randn(r, k, vocab, generator=gen), -1)
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(r, k)
    lens = torch.tensor([3, 2, 3, 1])
    positions = [17, 5, 40, 8]
    got = NoGreedy().verify(draft, lens, q, logits, params, [p.generator() for p in params], positions)
    for row in range(r):
        alone = Verifier().verify(draft[row : row + 1], lens[row : row + 1], q[row : row + 1],
                                  logits[row : row + 1], [params[row]], [params[row].generator()],
                                  positions[row : row + 1])
        assert got.row(row) == alone.row(0)
