"""R concurrent requests in one target forward per cycle: exactly what one request alone gives."""

from __future__ import annotations

import pytest
import torch

from trtspec.config import ScheduleConfig, load_build_config
from trtspec.models.drafter import Drafter, Proposal
from trtspec.models.packed_target import Chunk, PackedSlots
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.spec.batch import BatchDecoder, Request
from trtspec.spec.sampling import SamplingParams
from trtspec.spec.schedule import SPSTable
from trtspec.triton.verify import exact_marginals

from .conftest import REPO

PROMPTS = load_prompts("code")[:4] + load_prompts("math")[:4] + load_prompts("chat")[:4]
SPS = SPSTable(batch_tokens=[1, 8, 16, 32, 64], steps_per_s=[100.0, 95.0, 80.0, 60.0, 35.0])


@pytest.fixture(scope="module", params=["tiny-dflash", "tiny-draft-model", "tiny-dflash@engine",
                                        "tiny-dspark@engine"])
def pipeline(request, tmp_path_factory):
    """Torch pipelines, and engine-flavour ones (onnxruntime graphs, `EnginePackedTarget`)."""
    name, _, flavour = request.param.partition("@")
    config = load_build_config(REPO / "build_configs" / f"{name}.yaml")
    if not flavour:
        return load_pipeline(config)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTSPEC_CACHE_DIR", str(tmp_path_factory.mktemp("engine-cache")))
        return load_pipeline(config.model_copy(update={"flavour": flavour}))


def _packed(pipeline) -> PackedSlots:
    return pipeline.packed_target()


def _batch(pipeline, drafter, schedule=None, sps=None) -> BatchDecoder:
    return BatchDecoder(_packed(pipeline), drafter, pipeline.tokenizer.eos_id, schedule, sps,
                        pipeline.decoder.verifier)


