"""The prefix scheduler: Algorithm 1's choices, and that scheduled verification stays lossless.

The distribution tests simulate a target whose p depends only on the absolute position and a
drafter whose confidence in slot j depends on the draft token before it, so the scheduler's cut
moves with the drafts. Algorithm 1 (early stop) must reproduce p exactly; the variant that takes
the best cut over all prefixes (`argmax`) lets a draft's own value decide whether it is checked
and must be caught as biased by the same test: the test has teeth.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from trtspec.spec.schedule import SPSTable, schedule_lengths, survival
from trtspec.spec.verify import PAD, draw_uniforms, verify_sampling

DRAWS = 20_000
TV_BOUND = 0.02  # TV of 20k draws over ≤ 3 outcomes is ~0.005 when the law is right


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


def simulate(mode, p, q, confidence_of, k, sps, n_out, seed):
    """Emit `n_out` tokens per row by draft–schedule–verify cycles.  p, q: [positions, V]."""
    gen = torch.Generator().manual_seed(seed)
    emitted = torch.full((DRAWS, n_out), PAD, dtype=torch.long)
    n = torch.zeros(DRAWS, dtype=torch.long)
    lengths_seen: set[int] = set()
    while (n < n_out).any():
        pos = n[:, None] + torch.arange(k + 1)  # [N, k+1] absolute positions of p_1..p_{k+1}
        q_b, p_b = q[pos[:, :k]], p[pos]  # [N, k, V], [N, k+1, V]
        draft = torch.multinomial(q_b.flatten(0, 1), 1, generator=gen).view(DRAWS, k)
        conf = confidence_of(draft)  # [N, k]
        surv = survival(conf)
        lens = torch.tensor([schedule_lengths([row], sps, mode)[0] for row in surv])
        lengths_seen.update(lens.tolist())
        out = verify_sampling(draft, q_b, p_b, *draw_uniforms(DRAWS, k, gen), draft_lens=lens)
        for r in torch.nonzero(n < n_out).flatten().tolist():
            toks = out.row(r)[: n_out - int(n[r])]
            emitted[r, n[r] : n[r] + len(toks)] = torch.tensor(toks)
            n[r] += len(toks)
    return emitted, lengths_seen


def law(tokens: torch.Tensor, v: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=v).float() / len(tokens)


# Counterexample: c_2 is 1 after x_1 = 0 and 0 otherwise; verifying one token does not pay
# (SPS drops at B = 2) but two sure ones would. The argmax cut verifies x_1 only when x_1 = 0.
COUNTER_P = torch.tensor([[0.2, 0.8]] * 6)
COUNTER_Q = torch.tensor([[0.5, 0.5]] * 6)
COUNTER_SPS = SPSTable(batch_tokens=[1, 2, 3], steps_per_s=[1.0, 0.6, 0.6])


def counter_confidence(draft):
    c1 = torch.full((draft.shape[0],), 0.5)
    c2 = (draft[:, 0] == 0).float()
    return torch.stack([c1, c2], 1)


def test_argmax_cut_is_biased():
    emitted, seen = simulate("argmax", COUNTER_P, COUNTER_Q, counter_confidence, 2, COUNTER_SPS, 1, 3)
    assert seen == {0, 2}
    # exact law of the first token under this rule: P(0) = 0.5·0.4 + 0.5·0.2 = 0.3, not 0.2
    assert tv(law(emitted[:, 0], 2), COUNTER_P[0]) > 4 * TV_BOUND


def test_scheduler_on_the_counterexample_is_exact():
    emitted, seen = simulate("scheduler", COUNTER_P, COUNTER_Q, counter_confidence, 2, COUNTER_SPS, 1, 3)
    assert tv(law(emitted[:, 0], 2), COUNTER_P[0]) < TV_BOUND


# A case where Algorithm 1's cut itself moves with the drafts (1, 2 or 3 slots verified).
GEN = torch.Generator().manual_seed(0)
P3 = torch.softmax(torch.randn(8, 3, generator=GEN) * 1.5, -1)
Q3 = torch.softmax(torch.randn(8, 3, generator=GEN) * 1.5, -1)
SPS3 = SPSTable(batch_tokens=[1, 2, 3, 4], steps_per_s=[1.0, 0.9, 0.8, 0.7])


def moving_confidence(draft):
    c1 = torch.full((draft.shape[0],), 0.9)
    c2 = torch.where(draft[:, 0] == 0, 0.9, 0.1)
    c3 = torch.where(draft[:, 1] == 1, 0.8, 0.2)
    return torch.stack([c1, c2, c3], 1)


@pytest.mark.parametrize("mode", ["scheduler", "threshold", "full"])
def test_scheduled_verification_reproduces_target(mode):
    emitted, seen = simulate(mode, P3, Q3, moving_confidence, 3, SPS3, 3, seed=7)
    if mode == "scheduler":
        assert len(seen) >= 2, seen  # the cut really depends on the drafts
    for i in range(3):
        assert tv(law(emitted[:, i], 3), P3[i]) < TV_BOUND, (mode, i)


def test_scheduler_stops_at_first_non_improvement():
    # admitting slot 1 lowers Θ (1.0 -> 0.9); slots 1+2 together would raise it to 1.2
    surv = [torch.tensor([0.5, 0.5])]
    assert schedule_lengths(surv, COUNTER_SPS, "scheduler") == [0]
    assert schedule_lengths([torch.tensor([0.5, 0.5])], COUNTER_SPS, "argmax") == [2]


def test_scheduler_admits_globally_by_survival():
    sps = SPSTable(batch_tokens=[2, 3, 4, 5, 6], steps_per_s=[1.0, 0.95, 0.9, 0.8, 0.5])
    surv = [torch.tensor([0.9, 0.8, 0.1]), torch.tensor([0.95, 0.3, 0.2])]
    # order (1,1) .95, (0,1) .9, (0,2) .8, (1,2) .3; Θ = 2, 2.80, 3.47, 3.72, then 2.48: stop
    assert schedule_lengths(surv, sps, "scheduler") == [2, 1]
    assert schedule_lengths(surv, sps, "full") == [3, 3]
    assert schedule_lengths(surv, sps, "threshold", threshold=0.5) == [2, 1]


def test_sps_table_interpolates_and_extrapolates_by_cost():
    sps = SPSTable(batch_tokens=[1, 4], steps_per_s=[100.0, 70.0])
    assert sps.sps(1) == 100.0
    assert sps.sps(2) == pytest.approx(90.0)
    assert sps.sps(8) == pytest.approx(35.0)


def test_drafting_cost_moves_the_early_stop():
    """Θ = τ* / (T_draft + 1/SPS(B)): a step that already paid for drafting admits more of a block
    than the paper's τ* · SPS(B), and both stop at the first non-improvement."""
    sps = SPSTable(batch_tokens=[1, 2, 3, 4], steps_per_s=[100.0, 60.0, 45.0, 36.0])
    surv = [torch.tensor([0.7, 0.5, 0.3])]
    assert schedule_lengths(surv, sps, "scheduler") == [1]  # 1.7·60 > 1·100, 2.2·45 < 1.7·60
    assert schedule_lengths(surv, sps, "scheduler", draft_seconds=0.05) == [3]


