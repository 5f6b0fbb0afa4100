"""`trtspec verify`'s sampling test (`trtspec.spec.law_check`): calibrated under a correct rule,
and able to fail the slips a verifier is likely to have.

Each slip is planted in a copy of the rejection rule here, never in `trtspec.spec.verify`. One
verification step with one draft, under verify's own sampling parameters (temperature 1.3, top-k
3, top-p 0.9), run for `DEFAULT_SAMPLES` requests: the first token is the accepted draft or the
recovered token, the second the bonus token (or, after a rejection, the target's own next draw,
as the decoder continues). Their laws must be p_1 and p_2, the target's processed distributions.
The logits are a drafter's that agrees with its target about as well as the embedded DFlash
drafter does (TV(p, q) 0.15-0.2 per position). Measured over 20 seeds each, every slip fails at
2,000 requests 20 times of 20, and a correct rule never; so at ALPHA / LAWS, the level verify tests
each of its three sampled laws at (seeds 0-19).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from trtspec.spec.law_check import check_law, check_position
from trtspec.spec.sampling import probs_from_logits
from trtspec.spec.verify import draw_uniforms, inverse_cdf
from trtspec.triton.verify import ALPHA, DEFAULT_SAMPLES, LAWS, SAMPLING, SamplingCheck

V = 8
# [2, V] the target's logits at positions 1 and 2: at temperature 1.3 and top-k 3, about
# (0.6, 0.32, 0.08) at position 1, where top-p 0.9 keeps two tokens, and (0.45, 0.35, 0.2)
P_LOGITS = torch.tensor([[3.0, 2.18, 0.38, 0.0, -0.5, -1.0, -1.5, -2.0],
                         [1.0, 3.0, 0.5, 2.67, 0.0, 1.95, -0.5, -1.0]])
Q_LOGITS = P_LOGITS + torch.tensor([[-0.6, 0.4, 0.0, 0.3, 0.0, 0.0, 0.0, 0.0],
                                    [0.0, -0.5, 0.0, 0.2, 0.0, 0.6, 0.0, 0.0]])  # [2, V] the drafter's


def _nucleus_plus_one(logits: torch.Tensor) -> torch.Tensor:
    """top-p keeping one token more than the nucleus.  [..., V] -> [..., V]"""
    full = probs_from_logits(logits, SAMPLING.model_copy(update={"top_p": 1.0}))
    s, order = torch.sort(full, -1, descending=True)
    keep_n = ((s.cumsum(-1) - s) < SAMPLING.top_p).sum(-1, keepdim=True) + 1
    keep_sorted = (torch.arange(V).expand_as(s) < keep_n) & (s > 0)
    p = full.masked_fill(~torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted), 0.0)
    return p / p.sum(-1, keepdim=True)


def _run(slip: str, n: int, seed: int) -> list[dict[int, int]]:
    """n requests through one verification step of one draft under `slip`: counts of their first
    two tokens."""
    gen = torch.Generator().manual_seed(seed)
    p = probs_from_logits(P_LOGITS, SAMPLING)  # [2, V] what the target samples
    if slip == "temperature twice":
        p = probs_from_logits(P_LOGITS / SAMPLING.temperature, SAMPLING)
    elif slip == "top-p one token over":
        p = _nucleus_plus_one(P_LOGITS)
    q = probs_from_logits(Q_LOGITS, SAMPLING)  # [2, V]
    draft = torch.multinomial(q[0].expand(n, V), 1, generator=gen)[:, 0]  # [n]
    uniforms, u_last = draw_uniforms(n, 1, gen)  # [n, 1], [n]
    p_accept = torch.softmax(P_LOGITS[0], -1) if slip == "accept on unprocessed p" else p[0]  # [V]
    accepted = uniforms[:, 0] * q[0, draft] < p_accept[draft]  # [n]
    residual = p[0] if slip == "recovered from p" else (p[0] - q[0]).clamp_min(0)  # [V]
    recovered = inverse_cdf(residual.expand(n, V), u_last)  # [n]
    bonus = inverse_cdf((q[1] if slip == "bonus from q" else p[1]).expand(n, V), u_last)  # [n]
    own_next = torch.multinomial(p[1].expand(n, V), 1, generator=gen)[:, 0]  # [n] the target's next draw
    first = torch.where(accepted, draft, recovered)
    second = torch.where(accepted, bonus, own_next)
    return [{int(t): int(c) for t, c in zip(*torch.unique(x, return_counts=True), strict=True)}
            for x in (first, second)]


def _laws() -> list[dict[int, float]]:
    p = probs_from_logits(P_LOGITS, SAMPLING)  # [2, V]
    return [{t: float(row[t]) for t in range(V) if row[t] > 0} for row in p]


SLIPS = ["accept on unprocessed p", "recovered from p", "bonus from q", "temperature twice",
         "top-p one token over"]


def test_the_case_has_something_to_test():
    """The processed laws have several tokens (top-p binds at position 1) and the drafter disagrees
    with the target as a real one does."""
    p = probs_from_logits(P_LOGITS, SAMPLING)
    q = probs_from_logits(Q_LOGITS, SAMPLING)
    assert [int((row > 0).sum()) for row in p] == [2, 3]  # top-k 3; top-p cut one at position 1
    assert all(0.1 < 0.5 * (p[i] - q[i]).abs().sum() < 0.4 for i in range(2))


def test_a_correct_rule_passes_at_the_default_sample_size():
    for seed in range(3):
        assert check_law(_run("none", DEFAULT_SAMPLES, seed), _laws(), ALPHA).passed


@pytest.mark.parametrize("slip", SLIPS)
def test_each_slip_fails_at_the_default_sample_size(slip):
    """Every slip is caught at verify's default number of requests (3 seeds), at the level verify
    tests each of its sampled laws at (ALPHA / LAWS); at 400 requests under the former
    distribution-free bound, none of these was."""
    for seed in range(3):
        check = check_law(_run(slip, DEFAULT_SAMPLES, seed), _laws(), ALPHA / LAWS)
        assert not check.passed, (slip, seed, [(t.tv, t.p_value) for t in check.positions])


def test_the_p_value_is_calibrated():
    """Under the exact law, P(p ≤ a) ≤ a: over 400 samples of 300 draws (two laws, one of them with
    small probabilities) the share of p-values at most 0.05 and 0.2 is near those levels."""
    rng = np.random.default_rng(11)
    for law in ({0: 0.5, 1: 0.3, 2: 0.2}, {0: 0.85, 3: 0.1, 5: 0.03, 7: 0.02}):
        tokens, probs = list(law), np.array(list(law.values()))
        ps = []
        for _ in range(400):
            counts = rng.multinomial(300, probs)
            ps.append(check_position(dict(zip(tokens, counts.tolist(), strict=True)), law,
                                     simulations=2000, seed=int(rng.integers(1 << 30))).p_value)
        ps = np.array(ps)
        assert 0.02 <= (ps <= 0.05).mean() <= 0.08 and 0.14 <= (ps <= 0.2).mean() <= 0.26, law


def test_a_token_the_target_never_samples_fails_outright():
    law = {0: 0.6, 1: 0.4}
    check = check_law([{0: 1200, 1: 799, 5: 1}], [law], ALPHA)
    assert not check.passed and check.positions[0].outside == 1 and check.positions[0].p_value == 0.0


def test_every_processor_moves_the_law_verify_tests_under_them(tiny_target_dir):
    """verify's third sampled law (`processed_sampling`) certifies penalties, min-p and logit_bias
    only where each of them moves the law: on the embedded target's sampled prompt ('import os\n'),
    dropping any one of them moves some position's exact law by at least 0.04 in total variation
    (measured: penalties 0.32-0.42, the bias 0.07-0.15, min-p up to 0.086 at token 3). The guided
    law bars the likeliest first token's character, a newline here."""
    from trtspec.models.target import load_causal_lm
    from trtspec.tokenizer import ByteTokenizer
    from trtspec.triton.verify import barring_guide, exact_joint, marginals, processed_sampling

    model = load_causal_lm(tiny_target_dir, "float32")
    prompt = list(b"import os\n")
    plain = exact_joint(model, prompt, SAMPLING, 3)
    processed = processed_sampling(plain)

    laws = marginals(exact_joint(model, prompt, processed, 3), 3)

    def moved(other) -> float:
        """The largest total variation between a position's law and the processed law's."""
        return max(0.5 * sum(abs(a.get(t, 0.0) - b.get(t, 0.0)) for t in a.keys() | b.keys())
                   for a, b in zip(laws, marginals(other, 3), strict=True))

    for off in ({"min_p": 0.0}, {"logit_bias": ()},
                {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}):
        assert moved(exact_joint(model, prompt, processed.model_copy(update=off), 3)) >= 0.04, off
    assert barring_guide(plain, ByteTokenizer()).text == "[^\\n]*"  # the likeliest first token is '\n'


