"""The serving loop at batch R: one drafter pass, one target forward and one verification per step
for every running request, with exactly what each request decoded alone would give."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch

from trtspec.config import ScheduleConfig, TreeConfig, load_build_config
from trtspec.errors import ConfigError
from trtspec.models.draft_model import DraftModelDrafter
from trtspec.models.drafter import Drafter, NoDrafter, Proposal
from trtspec.models.graph_audit import CaptureAudit
from trtspec.models.target import Chunk, TargetModel
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.spec.decoder import Request, SpeculativeDecoder
from trtspec.spec.sampling import SamplingParams
from trtspec.spec.schedule import SPSTable

from .conftest import REPO, assert_samples_follow_target

PROMPTS = load_prompts("code")[:4] + load_prompts("math")[:4] + load_prompts("chat")[:4]
# a machine where verifying is cheap up to 16 tokens and drafting costs a third of a step
SPS = SPSTable(batch_tokens=[1, 8, 16, 32, 64], steps_per_s=[100.0, 95.0, 80.0, 60.0, 35.0],
               draft_batches=[1, 8], draft_lens=[1, 15], draft_seconds=[[0.003, 0.004], [0.004, 0.006]])
FULL = ScheduleConfig(mode="full")


def _config(name: str, flavour: str = "torch"):
    config = load_build_config(REPO / "build_configs" / f"{name}.yaml")
    return config.model_copy(update={"flavour": flavour})


@pytest.fixture(scope="module", params=["tiny-dflash", "tiny-dspark", "tiny-eagle3", "tiny-draft-model",
                                        "tiny-dflash@engine", "tiny-dspark@engine"])
def pipeline(request):
    """Torch pipelines of every drafter, and engine-flavour ones (onnxruntime graphs)."""
    name, _, flavour = request.param.partition("@")
    return load_pipeline(_config(name, flavour or "torch"))


@pytest.fixture(scope="module")
def alone():
    """Each prompt decoded alone by the torch target alone: the reference every batch, every drafter
    and both flavours must equal. Greedy, so a budget of 40 gives the first 40 of the 70 tokens
    (fewer where an end id came first): decoded once, at 70."""
    decoder = load_pipeline(_config("tiny-dflash"), use_drafter=False).decoder_for(1, FULL)
    full = [decoder.generate(list(p.encode()), 70).token_ids for p in PROMPTS]
    return {70: full, 40: [ids[:40] for ids in full]}


def _decoder(pipeline, drafter=None, schedule=FULL, slots=8, table=None, tree=None,
             prefill_chunk=None) -> SpeculativeDecoder:
    drafter = pipeline.drafter if drafter is None else drafter
    return SpeculativeDecoder(pipeline.target, drafter, pipeline.end_ids, pipeline.verifier,
                              schedule, table, slots, 512, tree=tree, prefill_chunk=prefill_chunk)


class ConfidentDrafter(Drafter):
    """A real drafter plus a made-up confidence that depends on the previous draft token, so the
    scheduler's cut moves with the drafts (the case that could break losslessness)."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.method, self.tap_layer_ids = inner.method, inner.tap_layer_ids
        self.num_draft_tokens = inner.num_draft_tokens

    def allocate(self, num_slots, capacity):
        self.inner = copy.copy(self.inner)
        self.inner.allocate(num_slots, capacity)

    def begin(self, slot, prompt, hidden, reused=0):
        self.inner.begin(slot, prompt, hidden, reused)

    def commit(self, slot, num_accepted, hidden):
        self.inner.commit(slot, num_accepted, hidden)

    def release(self, slot, tokens=None):
        self.inner.release(slot, tokens)

    def propose(self, rows, k):
        p = self.inner.propose(rows, k)
        anchors = torch.tensor([[row.committed[-1]] for row in rows])
        prev = torch.cat([anchors, p.tokens[:, :-1]], 1)  # x_{j-1}
        return Proposal(p.tokens, p.q_probs, torch.where(prev % 2 == 0, 0.95, 0.4))


def test_packed_forward_equals_one_sequence_at_a_time(pipeline):
    """Three requests in slots 0..2 fed in one forward, a draft-like step for all, a rejection in
    one slot: every logit equals the one-slot target fed the same tokens."""
    packed, single = copy.copy(pipeline.target), copy.copy(pipeline.target)
    packed.allocate(3, 256)
    single.allocate(1, 256)
    ids = [torch.tensor(list(p.encode())) for p in PROMPTS[:3]]
    offsets = [0, len(ids[0]), len(ids[0]) + len(ids[1])]
    outs = packed.forward([Chunk(r, x) for r, x in enumerate(ids)])
    step = [torch.randint(0, 256, (5,), generator=torch.Generator().manual_seed(r)) for r in range(3)]
    outs2 = packed.forward([Chunk(r, step[r]) for r in range(3)])
    packed.rewind(1, 3)
    outs3 = packed.forward([Chunk(1, step[0][:2])])
    for r, x in enumerate(ids):
        single.reset()
        ref = single.forward([Chunk(0, x)])
        got = outs.logits[offsets[r] : offsets[r] + len(x)]
        torch.testing.assert_close(got, ref.logits, atol=1e-4, rtol=1e-4)
        if single.tap_layer_ids:
            torch.testing.assert_close(outs.hidden[offsets[r] : offsets[r] + len(x)], ref.hidden,
                                       atol=1e-4, rtol=1e-4)
        ref2 = single.forward([Chunk(0, step[r])])
        torch.testing.assert_close(outs2.logits[5 * r : 5 * r + 5], ref2.logits, atol=1e-4, rtol=1e-4)
        if r == 1:
            single.rewind(0, 3)
            ref3 = single.forward([Chunk(0, step[0][:2])])
            torch.testing.assert_close(outs3.logits, ref3.logits, atol=1e-4, rtol=1e-4)
    assert packed.seq_len(1) == len(ids[1]) + 4


