"""The cost model's choices at their edges: no requests, exact ties, the margin met exactly, curves
longer than the draft asked for, copied drafts, and the acceptance estimates' arithmetic (found by
scripts/mutants.py over spec/cost.py and spec/schedule.py)."""

from __future__ import annotations

import json

import pytest
import torch

from trtspec.errors import ConfigError
from trtspec.spec.cost import (
    AcceptanceTracker,
    GainCalibration,
    MeasuredCost,
    admit_rows,
    best_draft_len,
    load_acceptance,
    tree_budget,
    tree_draft_seconds,
    tree_rows,
)
from trtspec.spec.schedule import SPSTable, survival

from .test_schedule import CONTEXT_GRID, FLAT, GRID, LINEAR


class _Steps:
    """A made-up machine for `best_draft_len`: a step drafting k tokens costs `seconds[k]`."""

    def __init__(self, *seconds: float):
        self.by_k = seconds

    def seconds(self, batch, draft_len):
        return self.by_k[draft_len]


class _RowSeconds:
    """A made-up machine for `admit_rows`: 1 s a step, and `per_row` s more for each drafting row."""

    def __init__(self, per_row: float = 1.0):
        self.per_row = per_row

    def step(self, batch, drafting, draft_len, drafts, context=None, prompt=0):
        return 1.0 + self.per_row * drafting


def test_no_requests_draft_nothing():
    assert best_draft_len(_Steps(1.0, 2.0), [], 1) == (0, 0.0)
    assert admit_rows(MeasuredCost(LINEAR), [], 4) == (0, [])


def test_best_draft_len_breaks_ties_towards_the_shorter_draft():
    # plain: 1 token in 1.5 s; k = 1: 2 tokens in 2 s; k = 2: 3 tokens in 3 s, the same 1 token/s
    assert best_draft_len(_Steps(1.5, 2.0, 3.0), [[1.0, 1.0]], 2) == (1, 1.0)
    # and plain decoding keeps a tie with drafting
    assert best_draft_len(_Steps(1.0, 2.0, 3.0), [[1.0, 1.0]], 2) == (0, 1.0)


def test_best_draft_len_drafts_when_the_margin_is_met_exactly():
    # k = 2: 2.5 tokens in 2 s = 1.25 tokens/s, exactly 1.25 × plain's 1 token in 1 s
    assert best_draft_len(_Steps(1.0, 2.0, 2.0), [[0.75, 0.75]], 2, min_gain=0.25) == (2, 1.25)
    # the margin multiplies plain's rate: 2 tokens in 2 s is 2.5 × plain's 0.4 tokens/s
    slow_plain = _Steps(2.5, 2.0, 2.0)
    assert best_draft_len(slow_plain, [[0.5, 0.5]], 2, min_gain=0.25) == (2, 1.0)
    k, rate = best_draft_len(slow_plain, [[0.5, 0.5]], 2, min_gain=1.6)
    assert (k, rate) == (0, pytest.approx(0.4))


def test_best_draft_len_looks_no_further_than_k_max():
    # a curve longer than k_max: a third sure draft would pay more, but k_max is 2
    assert best_draft_len(_Steps(1.0, 2.0, 2.0, 2.0), [[1.0, 1.0, 1.0]], 2) == (2, 1.5)


def test_best_draft_len_adds_each_position_in_order():
    # k = 1: 1.9 tokens in 1.5 s; k = 2: 2.2 in 2 s
    assert best_draft_len(_Steps(1.0, 1.5, 2.0), [[0.9, 0.3]], 2) == (1, pytest.approx(1.9 / 1.5))


def test_admit_rows_breaks_ties_towards_fewer_rows():
    # plain: 1 token in 1 s; one sure draft: 2 tokens in 2 s, no better
    assert admit_rows(_RowSeconds(), [[1.0]], 1) == (0, [])
    assert admit_rows(_RowSeconds(), [[1.0, 1.0]], 2) == (2, [0])  # 3 tokens in 2 s
    # 3 rows, plain 3 tokens/s: row 0's 4 sure drafts give 7 tokens in 2 s, and row 1's 3.5 more
    # tokens in 1 s more keep 3.5 tokens/s: the fewer rows win
    sure, most = [1.0] * 4, [1.0, 1.0, 1.0, 0.5]
    assert admit_rows(_RowSeconds(), [sure, most, []], 4) == (4, [0])


def test_admit_rows_looks_no_further_than_k_max():
    # a third sure draft would give 4 tokens in 2 s, but k_max is 2: 3 tokens in 2 s
    assert admit_rows(_RowSeconds(), [[1.0, 1.0, 1.0]], 2) == (2, [0])


