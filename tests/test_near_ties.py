"""Greedy losslessness at reduced precision (`trtspec.spec.near_ties`): in bfloat16 speculation may
part from plain decoding, only at near-ties of the target's two best tokens; a token off the argmax
by more than the target's rounding fails the audit in any dtype."""

from __future__ import annotations

import random

import pytest
import torch

from trtspec.bench.loop_overhead import tiny_pipeline
from trtspec.config import ScheduleConfig
from trtspec.models.target import Chunk
from trtspec.prompts import load_prompts
from trtspec.spec.near_ties import (
    MISMATCH,
    NEAR_TIE,
    GreedyAudit,
    GreedyJudge,
    audit_greedy,
    parted_by_length,
    shared_prefix,
)
from trtspec.triton.verify import Certificate, GreedyCheck

CPU = torch.device("cpu")
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def bf16():
    return (tiny_pipeline(CPU, dtype="bfloat16", cuda_graphs=False),
            tiny_pipeline(CPU, use_drafter=False, dtype="bfloat16", cuda_graphs=False))


def test_bfloat16_speculation_parts_from_plain_decoding_only_at_near_ties(bf16):
    spec, plain = bf16
    prompts = [spec.tokenizer.encode(load_prompts("math")[i]) for i in (0, 4, 7)]
    auditor = tiny_pipeline(CPU, use_drafter=False, dtype="bfloat16", cuda_graphs=False).decoder.target
    decoder = spec.decoder_for(1, ScheduleConfig(mode="full"))  # whole blocks: 16-token verify steps
    parted = 0
    for ids in prompts:
        alone = plain.decoder.generate(ids, MAX_TOKENS).token_ids
        drafted = decoder.generate(ids, MAX_TOKENS).token_ids
        if drafted == alone:
            continue
        parted += 1
        for output in (drafted, alone):  # both are greedy up to the target's rounding
            audit = audit_greedy(auditor, ids, output)
            assert audit.near_ties_only, audit.describe()
            assert 0 < audit.noise < 0.5 and audit.dtype == "bfloat16"
    # on this CPU's bfloat16 kernels prompts 4 and 7 part (at tokens 32 and 43 when written); none
    # parting would leave the near-tie branch above untested
    assert parted >= 1