class ConfidentDrafter(Drafter):
    """A real drafter plus a made-up confidence that depends on the previous draft token, so
    the scheduler's cut moves with the drafts (the case that could break losslessness)."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.method, self.tap_layer_ids = inner.method, inner.tap_layer_ids
        self.num_draft_tokens = inner.num_draft_tokens

    def __copy__(self):
        import copy

        return ConfidentDrafter(copy.copy(self.inner))

    def begin(self, prompt, hidden):
        self.inner.begin(prompt, hidden)

    def commit(self, num_accepted, hidden):
        self.inner.commit(num_accepted, hidden)

    def propose(self, committed, k, sampling, generator):
        p = self.inner.propose(committed, k, sampling, generator)
        prev = torch.cat([torch.tensor([[committed[-1]]]), p.tokens[:, :-1]], 1)  # x_{j-1}
        confidence = torch.where(prev % 2 == 0, 0.95, 0.4)
        return Proposal(tokens=p.tokens, q_probs=p.q_probs, confidence=confidence)


def test_packed_forward_equals_one_sequence_at_a_time(pipeline):
    single, packed = pipeline.target, _packed(pipeline)
    engine = pipeline.config.flavour == "engine"
    assert type(packed).__name__ == ("EnginePackedTarget" if engine else "PackedTarget")
    ids = [list(p.encode()) for p in PROMPTS[:3]]
    outs = packed.forward([Chunk(r, torch.tensor(x)) for r, x in enumerate(ids)])
    # a draft-like step: 5 tokens each, then reject 3 of request 1 and feed it again
    step = [torch.randint(0, 256, (5,), generator=torch.Generator().manual_seed(r)) for r in range(3)]
    outs2 = packed.forward([Chunk(r, step[r]) for r in range(3)])
    packed.rewind(1, 3)
    packed.compact(min_dead_fraction=0.0)
    outs3 = packed.forward([Chunk(1, step[0][:2])])
    for r, x in enumerate(ids):
        single.reset()
        ref = single.forward(torch.tensor([x]))
        torch.testing.assert_close(outs[r].logits, ref.logits[0], atol=1e-4, rtol=1e-4)
        if single.tap_layer_ids:
            torch.testing.assert_close(outs[r].hidden, ref.hidden[0], atol=1e-4, rtol=1e-4)
        ref2 = single.forward(step[r][None])
        torch.testing.assert_close(outs2[r].logits, ref2.logits[0], atol=1e-4, rtol=1e-4)
        if r == 1:
            single.rewind(3)
            ref3 = single.forward(step[0][:2][None])
            torch.testing.assert_close(outs3[0].logits, ref3.logits[0], atol=1e-4, rtol=1e-4)
    assert packed.seq_len(1) == len(ids[1]) + 4


def test_batched_greedy_identical_to_target_alone(pipeline):
    """Groups of 1 and 5 requests with unequal budgets: with and without the drafter, every
    request's tokens equal the one-request loop's (itself tested against the target alone)."""
    max_new = [60 + 23 * (i % 3) for i in range(len(PROMPTS))]
    alone = [pipeline.decoder.generate(list(p.encode()), n).token_ids for p, n in zip(PROMPTS, max_new,
                                                                                     strict=True)]
    plain, spec = _batch(pipeline, None), _batch(pipeline, pipeline.drafter)
    cycles = tokens = 0
    for start, size in [(0, 1), (1, 5), (6, 5), (11, 1)]:
        reqs = [Request(list(p.encode()), n) for p, n in zip(PROMPTS[start : start + size],
                                                              max_new[start : start + size], strict=True)]
        got = spec.generate(reqs)
        assert [r.token_ids for r in got] == alone[start : start + size]
        assert [r.token_ids for r in plain.generate(reqs)] == alone[start : start + size]
        cycles, tokens = cycles + spec.num_cycles, tokens + sum(len(r.token_ids) for r in got)
    assert cycles < tokens / 1.5  # speculation, not one token per cycle


@pytest.mark.parametrize("mode", ["scheduler", "threshold"])
def test_scheduled_batched_greedy_identical(pipeline, mode):
    drafter = ConfidentDrafter(pipeline.drafter)
    spec = _batch(pipeline, drafter, ScheduleConfig(mode=mode, threshold=0.5), SPS)
    reqs = [Request(list(p.encode()), 70) for p in PROMPTS[:6]]
    got = spec.generate(reqs)
    assert 0 < spec.admitted_drafts < spec.offered_drafts  # the cut really shortened blocks
    for req, res in zip(reqs, got, strict=True):
        assert res.token_ids == pipeline.decoder.generate(req.prompt, 70).token_ids


def test_scheduled_batched_sampling_follows_target():
    pipeline = load_pipeline(load_build_config(REPO / "build_configs" / "tiny-dflash.yaml"))
    model = pipeline.target.model
    prompt, steps, n, batch = list(b"Q: 12 + 34\nA:"), 4, 2000, 50
    sampling = SamplingParams(temperature=1.0, top_k=3)
    laws = exact_marginals(model, prompt, sampling, steps)
    spec = _batch(pipeline, ConfidentDrafter(pipeline.drafter), ScheduleConfig(mode="scheduler"), SPS)
    counts = [dict() for _ in range(steps)]
    accepted = drafted = 0
    for start in range(0, n, batch):
        reqs = [Request(prompt, steps, sampling.model_copy(update={"seed": s}))
                for s in range(start, start + batch)]
        for res in spec.generate(reqs):
            accepted, drafted = accepted + res.num_accepted, drafted + res.num_drafted
            for pos, tok in enumerate(res.token_ids):
                counts[pos][tok] = counts[pos].get(tok, 0) + 1
    assert 0 < accepted < drafted
    for pos in range(steps):
        support = set(laws[pos]) | set(counts[pos])
        tv = 0.5 * sum(abs(counts[pos].get(t, 0) / n - laws[pos].get(t, 0.0)) for t in support)
        assert tv < 0.06, (pos, tv)


def test_bad_requests_are_named():
    pipeline = load_pipeline(load_build_config(REPO / "build_configs" / "tiny-dflash.yaml"))
    spec = BatchDecoder(_packed(pipeline), pipeline.drafter, pipeline.tokenizer.eos_id)
    with pytest.raises(ValueError, match="request 1: prompt is empty"):
        spec.generate([Request([1, 2], 4), Request([], 4)])
    with pytest.raises(ValueError, match="SPS table"):
        BatchDecoder(_packed(pipeline), pipeline.drafter, 0, ScheduleConfig(mode="scheduler"))


def test_requests_joining_mid_flight_identical_to_alone(pipeline):
    """Continuous batching: requests added while others run (their prefill packed into the same
    forward as the others' verification) still get exactly the one-request tokens; a request
    whose callback asks to stop ends there, a cancelled one frees its slots."""
    decoder = _batch(pipeline, pipeline.drafter)
    prompts = PROMPTS[:5]
    alone = [pipeline.decoder.generate(list(p.encode()), 50).token_ids for p in prompts]
    streamed: dict[int, list[int]] = {}
    ids, results = [], {}
    for step in range(200):
        if step in (0, 1, 3):  # joins at steps 0, 1 and 3, one each
            i = len(ids)

            def on_tokens(new, i=i):
                streamed.setdefault(i, []).extend(new)
            ids.append(decoder.add(Request(list(prompts[i].encode()), 50), on_tokens))
        if step == 4:  # a request that stops itself after 7 tokens, and one cancelled later
            def stop_after_7(new):
                got = streamed.setdefault(3, [])
                got.extend(new)
                return len(got) >= 7
            ids.append(decoder.add(Request(list(prompts[3].encode()), 50), stop_after_7))
            cancelled = decoder.add(Request(list(prompts[4].encode()), 50))
        if step == 6:
            decoder.cancel(cancelled)
        results.update(decoder.step())
        if step > 6 and not decoder.num_running:
            break
    assert decoder.num_running == 0 and cancelled not in results
    for i in range(3):
        assert results[ids[i]].token_ids == alone[i] == streamed[i]
    stopped = results[ids[3]].token_ids
    assert 7 <= len(stopped) < 50 and stopped == alone[3][: len(stopped)]
    assert not (decoder.target.owner >= 0).any()  # every slot freed


def test_end_id_and_min_new_tokens():
    """A request's own end id (here the newline byte) ends it at its first occurrence, unless
    that comes before `min_new_tokens`: then it is emitted like any token and decoding goes on.
    Tokens are the unconstrained greedy decoding's, cut where the rule says."""
    pipeline = load_pipeline(load_build_config(REPO / "build_configs" / "tiny-dflash.yaml"))
    decoder = _batch(pipeline, pipeline.drafter)
    prompt = list(b"Q: 482 + 356\nA:")
    free = decoder.generate([Request(prompt, 60)])[0].token_ids
    newline = ord("\n")
    first = free.index(newline) + 1
    second = free.index(newline, first) + 1
    cut, later, unbounded = decoder.generate([
        Request(prompt, 60, end_id=newline),
        Request(prompt, 60, end_id=newline, min_new_tokens=first + 1),
        Request(prompt, 60, end_id=newline, min_new_tokens=first),
    ])
    assert cut.token_ids == free[:first]
    assert later.token_ids == free[:second]
    assert unbounded.token_ids == free[:first]  # an end id AT position min_new_tokens counts
    with pytest.raises(ValueError, match=r"min_new_tokens must be in \[0, max_new_tokens=4\], got 5"):
        decoder.generate([Request(prompt, 4, min_new_tokens=5)])