def test_best_draft_len_needs_the_margin_to_draft():
    """Drafting must beat plain decoding by 1 + min_gain; otherwise k = 0."""
    from trtspec.spec.cost import best_draft_len

    class Cost:  # drafting doubles a step's time
        def seconds(self, batch, draft_len):
            return 1.0 if draft_len == 0 else 2.0

    surv = [[0.9, 0.5]]  # k = 1: 1.9 / 2 = 0.95 tokens/s; k = 2: 2.4 / 2 = 1.2 against 1.0 plain
    assert best_draft_len(Cost(), surv, 2)[0] == 2
    assert best_draft_len(Cost(), surv, 2, min_gain=0.1)[0] == 2
    assert best_draft_len(Cost(), surv, 2, min_gain=0.25)[0] == 0


# measured on R requests × t tokens each: 2 × 8 tokens cost less than 8 × 2 (16 tokens either way)
GRID = SPSTable(batch_tokens=[1, 16, 64], steps_per_s=[100.0, 50.0, 20.0],
                verify_rows=[1, 2, 8], verify_tokens_per_row=[1, 8],
                verify_steps_per_s=[[100.0, 90.0], [95.0, 80.0], [80.0, 40.0]])


def test_step_seconds_reads_the_shape_of_the_step():
    assert GRID.step_seconds(2, 16) == pytest.approx(1 / 80.0)  # 2 requests × 8 tokens
    assert GRID.step_seconds(8, 16) == pytest.approx(1 / 80.0 + (1 / 40.0 - 1 / 80.0) / 7)  # 8 × 2
    # between measured points, linear in time: R = 4 × t = 4 is a third of the way from R = 2 to 8,
    # and t = 4 three sevenths of the way from t = 1 to 8 in each
    assert GRID.step_seconds(4, 16) == pytest.approx(
        (2 / 3) * (1 / 95.0 + (1 / 80.0 - 1 / 95.0) * 3 / 7)
        + (1 / 3) * (1 / 80.0 + (1 / 40.0 - 1 / 80.0) * 3 / 7))
    # past the last R the time grows as 1 / SPS(B) does; without a grid it is 1 / SPS(B)
    assert GRID.step_seconds(16, 16) == pytest.approx(1 / 80.0 * GRID.sps(8) / GRID.sps(16))
    plain = GRID.model_copy(update={"verify_rows": [], "verify_tokens_per_row": [], "verify_steps_per_s": []})
    assert plain.step_seconds(2, 16) == pytest.approx(1 / 50.0)