def test_batched_greedy_identical_to_target_alone(pipeline, alone):
    """R = 1..8 with unequal budgets, more requests than slots (they join as others leave): every
    request's tokens equal the target alone's; without the drafter too (once per flavour: the
    target is the same whatever the drafter)."""
    budgets = [40 if i % 2 else 70 for i in range(len(PROMPTS))]
    expected = [alone[n][i] for i, n in enumerate(budgets)]
    reqs = [Request(list(p.encode()), n) for p, n in zip(PROMPTS, budgets, strict=True)]
    spec = _decoder(pipeline)
    for slots in (1, 3):  # R = 8 is `spec` below, with all 12 requests
        decoder = _decoder(pipeline, slots=slots)
        got = decoder.generate_batch(reqs[: 2 + slots])
        assert [r.token_ids for r in got] == expected[: 2 + slots]
    got = spec.generate_batch(reqs)
    assert [r.token_ids for r in got] == expected
    tokens = sum(len(r.token_ids) for r in got)
    assert spec.num_steps < tokens / 8  # speculation and batching, not one token per request-step
    if pipeline.drafter.method != "dflash":
        return
    plain = _decoder(pipeline, NoDrafter(), slots=5).generate_batch(reqs)
    assert [r.token_ids for r in plain] == expected


def test_mixed_sampling_rows_leave_greedy_rows_exact(pipeline, alone):
    """Greedy requests decoded in the same steps as sampling requests (each with its own
    temperature/top-p/top-k) get exactly their target-alone tokens."""
    decoder = _decoder(pipeline, slots=6)
    params = [SamplingParams(temperature=0.7, top_k=5, seed=1),
              SamplingParams(temperature=1.2, top_p=0.8, seed=2), SamplingParams(temperature=1.0, seed=3)]
    reqs = []
    for i, p in enumerate(PROMPTS[:6]):
        sampling = SamplingParams() if i % 2 == 0 else params[i // 2]
        reqs.append(Request(list(p.encode()), 40, sampling))
    got = decoder.generate_batch(reqs)
    for i in range(0, 6, 2):
        assert got[i].token_ids == alone[40][i]
    assert all(len(r.token_ids) > 0 for r in got)


@pytest.mark.parametrize("mode", ["scheduler", "threshold", "adaptive"])
def test_scheduled_batched_greedy_identical(pipeline, alone, mode):
    drafter = ConfidentDrafter(pipeline.drafter)
    decoder = _decoder(pipeline, drafter, ScheduleConfig(mode=mode, threshold=0.5), table=SPS)
    got = decoder.generate_batch([Request(list(p.encode()), 70) for p in PROMPTS[:6]])
    if mode != "adaptive":
        assert 0 < decoder.admitted_drafts < decoder.offered_drafts  # the cut really shortened blocks
    assert sum(r.num_drafted for r in got) > 0  # adaptive too: drafts were verified, not only plain steps
    assert [r.token_ids for r in got] == alone[70][:6]


def test_one_drafter_pass_per_step_whatever_the_batch(pipeline):
    """The drafter runs once per step for the whole batch (a block drafter), or once per draft
    position (a chain drafter): counted, the same at R = 1 and R = 6."""
    for r in (1, 6):
        decoder = _decoder(pipeline, slots=r)
        decoder.generate_batch([Request(list(p.encode()), 40) for p in PROMPTS[:r]])
        counts = decoder.draft_len_counts  # k -> steps; drafting happens exactly when k > 0
        drafting_steps = sum(n for k, n in counts.items() if k)
        assert drafting_steps > 0
        if pipeline.drafter.method in ("dflash", "dspark"):
            assert decoder.drafter.num_forwards == drafting_steps
        else:
            assert decoder.drafter.num_forwards == sum(k * n for k, n in counts.items())


def test_caches_after_rejection_equal_caches_of_the_accepted_tokens(pipeline):
    """After a run with rejections, each slot's target K/V over its committed tokens equals a fresh
    prefill of those tokens (a rewind only changes a length)."""
    if pipeline.config.flavour == "engine":
        pytest.skip("the engine target keeps one packed cache (tested above through its logits)")
    decoder = _decoder(pipeline, slots=3)
    ids = [decoder.add(Request(list(p.encode()), 30)) for p in PROMPTS[:3]]
    for _ in range(4):
        decoder.step()
    lives = [decoder.lives[i] for i in ids if i in decoder.lives]
    assert lives and any(lv.result.num_drafted > lv.result.num_accepted for lv in lives)
    fresh = copy.copy(pipeline.target)
    fresh.allocate(1, 512)
    for lv in lives:
        committed = lv.request.prompt + lv.generated[:-1]  # the last token is fed by the next step
        assert decoder.target.seq_len(lv.slot) == len(committed)
        fresh.reset()
        fresh.forward([Chunk(0, torch.tensor(committed))])
        n = len(committed)
        for a, b in zip(decoder.target.cache.layers, fresh.cache.layers, strict=True):
            torch.testing.assert_close(a.keys[lv.slot, :, :n], b.keys[0, :, :n], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(a.values[lv.slot, :, :n], b.values[0, :, :n], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["tiny-dflash", "tiny-dspark"])
def test_adaptive_batched_sampling_follows_target(name):
    """R = 16 rows per step under the adaptive schedule (k moves with acceptance; DSpark cuts each
    block with Algorithm 1), each next request joining as one ends: the law of the first tokens is
    the target's."""
    pipeline = load_pipeline(_config(name))
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive"), slots=16, table=SPS)
    # a prompt whose law is spread (top token 0.91, 0.91, 0.41, 0.43; on "Q: 12 + 34\nA:" it was
    # 0.9999, which a biased verifier passes too) and whose blocks are sometimes accepted
    assert_samples_follow_target(pipeline.target.model, decoder, list(b"    def __init__(self"),
                                 SamplingParams(temperature=1.0, top_k=3), steps=4)


COUPLED = [SamplingParams(temperature=1.0, seed=5, coupling="gumbel"),
           SamplingParams(temperature=0.7, top_k=8, seed=6, coupling="gumbel"),
           SamplingParams(temperature=1.2, top_p=0.9, seed=2**63 + 7, coupling="gumbel")]


@pytest.fixture(scope="module")
def coupled_alone():
    """Six Gumbel-coupled sampled requests, each decoded alone by the torch target alone."""
    decoder = load_pipeline(_config("tiny-dflash"), use_drafter=False).decoder_for(1, FULL)
    return [decoder.generate(list(p.encode()), 50, s).token_ids
            for p, s in zip(PROMPTS[:6], COUPLED * 2, strict=True)]


@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=10, topk=4)], ids=["chain", "tree"])
def test_gumbel_coupled_sampling_is_what_the_target_alone_samples(pipeline, coupled_alone, tree):
    """Sampling with Gumbel coupling: every request's tokens equal what the target alone samples
    with its seed, the equality greedy decoding has, under sampling, whatever the drafter, chain or
    tree, flavour, batch or schedule: alone with whole blocks, and eight at a time under the
    adaptive schedule beside greedy and rejection-sampled requests."""
    reqs = [Request(list(p.encode()), 50, s) for p, s in zip(PROMPTS[:6], COUPLED * 2, strict=True)]
    others = [Request(list(PROMPTS[6].encode()), 30),
              Request(list(PROMPTS[7].encode()), 30, SamplingParams(temperature=1.0, seed=9))]
    for slots, schedule, batch in ((1, FULL, reqs[:2]), (8, ScheduleConfig(mode="adaptive"), reqs + others)):
        decoder = SpeculativeDecoder(pipeline.target, pipeline.drafter, pipeline.end_ids, pipeline.verifier,
                                     schedule, SPS, slots, 512, tree=tree)
        got = decoder.generate_batch(batch)
        n = sum(r.sampling.gumbel for r in batch)  # the coupled requests come first
        assert [r.token_ids for r in got[:n]] == coupled_alone[:n]
        # drafts were accepted, several in one step (a tree: a root path of depth 2 or more)
        assert max(a for r in got[:n] for a in r.accept_counts) >= 2


