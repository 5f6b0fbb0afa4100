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
    # a predicted output's drafts (spec.prediction): each a point mass, q(x) = 1
    "point_mass": (
        torch.tensor([[0.1, 0.2, 0.4, 0.1, 0.1, 0.1], [0.3, 0.1, 0.1, 0.2, 0.2, 0.1],
                      [0.05, 0.05, 0.1, 0.1, 0.3, 0.4]]),
        torch.tensor([[0, 0, 1.0, 0, 0, 0], [0, 0, 0, 0, 0, 1.0]]),
    ),
}


@pytest.mark.parametrize(
    "case,position",
    # with disjoint support x_1 is always rejected, so no second token is ever emitted
    [("overlapping", 0), ("overlapping", 1), ("disjoint", 0), ("identical", 0), ("identical", 1),
     ("point_mass", 0), ("point_mass", 1)],
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


def _reference_probs(row: list[float], params: SamplingParams) -> list[float]:
    """The processed distribution the plain way: the top_k largest logits / T, softmax, those at
    least min_p times the most likely, then the most likely tokens until their mass reaches top_p,
    renormalised."""
    z = [v / params.temperature for v in row]
    order = sorted(range(len(z)), key=lambda i: -z[i])
    kept = order[:params.top_k] if params.top_k else order
    top = max(z[i] for i in kept)
    weight = {i: math.exp(z[i] - top) for i in kept}
    kept = [i for i in kept if weight[i] >= params.min_p * weight[order[0]]]
    weight = {i: weight[i] for i in kept}
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
                                    SamplingParams(temperature=1.1, top_k=7, top_p=0.75),
                                    SamplingParams(temperature=1.0, min_p=0.1),
                                    SamplingParams(temperature=1.2, top_k=9, min_p=0.05, top_p=0.8)],
                         ids=["t0.7", "t1.3-k5", "t0.9-p0.6", "t1.1-k7-p0.75", "t1-m0.1",
                              "t1.2-k9-m0.05-p0.8"])
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


@pytest.mark.parametrize("temperature", [1e-30, 1e-40, 1e-45, 1e-46, 1e-300, 5e-324],
                         ids=["1e-30", "1e-40", "1e-45", "1e-46", "1e-300", "5e-324"])
def test_a_vanishing_temperature_samples_the_greedy_limit(temperature):
    """A temperature > 0 so small that logits / T overflows (30 / 1e-40 is inf in float32; Triton's
    FP32 and OpenAI's [0, 2] both let it through) must give the T → 0 limit, the argmax, under
    both couplings and with top-k: it gave NaN probabilities, so a rejection-sampled row stopped
    the whole step (torch.multinomial), and a Gumbel-coupled row emitted the argmax of inf + g,
    any token. Under float32's smallest (1e-46, 1e-300, 5e-324 as Python floats, which a local
    SamplingParams keeps) T itself rounded to 0 and the most likely token's (0 / 0) was NaN."""
    gen = torch.Generator().manual_seed(7)
    r, k, vocab = 4, 3, 16
    logits = 30 + 5 * torch.randn(r, k + 1, vocab, generator=gen)  # [R, k+1, V], as a model's can be
    params = [SamplingParams(temperature=temperature, seed=1),
              SamplingParams(temperature=temperature, top_k=4, seed=2),
              SamplingParams(temperature=temperature, seed=3, coupling="gumbel"),
              SamplingParams(temperature=temperature, top_p=0.9, seed=4, coupling="gumbel")]
    argmax = logits.argmax(-1)  # [R, k+1]
    for p in params:
        torch.testing.assert_close(probs_from_logits(logits, p),
                                   torch.nn.functional.one_hot(argmax, vocab).float())
    drafts, q = choose_tokens(logits[:, :k], params, [p.generator() for p in params], [9] * r)
    assert torch.equal(drafts, argmax[:, :k])
    drafts[:, 1] = (drafts[:, 1] + 1) % vocab  # the second draft of every row is wrong
    got = Verifier().verify(drafts, torch.full((r,), k), q, logits, params, [p.generator() for p in params],
                            [9] * r)
    want = verify_greedy(drafts, logits)
    assert torch.equal(got.num_accepted, want.num_accepted) and torch.equal(got.tokens, want.tokens)