def test_adaptive_and_the_scheduler_price_a_step_by_its_shape():
    from trtspec.spec.cost import MeasuredCost

    assert MeasuredCost(GRID).seconds(2, 7) == pytest.approx(1 / 80.0)  # not 1 / SPS(16) = 1 / 50
    # Algorithm 1 over 2 requests: 2 tokens (1 each) then each admitted draft adds one
    surv = [torch.tensor([0.9] * 7), torch.tensor([0.9] * 7)]
    with_grid = schedule_lengths(surv, GRID, "scheduler")
    without = schedule_lengths(surv, GRID.model_copy(update={"verify_rows": [], "verify_tokens_per_row": [],
                                                             "verify_steps_per_s": []}), "scheduler")
    assert sum(with_grid) > sum(without)  # cheaper long rows: more of each block pays


# the same grid timed again at 64 cached tokens per request (GRID's own context: 256)
CONTEXT_GRID = GRID.model_copy(update={"verify_context": 256, "short_context": 64,
                                       "short_steps_per_s": [[200.0, 180.0], [190.0, 160.0], [160.0, 80.0]],
                                       "loop_rows": [1, 8], "loop_seconds": [0.001, 0.004]})


def test_step_time_follows_the_requests_context_and_counts_the_loop():
    from trtspec.spec.cost import MeasuredCost, admit_rows

    long, short = GRID.step_seconds(2, 16), CONTEXT_GRID.step_seconds(2, 16, 64)
    assert short == pytest.approx(long / 2)
    assert CONTEXT_GRID.step_seconds(2, 16) == pytest.approx(long)  # no context: the grid's own
    assert CONTEXT_GRID.step_seconds(2, 16, 256) == pytest.approx(long)
    assert CONTEXT_GRID.step_seconds(2, 16, 160) == pytest.approx((long + short) / 2)  # linear
    assert CONTEXT_GRID.step_seconds(2, 16, 448) == pytest.approx(long + (long - short))  # and beyond
    assert CONTEXT_GRID.step_seconds(2, 16, 8) == pytest.approx(short)  # never below the short grid
    assert CONTEXT_GRID.loop_time(4) == pytest.approx(0.001 + 0.003 * 3 / 7)
    cost = MeasuredCost(CONTEXT_GRID)
    assert cost.step(8, 0, 0, 0, 64) == pytest.approx(1 / 160.0 + 0.004)
    # 8 requests with a_1 = 0.1: a draft each costs 1.087× a plain step at 64 cached tokens (the
    # forwards halve, the loop's 4 ms stays) and 1.108× at 256, so it pays only at the short context
    surv = [[0.1]] * 8
    assert admit_rows(cost, surv, 1, context=64) == (1, list(range(8)))
    assert admit_rows(cost, surv, 1, context=256) == (0, [])