def test_admit_rows_ranks_requests_by_their_gain_less_their_catch_up():
    """Row 0 would gain 2 tokens but must first catch up 0.5 s (1 token of plain decoding at 2 rows
    a second): row 1's 1.5 tokens rank first, and drafting alone (3.5 tokens in 1.25 s) beats both
    drafting (5.5 tokens in 2 s)."""
    rows = _RowSeconds(per_row=0.25)
    assert admit_rows(rows, [[1.0, 1.0], [1.0, 0.5]], 2, catch_up=[0.5, 0.0]) == (2, [1])
    assert admit_rows(rows, [[1.0, 1.0], [1.0, 0.5]], 2) == (2, [0, 1])  # no catch-up: 5.5 in 1.5 s


def test_admit_rows_refuses_a_catch_up_list_that_does_not_match_the_requests():
    for catch_up in ([0.0], [0.0, 0.0, 0.0]):
        with pytest.raises((ValueError, IndexError)):
            admit_rows(_RowSeconds(), [[1.0], [1.0]], 1, catch_up=catch_up)


def test_copied_drafts_cost_no_drafter_time():
    """Prompt lookup's drafts are copied: a step of copies is priced without the drafter's 2 ms, so
    a draft of survival 0.3 pays (2.6 tokens in 6 ms beats plain's 2 in 5 ms) where a drafted one
    does not (8 ms); a request with nothing to copy is never admitted."""
    surv = survival(torch.full((15,), 0.3)).tolist()
    cost = MeasuredCost(LINEAR)
    assert admit_rows(cost, [surv, surv], 15) == (0, [])
    assert admit_rows(cost, [surv, surv], 15, copies=True) == (1, [0, 1])
    assert admit_rows(cost, [[], surv], 15, copies=True) == (1, [1])
    assert cost.step(2, 0, 1, 2) == pytest.approx(LINEAR.step_seconds(2, 4))  # no drafter's time


def test_acceptance_tracker_counts_the_positions_a_step_tested():
    """A step that verified 4 drafts and accepted 2 tested positions 1..3 and passed 1..2; a prior
    shorter than the positions stands in where it has a rate, the default 0.7 beyond."""
    tracker = AcceptanceTracker(4, prior=[0.5, 0.5, 0.5], prior_weight=4.0)
    assert tracker.rates() == pytest.approx([0.5, 0.5, 0.5, 0.7])
    tracker.observe(4, 2)
    assert tracker.rates() == pytest.approx([3 / 5, 3 / 5, 2 / 5, 0.7])
    assert tracker.survival(2) == pytest.approx([3 / 5, 9 / 25])
    tracker.observe(1, 1)  # one draft offered and taken: position 2 was never tested
    assert tracker.rates() == pytest.approx([4 / 6, 3 / 5, 2 / 5, 0.7])
    assert AcceptanceTracker(2).rates() == [0.7, 0.7]  # no prior: the default everywhere


def test_acceptance_tracker_fades_old_counts_by_its_decay():
    tracker = AcceptanceTracker(1, prior=[0.5], prior_weight=4.0, decay=0.5)
    tracker.observe(1, 1)
    tracker.observe(1, 0)  # counts: tested 0.5 + 1, passed 0.5 + 0
    assert tracker.rates() == pytest.approx([(0.5 + 2.0) / (1.5 + 4.0)])
    steady = AcceptanceTracker(1, prior=[0.5], prior_weight=4.0, decay=1.0)
    steady.observe(1, 1)
    steady.observe(1, 0)
    assert steady.rates() == pytest.approx([3 / 6])


def test_gain_calibration_fades_old_steps_by_its_decay():
    cal = GainCalibration(decay=0.5, prior_weight=4.0)
    cal.observe(expected=4.0, accepted=2.0)
    cal.observe(expected=4.0, accepted=2.0)  # expected 0.5·4 + 4 = 6, accepted 0.5·2 + 2 = 3
    assert cal.factor == pytest.approx((3 + 4) / (6 + 4))
    assert cal.scale([1.0, 0.5]) == pytest.approx([0.7, 0.35])


@pytest.mark.parametrize("rates", [[1, 0.5, 0], [1.0], [0.0, 0.0]])
def test_acceptance_of_sure_and_hopeless_positions_is_taken(tmp_path, rates):
    (tmp_path / "acceptance.json").write_text(json.dumps({"acceptance_by_position": rates}))
    assert load_acceptance(tmp_path) == [float(r) for r in rates]


