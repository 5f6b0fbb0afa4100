"""Log-probabilities of the emitted tokens: the target's own, whatever the drafter proposed, in every
step shape (prefill, accepted chains, rejections, bonus tokens, trees, several requests a step)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from trtspec.config import ScheduleConfig, TreeConfig, load_build_config
from trtspec.models.graph_audit import CaptureAudit
from trtspec.models.target import TargetModel
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.spec.decoder import Request, SpeculativeDecoder
from trtspec.spec.logprobs import TokenLogprobs
from trtspec.spec.sampling import SamplingParams

from .conftest import REPO

PROMPTS = load_prompts("code")[:2] + load_prompts("math")[:2] + load_prompts("chat")[:2]
FULL = ScheduleConfig(mode="full")


def _config(name: str, flavour: str = "torch"):
    config = load_build_config(REPO / "build_configs" / f"{name}.yaml")
    return config.model_copy(update={"flavour": flavour})


@pytest.fixture(scope="module")
def model():
    """The target itself, in transformers: the reference."""
    return load_pipeline(_config("tiny-dflash"), use_drafter=False).target.model


def _reference(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """log_softmax of the target's logits at the positions that predict `generated` [n, V]."""
    ids = torch.tensor([prompt + generated])
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1)


def _requests(top: int) -> list[Request]:
    """Greedy and seeded sampled rows, one with min_tokens (its ban must not show in log p), one
    without log-probabilities beside them."""
    out = []
    for i, prompt in enumerate(PROMPTS):
        sampling = SamplingParams() if i % 2 == 0 else SamplingParams(temperature=0.8, top_k=20, seed=100 + i)
        out.append(Request(list(prompt.encode()), 24 + 4 * i, sampling, min_new_tokens=8 if i == 1 else 0,
                           logprobs=top))
    out.append(Request(list(PROMPTS[0].encode()), 16))
    return out


def _check(model, request: Request, got: TokenLogprobs, generated: list[int], atol: float) -> None:
    want = _reference(model, request.prompt, generated)  # [n, V]
    assert len(got) == len(generated) and got.top == request.logprobs
    chosen = want.gather(1, torch.tensor(generated)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(got.values), chosen, atol=atol, rtol=0)
    if request.logprobs:
        best = want.topk(request.logprobs, -1)
        torch.testing.assert_close(torch.tensor(got.top_values), best.values, atol=atol, rtol=0)
        # ids agree wherever two candidates are not tied within the tolerance
        for row, ids, values in zip(best.indices.tolist(), got.top_ids, best.values.tolist(), strict=True):
            for j, (a, b) in enumerate(zip(row, ids, strict=True)):
                tied = any(abs(values[j] - v) <= atol for k, v in enumerate(values) if k != j)
                assert a == b or tied


CASES = [("tiny-dflash", None), ("tiny-dflash", TreeConfig(nodes=12, topk=2)), ("tiny-dspark", None),
         ("tiny-eagle3", TreeConfig(nodes=10, topk=2)), ("tiny-draft-model", None),
         ("tiny-dflash@engine", None), ("tiny-dflash@graphs", None),
         ("tiny-dflash@graphs", TreeConfig(nodes=12))]


@pytest.mark.parametrize("name,tree", CASES)
def test_logprobs_are_the_targets_own_in_every_step(model, name, tree):
    """Six requests at once (three more than slots), every emitted token's log p and top-3 equal
    log_softmax(model(prompt + output)) at its position; the streamed pieces add up to the result.
    `graphs`: steps padded as CUDA graphs replay them, under the capture audit (log p is read
    from the step's own output before the next step overwrites it)."""
    name, _, flavour = name.partition("@")
    pipeline = load_pipeline(_config(name, "engine" if flavour == "engine" else "torch"))
    target, drafter, audit = pipeline.target, pipeline.drafter, contextlib.nullcontext()
    if flavour == "graphs":
        target = TargetModel(target.model, target.tap_layer_ids, cuda_graphs=True)
        drafter = copy.copy(drafter)
        drafter.cuda_graphs = True
        audit = CaptureAudit()
    decoder = SpeculativeDecoder(target, drafter, pipeline.end_ids, pipeline.verifier, FULL, None, 4, 512,
                                 tree=tree)
    requests = _requests(top=3)
    streamed: dict[int, TokenLogprobs] = {}
    waiting, ids, results = list(enumerate(requests)), {}, {}
    with audit:
        while waiting or decoder.num_running:
            while waiting and decoder.num_running < 4:
                i, request = waiting.pop(0)

                def on_tokens(emitted, i=i):
                    logprobs = emitted.logprobs
                    assert (logprobs is None) == (requests[i].logprobs is None)
                    if logprobs is not None:
                        assert len(logprobs) == len(emitted.ids)
                        streamed.setdefault(i, TokenLogprobs(requests[i].logprobs)).extend(logprobs)
                ids[decoder.add(request, on_tokens)] = i
            results.update({ids[rid]: out for rid, out in decoder.step().items()})
    if flavour == "graphs":
        assert audit.problems == [] and audit.replays > audit.captures > 0
    drafted = sum(results[i].num_accepted for i in results)
    assert drafted > 0, "the drafter must have had tokens accepted for this test to mean anything"
    atol = 1e-3 if flavour == "engine" else 1e-4
    for i, request in enumerate(requests):
        result = results[i]
        if request.logprobs is None:
            assert result.logprobs is None and i not in streamed
            continue
        _check(model, request, result.logprobs, result.token_ids, atol)
        assert streamed[i] == result.logprobs


