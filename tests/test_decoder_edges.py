"""Edges of the serving loop (`spec.decoder`) that the batch tests pass over: one-token requests, steps
where no row drafts a tree (or one row drafts none beside rows that do), predictions holding token 0,
the k of a step whose rows all draft from their predictions, when adaptive's probes come after a
drafting step, and what adaptive's planner is handed: the prompt tokens a step feeds, each request's
catch-up spread over its drafting steps, and steps where one draft is the most a row may verify."""

from __future__ import annotations

import copy

import pytest
import torch

from trtspec.config import LookupConfig, ScheduleConfig, TreeConfig
from trtspec.models.drafter import NoDrafter
from trtspec.models.target import Chunk
from trtspec.pipeline import load_pipeline
from trtspec.spec.decoder import (
    CATCH_UP_HORIZON,
    CATCH_UP_STEP,
    CONTEXT_STEP,
    PromptError,
    Request,
    SpeculativeDecoder,
)
from trtspec.spec.sampling import SamplingParams

from .test_batch import SPS, _config, _decoder

PROMPTS = [list(b"Q: 482 + 356\nA:"), list(b"def parse(self, text):\n"), list(b"import os\n")]


@pytest.fixture(scope="module")
def pipeline():
    return load_pipeline(_config("tiny-dflash"))


@pytest.fixture(scope="module")
def alone(pipeline):
    """Each prompt's first 12 greedy tokens, from the target alone."""
    plain = _decoder(pipeline, drafter=NoDrafter(), slots=1)
    return [plain.generate(p, 12).token_ids for p in PROMPTS]


def test_one_token_requests_get_the_targets_first_token(pipeline, alone):
    # max_new_tokens = 1 is the least a request may ask (>= 1): its prefill's token, then done
    decoder = _decoder(pipeline)
    one = decoder.generate(PROMPTS[0], 1)
    assert one.token_ids == alone[0][:1] and one.finish_reason in ("length", "stop")
    got = decoder.generate_batch([Request(p, 1) for p in PROMPTS])
    assert [r.token_ids for r in got] == [ids[:1] for ids in alone]


def test_a_step_where_no_row_may_draft_a_tree_is_k_0(pipeline, alone):
    # two tokens: the prefill gives the first, and the one step after it has no budget for drafts
    # (a step emits at most k + 1), so it feeds each row's last token alone and counts k = 0, with
    # no drafter pass
    decoder = _decoder(pipeline, tree=TreeConfig(nodes=8, topk=2))
    forwards = decoder.drafter.num_forwards
    got = decoder.generate_batch([Request(p, 2) for p in PROMPTS])
    assert [r.token_ids for r in got] == [ids[:2] for ids in alone]
    assert decoder.draft_len_counts == {0: 1} and decoder.offered_drafts == 0
    assert decoder.drafter.num_forwards == forwards
    assert decoder.num_steps == decoder.target.num_forwards == 2  # the prefill's step, then the k = 0 one
    # with room to draft, trees of every row decode the target's tokens
    got = decoder.generate_batch([Request(p, 12) for p in PROMPTS])
    assert [r.token_ids for r in got] == alone
    assert max(decoder.draft_len_counts) > 0


def test_a_prediction_may_hold_token_0(pipeline, alone):
    # token ids in [0, vocab) are the vocabulary's: 0 included
    decoder = _decoder(pipeline)
    request = Request(PROMPTS[0], 12, prediction=(0, *alone[0]))
    decoder.check(request)
    assert decoder.generate_batch([request])[0].token_ids == alone[0]


@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=8, topk=2)], ids=["chains", "trees"])
def test_k_counts_the_drafters_steps_beside_rows_drafting_from_their_predictions(pipeline, alone, tree):
    # k is the drafter's draft length (0: it drafts nothing); rows whose prediction continues their
    # answer draft from it instead, so a step where every row does has k = 0 and no drafter pass,
    # and the drafter's statistics count none of its drafts offered
    # (budgets of 12, 9 and 6 tokens: rows of one step drafting predictions of different lengths)
    decoder = _decoder(pipeline, tree=tree)
    forwards = decoder.drafter.num_forwards
    sizes = (12, 9, 6)
    got = decoder.generate_batch([Request(p, n, prediction=tuple(ids[:n]))
                                  for p, ids, n in zip(PROMPTS, alone, sizes, strict=True)])
    assert [r.token_ids for r in got] == [ids[:n] for ids, n in zip(alone, sizes, strict=True)]
    assert sum(r.num_predicted for r in got) > 0
    assert [(r.num_drafted, r.num_accepted) for r in got] == [(0, 0)] * 3
    drafting_steps = sum(n for k, n in decoder.draft_len_counts.items() if k)
    assert drafting_steps == decoder.drafter.num_forwards - forwards == 0


