"""Logit bias and repetition / frequency / presence penalties: the arithmetic against the definitions
and transformers, the target alone against `transformers.generate`, and speculation (chains and
trees, greedy and sampled) against the target alone under the same penalties."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from trtspec.config import ScheduleConfig, TreeConfig, load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.spec.decoder import Request, SpeculativeDecoder
from trtspec.spec.penalties import Penalties, penalized
from trtspec.spec.sampling import SamplingParams

from .conftest import REPO, assert_samples_follow_target

PENALTIES = SamplingParams(presence_penalty=0.8, frequency_penalty=0.4, repetition_penalty=1.3,
                           logit_bias=((ord(" "), -3.0), (ord("e"), 2.0)))
PROMPTS = load_prompts("math")[:3] + load_prompts("code")[:3] + load_prompts("chat")[:2]


def _by_definition(logits: torch.Tensor, params: SamplingParams, prompt: list[int],
                   generated: list[int]) -> torch.Tensor:
    """One position's penalized logits, token by token as the API references define them. [V]"""
    out = logits.clone()
    for token, bias in params.logit_bias:
        out[token] += bias
    for token in set(prompt) | set(generated):
        r = params.repetition_penalty
        out[token] = out[token] / r if out[token] > 0 else out[token] * r
    for token in set(generated):
        out[token] -= params.frequency_penalty * generated.count(token) + params.presence_penalty
    return out


def _path(drafts: torch.Tensor, parents: list[int], j: int) -> list[int]:
    """The drafts from the root to position j (a chain's x_1..x_j, a tree node's ancestors and
    itself); a position past a tree row's nodes (padding) has none."""
    path, node = [], j if j < len(parents) else 0
    while node > 0:
        path.insert(0, int(drafts[node - 1]))
        node = parents[node]
    return path


def _banned(words: tuple[tuple[int, ...], ...], seen: list[int]) -> list[int]:
    """The bad words' last tokens banned after `seen`: a one-token word's always, a longer word's
    where `seen` ends with its other tokens."""
    return sorted({w[-1] for w in words if len(w) == 1 or seen[-(len(w) - 1):] == list(w[:-1])})


def test_one_position_follows_the_definitions_and_transformers():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(50, generator=gen) * 3
        prompt = torch.randint(0, 50, (8,), generator=gen).tolist()
        generated = torch.randint(0, 50, (12,), generator=gen).tolist()
        params = SamplingParams(presence_penalty=0.7, frequency_penalty=-0.3, repetition_penalty=1.4,
                                logit_bias=((3, 5.0), (7, -100.0)))
        torch.testing.assert_close(penalized(logits, params, prompt, generated),
                                   _by_definition(logits, params, prompt, generated))
        # repetition alone, against transformers' own processor over prompt + output
        rep = SamplingParams(repetition_penalty=1.4)
        ids = torch.tensor([prompt + generated])
        hf = RepetitionPenaltyLogitsProcessor(1.4)(ids, logits[None].clone())[0]
        torch.testing.assert_close(penalized(logits, rep, prompt, generated), hf)
    assert penalized(logits, SamplingParams(), prompt, generated) is logits  # none asked: untouched


@pytest.mark.parametrize("tree", [False, True])
def test_each_position_counts_the_drafts_on_its_path(tree):
    """Position j of a step sees the committed tokens and the drafts on its own path: a chain's
    x_1..x_j, a tree node's ancestors and itself, never its siblings."""
    gen = torch.Generator().manual_seed(1)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.2)
    for _ in range(10):
        prompt = torch.randint(0, 20, (5,), generator=gen).tolist()
        generated = torch.randint(0, 20, (6,), generator=gen).tolist()
        drafts = torch.randint(0, 20, (7,), generator=gen)  # fed after the last committed token
        if tree:
            parents = [-1] + [int(torch.randint(0, j, (), generator=gen)) for j in range(1, 8)]
        else:
            parents = [-1] + list(range(7))
        state = Penalties(params, prompt, 20)
        state.extend(generated)
        logits = torch.randn(8, 20, generator=gen)
        out = logits.clone()
        state.apply(out, drafts, parents if tree else None)
        for j in range(8):
            path = _path(drafts, parents, j)
            torch.testing.assert_close(out[j], _by_definition(logits[j], params, prompt, generated + path))