def test_the_restricted_law_moves_with_each_restriction(tiny_target_dir):
    """verify's fourth sampled law (`restriction_of`) certifies bad words and the reasoning budget
    only where each moves the law: on 'import os\n' the likeliest pair of tokens 2 and 3 with a
    clean text, 'mp', is the bad word (its first token is a draft in the served requests; it moves
    token 3's law by the pair's probability, 0.16) and the block opens at the likeliest first token,
    '\n', so token 3 is '<' on half the paths (dropping the budget moves its law by 0.51); over
    openai:// (no budget) the bad word alone."""
    from trtspec.models.target import load_causal_lm
    from trtspec.tokenizer import ByteTokenizer
    from trtspec.triton.verify import Restriction, exact_joint, marginals, restriction_of

    model, tokenizer = load_causal_lm(tiny_target_dir, "float32"), ByteTokenizer()
    prompt = list(b"import os\n")
    plain = exact_joint(model, prompt, SAMPLING, 3)
    restriction = restriction_of(plain, tokenizer)
    assert restriction == Restriction(("mp",), (1, "\n", "</think>"))
    assert restriction_of(plain, tokenizer, budget=False) == Restriction(("mp",))

    def law(of: Restriction) -> list[dict[int, float]]:
        return marginals(exact_joint(model, prompt, of.sampling(SAMPLING, tokenizer), 3), 3)

    def tv(a: dict[int, float], b: dict[int, float]) -> float:
        return 0.5 * sum(abs(a.get(t, 0.0) - b.get(t, 0.0)) for t in a.keys() | b.keys())

    restricted = law(restriction)
    assert restricted[2][ord("<")] == pytest.approx(restricted[0][ord("\n")])  # forced where the block opened
    assert tv(restricted[2], law(Restriction(thinking=restriction.thinking))[2]) > 0.15
    assert tv(restricted[2], law(Restriction(restriction.bad_words))[2]) > 0.5