def test_sampled_drafts_are_drawn_from_the_q_the_verifier_is_given():
    """The accept test min(1, p/q) is exact only if each draft was drawn from the q it is handed:
    `choose_tokens`, which every drafter samples through, must draw a sampling row's slots
    independently from its processed q (temperature, top-k, top-p) and return that q. Drafts
    drawn from the unprocessed softmax (q still processed) passed every other fast test."""
    from trtspec.triton.verify import tv_bound

    draws, n, vocab = 20_000, 2, 8
    logits = 2 * torch.randn(1, n, vocab, generator=torch.Generator().manual_seed(3))  # [1, n, V]
    for params in (SamplingParams(temperature=0.6, top_k=5), SamplingParams(temperature=1.4, top_p=0.8)):
        rows = [params.model_copy(update={"seed": s}) for s in range(draws)]
        tokens, q = choose_tokens(logits.expand(draws, n, vocab), rows, [p.generator() for p in rows],
                                  [0] * draws)  # [draws, n], [draws, n, V]
        law = probs_from_logits(logits[0], params)  # [n, V]
        torch.testing.assert_close(q, law.expand(draws, n, vocab))
        joint = torch.bincount(tokens[:, 0] * vocab + tokens[:, 1], minlength=vocab**2).double() / draws
        want = (law[0, :, None] * law[1, None, :]).reshape(-1).double()  # slots independent
        assert tv(joint, want) < tv_bound(vocab**2, draws, 1e-3), (params, tv(joint, want))


# -- exact law of the chain rule, by enumeration -----------------------------------------------
# A 3-token vocabulary, k = 2 drafts. The target's p(· | prefix) are multiples of 1/8 and the
# drafter's q(· | prefix) take values in {0, 1/4, 1/2, 1}, both depending on the prefix (as a
# DSpark Markov head's q and every target's p do). Then every accept threshold p(x)/q(x) is a
# multiple of 1/8 and every recovered/bonus law's cumulative sums are multiples of 1/840, so
# uniforms at the midpoints of 8 (accept tests) and 840 (u_last) equal cells integrate the rule
# over its randomness exactly: the output law below is computed, not estimated.
EXACT_V, EXACT_K, ACCEPT_CELLS, LAST_CELLS = 3, 2, 8, 840
_P8 = [(4, 3, 1), (1, 1, 6), (2, 5, 1), (0, 3, 5), (8, 0, 0), (3, 3, 2), (1, 6, 1), (5, 0, 3),
       (2, 2, 4), (0, 1, 7), (6, 1, 1), (3, 0, 5), (1, 4, 3)]
_Q4 = [(2, 1, 1), (0, 2, 2), (1, 1, 2), (4, 0, 0)]


def _exact_p(prefix: tuple[int, ...]) -> list[float]:
    """The target's next-token law after `prefix` (one of 13 rows, by the prefix)."""
    key = sum((t + 1) * 4**i for i, t in enumerate(prefix))
    return [c / 8 for c in _P8[key % len(_P8)]]


def _exact_q(prefix: tuple[int, ...]) -> list[float]:
    key = sum((t + 1) * 3**i for i, t in enumerate(prefix))
    return [c / 4 for c in _Q4[key % len(_Q4)]]