class _Reference(LogitsProcessor):
    """The penalties for `transformers.generate`: bias and presence/frequency by the definitions,
    repetition by transformers' own processor."""

    def __init__(self, params: SamplingParams, prompt_len: int):
        self.params, self.prompt_len = params, prompt_len
        self.repetition = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)

    def __call__(self, input_ids, scores):
        for token, bias in self.params.logit_bias:
            scores[:, token] += bias
        scores = self.repetition(input_ids, scores)
        generated = input_ids[0, self.prompt_len :].tolist()
        f, a = self.params.frequency_penalty, self.params.presence_penalty
        for token in set(generated):
            scores[:, token] -= f * generated.count(token) + a
        return scores


@pytest.fixture(scope="module")
def dflash():
    return load_pipeline(load_build_config(REPO / "build_configs" / "tiny-dflash.yaml"))


@pytest.fixture(scope="module")
def plain_outputs(dflash):
    """The target alone under PENALTIES, greedy, 4 requests at a time."""
    plain = SpeculativeDecoder(dflash.target, None, dflash.decoder_for(1).end_ids, max_slots=4)
    results = plain.generate_batch([Request(list(p.encode()), 100, PENALTIES) for p in PROMPTS])
    return [r.token_ids for r in results]


def test_target_alone_equals_transformers_generate(dflash, plain_outputs):
    model = dflash.target.model
    unpenalized = SpeculativeDecoder(dflash.target, None, dflash.decoder_for(1).end_ids)
    for prompt, ours in list(zip(PROMPTS, plain_outputs, strict=True))[::3]:
        ids = list(prompt.encode())
        hf = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=100,
                            logits_processor=LogitsProcessorList([_Reference(PENALTIES, len(ids))]),
                            eos_token_id=model.config.eos_token_id,
                            pad_token_id=model.config.pad_token_id)[0, len(ids):].tolist()
        assert ours == hf, prompt
        assert ours != unpenalized.generate(ids, 100).token_ids  # the penalties change the text


@pytest.mark.parametrize("name,tree", [("tiny-dflash", None), ("tiny-dflash", TreeConfig(nodes=12, topk=3)),
                                       ("tiny-dspark", None), ("tiny-eagle3", TreeConfig(nodes=8, topk=2)),
                                       ("tiny-draft-model", None)])
def test_greedy_speculation_equals_the_target_alone(name, tree, plain_outputs):
    """Penalized requests beside plain ones in one batch: each is the target's own greedy text
    under its own parameters, and drafts are still accepted."""
    pipeline = load_pipeline(load_build_config(REPO / "build_configs" / f"{name}.yaml"))
    spec = pipeline.decoder_for(4, ScheduleConfig(mode="full"), tree=tree)
    requests = [Request(list(p.encode()), 100, PENALTIES) for p in PROMPTS]
    requests.insert(2, Request(list(PROMPTS[0].encode()), 100))  # no penalties, in the same steps
    results = spec.generate_batch(requests)
    plain = results.pop(2)
    assert plain.token_ids != plain_outputs[0]
    for prompt, result, expected in zip(PROMPTS, results, plain_outputs, strict=True):
        assert result.token_ids == expected, prompt
    assert sum(r.num_accepted for r in results) > len(PROMPTS) * 20


def test_sampling_follows_the_penalized_target(dflash):
    """Sampled under penalties and bias, 16 requests a step: each position's law is the penalized
    target's exact one (`exact_joint` walks it with the same penalties after each path). On this
    prompt a draft's own token is often the next one's too (spaces after a newline), so counting a
    position's history one draft short fails it (p 5e-5 at position 4), as does verifying with
    unpenalized p; an arithmetic prompt let the short count pass."""
    spec = dflash.decoder_for(16, ScheduleConfig(mode="full"))
    sampling = PENALTIES.model_copy(update={"temperature": 1.0, "top_k": 3, "repetition_penalty": 2.0})
    assert_samples_follow_target(dflash.target.model, spec, list(b"    def __init__(self"), sampling, steps=4)