# topk 1: the tree holds only each node's best child, the coupled chain (wider trees may stop it
# short of a deeper alternative, which counts as drafted and not accepted)
@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=4, topk=1)], ids=["chain", "tree"])
def test_a_drafter_that_is_the_target_gets_every_coupled_draft_accepted(tree):
    """The drafter draws its coupled drafts with the noise of the very positions the verifier keys
    them at: a drafter that is the target itself proposes what the target samples, every time. (Off by
    one position, texts still equal the target alone's, but drafts would match only by chance.)"""
    pipeline = load_pipeline(_config("tiny-draft-model"), use_drafter=False)
    drafter = DraftModelDrafter(pipeline.target.model, 4)
    decoder = SpeculativeDecoder(pipeline.target, drafter, pipeline.end_ids, pipeline.verifier, FULL, None,
                                 3, 512, tree=tree)
    got = decoder.generate_batch([Request(list(p.encode()), 40, s)
                                  for p, s in zip(PROMPTS[3:6], COUPLED, strict=True)])
    drafted = sum(r.num_drafted for r in got)
    assert drafted > 40 and sum(r.num_accepted for r in got) == drafted


def test_adaptive_turns_speculation_off_where_it_cannot_pay():
    """A machine where drafting costs more than a target step: adaptive decodes plainly (k = 0)
    but for its probes, which come ever rarer, and still gives the target's tokens; where verifying
    is nearly free it drafts."""
    pipeline = load_pipeline(_config("tiny-dflash"))
    slow_drafter = SPS.model_copy(update={"draft_seconds": [[0.5, 0.5], [0.5, 0.5]]})
    prompts = [list(p.encode()) for p in PROMPTS[4:8]]
    never = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive", probe_every=0), slots=4,
                     table=slow_drafter)
    off = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive", probe_every=4), slots=4,
                   table=slow_drafter)
    on = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive"), slots=4, table=SPS)
    got_never = never.generate_batch([Request(p, 40) for p in prompts])
    got_off = off.generate_batch([Request(p, 40) for p in prompts])
    got_on = on.generate_batch([Request(p, 40) for p in prompts])
    assert set(never.draft_len_counts) == {0} and never.offered_drafts == 0 and never.num_probes == 0
    # probes at the first step without drafting, then after 4, 8, 16, … more: steps 1, 5, 13, 29
    steps = sum(off.draft_len_counts.values())
    assert off.num_probes == sum(n for k, n in off.draft_len_counts.items() if k) == \
        sum(1 for s in (1, 5, 13, 29, 61) if s <= steps)
    assert max(on.draft_len_counts) > 0
    assert [r.token_ids for r in got_never] == [r.token_ids for r in got_off] == [r.token_ids for r in got_on]


