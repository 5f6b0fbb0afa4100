"""What a choice reports besides its text, without a server (`trtspec.openai.choice`): `usage` and
the `trtspec` figures of a request's choices, finish_reason when the model gave none, an empty
logprobs step, whether an answer reasoned, and when a named tool call starts. Each case was a
change to the module that every other fast test passed (scripts/mutants.py); the served tests
(test_openai) need a tritonserver."""

from __future__ import annotations

import dataclasses

from trtspec.openai.choice import Choice, figures_of, usage_of
from trtspec.openai.logprobs import LogprobsBody
from trtspec.openai.reasoning import REASONING
from trtspec.openai.tools import tool_plan
from trtspec.openai.triton_stream import Generation, Step
from trtspec.tokenizer import ByteTokenizer

from .test_tools import TOOLS


def _run(gen: Generation, prompt_ids: list[int], sample: int, totals: dict) -> Choice:
    """A choice that took three ids in two steps, the model's totals (cumulative) on the last."""
    seed = None if gen.seed is None else gen.seed + sample  # choice j samples with seed + j
    run = Choice(dataclasses.replace(gen, seed=seed), prompt_ids, sample)
    run.take(Step("ab", [10, 11]))
    run.take(Step("c", [12], finish_reason="length", final=True, **totals))
    return run


def test_usage_counts_each_prompt_once_and_the_figures_add_up_every_choice():
    """Two prompts, the first with n = 2: prompt_tokens and cached_tokens count each prompt once (its
    choice 0), completion_tokens every choice's; total = prompt + completion; rejected prediction
    tokens = predicted - accepted; the figures are the largest totals the model reported per choice
    (a step without them reports 0), added up over the choices or one choice's alone; a sampled
    request reports its first choice's seed, a greedy one none."""
    gen = Generation("", 8, temperature=0.7, seed=5, prediction="abc")
    a0 = _run(gen, [1, 2, 3], 0, dict(accepted_tokens=2, draft_tokens=4, target_forwards=3, cached_tokens=2,
                                      prediction_tokens=3, accepted_prediction_tokens=1))
    a1 = _run(gen, [1, 2, 3], 1, dict(accepted_tokens=1, draft_tokens=2, target_forwards=2, cached_tokens=2,
                                      prediction_tokens=2, accepted_prediction_tokens=2))
    b0 = _run(gen, [4, 5], 0, dict(accepted_tokens=0, draft_tokens=1, target_forwards=3, cached_tokens=1,
                                   prediction_tokens=1, accepted_prediction_tokens=0))
    runs = [a0, a1, b0]
    assert usage_of(runs) == {
        "prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 3},
        "completion_tokens_details": {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 3}}
    assert figures_of(runs) == {"accepted_tokens": 3, "draft_tokens": 7, "target_forwards": 8,
                                "cached_tokens": 5, "seed": 5}
    assert figures_of(runs, 1) == {"accepted_tokens": 1, "draft_tokens": 2, "target_forwards": 2,
                                   "cached_tokens": 2, "seed": 5}
    greedy = _run(Generation("", 8), [1], 0, dict(accepted_tokens=2, draft_tokens=2, target_forwards=2))
    assert figures_of([greedy]) == {"accepted_tokens": 2, "draft_tokens": 2, "target_forwards": 2,
                                    "cached_tokens": 0}
    assert "completion_tokens_details" not in usage_of([greedy])


def test_finish_reason_without_the_models_is_length_only_when_the_limit_was_reached():
    """A last response that names no finish_reason: 'length' when max_tokens ids came, else 'stop'."""
    for ids, want in (([1, 2, 3], "length"), ([1, 2], "stop")):
        run = Choice(Generation("", 3), [7])
        run.take(Step("x" * len(ids), ids, final=True))
        assert run.finish_reason() == want, ids


def test_a_step_with_no_new_token_has_no_logprobs():
    """Streamed with logprobs: a response that brings no id (the last, empty one) has logprobs None,
    not an empty body."""
    tok = ByteTokenizer()
    body = LogprobsBody(tok, chat=False)
    run = Choice(Generation("", 8, logprobs=0), [65], logprobs=body, decode=tok.decode)
    run.take(Step("hi", tok.encode("hi"), logprobs=[-0.1, -0.2], top_ids=[[], []], top_logprobs=[[], []]))
    assert run.logprobs_body()["tokens"] == ["h", "i"]
    run.take(Step("", [], final=True))
    assert run.logprobs_body() is None


def test_an_answer_reasoned_only_when_some_of_its_text_was_reasoning():
    """`Choice.reasoned` (a chat answer that is all reasoning gets content null): set by a reasoning
    block's text, not by content alone."""
    plain = Choice(Generation("", 64), [], start=REASONING)
    plain.deltas("</think>", final=False)
    plain.deltas("Hello", final=True)
    assert not plain.reasoned
    thought = Choice(Generation("", 64), [], start=REASONING)
    thought.deltas("I think", final=False)
    thought.deltas(" so", final=True)
    assert thought.reasoned


def test_a_named_call_starts_with_the_content_not_inside_the_reasoning():
    """tool_choice naming a function, after a reasoning block: while the model is still reasoning no
    tool_calls delta is streamed; the call begins once the content does."""
    named = tool_plan(TOOLS, {"type": "function", "function": {"name": "add"}}, None, None)
    run = Choice(Generation("", 64), [], tools=named, start=REASONING)
    thinking = run.deltas("Let me add them.", final=False)
    assert thinking and all("tool_calls" not in d for d in thinking), thinking
    rest = run.deltas('</think>{"a": 1, "b": 2}', final=True)
    assert any("tool_calls" in d for d in rest), rest


def test_an_answer_of_exactly_min_tokens_ids_still_heeds_a_stop_past_their_text():
    """min_tokens = 2 and the answer is those 2 ids, 'a' and the first byte of '€': their text is
    'a' (the piece is held), and the '\\ufffd' the last response flushes ends past it, so a stop
    string '\\ufffd' cuts it. (Protection is settled once min_tokens ids came, not one id later.)"""
    tok = ByteTokenizer()
    ids = tok.encode("a") + tok.encode("€")[:1]
    run = Choice(Generation("", 2, min_tokens=2, stop_words=("\ufffd",)), [], decode=tok.decode)
    text = run.take(Step("a", ids)) + run.take(Step("\ufffd", [], final=True))
    assert (text, run.trimmer.stopped) == ("a", True)