def test_a_probe_comes_after_probe_every_plain_steps_since_the_last_drafting_step(pipeline):
    # `_probe`: the first step without drafting probes; then one drafts after `probe_every` more
    # without (doubling while probes leave drafting off); a drafting step starts the count afresh
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive", probe_every=4), slots=1, table=SPS)
    assert [decoder._probe(drafting=False) for _ in range(14)] == \
        [True, False, False, False, True, False, False, False, False, False, False, False, True, False]
    assert decoder.num_probes == 3
    assert decoder._probe(drafting=True) is False
    assert [decoder._probe(drafting=False) for _ in range(5)] == [False, False, False, True, False]
    assert decoder.num_probes == 4


def test_a_tree_row_keeps_its_whole_tree_beside_a_row_whose_tree_is_cut(pipeline):
    # a row with little budget left drafts a tree cut to that depth; the row beside it still sends
    # its whole tree (its nodes, parents and depths): it drafts and gets accepted what it does alone,
    # in either row (the drafter reads the hidden states of its own row's accepted path)
    tree = TreeConfig(nodes=8, topk=2)
    long, short = Request(PROMPTS[0], 12), Request(PROMPTS[1], 3)
    alone = _decoder(pipeline, slots=2, tree=tree).generate_batch([long])[0]
    assert alone.num_drafted > 0 and alone.num_accepted > 0
    for both in (_decoder(pipeline, slots=2, tree=tree).generate_batch([long, short])[0],
                 _decoder(pipeline, slots=2, tree=tree).generate_batch([short, long])[1]):
        assert both.token_ids == alone.token_ids
        assert (both.num_drafted, both.num_accepted) == (alone.num_drafted, alone.num_accepted)


def test_each_step_prices_the_prompt_tokens_its_forward_feeds(pipeline, alone):
    # the planner is handed the prompt tokens the step's one forward feeds beside the drafts (the
    # cost model prices them): a prompt of 15 prefilled 6 at a time is 6, 6, then 3, then none
    decoder = _decoder(pipeline, slots=1, prefill_chunk=6)
    priced, draft = [], decoder._draft_chains

    def drafting(running, prompt):
        priced.append(prompt)
        return draft(running, prompt)

    decoder._draft_chains = drafting
    result = decoder.generate_batch([Request(PROMPTS[0], 12)])[0]
    assert result.token_ids == alone[0]
    assert len(PROMPTS[0]) == 15 and priced[:3] == [6, 6, 3] and set(priced[3:]) == {0}
    assert result.num_target_calls == len(priced)  # its request is in every step's one forward


def test_a_catch_up_is_spread_over_the_steps_its_request_is_expected_to_draft(pipeline):
    # what a request's drafter catch-up adds to a step it drafts in: the whole time over its
    # remaining budget at the tokens a step emits for it, at least 1 step, at most CATCH_UP_HORIZON
    # (budgets 2, 12 and 99 at 4 tokens a step: 1, 3 and 8 steps)
    table = SPS.model_copy(update={"catch_up_seconds": [0.001, 0.002]})
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive"), slots=3, table=table)
    for n in (3, 13, 100):
        decoder.add(Request(PROMPTS[0], n))
    whole = table.catch_up_time(3, 40)
    assert whole > 0 and CATCH_UP_HORIZON == 8
    assert decoder._catch_up_seconds(list(decoder.lives.values()), [40] * 3, [4.0] * 3) == \
        pytest.approx([whole, whole / 3, whole / 8])


def test_a_step_whose_rows_may_verify_one_draft_is_still_the_cost_models_choice(pipeline, alone):
    # adaptive plans k = 1 as any other k: with a drafter too slow to pay, three 3-token requests
    # one after another (each one step with a budget of 1 after its prefill) draft only in the
    # first such step, a probe, and decode the rest plainly
    slow = SPS.model_copy(update={"draft_seconds": [[1.0, 1.0], [1.0, 1.0]]})
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive"), slots=1, table=slow)
    got = decoder.generate_batch([Request(p, 3) for p in PROMPTS])
    assert [r.token_ids for r in got] == [ids[:3] for ids in alone]
    assert decoder.draft_len_counts.get(1) == decoder.num_probes == 1