def test_catch_up_is_what_plain_steps_piled_up_and_adaptive_pays_it(pipeline):
    """Steps without drafting leave every drafter a catch-up (the positions its next proposal must
    absorb: EAGLE-3 at most its window), and adaptive speculation prices it: a machine where each
    position takes a second never drafts again, one where it is free drafts as before."""
    from trtspec.models.eagle3_drafter import CATCH_UP_WINDOW

    prompts = [list(p.encode()) for p in PROMPTS[:2]]
    plain = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive", probe_every=0), slots=2,
                     table=SPS.model_copy(update={"draft_seconds": [[9.0, 9.0], [9.0, 9.0]]}))
    for p in prompts:
        plain.add(Request(p, 60))
    for _ in range(40):
        plain.step()
    assert plain.offered_drafts == 0
    for lv in plain.lives.values():
        cached = len(lv.committed) - 1  # the target's positions; the last token is fed next
        expected = {"eagle3": min(cached, CATCH_UP_WINDOW), "draft_model": cached + 1}.get(
            pipeline.drafter.method, cached)
        assert plain.drafter.catch_up(lv.slot, len(lv.committed)) == expected
    priced = SPS.model_copy(update={"draft_catch_up": 2, "catch_up_seconds": [1.0, 1.0]})
    free = SPS.model_copy(update={"draft_catch_up": 2, "catch_up_seconds": [0.0, 0.0]})
    runs = {}
    for name, table in (("priced", priced), ("free", free)):
        decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive", probe_every=0), slots=2,
                           table=table)
        runs[name] = ([r.token_ids for r in decoder.generate_batch([Request(p, 40) for p in prompts])],
                      decoder.offered_drafts)
    assert runs["priced"][1] == 0 < runs["free"][1] and runs["priced"][0] == runs["free"][0]


def test_plain_steps_hold_a_bounded_pile_of_taps_and_draft_as_before(pipeline, monkeypatch):
    """A block drafter (DFlash, DSpark; torch and engine) projects what plain steps pile up once it
    reaches ABSORB_AT positions, so a request that does not draft holds few taps (it held its
    whole prompt and output); its next drafts are those of a drafter that kept the whole pile."""
    from trtspec.models import dflash_drafter
    from trtspec.spec.decoder import _draft_row

    if not isinstance(pipeline.drafter, dflash_drafter.BlockDrafter):
        pytest.skip("only block drafters keep every position's taps (EAGLE-3 keeps a window)")
    never_pays = SPS.model_copy(update={"draft_seconds": [[9.0, 9.0], [9.0, 9.0]]})

    def plain_run(absorb_at: int):
        monkeypatch.setattr(dflash_drafter, "ABSORB_AT", absorb_at)
        decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive", probe_every=0), slots=2,
                           table=never_pays)
        for p in PROMPTS[:2]:
            decoder.add(Request(list(p.encode()), 350))
        piles = []
        for _ in range(300):
            decoder.step()
            piles.append(max(decoder.drafter.pending.positions.values(), default=0))
        assert decoder.offered_drafts == 0
        return piles, decoder.drafter.propose([_draft_row(lv) for lv in decoder.lives.values()], 4)

    absorb_at = dflash_drafter.ABSORB_AT
    bounded, drafts = plain_run(absorb_at)
    kept, kept_drafts = plain_run(10**9)
    assert max(bounded) < absorb_at < max(kept)
    assert torch.equal(drafts.tokens, kept_drafts.tokens)


def test_kv_bytes_per_position_is_what_allocate_takes(pipeline, monkeypatch):
    """The memory check (`trtspec.memory`) adds target's and drafter's `kv_bytes_per_position`:
    each must be what their `allocate` really takes per slot position."""
    from trtspec.models import kv_slots

    allocated = []
    make = kv_slots.SlotKV.__init__

    def counting(self, *args, **kwargs):
        make(self, *args, **kwargs)
        allocated.append(self.keys.nbytes + self.values.nbytes)

    monkeypatch.setattr(kv_slots.SlotKV, "__init__", counting)
    models = [copy.copy(pipeline.drafter)] + ([copy.copy(pipeline.target)]
                                              if isinstance(pipeline.target, TargetModel) else [])
    for model in models:
        taken = []
        for capacity in (64, 96):
            allocated.clear()
            model.allocate(3, capacity)
            taken.append(sum(allocated))
        assert (taken[1] - taken[0]) // (3 * 32) == model.kv_bytes_per_position, type(model).__name__


def test_catch_up_is_spread_over_the_steps_a_request_will_draft():
    """A catch-up is paid once, then the request drafts on: adaptive spreads it over the steps the
    request is expected to draft. EAGLE-3 starts each request with its window's 32 positions to
    absorb; at 1 ms a position that whole pile costs more than drafting gains in a step, spread
    over 8 steps it does not. So a request with 40 tokens to go drafts (charged whole, it never
    would: the pile never shrinks without drafting), and one with 5 tokens to go, which would
    repay the catch-up over at most two steps, decodes plainly; both emit the target's tokens."""
    pipeline = load_pipeline(_config("tiny-eagle3"))
    prompts = [list(p.encode()) for p in PROMPTS[:2]]
    assert all(len(p) >= 32 for p in prompts)
    table = SPS.model_copy(update={"draft_catch_up": 2, "catch_up_seconds": [1e-3, 1e-3]})
    plain = load_pipeline(_config("tiny-eagle3"), use_drafter=False).decoder_for(2, FULL)
    for n, drafts in ((40, True), (5, False)):
        decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive", probe_every=0), slots=2,
                           table=table)
        tokens = [r.token_ids for r in decoder.generate_batch([Request(p, n) for p in prompts])]
        assert (decoder.offered_drafts > 0) == drafts, n
        assert tokens == [r.token_ids for r in plain.generate_batch([Request(p, n) for p in prompts])]