def test_sps_table_with_a_misshaped_grid_is_refused(tmp_path):
    from trtspec.errors import ConfigError

    bad = GRID.model_copy(update={"verify_steps_per_s": [[100.0], [95.0, 80.0], [80.0, 40.0]]})
    path = tmp_path / "sps.json"
    bad.save(path)
    with pytest.raises(ConfigError, match="verify_steps_per_s"):
        SPSTable.load(path)
    bad = CONTEXT_GRID.model_copy(update={"short_steps_per_s": [[1.0, 2.0]]})
    bad.save(path)
    with pytest.raises(ConfigError, match="short_steps_per_s"):
        SPSTable.load(path)


@pytest.mark.parametrize("field,value,said", [
    # taken as they were: a NaN, zero or negative rate priced every step wrong, "100" and true were
    # read as numbers
    ("steps_per_s", [float("nan"), 90.0], "steps_per_s must be steps per second > 0, got nan"),
    ("steps_per_s", [0, 90.0], "steps_per_s must be steps per second > 0, got 0"),
    ("steps_per_s", [-1.0, 90.0], "steps_per_s must be steps per second > 0, got -1.0"),
    ("steps_per_s", ["100", 90.0], "steps_per_s.0: Input should be a valid number, got '100'"),
    ("steps_per_s", [True, 90.0], "steps_per_s.0: Input should be a valid number, got True"),
    ("batch_tokens", [1.5, 8], "batch_tokens.0: Input should be a valid integer, got 1.5"),
    ("loop_seconds", [float("inf")], "loop_seconds must be seconds >= 0, got inf"),
])
def test_sps_table_of_wrong_values_is_refused_naming_the_field(tmp_path, field, value, said):
    from trtspec.errors import ConfigError

    body = {"batch_tokens": [1, 8], "steps_per_s": [100.0, 90.0], "loop_rows": [1], "loop_seconds": [0.001]}
    path = tmp_path / "sps.json"
    path.write_text(json.dumps({**body, field: value}))
    with pytest.raises(ConfigError, match=re.escape(f"{path}: ") + ".*" + re.escape(said)):
        SPSTable.load(path)


def test_sps_table_missing_a_field_names_it_not_the_whole_table(tmp_path):
    """pydantic's input for a missing field is the whole table: the error quoted all of it."""
    from trtspec.errors import ConfigError

    path = tmp_path / "sps.json"
    path.write_text(json.dumps({"batch_tokens": [1, 8], "machine": "x" * 500}))
    with pytest.raises(ConfigError) as info:
        SPSTable.load(path)
    assert str(info.value) == \
        f"{path}: not an SPS table written by `trtspec profile` (steps_per_s: Field required)"


class _StepCost:
    """A made-up machine: each token the target verifies costs 0.1 s over a 1 s step, and drafting
    costs 0.5 s for the step plus 0.1 s per drafting row."""

    def step(self, batch, drafting, draft_len, drafts, context=None, prompt=0):
        return 1.0 + 0.1 * drafts + (0.5 + 0.1 * drafting if drafting else 0.0)