def test_a_tree_row_with_no_budget_beside_drafting_rows_drafts_nothing(pipeline, alone):
    # a 2-token request's one step after its prefill has no budget for drafts: it feeds its last token
    # alone (a tree of no nodes, its padded depths 0) while the 12-token request beside it drafts a
    # tree; neither request counts the other's drafts
    tree = TreeConfig(nodes=8, topk=2)
    long, short = _decoder(pipeline, slots=2, tree=tree).generate_batch([Request(PROMPTS[0], 12),
                                                                         Request(PROMPTS[1], 2)])
    assert (long.token_ids, short.token_ids) == (alone[0], alone[1][:2])
    assert long.num_drafted > 0
    assert (short.num_drafted, short.num_accepted, short.num_target_calls) == (0, 0, 2)


def test_a_request_without_min_tokens_may_have_every_token_end_it(pipeline, alone):
    """Only min_tokens makes an all-ending vocabulary unservable: with none, a request whose stop ids
    cover every token is taken and ends at its first token, the target's own."""
    everything = Request(PROMPTS[0], 8, stop_ids=tuple(range(pipeline.target.vocab_size)))
    decoder = _decoder(pipeline)
    decoder.check(everything)
    got = decoder.generate_batch([everything])[0]
    assert got.token_ids == alone[0][:1] and got.finish_reason == "stop"


def test_a_decoder_given_no_max_slots_holds_one_request_at_a_time(pipeline):
    """max_slots defaults to one: a second request added while the first runs is refused, naming
    the one slot."""
    decoder = SpeculativeDecoder(pipeline.target, pipeline.drafter, pipeline.end_ids)
    decoder.add(Request(PROMPTS[0], 4))
    with pytest.raises(RuntimeError, match="all 1 slots are busy"):
        decoder.add(Request(PROMPTS[1], 4))


def test_only_a_requests_first_streamed_step_carries_its_prompts_cached_tokens(pipeline, alone):
    """The stream's consumers keep the largest cached_tokens they are handed: steps after the first
    carry 0 cached tokens and no prompt log-probabilities, the first the request's own (0 here, no
    prefix reuse)."""
    steps = []
    decoder = _decoder(pipeline, slots=1)
    decoder.add(Request(PROMPTS[0], 12), steps.append)
    while decoder.lives:
        decoder.step()
    assert len(steps) > 1 and [t for s in steps for t in s.ids] == alone[0]
    assert [(s.cached_tokens, s.prompt_logprobs) for s in steps] == [(0, None)] * len(steps)


def test_a_row_drafting_past_k_from_its_prediction_beside_a_drafter_row_decodes_as_alone(pipeline):
    """A prediction may send more drafts than the drafter's k: the step's drafts are then as wide as
    the prediction's, and the drafter's row beside it fills only its own k columns."""
    plain = _decoder(pipeline, drafter=NoDrafter(), slots=1)
    want = [plain.generate(p, 24).token_ids for p in PROMPTS[:2]]
    decoder = _decoder(pipeline, slots=2)
    assert decoder.num_draft_tokens < 22 and len(want[0]) == 24
    got = decoder.generate_batch([Request(PROMPTS[0], 24, prediction=tuple(want[0][1:])),
                                  Request(PROMPTS[1], 24)])
    assert [r.token_ids for r in got] == want
    assert got[0].num_predicted > decoder.num_draft_tokens and got[1].num_drafted > 0


def test_a_probes_verdicts_are_held_against_what_the_history_expected(pipeline):
    """A probe drafts outside the cost model's plan (it expected nothing of it): the calibration still
    holds its accepted drafts against what the acceptance history expected of the drafts it offered."""
    slow = SPS.model_copy(update={"draft_seconds": [[1.0, 1.0], [1.0, 1.0]]})
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive"), slots=1, table=slow)
    got = decoder.generate_batch([Request(p, 3) for p in PROMPTS])
    assert decoder.num_probes == 1 and sum(r.num_drafted for r in got) == 1  # the probe's one draft
    assert decoder.calibration.expected > 0
    assert decoder.calibration.accepted == sum(r.num_accepted for r in got)


def test_a_prefill_chunk_spent_on_one_prompt_leaves_the_next_for_a_later_step(pipeline, alone):
    """Chunked prefill: a step whose chunk one prompt used up feeds no piece of the next request's
    prompt; that one starts in a later step, and both decode as alone."""
    decoder = _decoder(pipeline, slots=2, prefill_chunk=len(PROMPTS[0]))
    decoder.add(Request(PROMPTS[0], 12))
    decoder.add(Request(PROMPTS[1], 12))
    pieces = decoder._prefill_pieces([lv for lv in decoder.lives.values()])
    assert [(start, end) for _, start, end in pieces] == [(0, len(PROMPTS[0]))]
    again = _decoder(pipeline, slots=2, prefill_chunk=len(PROMPTS[0]))
    got = again.generate_batch([Request(p, 12) for p in PROMPTS[:2]])
    assert [r.token_ids for r in got] == alone[:2]