def test_probes_switch_drafting_on_where_the_prior_says_it_cannot_pay():
    """A prior that says almost nothing is accepted keeps adaptive from ever drafting, though the
    batch's requests are easy ones; probing learns their acceptance from the verdicts and drafting
    switches on (and the tokens stay the target's)."""
    pipeline = load_pipeline(_config("tiny-dflash"))
    prompts = [list(p.encode()) for p in load_prompts("math")[:4]]
    pessimist = [0.02] * pipeline.drafter.num_draft_tokens

    def run(probe_every: int):
        schedule = ScheduleConfig(mode="adaptive", probe_every=probe_every)
        decoder = SpeculativeDecoder(pipeline.target, pipeline.drafter, pipeline.end_ids,
                                     pipeline.verifier, schedule, SPS, 4, 512, acceptance_prior=pessimist)
        return decoder, [r.token_ids for r in decoder.generate_batch([Request(p, 80) for p in prompts])]

    never, tokens_never = run(0)
    probing, tokens = run(8)
    assert sum(n for k, n in never.draft_len_counts.items() if k) == 0
    drafting_steps = sum(n for k, n in probing.draft_len_counts.items() if k)
    assert probing.num_probes >= 1 and drafting_steps > probing.num_probes
    assert tokens == tokens_never


def test_adaptive_admits_the_rows_that_pay():
    """Rows whose acceptance history is poor decode plainly beside rows that draft, in one step."""
    pipeline = load_pipeline(_config("tiny-dflash"))
    # verification dearer than on SPS: a row's drafts must be worth their tokens
    table = SPS.model_copy(update={"steps_per_s": [100.0, 80.0, 60.0, 40.0, 20.0]})
    schedule = ScheduleConfig(mode="adaptive", probe_every=0)
    decoder = _decoder(pipeline, schedule=schedule, slots=4, table=table)
    for p in PROMPTS[:4]:
        decoder.add(Request(list(p.encode()), 60))
    decoder.step()  # prefill
    lives = list(decoder.lives.values())
    for lv in lives[:2]:  # two requests that have been rejecting everything lately
        for _ in range(10):
            lv.acceptance.observe(15, 0)
    drafted = {lv.slot: lv.result.num_drafted for lv in lives}
    decoder.step()
    assert [lv.result.num_drafted > drafted[lv.slot] for lv in lives] == [False, False, True, True]


def test_adaptive_dspark_drafts_whole_blocks_and_lets_algorithm_1_cut():
    """A drafter with confidences drafts its whole block whenever drafting pays (one pass costs the
    same at any k); the verified prefix of each row is Algorithm 1's, from this step's confidences."""
    pipeline = load_pipeline(_config("tiny-dspark"))
    k_max = pipeline.drafter.num_draft_tokens
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive"), slots=4, table=SPS)
    for p in PROMPTS[:4]:
        decoder.add(Request(list(p.encode()), 200))  # budgets stay above k_max for these steps
    for _ in range(6):
        decoder.step()
    assert pipeline.drafter.has_confidence
    assert set(decoder.draft_len_counts) <= {0, k_max} and decoder.draft_len_counts.get(k_max), \
        decoder.draft_len_counts
    prompts = [list(p.encode()) for p in PROMPTS[4:8]]
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive"), slots=4, table=SPS)
    got = decoder.generate_batch([Request(p, 40) for p in prompts])
    alone = _decoder(pipeline, schedule=FULL, slots=4).generate_batch([Request(p, 40) for p in prompts])
    assert [r.token_ids for r in got] == [r.token_ids for r in alone]


def test_end_id_and_min_tokens():
    """A request's own end id stops it; min_new_tokens removes the end id from p until then."""
    pipeline = load_pipeline(_config("tiny-dflash"))
    decoder = _decoder(pipeline, slots=2)
    prompt, newline = list(b"Q: 482 + 356\nA:"), ord("\n")
    full = decoder.generate_batch([Request(prompt, 60)])[0].token_ids
    cut = decoder.generate_batch([Request(prompt, 60, end_id=newline)])[0].token_ids
    m = full.index(newline)
    assert cut == full[: m + 1]
    longer = decoder.generate_batch([Request(prompt, 60, min_new_tokens=m + 3, end_id=newline)])[0].token_ids
    assert longer[:m] == full[:m] and newline not in longer[: m + 3]
    with torch.no_grad():
        logits = pipeline.target.model(torch.tensor([prompt + full[:m]])).logits[0, -1]
    logits[newline] = float("-inf")
    assert longer[m] == int(logits.argmax())


@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=12, topk=2)], ids=["chains", "trees"])
def test_every_end_id_ends_a_request_as_generate_does(tree):
    """With several end ids (generation_config.json's list), a request ends at the first of any of
    them, and min_new_tokens holds back all of them: what transformers' `generate` gives with the
    same `eos_token_id` list, for DFlash's long accepted blocks and for trees."""
    pipeline = load_pipeline(_config("tiny-dflash"))
    model = pipeline.target.model
    prompts = [list(p.encode()) for p in PROMPTS[:3]]
    free = SpeculativeDecoder(pipeline.target, pipeline.drafter, (), pipeline.verifier, FULL, None, 3, 512,
                              tree=tree).generate_batch([Request(p, 60) for p in prompts])
    # two ends each request meets: its 12th and 20th tokens' first uses, whichever comes first
    ends = [(out.token_ids[11], out.token_ids[19]) for out in free]
    for prompt, out, pair in zip(prompts, free, ends, strict=True):
        decoder = SpeculativeDecoder(pipeline.target, pipeline.drafter, pair, pipeline.verifier, FULL, None,
                                     1, 512, tree=tree)
        first = min(out.token_ids.index(t) for t in pair)
        got = decoder.generate_batch([Request(prompt, 60), Request(prompt, 60, min_new_tokens=first + 4)])
        assert got[0].token_ids == out.token_ids[: first + 1]
        assert not set(pair) & set(got[1].token_ids[: first + 4])
        for result, at_least in zip(got, (0, first + 4), strict=True):
            ids = torch.tensor([prompt])
            want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=60, min_new_tokens=at_least, eos_token_id=list(pair),
                                  pad_token_id=pair[0])
            assert result.token_ids == want[0, len(prompt):].tolist()