def test_admit_rows_takes_the_rows_whose_gain_pays():
    from trtspec.spec.cost import admit_rows

    easy, hard = [0.95, 0.9, 0.85, 0.8], [0.2, 0.04, 0.01, 0.0]
    # plain: 4 rows / 1 s. Easy rows at k = 4: 4 + 2 · 3.5 = 11 tokens in 1 + 0.8 + 0.7 = 2.5 s;
    # adding a hard row would add 0.25 tokens for 0.5 s
    k, rows = admit_rows(_StepCost(), [hard, easy, hard, easy], 4)
    assert (k, rows) == (4, [1, 3])
    assert admit_rows(_StepCost(), [hard] * 4, 4) == (0, [])
    # a margin the best gain (4.4 vs 4 tokens/s) does not clear
    assert admit_rows(_StepCost(), [hard, easy, hard, easy], 4, min_gain=0.2) == (0, [])
    # a request with 2 tokens of budget left drafts at most 2 (its survival curve is that short)
    k, rows = admit_rows(_StepCost(), [easy[:2], easy, hard, hard], 4)
    assert rows == [0, 1] and k == 4


def test_admit_rows_prices_each_requests_catch_up():
    """A request whose drafter must first absorb what plain steps piled up pays that time in the
    step it drafts in: a small catch-up leaves the choice as it was, a large one turns it off."""
    from trtspec.spec.cost import admit_rows

    easy, hard = [0.95, 0.9, 0.85, 0.8], [0.2, 0.04, 0.01, 0.0]
    survivals = [hard, easy, hard, easy]
    # 11 tokens in 2.5 + 0.2 s = 4.07 tokens/s beats plain's 4; with 0.4 s, 3.79 does not, and
    # row 1 alone (7.5 tokens in 2 s) never did
    assert admit_rows(_StepCost(), survivals, 4, catch_up=[0.0, 0.0, 0.0, 0.2]) == (4, [1, 3])
    assert admit_rows(_StepCost(), survivals, 4, catch_up=[0.0, 0.0, 0.0, 0.4]) == (0, [])
    assert admit_rows(_StepCost(), survivals, 4, catch_up=[0.0] * 4) == admit_rows(_StepCost(), survivals, 4)


def test_catch_up_time_is_per_position_beyond_what_draft_times_include(tmp_path):
    from trtspec.errors import ConfigError

    table = SPSTable(batch_tokens=[1], steps_per_s=[100.0], draft_batches=[1, 4], draft_lens=[1],
                     draft_seconds=[[0.001], [0.002]], draft_catch_up=2, catch_up_seconds=[1e-5, 2e-5])
    assert table.catch_up_time(1, 2) == 0.0 and table.catch_up_time(4, 1) == 0.0
    assert table.catch_up_time(1, 12) == pytest.approx(10e-5)
    assert table.catch_up_time(2, 12) == pytest.approx(10 * (1e-5 + 1e-5 / 3))  # linear in R
    assert table.catch_up_time(8, 12) == table.catch_up_time(4, 12) == pytest.approx(20e-5)  # flat past 4
    assert table.model_copy(update={"catch_up_seconds": []}).catch_up_time(4, 40) == 0.0  # not measured
    path = tmp_path / "sps.json"
    table.model_copy(update={"catch_up_seconds": [1e-5]}).save(path)
    with pytest.raises(ConfigError, match="catch_up_seconds"):
        SPSTable.load(path)


def test_gain_calibration_scales_expected_gains_by_what_was_accepted():
    from trtspec.spec.cost import GainCalibration

    cal = GainCalibration(decay=1.0, prior_weight=4.0)
    assert cal.factor == 1.0
    for _ in range(9):
        cal.observe(expected=4.0, accepted=2.0)  # half of what the estimates promised
    assert cal.factor == pytest.approx((18 + 4) / (36 + 4))
    assert cal.scale([0.9, 0.5]) == pytest.approx([0.9 * cal.factor, 0.5 * cal.factor])
    for _ in range(100):
        cal.observe(expected=1.0, accepted=3.0)
    assert max(cal.scale([0.9, 0.5])) == 1.0  # a survival stays a probability