def test_a_bias_outside_the_vocabulary_is_refused(dflash):
    decoder = dflash.decoder_for(1)
    vocab = decoder.target.vocab_size
    with pytest.raises(ValueError, match=f"logit_bias names token {vocab}, outside the target's vocabulary"):
        decoder.add(Request([1, 2, 3], 5, SamplingParams(logit_bias=((vocab, 1.0),))))


def along_random_step(params: SamplingParams, generated: list[int], tree: bool, gen: torch.Generator,
                      vocab: int) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """One random step of 8 positions over `vocab` tokens (a chain, or a random tree) after
    `generated` (extended in two parts): its logits [8, V], what `Penalties.apply` made of them,
    and each position's path (the drafts on the way to it, root first)."""
    drafts = torch.randint(0, vocab, (7,), generator=gen)
    parents = [-1] + ([int(torch.randint(0, j, (), generator=gen)) for j in range(1, 8)] if tree
                      else list(range(7)))
    state = Penalties(params, [1, 2], vocab)
    state.extend(generated[:2])
    state.extend(generated[2:])
    logits = torch.randn(8, vocab, generator=gen)
    out = logits.clone()
    state.apply(out, drafts, parents if tree else None)
    return logits, out, [_path(drafts, parents, j) for j in range(8)]


@pytest.mark.parametrize("tree", [False, True])
def test_bad_words_are_banned_along_each_path(tree):
    """A bad word's last token is -inf at exactly the positions whose path (the generated tokens,
    then a chain's x_1..x_j or a tree node's ancestors and itself) ends with the word's other
    tokens; a one-token word everywhere; nothing else moves."""
    gen = torch.Generator().manual_seed(2)
    for _ in range(20):
        words = tuple(tuple(torch.randint(0, 4, (n,), generator=gen).tolist()) for n in (1, 2, 2, 3))
        params = SamplingParams(bad_words=words[1:] if _ % 2 else words)
        generated = torch.randint(0, 4, (5,), generator=gen).tolist()
        logits, out, paths = along_random_step(params, generated, tree, gen, 6)
        for j, path in enumerate(paths):
            expected = logits[j].clone()
            expected[_banned(params.bad_words, generated + path)] = float("-inf")
            torch.testing.assert_close(out[j], expected)


BAD = SamplingParams(bad_words=(tuple(b"= 8"), tuple(b"carry"), (ord("+"),)))


@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=12, topk=3)], ids=["chain", "tree"])
def test_bad_words_keep_speculation_lossless(dflash, tree):
    """Greedy under bad words: the speculative text is the target alone's under them, holds none of
    them, and differs from the plain text; sampled, each position's law is the exact one."""
    plain = SpeculativeDecoder(dflash.target, None, dflash.decoder_for(1).end_ids, max_slots=4)
    spec = dflash.decoder_for(4, ScheduleConfig(mode="full"), tree=tree)
    prompts = [list(p.encode()) for p in load_prompts("math")[:4]]
    want = [r.token_ids for r in plain.generate_batch([Request(p, 80, BAD) for p in prompts])]
    got = spec.generate_batch([Request(p, 80, BAD) for p in prompts])
    assert [r.token_ids for r in got] == want
    assert sum(r.num_accepted for r in got) > 40
    free = [r.token_ids for r in plain.generate_batch([Request(p, 80) for p in prompts])]
    text = [bytes(t for t in ids if t < 256) for ids in want]  # the byte model's text, its end id left out
    assert want != free and all(b"carry" not in t and b"+" not in t and b"= 8" not in t for t in text)
    assert any(b"carry" in bytes(t for t in ids if t < 256) for ids in free)  # the ban bites
    if tree is None:
        sampling = BAD.model_copy(update={"temperature": 1.0, "top_k": 3})
        spec16 = dflash.decoder_for(16, ScheduleConfig(mode="full"))
        prompt = list(b"Q: 482 + 356\nA:")
        assert_samples_follow_target(dflash.target.model, spec16, prompt, sampling, steps=4)