def test_a_law_check_says_whether_the_server_drafted():
    """Beside a sampled law, `verify` says how many tokens the server drafted for those requests: none
    is a law the acceptance rule never touched, and a server that reports no draft figures (vLLM,
    trtllm-serve) is said to (its line was left out, as if the question did not arise)."""
    rng = random.Random(5)
    law = {0: 0.5, 1: 0.3, 2: 0.2}
    draws = rng.choices(list(law), weights=list(law.values()), k=400)
    checked = check_law([{t: draws.count(t) for t in law}], [law], alpha=0.01)
    said = {drafted: "\n".join(SamplingCheck("p", 400, checked, drafted=drafted).lines())
            for drafted in (None, 0, 250)}
    assert "reports no draft figures: whether its acceptance rule was exercised is not known" in said[None]
    assert "drafted 0 tokens for these requests: its acceptance rule was NOT exercised" in said[0]
    assert "drafted 250 tokens for these requests\n" in said[250] + "\n" and "NOT" not in said[250]


def test_draws_of_the_law_itself_exactly_are_its_likeliest_outcome():
    """Ten draws at exactly the law's shares (1, 2, 7 of 10 for 0.1, 0.2, 0.7) have TV 0 up to float
    rounding; no simulated sample is closer, and those that tie with it count as at least as far, so
    p = (1 + S) / (1 + S) = 1. A law given with zeros (token 3) does not count them in its support;
    no draw is outside it."""
    law = {0: 0.1, 1: 0.2, 2: 0.7, 3: 0.0}
    check = check_position({0: 1, 1: 2, 2: 7}, law, simulations=500)
    assert (check.draws, check.support, check.outside, check.p_value) == (10, 3, 0, 1.0)
    assert check.tv == pytest.approx(0.0, abs=1e-12)


def test_a_position_without_draws_passes_and_one_draw_counts_whole():
    """No draws: nothing to test, TV 0 and p 1. One draw of token 0 against a fair coin: the empirical
    law is (1, 0), TV = 0.5 * (0.5 + 0.5) = 0.5, however rarely drawn tokens are counted (as 0)."""
    law = {0: 0.5, 1: 0.5}
    none = check_position({}, law)
    assert (none.draws, none.support, none.tv, none.p_value, none.outside) == (0, 2, 0.0, 1.0, 0)
    assert check_position({0: 1}, law).tv == 0.5
    assert check_position({0: 3}, law).tv == 0.5  # 0.5 * (|1 - 0.5| + |0 - 0.5|)


def test_positions_share_alpha_equally_and_a_p_value_at_the_level_fails():
    """With one simulation every p-value is (1 + 0) / 2 = 1/2 or (1 + 1) / 2 = 1: 100 draws all of
    token 0 from a fair coin are farther than the simulated sample (p = 1/2), 50 and 50 (TV 0) no
    farther (p = 1). Alone at alpha 1/2 the far one fails (p = level); beside the near one each is
    tested at 1/4 and both pass."""
    law = {0: 0.5, 1: 0.5}
    far, near = {0: 100}, {0: 50, 1: 50}
    alone = check_law([far], [law], alpha=0.5, simulations=1)
    assert alone.positions[0].p_value == 0.5 and alone.level == 0.5 and not alone.passed
    both = check_law([far, near], [law, law], alpha=0.5, simulations=1)
    assert [p.p_value for p in both.positions] == [0.5, 1.0] and both.level == 0.25 and both.passed


def test_counts_and_laws_of_different_lengths_are_refused():
    with pytest.raises(ValueError):
        check_law([{0: 1}, {0: 1}], [{0: 1.0}], ALPHA)