def test_bad_requests_are_named():
    pipeline = load_pipeline(_config("tiny-dflash"))
    decoder = _decoder(pipeline, slots=2)
    with pytest.raises(ValueError, match="request 1: prompt is empty"):
        decoder.generate_batch([Request([1, 2], 4), Request([], 4)])
    with pytest.raises(ValueError, match=r"prompt of 500 tokens \+ max_tokens 20 = 520 tokens exceeds this "
                                         r"deployment's context of 512"):
        decoder.add(Request([65] * 500, 20))
    # every token an end before min_new_tokens: the ban left no token (NaN probabilities when sampled,
    # which failed every request in the step; greedy emitted token 0 and ended at once)
    vocab = pipeline.target.vocab_size
    for sampling in (SamplingParams(), SamplingParams(temperature=1.0, seed=3)):
        everything = Request([65, 66], 8, sampling, min_new_tokens=4, stop_ids=tuple(range(vocab)))
        with pytest.raises(ValueError, match=f"min_tokens 4 cannot be met: the end ids and stop ids cover "
                                             f"all {vocab} tokens of the vocabulary"):
            decoder.add(everything)
        all_but_one = dataclasses.replace(everything, stop_ids=tuple(range(1, vocab)))
        assert decoder.generate_batch([all_but_one])[0].token_ids[:4] == [0, 0, 0, 0]  # the one id left
    with pytest.raises(ValueError, match="SPS table"):
        _decoder(pipeline, schedule=ScheduleConfig(mode="scheduler"))


def test_cuda_device_without_a_gpu_is_one_line_naming_the_field():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    config = _config("tiny-dflash")
    config = config.model_copy(update={"target": config.target.model_copy(update={"device": "cuda"})})
    with pytest.raises(ConfigError, match=r"^target.device is 'cuda' but this machine has no CUDA GPU"):
        load_pipeline(config)


@pytest.mark.parametrize("schedule,tree", [(FULL, None), (ScheduleConfig(mode="adaptive"), None),
                                           (FULL, TreeConfig(nodes=12, topk=3))],
                         ids=["full", "adaptive", "tree"])
def test_target_steps_padded_for_cuda_graphs_decode_the_same(pipeline, alone, schedule, tree):
    """cuda_graphs: the target's decode steps, a draft model's and EAGLE-3's chain steps and a
    DFlash/DSpark block forward padded to static shapes (what a CUDA graph replays; eagerly here) decode every
    request's one-request tokens, with requests joining as others leave (their prefill steps run
    packed) and, adaptive, rows of different chain lengths and rows that do not draft; with draft
    trees, the target's tree verification and EAGLE-3's and a draft model's tree steps padded too;
    and a graph would capture every padded step and replay it faithfully (`CaptureAudit`)."""
    if not isinstance(pipeline.target, TargetModel):
        pytest.skip("engine flavour: its target is onnxruntime sessions")
    target = TargetModel(pipeline.target.model, pipeline.target.tap_layer_ids, cuda_graphs=True)
    drafter = pipeline.drafter
    if drafter.method == "draft_model":  # its chain steps padded too
        drafter = DraftModelDrafter(drafter.lm.model, drafter.num_draft_tokens, cuda_graphs=True)
    elif drafter.method in ("dflash", "dspark", "eagle3"):  # its block forwards / chain steps too
        drafter = copy.copy(drafter)
        drafter.cuda_graphs = True
    decoder = SpeculativeDecoder(target, drafter, pipeline.end_ids, pipeline.verifier,
                                 schedule, SPS, 3, 512, tree=tree)
    with CaptureAudit() as audit:  # each padded step run as a CUDA graph's capture and replays would
        got = decoder.generate_batch([Request(list(p.encode()), 40) for p in PROMPTS[2:6]])
    assert [r.token_ids for r in got] == alone[40][2:6]
    assert audit.problems == [] and audit.replays > audit.captures > 0
    assert 0 < decoder.target.graphed.num_steps < decoder.num_steps
    assert any(trees for *_, trees in decoder.target.graphed.graphs) == (tree is not None)
    if drafter.method == "draft_model":
        assert decoder.drafter.lm.graphed.num_steps > decoder.num_steps
    else:  # every block forward, catch-up and chain step padded
        assert decoder.drafter.graphed.num_steps == decoder.drafter.num_forwards > 0
    if drafter.method in ("dflash", "dspark"):  # and its context projections, but the prompts'
        assert decoder.drafter.projections.num_steps > 0


def test_requests_joining_mid_flight_identical_to_alone(pipeline, alone):
    """Continuous batching: requests added while others run (their prefill packed into the same
    forward as the others' verification) still get exactly the one-request tokens; a request
    whose callback asks to stop ends there, a cancelled one frees its slot."""
    decoder = _decoder(pipeline, slots=5)
    prompts = PROMPTS[:5]
    streamed: dict[int, list[int]] = {}
    ids, results = [], {}
    for step in range(200):
        if step in (0, 1, 3):  # joins at steps 0, 1 and 3, one each
            i = len(ids)

            def on_tokens(emitted, i=i):
                streamed.setdefault(i, []).extend(emitted.ids)
            ids.append(decoder.add(Request(list(prompts[i].encode()), 40), on_tokens))
        if step == 4:  # a request that stops itself after 7 tokens, and one cancelled later
            def stop_after_7(emitted):
                got = streamed.setdefault(3, [])
                got.extend(emitted.ids)
                return len(got) >= 7
            ids.append(decoder.add(Request(list(prompts[3].encode()), 40), stop_after_7))
            cancelled = decoder.add(Request(list(prompts[4].encode()), 40))
        if step == 6:
            decoder.cancel(cancelled)
        results.update(decoder.step())
        if step > 6 and not decoder.num_running:
            break
    assert decoder.num_running == 0 and cancelled not in results
    for i in range(3):
        assert results[ids[i]].token_ids == alone[40][i] == streamed[i]
    stopped = results[ids[3]].token_ids
    assert 7 <= len(stopped) < 40 and stopped == alone[40][3][: len(stopped)]
    assert not decoder.target.lengths  # every slot freed