def test_the_judge_leaves_the_reference_s_own_tokens_to_it():
    """Where an output equals its reference (the target alone's decoding) the tokens are the target's
    by definition; only those from where they part are judged. In bfloat16 plain decoding's one-token
    steps at times round apart from the audit's one forward by more than the chunked pass measures,
    and a served text that parted from such a reference only at a later near-tie was judged a
    mismatch for a token the reference itself chose (the randomized batch harness met it: token 34
    0.90 off, beyond 2 × the measured 0.42, the parting at token 144 a 0.013 near-tie). Here the
    reference's own token is made off the argmax by hand, in float32: deterministic."""
    plain = tiny_pipeline(CPU, use_drafter=False, dtype="float32", cuda_graphs=False)
    ids = plain.tokenizer.encode(load_prompts("code")[3])
    greedy = plain.decoder.generate(ids, 8).token_ids
    with torch.inference_mode():
        logits = plain.target.model(torch.tensor([ids + greedy[:5]])).logits[0, -1]  # [V]
    off = int(logits.topk(4).indices[-1])  # a token clearly off the argmax at position 5
    head = greedy[:5] + [off]
    output = head + plain.decoder.generate(ids + head, 24).token_ids  # greedy after it
    reference = output[:-1] + [(output[-1] + 1) % plain.target.vocab_size]  # parts at the last token
    judge = GreedyJudge(plain.config.target, plain.target)
    assert not judge.audit(ids, output).near_ties_only  # position 5 is off the argmax
    assert judge(ids, output, reference) == NEAR_TIE  # the output's own last token is the argmax
    assert judge.audit(ids, output, start=len(output) - 1).off_argmax == []


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_token_off_the_argmax_fails_the_audit(dtype):
    plain = tiny_pipeline(CPU, use_drafter=False, dtype=dtype, cuda_graphs=False)
    target = tiny_pipeline(CPU, use_drafter=False, dtype=dtype, cuda_graphs=False).decoder.target
    rng = random.Random(17)
    ids = plain.tokenizer.encode(rng.choice(load_prompts("code")))
    output = plain.decoder.generate(ids, 64).token_ids
    clean = audit_greedy(target, ids, output)
    assert clean.near_ties_only and clean.first_wrong is None
    # the runner-up at a random position where it trails the best by a clear margin
    target.allocate(1, len(ids) + len(output))
    logits = target.forward([Chunk(0, torch.tensor(ids + output[:-1]))]).logits[len(ids) - 1:]  # [n, V]
    top2 = logits.topk(2, -1)
    clear = [j for j in range(len(output)) if top2.values[j, 0] - top2.values[j, 1] > 0.5]
    j = rng.choice(clear)
    wrong = output[:j] + [int(top2.indices[j, 1])] + output[j + 1:]
    audit = audit_greedy(target, ids, wrong)
    assert not audit.near_ties_only and audit.first_wrong == j
    assert f"token {j} is off the target's argmax" in audit.describe()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_audit_holds_a_coupled_text_to_its_seeds_scores(dtype):
    """Gumbel-coupled sampling is greedy decoding of log p + g(seed, position): its text passes the
    audit under its own sampling parameters, and fails as greedy, under another seed, or with one
    token swapped for the runner-up of those scores."""
    from trtspec.spec.coupling import coupled_scores
    from trtspec.spec.sampling import SamplingParams

    plain = tiny_pipeline(CPU, use_drafter=False, dtype=dtype, cuda_graphs=False)
    target = tiny_pipeline(CPU, use_drafter=False, dtype=dtype, cuda_graphs=False).decoder.target
    rng = random.Random(23)
    ids = plain.tokenizer.encode(rng.choice(load_prompts("chat")))
    sampling = SamplingParams(temperature=0.8, top_k=40, seed=rng.randrange(2**63), coupling="gumbel")
    output = plain.decoder.generate(ids, 64, sampling).token_ids
    clean = audit_greedy(target, ids, output, sampling=sampling)
    assert clean.off_argmax == [] and clean.choice == "coupled sample", clean.describe()
    assert not audit_greedy(target, ids, output).near_ties_only  # a sample is not the argmax
    reseeded = sampling.model_copy(update={"seed": sampling.seed + 1})
    assert not audit_greedy(target, ids, output, sampling=reseeded).near_ties_only
    target.allocate(1, len(ids) + len(output))
    logits = target.forward([Chunk(0, torch.tensor(ids + output[:-1]))]).logits[len(ids) - 1:]  # [n, V]
    positions = [list(range(len(ids), len(ids) + len(output)))]
    scores = coupled_scores(logits[None], [sampling], positions)[0]  # [n, V]
    top2 = scores.topk(2, -1)
    assert top2.indices[:, 0].tolist() == output  # the convention: output[j] is chosen at position P + j
    clear = [j for j in range(len(output)) if top2.values[j, 0] - top2.values[j, 1] > 1.0]
    j = rng.choice(clear)
    wrong = output[:j] + [int(top2.indices[j, 1])] + output[j + 1:]
    audit = audit_greedy(target, ids, wrong, sampling=sampling)
    assert audit.first_wrong == j and f"token {j} is off the target's coupled sample" in audit.describe()


def test_a_difference_passes_certification_only_when_the_audit_finds_near_ties():
    tie = GreedyAudit(tokens=48, off_argmax=[20], gaps=[0.03], noise=0.1, dtype="bfloat16")
    wrong = GreedyAudit(tokens=48, off_argmax=[20], gaps=[0.3], noise=0.1, dtype="bfloat16")
    for audit, passed in ((tie, True), (wrong, False), (None, False)):
        cert = Certificate(greedy=[GreedyCheck("Q: 1 + 1", False, 20, 3.0, audit=audit)])
        assert cert.passed is passed
        lines = "\n".join(cert.lines())
        assert ("differs at token 20" if passed else "MISMATCH at token 20") in lines
        assert ("PASS: lossless" if passed else "FAIL") in lines