def test_a_tree_step_commits_the_targets_taps_of_the_accepted_path(pipeline):
    """After a tree step the drafter is handed the target's taps of the row's last token and its
    accepted nodes, the path's, not the first nodes': prompt and commits together are the taps a
    plain forward of the committed text gives."""
    taps = []

    class Recording(type(pipeline.drafter)):
        def begin(self, slot, prompt, hidden, reused=0):
            taps.append(hidden.clone())
            super().begin(slot, prompt, hidden, reused)

        def commit(self, slot, num_accepted, hidden):
            taps.append(hidden.clone())
            super().commit(slot, num_accepted, hidden)

    drafter = copy.copy(pipeline.drafter)
    drafter.__class__ = Recording
    decoder = _decoder(pipeline, drafter=drafter, slots=1, tree=TreeConfig(nodes=8, topk=2))
    got = decoder.generate_batch([Request(PROMPTS[2], 24)])[0]
    assert got.num_accepted > 0
    single = copy.copy(pipeline.target)
    single.allocate(1, 256)
    fed = torch.tensor(PROMPTS[2] + got.token_ids[:-1])
    torch.testing.assert_close(torch.cat(taps), single.forward([Chunk(0, fed)]).hidden, atol=1e-4, rtol=1e-4)


def test_a_prompt_of_exactly_max_input_tokens_is_taken(pipeline, alone):
    """limits.max_input_tokens is the longest prompt taken: a prompt of exactly that many tokens
    decodes as the target alone, one a token longer is refused naming both numbers."""
    n = len(PROMPTS[0])
    decoder = SpeculativeDecoder(pipeline.target, pipeline.drafter, pipeline.end_ids, max_prompt=n)
    decoder.check(Request(PROMPTS[0], 4))
    assert decoder.generate(PROMPTS[0], 4).token_ids == alone[0][:4]
    with pytest.raises(PromptError, match=f"prompt of {n + 1} tokens exceeds limits.max_input_tokens {n}"):
        decoder.check(Request(PROMPTS[0] + [32], 4))


def test_a_tree_row_with_a_budget_of_one_drafts_a_one_deep_tree(pipeline, alone):
    """A 3-token request's step after its prefill may verify one draft: it drafts a tree cut to
    depth 1 (k = 1, its nodes offered) rather than feeding its last token alone, and decodes as the
    target alone."""
    decoder = _decoder(pipeline, slots=1, tree=TreeConfig(nodes=8, topk=2))
    got = decoder.generate_batch([Request(PROMPTS[0], 3)])[0]
    assert got.token_ids == alone[0][:3]
    assert decoder.draft_len_counts.get(1) == 1 and decoder.offered_drafts > 0 and got.num_drafted > 0


def test_the_cost_model_reads_context_and_catch_ups_rounded_up(pipeline):
    """Adaptive prices a step at its longest running request's cached tokens rounded up to
    CONTEXT_STEP, and each request's drafter catch-up rounded up to CATCH_UP_STEP, so its plan is not
    remade at every step: after its prefill a 15-token prompt reads as 32 positions, its 15-position
    catch-up as 16."""
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive"), slots=1, table=SPS)
    decoder.add(Request(PROMPTS[0], 12))
    decoder.step()
    running = list(decoder.lives.values())
    lv = running[0]
    assert (CONTEXT_STEP, CATCH_UP_STEP) == (32, 8)
    assert decoder.target.seq_len(lv.slot) == len(PROMPTS[0]) == 15
    assert decoder.drafter.catch_up(lv.slot, len(lv.committed)) == 15
    assert decoder._context(running) == 32 and decoder._catch_ups(running) == [16]


def test_prompt_lookup_without_a_pool_learns_from_the_requests_own_copies(pipeline):
    """With prompt lookup and no pool (pool_tokens 0), n-gram speculation decodes as the target
    alone, and the acceptance of its copies is learnt under copies from the request's own tokens,
    none under the pool's."""
    prompt = list(b"x = 1\nx = 1\nx = 1\nx = 1\n")
    want = _decoder(pipeline, drafter=NoDrafter(), slots=1).generate(prompt, 8).token_ids
    decoder = SpeculativeDecoder(pipeline.target, NoDrafter(), pipeline.end_ids,
                                 lookup=LookupConfig(pool_tokens=0))
    got = decoder.generate(prompt, 8)
    assert decoder.pool is None and got.token_ids == want and got.num_drafted > 0
    learnt = {key for key, tracker in decoder.lookup_acceptance.items() if tracker.version}
    assert learnt and all(not pooled for pooled, _ in learnt)