def _two_then_two(pipeline, prompts: list[list[int]], chunk: int | None):
    """Requests 0 and 1 join at step 0, 2 and 3 together at step 2. Returns the results by request,
    the prompt tokens of requests 2 and 3 in the target's cache after each step, and per step the
    requests that were decoding before it and those it emitted tokens for."""
    decoder = _decoder(pipeline, slots=4, prefill_chunk=chunk)
    rids, results, fed, decoded, emitted = [], {}, [[0, 0]], [], set()

    def prompt_in(n: int) -> int:
        if n >= len(rids):
            return 0
        live = decoder.lives.get(rids[n])
        return live.prefill.fed if live is not None and live.prefill else len(prompts[n])

    for step in range(300):
        for n in {0: (0, 1), 2: (2, 3)}.get(step, ()):
            rids.append(decoder.add(Request(prompts[n], 40), lambda e, n=n: emitted.add(n)))
        emitted.clear()
        running = {n for n, rid in enumerate(rids) if rid in decoder.lives
                   and prompt_in(n) == len(prompts[n])}
        results.update(decoder.step())
        decoded.append((running, set(emitted)))
        fed.append([prompt_in(2), prompt_in(3)])
        if len(results) == len(prompts):
            break
    return [results[rid] for rid in rids], fed, decoded