def test_an_output_that_only_ends_elsewhere_is_a_mismatch():
    """Cut short, or run on past where the target alone stopped, every token an output has is the
    argmax, so the audit finds nothing off it: the judge passed such outputs as near-ties (and
    `verify` a server that stops early). No token choice parts them: a mismatch."""
    plain = tiny_pipeline(CPU, use_drafter=False, dtype="float32", cuda_graphs=False)
    ids = plain.tokenizer.encode(load_prompts("code")[3])
    reference = plain.decoder.generate(ids, 12).token_ids
    longer = plain.decoder.generate(ids, 16).token_ids
    judge = GreedyJudge(plain.config.target, plain.target)
    for output in (reference[:7], longer):
        assert judge.audit(ids, output).off_argmax == []  # greedy all the way
        assert judge(ids, output, reference) == MISMATCH
    check = GreedyCheck("Q: 1 + 1", False, 7, 3.0, audit=judge.audit(ids, reference[:7]), lengths=(7, 12))
    cert = Certificate(greedy=[check])
    assert not cert.passed and "served 7 tokens, the target alone 12" in "\n".join(cert.lines())


def test_the_audit_judges_the_first_token_and_a_penalized_text_by_its_penalized_logits():
    """Unless told where the reference's own tokens end, every token is judged, the first one too;
    and a text decoded under repetition/presence penalties (`spec.penalties`) is held to the
    argmax of the penalized logits, with the rounding noise scaled by the repetition factor (a logit
    divided or multiplied by r moves its rounding by as much)."""
    from trtspec.spec.sampling import SamplingParams

    plain = tiny_pipeline(CPU, use_drafter=False, dtype="float32", cuda_graphs=False)
    ids = plain.tokenizer.encode(load_prompts("code")[3])
    judge = GreedyJudge(plain.config.target, plain.target)
    with torch.inference_mode():
        logits = plain.target.model(torch.tensor([ids])).logits[0, -1]  # [V]: chooses the first token
    off = int(logits.topk(4).indices[-1])
    output = [off] + plain.decoder.generate(ids + [off], 12).token_ids
    auditor = tiny_pipeline(CPU, use_drafter=False, dtype="float32", cuda_graphs=False).decoder.target
    audit = audit_greedy(auditor, ids, output)
    assert audit.off_argmax == [0] and audit.first_wrong == 0, audit.describe()
    assert audit_greedy(auditor, ids, output, start=1).off_argmax == []
    assert judge.audit(ids, output).off_argmax == [0]  # the judge's audit judges it too
    for r in (1.3, 0.8):
        penalized = SamplingParams(repetition_penalty=r, presence_penalty=0.8)
        text = plain.decoder.generate(ids, 48, penalized).token_ids
        assert text != plain.decoder.generate(ids, 48).token_ids  # the penalties change the text
        held = judge.audit(ids, text, penalized)
        assert held.off_argmax == [], held.describe()
        as_greedy = judge.audit(ids, text)
        assert not as_greedy.near_ties_only  # not the unpenalized argmax
        assert as_greedy.noise > 0 and held.noise == pytest.approx(max(r, 1 / r) * as_greedy.noise)


def test_a_gap_of_exactly_the_tolerance_is_a_near_tie():
    """A near-tie is a gap of at most TIE_FACTOR × noise: the bound itself passes, past it fails."""
    at = GreedyAudit(tokens=8, off_argmax=[3], gaps=[0.25], noise=0.125, dtype="bfloat16")  # 2 × 0.125
    assert at.near_ties_only and at.first_wrong is None
    past = GreedyAudit(tokens=8, off_argmax=[3], gaps=[0.2500001], noise=0.125, dtype="bfloat16")
    assert not past.near_ties_only and past.first_wrong == 3


def test_a_near_tie_is_described_by_its_largest_gap():
    audit = GreedyAudit(tokens=40, off_argmax=[3, 9, 30], gaps=[0.02, 0.11, 0.05], noise=0.1,
                        dtype="bfloat16")
    assert audit.near_ties_only
    assert audit.describe().startswith("3 of 40 tokens at near-ties (largest gap 0.11 ≤ 2 × bfloat16")