def test_a_request_estimate_follows_its_population_between_its_own_observations():
    from trtspec.spec.cost import AcceptanceTracker

    population = AcceptanceTracker(3, prior=[0.5, 0.5, 0.5])
    request = AcceptanceTracker(3, prior=population, decay=0.9)
    before = request.rates()
    for _ in range(20):
        population.observe(3, 3)  # every other request accepts everything
    assert request.rates()[0] > before[0] + 0.3


def test_algorithm_1_prices_the_rows_that_feed_one_token():
    """Rows decoding plainly in the same forward make verification dearer (B starts at all rows)."""
    sps = SPSTable(batch_tokens=[1, 2, 3, 4, 5], steps_per_s=[100.0, 90.0, 70.0, 50.0, 30.0])
    surv = [torch.tensor([0.8])]
    assert schedule_lengths(surv, sps, "scheduler") == [1]  # 1.8 · 90 > 1 · 100
    assert schedule_lengths(surv, sps, "scheduler", plain_rows=3) == [0]  # 4.8 · 30 < 4 · 50


def test_the_cost_memo_stays_bounded_over_a_long_run():
    """A served day plans at ever new contexts: the step prices the cost model keeps must not grow
    with the plans made (every price kept grew the memo for good: 0.87 M after 20,000 plans), and
    a price dropped and read again is the same."""
    import random

    from trtspec.spec.cost import COST_MEMO, MeasuredCost, admit_rows

    rng = random.Random(0)
    cost, fresh = MeasuredCost(CONTEXT_GRID), MeasuredCost(CONTEXT_GRID, memo=10**9)
    for _ in range(300):
        batch = rng.randint(1, 8)
        survivals = [[0.8 ** (j + 1) for j in range(rng.randint(0, 15))] for _ in range(batch)]
        context = 32 * rng.randint(1, 1024)  # the decoder's CONTEXT_STEP buckets of a 32k context
        chosen = admit_rows(cost, survivals, 15, context=context)
        assert chosen == admit_rows(fresh, survivals, 15, context=context)
    assert len(fresh._seconds) > 2 * COST_MEMO  # what an unbounded memo would hold
    assert len(cost._seconds) <= COST_MEMO


# a CPU-like machine: 4 ms a forward plus 0.5 ms a token; a GPU-like one: flat until 64 tokens
LINEAR = SPSTable(batch_tokens=[1, 2, 4, 8, 16, 32, 64, 128],
                  steps_per_s=[1 / (0.004 + 0.0005 * b) for b in [1, 2, 4, 8, 16, 32, 64, 128]],
                  draft_batches=[1, 8], draft_lens=[1, 15], draft_seconds=[[0.002, 0.002], [0.002, 0.002]])
FLAT = SPSTable(batch_tokens=[1, 64, 128, 256], steps_per_s=[100.0, 100.0, 50.0, 25.0])


