"""What one generation measured (`GenerationResult`): its counters, τ, decode rate, acceptance by
position and the dict `trtspec generate --json` prints, worked by hand."""

from __future__ import annotations

from trtspec.spec.metrics import GenerationResult, acceptance_by_position


def test_a_fresh_result_counts_nothing_and_divides_by_no_zero():
    result = GenerationResult(prompt_len=5, num_draft_tokens=3)
    counters = (result.cached_tokens, result.num_target_calls, result.num_drafted, result.num_accepted,
                result.num_predicted, result.num_prediction_accepted, result.num_looked_up,
                result.num_lookup_accepted, result.num_pooled, result.num_pool_accepted)
    assert counters == (0,) * 10
    assert result.to_dict() == {
        "token_ids": [], "num_generated": 0, "tau": 0.0, "cached_tokens": 0, "num_target_calls": 0,
        "num_drafted": 0, "num_accepted": 0, "acceptance_by_position": [0.0, 0.0, 0.0], "prefill_s": 0.0,
        "draft_s": 0.0, "decode_s": 0.0, "decode_tokens_per_s": 0.0, "finish_reason": None,
    }
    result.token_ids, result.num_target_calls = [7], 1  # the prefill's token alone
    assert result.tau == 1.0


def test_a_result_reports_its_cycles_rates_and_copies():
    """8 tokens in 3 forwards, 0.75 s after a 0.5 s prefill; cycles offering 3, 1 and 2 drafts (1, 0
    and 2 accepted): draft 1 offered thrice, passed twice; draft 2 offered twice (by the cycles of 3
    and 2), passed once; draft 3 offered once, rejected; draft 4 never offered."""
    result = GenerationResult(prompt_len=4, num_draft_tokens=4, token_ids=list(range(8)), num_target_calls=3,
                              prefill_s=0.5, draft_s=0.125, total_s=1.25, seed=9, finish_reason="length",
                              num_looked_up=2, num_lookup_accepted=1, num_pooled=1, num_pool_accepted=1)
    for drafted, accepted in ((3, 1), (1, 0), (2, 2)):
        result.record_cycle(drafted, accepted)
    assert (result.drafted_counts, result.accept_counts) == ([3, 1, 2], [1, 0, 2])
    assert acceptance_by_position([(3, 1), (1, 0), (2, 2)], 4) == [2 / 3, 0.5, 0.0, None]
    assert result.to_dict() == {
        "token_ids": list(range(8)), "num_generated": 8, "tau": 2.6667, "cached_tokens": 0,
        "num_target_calls": 3, "num_drafted": 6, "num_accepted": 3,
        "acceptance_by_position": [0.6667, 0.5, 0.0, 0.0], "prefill_s": 0.5, "draft_s": 0.125,
        "decode_s": 0.75, "decode_tokens_per_s": 9.33, "finish_reason": "length", "seed": 9,
        "num_looked_up": 2, "num_lookup_accepted": 1, "num_pooled": 1, "num_pool_accepted": 1,
    }
