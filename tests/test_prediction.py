"""Predicted outputs (OpenAI's `prediction`): drafts from a text the answer is expected to repeat.

The prediction only proposes; the target decides, so an answer is the same with any prediction
(greedy and Gumbel-coupled texts token for token, every drafter, beside requests without one), and
one that predicts the answer well takes fewer target forwards. Where drafting resumes after an
edit is tested on random token sequences. The verifier's law with a point-mass draft is
tests/test_verify.py's `point_mass` case; the served path is tests/test_openai.py's."""

from __future__ import annotations

import random

import pytest

from trtspec.config import ScheduleConfig, TreeConfig, load_build_config
from trtspec.spec.decoder import Request
from trtspec.spec.prediction import MATCH, PREDICTION_DRAFTS, PredictedDrafts
from trtspec.spec.sampling import SamplingParams

from .conftest import REPO, assert_samples_follow_target

PROMPTS = ["def parse(self, text):\n", "Q: 482 + 356\nA:", "import os\n", "class Server:\n    def"]


def _edited(rng: random.Random, tokens: list[int], vocab: int) -> list[int]:
    """`tokens` with a stretch deleted, one inserted and one changed, at random places."""
    out = list(tokens)
    for _ in range(3):
        at, n = rng.randrange(len(out)), rng.randint(1, 6)
        kind = rng.choice(["delete", "insert", "change"])
        new = [rng.randrange(vocab) for _ in range(n)]
        out[at : at + (0 if kind == "insert" else n)] = [] if kind == "delete" else new
    return out


@pytest.mark.parametrize("seed", range(6))
def test_drafts_follow_the_answer_and_resume_after_an_edit(seed):
    """An answer that is the prediction with edits: wherever the answer's last 8 tokens and next
    token are the prediction's own (away from the edits), the drafts are the answer's next tokens;
    an answer that is the prediction is drafted whole."""
    rng = random.Random(seed)
    vocab = 1000  # long random sequences: a pair of tokens is (nearly) never repeated
    prediction = [rng.randrange(vocab) for _ in range(300)]
    exact = PredictedDrafts(prediction)
    assert all(exact.next(prediction[:i], 4) == prediction[i : i + 4] for i in range(300))
    answer = _edited(rng, prediction, vocab)
    drafts = PredictedDrafts(prediction)
    at = {tuple(prediction[i - 9 : i]): i for i in range(9, 301)}  # 9-grams: unique here
    checked = 0
    for i in range(9, len(answer)):
        got = drafts.next(answer[:i], PREDICTION_DRAFTS)
        place = at.get(tuple(answer[i - 9 : i]))  # the answer's last 9 tokens are the prediction's
        if place is not None:
            assert got == prediction[place : place + PREDICTION_DRAFTS], i
            checked += 1
    assert checked > 200


def test_a_prediction_that_never_matches_drafts_nothing():
    drafts = PredictedDrafts([1, 2, 3, 4])
    assert drafts.next([], 2) == [1, 2]
    assert drafts.next([7], 2) == []  # left it at once
    assert drafts.next([7, 8, 9], 2) == []
    assert drafts.next([7, 8, 9, 2, 3], 2) == [4]  # came back: (2, 3) ends at 3 in the prediction


def _brute_force(prediction: list[int], answer: list[int], n: int) -> list[int]:
    """The rule, spelt out: the place moves with the answer while it follows the prediction; else it
    is the end of the longest run (2..MATCH) of the answer's last tokens in the prediction, of equally
    long ones the first at or after the place, else the last before it; none: no drafts."""
    at, lost = 0, False
    for i in range(len(answer)):
        if not lost and at < len(prediction) and prediction[at] == answer[i]:
            at += 1
            continue
        ends = [end for end in range(2, len(prediction) + 1)
                if i >= 1 and prediction[end - 2:end] == answer[i - 1:i + 1]]
        runs = {end: max(k for k in range(2, min(MATCH, end, i + 1) + 1)
                         if prediction[end - k:end] == answer[i + 1 - k:i + 1]) for end in ends}
        lost = not runs
        if runs:
            longest = [end for end, k in runs.items() if k == max(runs.values())]
            at = min((e for e in longest if e >= at), default=max(longest))
    return [] if lost else prediction[at:at + n]


@pytest.mark.parametrize("seed", range(4))
def test_where_the_answer_comes_back_is_the_rules(seed):
    """Predictions over 2 to 4 tokens (pairs repeat: the place is chosen among many), some of a
    repeated stretch longer than MATCH, and answers that are them edited, fed a few tokens at a
    time: every proposal is the brute-force rule's."""
    rng = random.Random(seed)
    for _ in range(150):
        vocab = rng.choice([2, 3, 4])
        if rng.random() < 0.3:
            stretch = [rng.randrange(vocab) for _ in range(MATCH + rng.randint(1, 8))]
            prediction = stretch + [rng.randrange(vocab) for _ in range(rng.randint(0, 5))] + stretch
        else:
            prediction = [rng.randrange(vocab) for _ in range(rng.randint(20, 40))]
        answer = _edited(rng, prediction, vocab) + [rng.randrange(vocab) for _ in range(rng.randint(0, 5))]
        drafts, i = PredictedDrafts(prediction), rng.randint(0, 2)
        while i <= len(answer):
            n = rng.randint(1, 6)
            got = drafts.next(answer[:i], n)
            assert got == _brute_force(prediction, answer[:i], n), (prediction, answer[:i], n)
            i += rng.randint(1, 3)