def test_a_step_that_also_prefills_is_priced_with_its_prompt_tokens():
    """With chunked prefill a step's forward feeds prompt pieces beside the running requests' tokens;
    they were priced as a decode step, so on a CPU a step 7x dearer (2 rows + 64 prompt tokens:
    37 ms against 5) chose its draft length as if it were not: plain, where drafting gains 20 %."""
    from trtspec.spec.cost import MeasuredCost, admit_rows

    assert LINEAR.step_seconds(2, 2, prompt=62) == pytest.approx(0.004 + 0.0005 * 64)
    assert FLAT.step_seconds(2, 2, prompt=32) == pytest.approx(0.01)  # memory-bound: nearly free
    # ... but it makes the drafts compute-bound: 32 drafts were free, beside it they are not
    assert FLAT.step_seconds(2, 34) == FLAT.step_seconds(2, 2)
    assert FLAT.step_seconds(2, 34, prompt=64) - FLAT.step_seconds(2, 2, prompt=64) == \
        pytest.approx(1 / FLAT.sps(98) - 1 / FLAT.sps(66)) != 0
    surv = [survival(torch.full((15,), 0.3)).tolist()] * 2
    cost = MeasuredCost(LINEAR)
    # plain: 2 tokens in 5 ms = 400/s; k = 1: 2.6 in 8 ms = 325/s. With 64 prompt tokens: plain
    # 2 in 37 ms = 54/s; k = 1: 2.6 in 40 ms = 65/s, k = 3 (the best): 2.83 in 42 ms = 68/s
    assert admit_rows(cost, surv, 15, min_gain=0.1) == (0, [])
    assert admit_rows(cost, surv, 15, min_gain=0.1, prompt=64) == (3, [0, 1])
    assert cost.step(2, 0, 0, 0) != cost.step(2, 0, 0, 0, prompt=64)  # kept apart in the memo
    # Algorithm 1 likewise (2 ms of drafting): a draft of survival 0.1 pays only beside the prompt piece
    one = [torch.tensor([0.1])]
    assert schedule_lengths(one, LINEAR, "scheduler", draft_seconds=0.002, plain_rows=1) == [0]
    assert schedule_lengths(one, LINEAR, "scheduler", draft_seconds=0.002, plain_rows=1, prompt=64) == [1]


def test_step_seconds_at_the_edges_of_what_was_measured():
    """One request reads the grid's R = 1 row (not 1 / SPS); a one-token prompt piece is priced like
    a longer one; a grid timed at one context only, or at a short context no shorter than its own,
    does not move with the requests' context; catch-up is flat past the last of three R."""
    assert GRID.step_seconds(1, 8) == pytest.approx(1 / 90.0)  # 1 / SPS(8) would be 1 / 76.7
    assert LINEAR.step_seconds(2, 2, prompt=1) == pytest.approx(1 / LINEAR.sps(3))  # 1 / SPS(2) + its share
    assert LINEAR.sps(3) < LINEAR.sps(2)
    one_context = GRID.model_copy(update={"verify_context": 256})  # no short grid
    assert one_context.step_seconds(2, 16, 64) == pytest.approx(1 / 80.0)
    misordered = CONTEXT_GRID.model_copy(update={"verify_context": 64})  # short grid not shorter
    assert misordered.step_seconds(2, 16, 8) == pytest.approx(1 / 80.0)
    three = SPSTable(batch_tokens=[1], steps_per_s=[100.0], draft_batches=[1, 2, 4], draft_lens=[1],
                     draft_seconds=[[0.001]] * 3, draft_catch_up=2, catch_up_seconds=[1e-5, 2e-5, 4e-5])
    assert three.catch_up_time(8, 12) == pytest.approx(10 * 4e-5)  # R = 4's rate, not R = 2's


def test_threshold_mode_keeps_a_survival_equal_to_the_cut():
    """The threshold mode verifies the slots whose survival is ≥ `threshold` (ScheduleConfig): sure
    drafts (survival 1) pass threshold 1, and a slot exactly at 0.5 passes 0.5."""
    surv = [torch.tensor([1.0, 1.0, 0.5]), torch.tensor([0.5, 0.25])]
    assert schedule_lengths(surv, SPS3, "threshold", threshold=1.0) == [2, 0]
    assert schedule_lengths(surv, SPS3, "threshold", threshold=0.5) == [3, 1]


def test_scheduler_stops_at_a_draft_that_leaves_the_rate_as_it_was():
    """A tie is no improvement: a forward of B tokens taking B seconds, a sure draft gives 2 tokens in
    2 s against 1 in 1 s, and is not verified; one that takes a little less than 2 s is."""
    sure = [torch.tensor([1.0])]
    assert schedule_lengths(sure, SPSTable(batch_tokens=[1, 2], steps_per_s=[1.0, 0.5]), "scheduler") == [0]
    assert schedule_lengths(sure, SPSTable(batch_tokens=[1, 2], steps_per_s=[1.0, 0.51]), "scheduler") == [1]