def test_adaptive_with_probe_every_0_never_probes(pipeline, alone):
    """probe_every = 0 turns probes off: with a drafter too slow to pay, adaptive decodes every
    step plainly (k = 0, nothing drafted), as the target alone."""
    slow = SPS.model_copy(update={"draft_seconds": [[1.0, 1.0], [1.0, 1.0]]})
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive", probe_every=0), slots=1, table=slow)
    got = decoder.generate_batch([Request(PROMPTS[0], 6)])[0]
    assert got.token_ids == alone[0][:6] and got.num_drafted == 0
    assert set(decoder.draft_len_counts) == {0} and decoder.num_probes == decoder.offered_drafts == 0


def test_a_single_token_bad_word_is_no_dead_end(pipeline, alone):
    """A one-token bad word is -inf at every position of a row, yet each position keeps other tokens:
    no dead end. The request decodes as the target alone with the same ban: the banned second token
    replaced, the first kept."""
    sampling = SamplingParams(bad_words=((alone[0][1],),))
    want = _decoder(pipeline, drafter=NoDrafter(), slots=1).generate_batch([Request(PROMPTS[0], 8, sampling)])
    got = _decoder(pipeline, slots=1).generate_batch([Request(PROMPTS[0], 8, sampling)])[0]
    assert got.error is None and got.token_ids == want[0].token_ids
    assert got.token_ids[0] == alone[0][0] and alone[0][1] not in got.token_ids


def test_adaptive_admits_the_trees_its_estimates_say_pay(pipeline, alone):
    """With SPS's costs, adaptive admits drafting rows' trees from their acceptance estimates (the
    tokens a tree is expected to gain over its depth): the first step after the prefill drafts
    trees as the cost model's choice, not as a probe, and the batch decodes as the target
    alone."""
    tree = TreeConfig(nodes=8, topk=2)
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive"), slots=3, table=SPS, tree=tree)
    got = decoder.generate_batch([Request(p, 12) for p in PROMPTS])
    assert [r.token_ids for r in got] == alone
    # the first drafting step's deepest node 8 deep (the 8 nodes in one chain), then shallower ones
    assert decoder.num_probes == 0 and max(decoder.draft_len_counts) == 8 and decoder.offered_drafts > 0


def test_adaptive_prices_a_block_drafters_tree_as_one_pass(pipeline, alone):
    """A block drafter (DFlash) drafts a whole tree in one forward at the rows' batch: with drafting
    cheap for one row and dear for more, a lone request's tree is priced at one row's pass and
    admitted (not at a chain drafter's forward of its top-k frontier per depth, which would not pay):
    no probe, and the request decodes as the target alone."""
    table = SPS.model_copy(update={"draft_seconds": [[0.001, 0.001], [1.0, 1.0]]})
    tree = TreeConfig(nodes=8, topk=2)
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive"), slots=1, table=table, tree=tree)
    assert decoder.drafter.method == "dflash"
    got = decoder.generate_batch([Request(PROMPTS[0], 12)])[0]
    assert got.token_ids == alone[0]
    assert decoder.num_probes == 0 and max(decoder.draft_len_counts) > 0 and got.num_drafted > 0


def test_adaptive_spreads_a_catch_up_over_the_steps_a_request_will_draft(pipeline):
    """A drafter's catch-up (1 ms at any size here) is priced over the steps the request is then
    expected to draft, its budget at 1 + the drafts it expects accepted per step: spread so, drafting
    pays for a 40-token request and it drafts (probes off: the cost model's choice), decoding as the
    target alone; charged whole to one step it would not."""
    table = SPS.model_copy(update={"catch_up_seconds": [0.001, 0.001]})
    schedule = ScheduleConfig(mode="adaptive", probe_every=0)
    decoder = _decoder(pipeline, schedule=schedule, slots=1, table=table)
    want = _decoder(pipeline, drafter=NoDrafter(), slots=1).generate(PROMPTS[0], 40).token_ids
    got = decoder.generate_batch([Request(PROMPTS[0], 40)])[0]
    assert got.token_ids == want
    assert decoder.num_probes == 0 and got.num_drafted > 0 and max(decoder.draft_len_counts) > 0