def test_long_prompts_are_prefilled_in_pieces_while_the_others_decode(pipeline, alone):
    """Chunked prefill: with `prefill_chunk` 32, two prompts of 117 and 110 tokens joining two
    running requests are fed at most 32 prompt tokens per step, the first whole before the second
    starts (arrival order), and the running requests emit tokens in every one of those steps (fed
    whole, one step fed all 227 and the others waited for it). Every request decodes exactly what
    it decodes alone, with the drafts it gets when its prompt is fed whole (the drafter's context
    taps are the whole prompt's)."""
    assert pipeline.decoder_for(1, FULL).prefill_chunk == 512  # limits.prefill_chunk's default reaches it
    order = (8, 9, 0, 1)  # two chat prompts decoding, then two long code prompts joining together
    prompts = [list(PROMPTS[i].encode()) for i in order]
    chunked, fed, decoded = _two_then_two(pipeline, prompts, 32)
    whole, whole_fed, _ = _two_then_two(pipeline, prompts, None)
    for result, other, i in zip(chunked, whole, order, strict=True):
        assert result.token_ids == other.token_ids == alone[40][i]
        assert result.accept_counts == other.accept_counts
    assert whole_fed[3] == [117, 110]  # fed whole: both in the step they joined
    steps = [s for s in range(1, len(fed)) if fed[s] != fed[s - 1]]  # the steps that fed prompt tokens
    assert len(steps) == -(-227 // 32)
    for s in steps:
        assert sum(fed[s]) - sum(fed[s - 1]) <= 32
        assert fed[s][1] == 0 or fed[s][0] == 117  # the first's prompt was all in before
        running, emitted = decoded[s - 1]
        assert running and running <= emitted  # every running request decoded meanwhile


def test_bfloat16_speculation_equals_its_own_target_alone():
    """`target.dtype` / `drafter.dtype` bfloat16: batched speculation is token-identical to the
    bfloat16 target decoding alone (lossless relative to the target that verifies)."""
    config = _config("tiny-dflash")
    config = config.model_copy(update={"target": config.target.model_copy(update={"dtype": "bfloat16"}),
                                        "drafter": config.drafter.model_copy(update={"dtype": "bfloat16"})})
    spec, plain = load_pipeline(config), load_pipeline(config, use_drafter=False)
    assert spec.drafter.model.fc.weight.dtype == torch.bfloat16
    ids = [list(p.encode()) for p in PROMPTS[:2] + PROMPTS[4:6]]
    alone = [plain.decoder_for(1, FULL).generate(x, 40).token_ids for x in ids]
    got = spec.decoder_for(4, FULL).generate_batch([Request(x, 40) for x in ids])
    assert [r.token_ids for r in got] == alone
    assert sum(r.num_accepted for r in got) > 0


def _random_request(rng: random.Random) -> Request:
    """A held-out prompt cut anywhere or random printable bytes, with a random mix of what a request
    may ask: greedy, Gumbel-coupled (temperature, top-k, top-p, a 64-bit seed) or rejection sampling,
    min_tokens, its own end id, stop ids, ignore_eos, log-probabilities of its tokens and prompt."""
    if rng.random() < 0.7:
        text = rng.choice(PROMPTS + load_prompts("math")[4:])
        prompt = list(text[: rng.randint(1, len(text))].encode())
    else:
        prompt = [rng.randrange(32, 127) for _ in range(rng.randint(1, 40))]
    max_new = rng.randint(1, 40)
    kind = rng.random()
    if kind < 0.45:
        sampling = SamplingParams()
    elif kind < 0.9:
        sampling = SamplingParams(temperature=rng.choice([0.3, 0.7, 1.0, 1.5]),
                                  top_k=rng.choice([0, 1, 3, 20]), top_p=rng.choice([1.0, 0.9, 0.5]),
                                  seed=rng.getrandbits(64), coupling="gumbel")
    else:
        sampling = SamplingParams(temperature=1.0, seed=rng.getrandbits(32))
    asks = {"min_new_tokens": rng.randint(0, max_new) if rng.random() < 0.3 else 0,
            "end_id": rng.choice([10, 32, 61]) if rng.random() < 0.2 else None,
            "stop_ids": tuple(rng.sample([10, 32, 44, 46, 58, 101], rng.randint(1, 2)))
            if rng.random() < 0.3 else (),
            "ignore_eos": rng.random() < 0.1,
            "logprobs": rng.randint(0, 3) if rng.random() < 0.3 else None,
            "prompt_logprobs": rng.randint(0, 2) if rng.random() < 0.1 else None}
    return Request(prompt, max_new, sampling, **asks)


@pytest.fixture(scope="module")
def random_mix() -> list[tuple[Request, object]]:
    """12 random requests (`_random_request`, seeded), each with what the torch target alone, one
    request at a time, decodes for it: the reference every batch, drafter and flavour must equal."""
    rng = random.Random(2026)
    requests = [_random_request(rng) for _ in range(12)]
    alone = load_pipeline(_config("tiny-dflash"), use_drafter=False).decoder_for(1, FULL)
    return [(r, alone.generate_batch([r])[0]) for r in requests]


@pytest.mark.parametrize(("tree", "prefill_chunk"), [(None, None), (TreeConfig(nodes=8, topk=3), 9)],
                         ids=["chain", "tree-chunked"])
def test_random_batch_mixes_decode_what_each_request_decodes_alone(pipeline, random_mix, tree, prefill_chunk):
    """Differential: 12 random requests (`random_mix`) served 4 slots at a time under the adaptive
    schedule, joining at random steps beside others well into their outputs, one cancelled and one
    ended by its callback (their slots then reused), rejection-sampled ones beside: every greedy and
    Gumbel-coupled request's tokens, streamed and returned, and its log-probabilities are the target
    alone's (docs/SAMPLING.md). The same harness by hand (2026-12-02): 560 random batches of 1 to 13
    requests over every drafter and none, both flavours, chains and trees, every schedule, contexts
    up to 1,024 tokens (1,637 requests compared in the 420 batches counted): none differed. With trees
    the prompts are fed 9 tokens a step at most (chunked prefill): requests join, and are cancelled,
    while others' prompts are still going in."""
    rng = random.Random(f"{pipeline.config.drafter.method}-{pipeline.config.flavour}-{tree is None}")
    requests = [r for r, _ in random_mix]
    cancel_at, stop_after = {rng.randrange(12): rng.randint(0, 4)}, {rng.randrange(12): rng.randint(1, 6)}
    decoder = _decoder(pipeline, schedule=ScheduleConfig(mode="adaptive", probe_every=2), slots=4, table=SPS,
                       tree=tree, prefill_chunk=prefill_chunk)
    waiting, ids, results, streamed, steps = list(range(12)), {}, {}, {}, {}
    while waiting or decoder.num_running:
        while waiting and decoder.num_running < 4 and (not decoder.num_running or rng.random() < 0.5):
            i = waiting.pop(0)

            def on_tokens(emitted, i=i):
                streamed.setdefault(i, []).extend(emitted.ids)
                return i in stop_after and len(streamed[i]) >= stop_after[i]
            ids[i], steps[i] = decoder.add(requests[i], on_tokens), 0
        for i, at in cancel_at.items():
            if i in steps and steps[i] == at:
                decoder.cancel(ids[i])
        results.update(decoder.step())
        steps = {i: n + 1 for i, n in steps.items()}
    assert not decoder.target.lengths  # every slot freed
    compared = 0
    for i, request in enumerate(requests):
        if ids[i] not in results or (request.sampling.temperature and not request.sampling.gumbel):
            continue  # cancelled, or rejection sampled: its law is tested, not its tokens
        got, want = results[ids[i]], random_mix[i][1]
        n = len(got.token_ids) if i in stop_after else len(want.token_ids)
        assert got.token_ids == want.token_ids[:n] == streamed[i], (i, request)
        if request.logprobs is not None:
            torch.testing.assert_close(got.logprobs.values, want.logprobs.values[:n], atol=1e-4, rtol=0)
        if request.prompt_logprobs is not None:
            torch.testing.assert_close(got.prompt_logprobs.values, want.prompt_logprobs.values, atol=1e-4,
                                       rtol=0)
        compared += 1
    assert compared >= 6


def test_adaptive_prices_the_prompt_pieces_its_step_feeds():
    """A step that prefills a piece of a new prompt costs more whatever k is, so drafting pays more
    easily in it. The adaptive choice priced every step as a decode step: two running requests at
    acceptance 0.3 on a CPU-like machine (`test_schedule.LINEAR`) stayed plain while a 300-token
    prompt went in, 64 tokens a step, where drafting gives 20 % more tokens per second."""
    from .test_schedule import LINEAR

    pipeline = load_pipeline(_config("tiny-dflash"))
    hard = [0.3] * pipeline.drafter.num_draft_tokens
    drafted = {}
    for joins in (False, True):
        decoder = SpeculativeDecoder(pipeline.target, pipeline.drafter, pipeline.end_ids, pipeline.verifier,
                                     ScheduleConfig(mode="adaptive", probe_every=0), LINEAR, 3, 512,
                                     acceptance_prior=hard, prefill_chunk=64)
        for p in PROMPTS[:2]:
            decoder.add(Request(list(p.encode())[:30], 8))  # 60 tokens: one step
        decoder.step()  # both prompts in, one token each
        if joins:
            decoder.add(Request(list(("x" * 300).encode()), 8))
        decoder.step()  # the two decode, beside the new prompt's first 64 tokens when it joins
        drafted[joins] = decoder.offered_drafts
    assert drafted[False] == 0 < drafted[True]