@pytest.mark.parametrize("rates,said", [
    ([0.5, 1.5], "got 1.5"), ([-0.1], "got -0.1"), ([], "one or more$"), ([0.5, 2], "got 2"),
])
def test_acceptance_outside_0_to_1_or_empty_is_refused(tmp_path, rates, said):
    (tmp_path / "acceptance.json").write_text(json.dumps({"acceptance_by_position": rates}))
    with pytest.raises(ConfigError, match=said):
        load_acceptance(tmp_path)


# a target forward of B tokens takes B seconds up to 2 (flat-extrapolated by cost past it); no drafter time
SECONDS_PER_TOKEN = SPSTable(batch_tokens=[1, 2], steps_per_s=[1.0, 0.5])


def test_tree_rows_breaks_ties_towards_plain_decoding():
    # plain: 1 token in 1 s; a tree of 1 node expecting 2 tokens: 2 tokens in 2 s
    assert tree_rows(SECONDS_PER_TOKEN, [2.0], 1, 1, 1, per_depth_forward=False, topk=1) == []
    assert tree_rows(SECONDS_PER_TOKEN, [2.5], 1, 1, 1, per_depth_forward=False, topk=1) == [0]


def test_tree_rows_needs_the_margin_over_plain_decoding():
    # 2.6 tokens in 2 s is 1.3 × plain's 1 token in 1 s
    assert tree_rows(SECONDS_PER_TOKEN, [2.6], 1, 1, 1, per_depth_forward=False, topk=1, min_gain=0.25) == [0]
    assert tree_rows(SECONDS_PER_TOKEN, [2.6], 1, 1, 1, per_depth_forward=False, topk=1, min_gain=0.5) == []


def test_tree_rows_counts_the_loops_time_in_both_steps():
    """LINEAR with 1 ms of loop: plain 1 token in 4.5 + 1 ms; a 1-node tree 2 ms of drafting + 5 ms of
    forward + 1 ms, so it pays from 1.45 expected tokens."""
    looped = LINEAR.model_copy(update={"loop_rows": [1, 8], "loop_seconds": [0.001, 0.001]})
    assert tree_rows(looped, [2.0], 1, 1, 1, per_depth_forward=False, topk=1) == [0]
    assert tree_rows(looped, [1.3], 1, 1, 1, per_depth_forward=False, topk=1) == []


def test_tree_rows_prices_a_prompt_piece_only_when_given():
    """A 1-node tree expecting 1.52 tokens: 7 ms against plain's 4.5 ms does not pay; beside one
    prompt token (7.45 ms against 5 ms) it does."""
    assert tree_rows(LINEAR, [1.52], 1, 1, 1, per_depth_forward=False, topk=1) == []
    assert tree_rows(LINEAR, [1.52], 1, 1, 1, per_depth_forward=False, topk=1, prompt=1) == [0]


def test_tree_drafting_of_a_chain_drafter_is_timed_over_its_frontier():
    table = SPSTable(batch_tokens=[1], steps_per_s=[100.0], draft_batches=[1, 8], draft_lens=[1, 4],
                     draft_seconds=[[0.001, 0.002], [0.004, 0.008]])
    # 2 trees of top-4 frontiers: 8 rows a depth; a block drafter forwards the 2 trees once
    assert tree_draft_seconds(table, 2, 4, per_depth_forward=True, topk=4) == pytest.approx(0.008)
    block = tree_draft_seconds(table, 2, 4, per_depth_forward=False, topk=4)
    assert block == pytest.approx(0.002 + 0.006 / 7)


def test_tree_budget_compares_with_the_chains_own_forward():
    # LINEAR: 4 ms + 0.5 ms a token; a chain of 3 verifies 4 tokens (6 ms), 1.1 × that covers 5 tokens
    assert tree_budget(LINEAR, 3) == 4
    # a flat table with no slack: every forward up to 64 tokens costs exactly the chain's
    assert tree_budget(FLAT, 15, slack=0.0) == 63


def test_sps_table_of_a_grid_without_a_short_grid_and_of_zero_seconds_loads(tmp_path):
    """A grid timed at one context only, and a drafter, catch-up or loop measured at 0 s, are tables
    `trtspec profile` may write: they load as they were saved."""
    path = tmp_path / "sps.json"
    GRID.save(path)
    assert SPSTable.load(path) == GRID
    free = SPSTable(batch_tokens=[1], steps_per_s=[100.0], draft_batches=[1], draft_lens=[1],
                    draft_seconds=[[0.0]], catch_up_seconds=[0.0], loop_rows=[1], loop_seconds=[0.0])
    free.save(path)
    assert SPSTable.load(path) == free


