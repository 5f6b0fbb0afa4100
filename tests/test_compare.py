"""`trtspec compare`'s judgement of two answers, without servers (served: test_openai)."""

from __future__ import annotations

import math

from trtspec.openai.compare import DIFFERENT, IDENTICAL, NEAR_TIE, REFUSED, Answer, Choice, asks, judge


def _answer(tokens: list[str], top: list[dict[str, float]], finish: str = "length") -> Answer:
    return Answer([Choice("".join(tokens), finish, tokens, top)], completion_tokens=len(tokens))


def test_answers_that_part_at_a_near_tie_pass_within_the_tolerance_only():
    """The reference wrote '8' where its log-probabilities put '3' 0.02 nats behind; the served
    deployment wrote '3': a near tie within 0.05 nats, a difference at 0 (and for samples, always)."""
    tie = {"8": math.log(0.505), "3": math.log(0.495)}
    reference = _answer(["=", " ", "8", "3"], [{"=": -0.1}, {" ": -0.2}, tie, {"3": -0.3}])
    served = _answer(["=", " ", "3", "8"], [{"=": -0.1}, {" ": -0.2}, tie, {"8": -0.3}])
    assert judge(served, reference, 0.05)[0] == NEAR_TIE
    assert "parted at token 2 ('3' for '8', 0.0200 nats behind" in judge(served, reference, 0.05)[1]
    assert judge(served, reference, 0.0)[0] == DIFFERENT
    assert judge(served, reference, 0.05, greedy=False)[0] == DIFFERENT
    far = _answer(["=", " ", "7", "3"], [{"=": -0.1}, {" ": -0.2}, tie, {"3": -0.3}])  # not in the top 2
    assert judge(far, reference, 1.0)[0] == DIFFERENT
    assert judge(reference, reference, 0.0) == (IDENTICAL, "")


def test_refusals_agree_only_when_both_refuse_alike_and_token_counts_must_agree():
    ok = _answer(["a"], [{"a": 0.0}])
    assert judge(Answer(refused=400, message="bad"), Answer(refused=400, message="bad"), 0)[0] == REFUSED
    assert judge(Answer(refused=400), ok, 0)[0] == DIFFERENT
    assert judge(ok, Answer(refused=503), 0)[0] == DIFFERENT
    counted = _answer(["a"], [{"a": 0.0}])
    counted.completion_tokens = 2
    assert judge(counted, ok, 0) == (DIFFERENT, "usage.completion_tokens 2 vs the reference's 1")


def test_requests_are_seeded_and_mix_the_features():
    one, again = asks(["Q: 1 + 2\nA:", "def f(x):\n"], 200, 32, "m", seed=3), \
        asks(["Q: 1 + 2\nA:", "def f(x):\n"], 200, 32, "m", seed=3)
    assert one == again and one != asks(["Q: 1 + 2\nA:"], 200, 32, "m", seed=4)
    bodies = [a.body for a in one]
    assert {a.endpoint for a in one} == {"completions", "chat/completions"}
    for feature in ("stop", "presence_penalty", "n", "stream"):
        assert 0 < sum(feature in b for b in bodies) < len(bodies), feature
    assert all(1 <= b["max_tokens"] <= 32 and b["temperature"] == 0 and "seed" not in b for b in bodies)
    sampled = asks(["x"], 10, 8, "m", seed=0, temperature=0.7, chat=False)
    assert all(a.endpoint == "completions" and a.body["seed"] >= 0 for a in sampled)