def _enumerated_law(rule, draft_len: int) -> dict[tuple[int, ...], float]:
    """P(the rule emits exactly this token sequence), over drafts x ~ q and all of its randomness."""
    import itertools

    cells = lambda n: (torch.arange(n, dtype=torch.float64) + 0.5) / n  # noqa: E731
    drafts, weights, qs, ps = [], [], [], []
    for x in itertools.product(range(EXACT_V), repeat=EXACT_K):
        w = math.prod(_exact_q(x[:i])[x[i]] for i in range(EXACT_K))
        if w > 0:
            drafts.append(x)
            weights.append(w)
            qs.append([_exact_q(x[:i]) for i in range(EXACT_K)])
            ps.append([_exact_p(x[:i]) for i in range(EXACT_K + 1)])
    grid = torch.cartesian_prod(*[cells(ACCEPT_CELLS)] * EXACT_K, cells(LAST_CELLS))  # [G, k+1]
    d, g = len(drafts), grid.shape[0]
    rows = lambda t: t.repeat_interleave(g, 0)  # noqa: E731 - each draft against every grid point
    out = rule(rows(torch.tensor(drafts)), rows(torch.tensor(qs)), rows(torch.tensor(ps)),
               grid[:, :EXACT_K].float().repeat(d, 1), grid[:, EXACT_K].float().repeat(d),
               torch.full((d * g,), draft_len))
    mass = torch.tensor(weights, dtype=torch.float64).repeat_interleave(g) / g
    law: dict[tuple[int, ...], float] = {}
    for tokens, n, m in zip(out.tokens.tolist(), out.num_accepted.tolist(), mass.tolist(), strict=True):
        law[tuple(tokens[: n + 1])] = law.get(tuple(tokens[: n + 1]), 0.0) + m
    return law


def _assert_target_law(law: dict[tuple[int, ...], float], draft_len: int) -> None:
    """Each emitted sequence s, continued by the target itself, must give every sequence of
    draft_len + 1 tokens its probability under p (the chain rule): P(s) = Π p(s_j | s_<j)."""
    import itertools

    assert all(1 <= len(s) <= draft_len + 1 for s in law)
    for z in itertools.product(range(EXACT_V), repeat=draft_len + 1):
        want = math.prod(_exact_p(z[:j])[z[j]] for j in range(len(z)))
        got = sum(m * math.prod(_exact_p(z[:j])[z[j]] for j in range(len(s), len(z)))
                  for s, m in law.items() if z[: len(s)] == s)
        assert got == pytest.approx(want, abs=1e-12), (z, got, want)


@pytest.mark.parametrize("draft_len", [0, 1, 2])
def test_chain_rule_gives_the_target_s_joint_law_exactly(draft_len):
    """The joint law of everything one verification emits (accepted, then recovered or bonus), q
    and p depending on the prefix, computed exactly: equal to the target's for draft lengths 0
    (plain decoding), 1 (a cut block: bonus from p_2 after one draft) and 2."""
    _assert_target_law(_enumerated_law(verify_explicit, draft_len), draft_len)


def test_sampling_rows_without_drafts_need_no_q_probs():
    """A step whose rejection-sampled rows drafted nothing (draft_lens 0; greedy rows may have) comes
    without q_probs: each such row emits one token from its p_1, the verdict any q would give; a
    sampled row with drafts and no q_probs is refused."""
    gen = torch.Generator().manual_seed(9)
    r, k, vocab = 3, 4, 10
    logits = 3 * torch.randn(r, k + 1, vocab, generator=gen)
    params = [SamplingParams(temperature=0.9, seed=1), SamplingParams(),
              SamplingParams(temperature=1.2, top_k=5, seed=2)]
    draft = torch.randint(0, vocab, (r, k), generator=gen)
    lens = torch.tensor([0, 3, 0])
    q = torch.softmax(torch.randn(r, k, vocab, generator=gen), -1)
    got = Verifier().verify(draft, lens, None, logits, params, [p.generator() for p in params])
    want = Verifier().verify(draft, lens, q, logits, params, [p.generator() for p in params])
    assert torch.equal(got.num_accepted, want.num_accepted) and torch.equal(got.tokens, want.tokens)
    assert got.num_accepted[[0, 2]].tolist() == [0, 0]
    assert got.row(1) == verify_greedy(draft[1:2], logits[1:2], lens[1:2]).row(0)
    with pytest.raises(RuntimeError, match="sampling rows with drafts need their q_probs"):
        Verifier().verify(draft, torch.tensor([1, 3, 0]), None, logits, params,
                          [p.generator() for p in params])