def test_a_prediction_is_followed_at_its_edges():
    """The answer's first token is followed when the first call already holds it; a place is found
    again from the answer's first two tokens and at the prediction's first pair, at the longest
    run of the answer's last tokens; one draft is drafted when one is asked for; an answer running
    past the prediction's end drafts nothing."""
    assert PredictedDrafts([1, 2, 3, 4]).next([1], 2) == [2, 3]
    assert PredictedDrafts([5, 1, 2, 3]).next([1, 2], 2) == [3]  # left at once, back at (1, 2)
    assert PredictedDrafts([1, 2, 3, 4]).next([7, 1, 2], 2) == [3, 4]  # back at the first pair
    assert PredictedDrafts([1, 2, 3]).next([1], 1) == [2]
    assert PredictedDrafts([1, 2]).next([1, 2, 5], 2) == []
    # left at the end: (2, 3) is at 3 after (1, 2, 3) and at 7 after (5, 2, 3), the longer run wins
    prediction = [1, 2, 3, 4, 5, 2, 3, 6, 1, 2, 7]
    assert PredictedDrafts(prediction).next([*prediction[:10], 3], 2) == [4, 5]


@pytest.mark.parametrize("second, expected", [(MATCH, [5, 6]), (MATCH - 1, [7, 8])], ids=["tie", "shorter"])
def test_runs_are_compared_over_match_tokens_at_most(second, expected):
    """Runs are compared over the answer's last MATCH tokens at most: two places that both hold
    that many tie, and the first at or after the current place wins, not the one holding the longer
    run; one token fewer loses. Here the answer follows a copy of its tail that ends early (88), so
    its last token sends it looking: the prediction's second copy (after 99) holds its last
    `second` tokens, the third (after 98) its whole tail."""
    tail = list(range(10, 10 + MATCH + 2))  # the answer's last MATCH + 2 tokens, each unique
    prediction = [1, 2, 3, *tail[:-1], 88, 99, *tail[-second:], 5, 6, 98, *tail, 7, 8]
    answer = [50, *tail]  # follows the first copy from (tail[0], tail[1]) until 88
    assert PredictedDrafts(prediction).next(answer[:-1], 2) == [88, 99]  # on the first copy
    assert PredictedDrafts(prediction).next(answer, 2) == expected


@pytest.fixture(scope="module", params=["tiny-dflash", "tiny-draft-model"])
def pipeline(request):
    from trtspec.pipeline import load_pipeline

    return load_pipeline(load_build_config(REPO / "build_configs" / f"{request.param}.yaml"))


@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=10, topk=3)], ids=["chains", "trees"])
@pytest.mark.parametrize("coupling", ["greedy", "gumbel"])
def test_an_answer_is_the_same_with_any_prediction(pipeline, coupling, tree):
    """Four requests decoded together, three with an edited copy of their answer as the prediction
    (one exact), one without: every text equals the one decoded without predictions; the exact
    prediction is drafted and accepted whole, in fewer target forwards. In a tree deployment a
    predicted row's drafts are a chain beside the others' trees."""
    rng = random.Random(3)
    decoder = pipeline.decoder_for(4, ScheduleConfig(mode="full"), tree=tree)
    encode = pipeline.tokenizer.encode
    sampling = [SamplingParams() if coupling == "greedy" else
                SamplingParams(temperature=0.9, seed=11 + i, coupling="gumbel") for i in range(4)]
    requests = [Request(encode(p, True), 96, s) for p, s in zip(PROMPTS, sampling, strict=True)]
    plain = decoder.generate_batch(requests)
    predictions = [tuple(plain[0].token_ids)] + \
        [tuple(_edited(rng, r.token_ids, pipeline.target.vocab_size)) for r in plain[1:3]] + [()]
    got = decoder.generate_batch([Request(r.prompt, 96, r.sampling, prediction=q)
                                  for r, q in zip(requests, predictions, strict=True)])
    assert [g.token_ids for g in got] == [p.token_ids for p in plain]
    exact = got[0]
    # drafted whole from its prediction: every draft accepted, each step's last token the target's
    assert exact.num_predicted == exact.num_prediction_accepted == \
        len(exact.token_ids) - exact.num_target_calls and exact.num_drafted == 0
    assert exact.num_target_calls < plain[0].num_target_calls
    assert all(g.num_prediction_accepted > 0 for g in got[1:3]) and got[3].num_predicted == 0
    assert all(g.num_prediction_accepted <= g.num_predicted for g in got)


def test_a_prediction_outside_the_vocabulary_or_the_context_is_refused(pipeline):
    decoder = pipeline.decoder_for(1)
    vocab = pipeline.target.vocab_size
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        decoder.check(Request([1, 2], 4, prediction=(1, vocab)))
    with pytest.raises(ValueError, match="more than this deployment's context"):
        decoder.check(Request([1, 2], 4, prediction=(1,) * (decoder.capacity + 1)))


@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=10, topk=3)], ids=["chains", "trees"])
def test_rejection_sampled_answers_with_a_prediction_follow_the_target(pipeline, tree):
    """Each predicted draft a point mass (q(x) = 1): the law of a sampled request's first tokens is
    the target's, the prediction being the greedy answer (often accepted, sometimes not)."""
    prompt = list(b"    def __init__(self")
    decoder = pipeline.decoder_for(8, ScheduleConfig(mode="full"), tree=tree)
    greedy = decoder.generate_batch([Request(prompt, 8)])[0].token_ids
    sampling = SamplingParams(temperature=1.0, top_k=3)
    assert_samples_follow_target(pipeline.target.model, decoder, prompt, sampling, steps=4, n=1000,
                                 prediction=tuple(greedy))