def test_sps_table_of_slow_rates_loads_and_of_an_infinite_rate_is_refused(tmp_path):
    path = tmp_path / "sps.json"
    SECONDS_PER_TOKEN.save(path)  # 1 and 0.5 steps per second: slow, not wrong
    assert SPSTable.load(path) == SECONDS_PER_TOKEN
    path.write_text(json.dumps({"batch_tokens": [1, 8], "steps_per_s": [1e400, 90.0]}))
    with pytest.raises(ConfigError, match="steps_per_s must be steps per second > 0, got inf"):
        SPSTable.load(path)


def test_sps_table_defaults_price_as_unmeasured():
    """Left out: no drafts cost nothing, catch-up counts every pending position (draft_catch_up 0), a
    short grid without contexts does not move with the context, and one whose short_context is left
    at 0 was timed at an empty cache."""
    table = SPSTable(batch_tokens=[1], steps_per_s=[100.0], draft_batches=[1], draft_lens=[1, 4],
                     draft_seconds=[[0.001, 0.002]], catch_up_seconds=[1e-5])
    assert table.draft_time(1, 0) == 0.0
    assert table.catch_up_time(1, 3) == pytest.approx(3e-5)
    no_contexts = SPSTable(**CONTEXT_GRID.model_dump(exclude={"verify_context", "short_context"}))
    assert no_contexts.step_seconds(2, 16, 64) == pytest.approx(1 / 80.0)
    empty_short = SPSTable(**CONTEXT_GRID.model_dump(exclude={"short_context"}))
    assert empty_short.step_seconds(2, 16, 128) == pytest.approx(1 / 160.0 + (1 / 80.0 - 1 / 160.0) / 2)


def test_step_seconds_past_the_grids_last_rows_at_several_tokens_a_row():
    # 16 requests × 2 tokens: R = 8's time at t = 2, grown as 1 / SPS(B) grows from 16 to 32 tokens
    at_8 = 1 / 80.0 + (1 / 40.0 - 1 / 80.0) / 7
    assert GRID.step_seconds(16, 32) == pytest.approx(at_8 * GRID.sps(16) / GRID.sps(32))


def test_draft_time_is_linear_in_batch_and_draft_length_between_and_past_what_was_measured():
    table = SPSTable(batch_tokens=[1], steps_per_s=[100.0], draft_batches=[1, 8], draft_lens=[1, 4],
                     draft_seconds=[[0.001, 0.002], [0.004, 0.008]])
    assert table.draft_time(1, 2) == pytest.approx(0.001 + 0.001 / 3)  # between draft lengths
    at_4 = (0.001 + 0.003 * 3 / 7, 0.002 + 0.006 * 3 / 7)  # R = 4 between the batches, k = 1 and 4
    assert table.draft_time(4, 3) == pytest.approx(at_4[0] + (at_4[1] - at_4[0]) * 2 / 3)
    assert table.draft_time(8, 8) == pytest.approx(0.016)  # past the longest draft: proportional to k
    assert table.draft_time(16, 1) == pytest.approx(0.008)  # past the largest batch: proportional to R
    assert table.draft_time(0, 4) == table.draft_time(1, 4) == 0.002  # flat below the first


def test_loop_time_of_no_running_requests_is_nothing_and_of_one_is_the_first_measured():
    # CONTEXT_GRID's loop: 1 ms at R = 1, 4 ms at R = 8
    assert CONTEXT_GRID.loop_time(0) == 0.0
    assert CONTEXT_GRID.loop_time(1) == pytest.approx(0.001)


def test_catch_up_time_of_one_position_beyond_what_draft_times_include():
    table = SPSTable(batch_tokens=[1], steps_per_s=[100.0], draft_batches=[1], draft_lens=[1],
                     draft_seconds=[[0.001]], draft_catch_up=2, catch_up_seconds=[1e-5])
    assert table.catch_up_time(1, 2) == 0.0
    assert table.catch_up_time(1, 3) == pytest.approx(1e-5)


@pytest.mark.parametrize("batch_tokens,steps_per_s", [([1, 8], [100.0]), ([], [])])
def test_sps_table_of_unequal_or_no_measured_batches_is_refused(tmp_path, batch_tokens, steps_per_s):
    path = tmp_path / "sps.json"
    path.write_text(json.dumps({"batch_tokens": batch_tokens, "steps_per_s": steps_per_s}))
    said = "batch_tokens and steps_per_s must be non-empty and equal in length"
    with pytest.raises(ConfigError, match=said):
        SPSTable.load(path)