def test_a_forced_token_outside_the_vocabulary_forces_nothing():
    """A reasoning block's end id the target cannot emit (its vocabulary's size or past it; the
    decoder does not refuse one) forces nothing: the step's logits are left as they are."""
    from trtspec.spec.thinking_budget import ThinkingBudget

    for end in (6, 7):  # the vocabulary is 0..5
        state = Penalties(SamplingParams(thinking=ThinkingBudget(budget=0, end=(end,))), [1, 2], 6)
        logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(end))
        out = logits.clone()
        state.apply(out, torch.tensor([0, 1]))  # the budget is spent from the start: end is due
        torch.testing.assert_close(out, logits)
    inside = Penalties(SamplingParams(thinking=ThinkingBudget(budget=0, end=(5,))), [1, 2], 6)
    out = torch.zeros(1, 6)
    inside.apply(out)  # the last id of the vocabulary is forced
    assert out[0].tolist() == [float("-inf")] * 5 + [0.0]


def test_a_short_chain_counts_each_draft_from_the_position_after_it():
    """Steps of one to three positions (no draft, one, two): position j of a chain sees the committed
    tokens and x_1..x_j, a single draft too."""
    gen = torch.Generator().manual_seed(4)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.2)
    for width in (1, 2, 3) * 4:
        prompt = torch.randint(0, 10, (4,), generator=gen).tolist()
        generated = torch.randint(0, 10, (3,), generator=gen).tolist()
        drafts = torch.randint(0, 10, (width - 1,), generator=gen)
        state = Penalties(params, prompt, 10)
        state.extend(generated)
        logits = torch.randn(width, 10, generator=gen)
        out = logits.clone()
        state.apply(out, drafts)
        for j in range(width):
            expected = _by_definition(logits[j], params, prompt, generated + drafts[:j].tolist())
            torch.testing.assert_close(out[j], expected)


def test_a_tree_row_s_padding_sees_the_committed_tokens_alone():
    """A tree row with fewer nodes than the step's width (`DraftTree.row_parents` shorter than it):
    its nodes see their paths, and the padding positions after them, never verified, the committed
    tokens alone, for penalties and bad words both."""
    gen = torch.Generator().manual_seed(5)
    for _ in range(10):
        words = tuple(tuple(torch.randint(0, 4, (n,), generator=gen).tolist()) for n in (2, 3))
        params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.2,
                                bad_words=words)
        prompt = torch.randint(0, 6, (4,), generator=gen).tolist()
        generated = torch.randint(0, 4, (5,), generator=gen).tolist()
        drafts = torch.randint(0, 4, (7,), generator=gen)
        parents = [-1] + [int(torch.randint(0, j, (), generator=gen)) for j in range(1, 5)]  # 5 of 8
        state = Penalties(params, prompt, 6)
        state.extend(generated)
        logits = torch.randn(8, 6, generator=gen)
        out = logits.clone()
        state.apply(out, drafts, parents)
        for j in range(8):
            seen = generated + _path(drafts, parents, j)
            expected = _by_definition(logits[j], params, prompt, seen)
            expected[_banned(words, seen)] = float("-inf")
            torch.testing.assert_close(out[j], expected)


def test_a_bad_word_ending_in_any_token_of_the_vocabulary_is_banned_one_outside_it_is_not():
    """A one-token bad word is banned everywhere, whatever its id within the vocabulary (ids past
    the step's width too); one naming the vocabulary's size or past it bans nothing."""
    vocab = 12
    state = Penalties(SamplingParams(bad_words=((9,), (vocab,), (vocab + 3,))), [1, 2], vocab)
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(6))
    out = logits.clone()
    state.apply(out, torch.tensor([0, 1]))
    expected = logits.clone()
    expected[:, 9] = float("-inf")
    torch.testing.assert_close(out, expected)