def test_logprobs_of_zero_alternatives_and_a_short_request(model):
    """top 0: the emitted tokens' log p only; a request of one token: the prefill's."""
    pipeline = load_pipeline(_config("tiny-dflash"))
    decoder = pipeline.decoder_for(2, FULL)
    requests = [Request(list(PROMPTS[2].encode()), 30, logprobs=0), Request(list(PROMPTS[3].encode()), 1,
                                                                          logprobs=5)]
    for request, result in zip(requests, decoder.generate_batch(requests), strict=True):
        assert result.logprobs.top_ids == [[] for _ in result.token_ids] or request.logprobs
        _check(model, request, result.logprobs, result.token_ids, 1e-4)


def test_ignore_eos_runs_past_the_end_ids_and_stop_ids_still_end():
    """ignore_eos: the end ids (the decoder's, or end_id) do not end a request, so it runs to
    max_tokens exactly as the target continues; stop_ids still end it."""
    pipeline = load_pipeline(_config("tiny-dflash"))
    prompt = list(PROMPTS[1].encode())
    free = SpeculativeDecoder(pipeline.target, pipeline.drafter, (), pipeline.verifier, FULL, None, 2,
                              512).generate_batch([Request(prompt, 50)])[0].token_ids
    end = free[9]  # the id the request first meets at or before its 10th token
    first = free.index(end)
    decoder = SpeculativeDecoder(pipeline.target, pipeline.drafter, (end,), pipeline.verifier, FULL, None, 3,
                                 512)
    ended, ignored, stopped = decoder.generate_batch([
        Request(prompt, 50), Request(prompt, 50, ignore_eos=True),
        Request(prompt, 50, ignore_eos=True, stop_ids=(free[30],))])
    assert ended.token_ids == free[: first + 1]
    assert ignored.token_ids == free
    assert stopped.token_ids == free[: free.index(free[30]) + 1]


@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=12, topk=2)], ids=["chains", "trees"])
def test_logprobs_show_the_raw_distribution_under_min_tokens(model, tree):
    """Where min_tokens bans the end id the target likes best, the emitted token is another, and
    the log-probabilities still show the target's raw p, the end id on top (vLLM's raw_logprobs)."""
    pipeline = load_pipeline(_config("tiny-dflash"))
    prompt = list(PROMPTS[4].encode())
    free = SpeculativeDecoder(pipeline.target, pipeline.drafter, (), pipeline.verifier, FULL, None, 1, 512,
                              tree=tree).generate_batch([Request(prompt, 30)])[0].token_ids
    end = free[5]
    first = free.index(end)  # the first position where greedy decoding would emit it
    decoder = SpeculativeDecoder(pipeline.target, pipeline.drafter, (end,), pipeline.verifier, FULL, None, 1,
                                 512, tree=tree)
    request = Request(prompt, 30, min_new_tokens=first + 3, logprobs=2)
    result = decoder.generate_batch([request])[0]
    assert result.token_ids[first] != end and result.logprobs.top_ids[first][0] == end
    _check(model, request, result.logprobs, result.token_ids, 1e-4)


@pytest.mark.parametrize("chunk", [512, 7], ids=["whole", "pieces"])
@pytest.mark.parametrize("flavour", ["torch", "engine"])
def test_prompt_logprobs_come_with_the_first_token_and_change_nothing_else(model, flavour, chunk):
    """prompt_logprobs: the prompt's tokens after its first, log_softmax(model(prompt)) at positions
    0..P-2, handed over with the first token; requests prefilled in the same step as others decode
    (two join mid-flight) get theirs, and every request's tokens are those it gets without. With
    `prompt_logprobs_chunk` 7 every prompt but the one-token one is fed in pieces of 7, one a step (no
    forward scores more): the same values, each piece counted as a target call, and DFlash's context
    taps are whole (the same tokens)."""
    pipeline = load_pipeline(_config("tiny-dflash", flavour))
    decoder = SpeculativeDecoder(pipeline.target, pipeline.drafter, pipeline.end_ids, pipeline.verifier,
                                 FULL, None, 5, 512, prompt_logprobs_chunk=chunk)
    prompts = [list(p.encode()) for p in PROMPTS[:4]] + [[65]]  # and a one-token prompt: nothing to score
    plain = decoder.generate_batch([Request(p, 20) for p in prompts])
    firsts: dict[int, list] = {}
    ids, results = {}, {}
    for step in range(200):
        for i in {0: [0, 1], 2: [2, 3, 4]}.get(step, []):  # three join while two decode
            top = None if i == 1 else i % 3

            def on_tokens(emitted, i=i):
                firsts.setdefault(i, []).append(emitted.prompt_logprobs)
            ids[decoder.add(Request(prompts[i], 20, prompt_logprobs=top), on_tokens)] = i
        results.update({ids[rid]: out for rid, out in decoder.step().items()})
        if len(results) == len(prompts):
            break
    for i, prompt in enumerate(prompts):
        assert results[i].token_ids == plain[i].token_ids
        pieces = -(-(len(prompt) - chunk) // chunk) if i != 1 and len(prompt) > chunk else 0
        assert results[i].num_target_calls == plain[i].num_target_calls + pieces  # each piece is a forward
        assert results[i].accept_counts == plain[i].accept_counts  # the same drafts: the same context
        if i == 1:
            assert results[i].prompt_logprobs is None and set(firsts[i]) == {None}
            continue
        got = results[i].prompt_logprobs
        assert firsts[i][0] is got and set(firsts[i][1:]) <= {None}
        assert got.top == i % 3 and len(got) == len(prompt) - 1
        if len(prompt) > 1:
            atol = 1e-3 if flavour == "engine" else 1e-4
            _check(model, Request(prompt[:1], 1, logprobs=i % 3), got, prompt[1:], atol)