def test_shared_prefix_and_parted_by_length_on_outputs_of_different_lengths():
    """Where one output is a prefix of the other, they share all of the shorter; where they part at
    a token, they share what comes before it, and a length difference does not make that a
    parting by length."""
    assert shared_prefix([4, 5, 6], [4, 5, 6, 7, 8]) == 3
    assert shared_prefix([4, 5, 6, 7, 8], [4, 5]) == 2
    assert shared_prefix([4, 9, 6], [4, 5, 6, 7]) == 1
    assert parted_by_length([4, 5], [4, 5, 6]) and parted_by_length("ab", "a")
    assert not parted_by_length([4, 9, 6], [4, 5, 6, 7])  # a token parts them before either ends
    assert not parted_by_length([4, 9], [4, 5])


@pytest.mark.parametrize("prompt,output", [([], [65, 66]), ([65, 66], [])])
def test_an_empty_prompt_or_output_is_refused(prompt, output):
    target = tiny_pipeline(CPU, use_drafter=False, dtype="float32", cuda_graphs=False).decoder.target
    with pytest.raises(ValueError, match="non-empty prompt and output"):
        audit_greedy(target, prompt, output)


def test_a_token_off_the_argmax_by_less_than_one_logit_fails_a_float32_audit():
    """Off by a small gap, still far beyond float32's rounding (about 1e-5): not a near-tie."""
    plain = tiny_pipeline(CPU, use_drafter=False, dtype="float32", cuda_graphs=False)
    target = tiny_pipeline(CPU, use_drafter=False, dtype="float32", cuda_graphs=False).decoder.target
    rng = random.Random(29)
    ids = plain.tokenizer.encode(load_prompts("math")[rng.randrange(3)])  # each has gaps of 0.02-0.08
    output = plain.decoder.generate(ids, 48).token_ids
    target.allocate(1, len(ids) + len(output))
    logits = target.forward([Chunk(0, torch.tensor(ids + output[:-1]))]).logits[len(ids) - 1:]  # [n, V]
    top2 = logits.topk(2, -1)
    close = [j for j in range(len(output)) if 0.01 < top2.values[j, 0] - top2.values[j, 1] < 0.5]
    j = rng.choice(close)
    wrong = output[:j] + [int(top2.indices[j, 1])] + output[j + 1:]
    audit = audit_greedy(target, ids, wrong)
    assert audit.off_argmax[0] == j and audit.first_wrong == j and audit.gaps[0] < 0.5


def test_a_guided_text_is_held_to_the_argmax_of_its_masked_logits():
    """A text decoded under a guide (`spec.grammar`) is the argmax at each position only among the
    tokens the guide allows after the tokens before it: with the guide it passes the audit, every
    position masked after its own path (the last one too); without it, it is off the argmax."""
    from trtspec.spec.grammar import Guide, GuideState

    plain = tiny_pipeline(CPU, use_drafter=False, dtype="float32", cuda_graphs=False)
    target = tiny_pipeline(CPU, use_drafter=False, dtype="float32", cuda_graphs=False).decoder.target
    compiled = plain.guides.compile(Guide("regex", "[qzxj]{12}"))
    vocab, ends = plain.target.vocab_size, sorted(plain.decoder.end_ids)
    ids = plain.tokenizer.encode(load_prompts("chat")[1])
    output: list[int] = []
    with torch.inference_mode():
        for _ in range(8):  # the masked argmax, one token at a time
            logits = plain.target.model(torch.tensor([ids + output])).logits[0, -1:].clone()  # [1, V]
            state = GuideState(compiled, ends, vocab)
            state.extend(output)
            state.mask(logits)
            output.append(int(logits[0].argmax()))
    assert not audit_greedy(target, ids, output).near_ties_only
    audit = audit_greedy(target, ids, output, grammar=GuideState(compiled, ends, vocab))
    assert audit.off_argmax == [], audit.describe()
