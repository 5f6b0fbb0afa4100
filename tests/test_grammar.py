"""Guided decoding (`spec.grammar`): each position's mask against a fresh matcher walked along its
own path, the guided target alone against `transformers.generate` under XGrammar's own logits mask,
and speculation (chains and trees, greedy and sampled) against the guided target alone."""

from __future__ import annotations

import json
import re

import pytest
import torch
import xgrammar as xgr
from transformers import LogitsProcessor, LogitsProcessorList

from trtspec import json_text
from trtspec.config import ScheduleConfig, TreeConfig, load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.spec.decoder import Request, SpeculativeDecoder
from trtspec.spec.grammar import Guide, GuideError, GuideState, compact_guide
from trtspec.spec.sampling import SamplingParams
from trtspec.triton.verify import allowed_after

from .conftest import REPO, assert_samples_follow_target

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["cm", "kg"]}},
          "required": ["answer", "unit"]}
GUIDES = [Guide("json_schema", json.dumps(SCHEMA)), Guide("regex", r"( [0-9]+[-*/])+ ?[0-9]+;"),
          Guide("json"), Guide("ebnf_grammar", 'root ::= ("yes" | "no") " because " [a-z ]+ "."')]
PROMPTS = load_prompts("math")[:3] + load_prompts("code")[:2] + load_prompts("chat")[:2]


@pytest.fixture(scope="module")
def dflash():
    return load_pipeline(load_build_config(REPO / "build_configs" / "tiny-dflash.yaml"))


def _fresh_mask(compiled, end_ids, vocab: int, path: list[int]) -> torch.Tensor:
    """Allowed tokens after `path`, from a new matcher that accepted it token by token (`trtspec
    verify`'s own walk of a guided law). [V] bool"""
    return allowed_after(compiled, end_ids, vocab)(path)


@pytest.mark.parametrize("tree", [False, True])
def test_each_position_is_masked_after_the_drafts_on_its_path(dflash, tree):
    """Random chains and trees whose drafts are mostly allowed: every reachable position's mask is a
    fresh matcher's after that path, positions past a refused draft are left alone, and the
    request's own matcher stands where it stood."""
    vocab, ends = dflash.target.vocab_size, dflash.end_ids
    compiled = dflash.guides.compile(GUIDES[0])
    gen = torch.Generator().manual_seed(3)
    refused = checked = 0
    for _ in range(12):
        state = GuideState(compiled, ends, vocab)
        committed = list(b'{"answer": ')
        state.extend(committed)
        parents = [-1] + ([int(torch.randint(0, j, (), generator=gen)) for j in range(1, 9)] if tree
                          else list(range(8)))
        drafts, paths, valid = [], {0: []}, {0: True}
        for j in range(1, 9):  # each node's token: mostly one its path allows
            path = paths[parents[j]]
            token = int(torch.randint(0, 256, (), generator=gen))
            if valid[parents[j]] and torch.rand((), generator=gen) < 0.85:
                allowed = _fresh_mask(compiled, ends, vocab, committed + path).nonzero().flatten()
                token = int(allowed[torch.randint(0, len(allowed), (), generator=gen)])
            valid[j] = valid[parents[j]] and token not in ends and bool(
                _fresh_mask(compiled, ends, vocab, committed + path)[token])
            drafts.append(token)
            paths[j] = path + [token]
        logits = torch.randn(9, vocab, generator=gen)
        out = logits.clone()
        state.mask(out, torch.tensor(drafts), parents if tree else None)
        for j in range(9):
            if valid[j]:
                allowed = _fresh_mask(compiled, ends, vocab, committed + paths[j])
                expected = logits[j].masked_fill(~allowed, float("-inf"))
                checked += 1
            else:
                expected, refused = logits[j], refused + 1
            torch.testing.assert_close(out[j], expected)
        again = logits.clone()[:1]
        state.mask(again)  # the matcher rolled every draft back
        assert torch.equal(again[0], out[0])
    assert refused > 5 and checked > 40


class _XGrammarMask(LogitsProcessor):
    """XGrammar's own mask for `transformers.generate`: a matcher fed the generated tokens."""

    def __init__(self, compiled, end_ids, prompt_len: int, vocab: int):
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(end_ids))
        self.prompt_len, self.vocab, self.seen = prompt_len, vocab, 0

    def __call__(self, input_ids, scores):
        for token in input_ids[0, self.prompt_len + self.seen :].tolist():
            assert self.matcher.accept_token(token)
            self.seen += 1
        bitmask = xgr.allocate_token_bitmask(1, self.vocab)
        self.matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(scores, bitmask)
        return scores


def _valid(guide: Guide, text: str) -> bool:
    if guide.kind == "json_schema":
        value = json.loads(text)
        return isinstance(value["answer"], int) and value["unit"] in ("cm", "kg") and len(value) == 2
    if guide.kind == "regex":
        return re.fullmatch(guide.text, text) is not None
    if guide.kind == "json":
        json.loads(text)
        return True
    return re.fullmatch(r"(yes|no) because [a-z ]+\.", text) is not None


@pytest.fixture(scope="module")
def plain_outputs(dflash):
    """The guided target alone, greedy, 4 requests at a time: prompt i under guide i mod 4."""
    plain = SpeculativeDecoder(dflash.target, None, dflash.end_ids, max_slots=4)
    requests = [Request(list(p.encode()), 120, guide=dflash.guides.compile(GUIDES[i % 4]))
                for i, p in enumerate(PROMPTS)]
    return [r.token_ids for r in plain.generate_batch(requests)]


def test_target_alone_equals_transformers_generate(dflash, plain_outputs):
    model, ends, vocab = dflash.target.model, dflash.end_ids, dflash.target.vocab_size
    finished = 0
    for i, (prompt, ours) in enumerate(zip(PROMPTS, plain_outputs, strict=True)):
        ids, guide = list(prompt.encode()), GUIDES[i % 4]
        mask = _XGrammarMask(dflash.guides.compile(guide), ends, len(ids), vocab)
        hf = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=120,
                            logits_processor=LogitsProcessorList([mask]), eos_token_id=list(ends),
                            pad_token_id=model.config.pad_token_id)[0, len(ids):].tolist()
        assert ours == hf, (prompt, guide.kind)
        if ours[-1] in ends:  # a text that ended is in the guide's language
            finished += 1
            assert _valid(guide, dflash.tokenizer.decode(ours)), dflash.tokenizer.decode(ours)
    assert finished >= 4


@pytest.mark.parametrize("name,tree", [("tiny-dflash", None), ("tiny-dflash", TreeConfig(nodes=12, topk=3)),
                                       ("tiny-dspark", None), ("tiny-eagle3", TreeConfig(nodes=8, topk=2)),
                                       ("tiny-draft-model", None)])
def test_greedy_speculation_equals_the_guided_target_alone(name, tree, plain_outputs):
    """Guided requests beside an unguided one in the same steps: each is the guided target's own
    greedy text, and drafts are still accepted."""
    pipeline = load_pipeline(load_build_config(REPO / "build_configs" / f"{name}.yaml"))
    spec = pipeline.decoder_for(4, ScheduleConfig(mode="full"), tree=tree)
    requests = [Request(list(p.encode()), 120, guide=pipeline.guides.compile(GUIDES[i % 4]))
                for i, p in enumerate(PROMPTS)]
    requests.insert(2, Request(list(PROMPTS[0].encode()), 120))
    results = spec.generate_batch(requests)
    plain = results.pop(2)
    assert plain.token_ids != plain_outputs[0]
    for prompt, result, expected in zip(PROMPTS, results, plain_outputs, strict=True):
        assert result.token_ids == expected, prompt
    assert sum(r.num_accepted for r in results) > len(PROMPTS) * 10


def _walk(matcher, tokens: list[int]) -> tuple[int, bool]:
    """Accept `tokens` on the matcher until one is refused or an end id ends the text: (taken,
    refused)."""
    taken = 0
    for token in tokens:
        if matcher.is_terminated():
            return taken, False
        if not matcher.accept_token(token):
            return taken, True
        taken += 1
    return taken, False


@pytest.mark.parametrize("name", ["tiny-dflash", "tiny-dspark", "tiny-eagle3", "tiny-draft-model"])
@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=12, topk=3)], ids=["chain", "tree"])
def test_drafts_keep_to_the_guide(name, tree, monkeypatch):
    """Every drafter's drafts are masked by the request's guide after the drafts before them: each
    step's chain, and each tree node's path from the root, is one the guide allows (up to an end
    id). Unguided, a chain draft was refused in 80 to 103 of the steps of these four requests, by
    drafter; a tree node (12 nodes, top-3) 221 to 324 times."""
    pipeline = load_pipeline(load_build_config(REPO / "build_configs" / f"{name}.yaml"))
    decoder = pipeline.decoder_for(1, ScheduleConfig(mode="full"), tree=tree)
    steps = refused = drafts = 0
    fill = GuideState.fill

    def checked_fill(self, s, fed=None, parents=None):  # the step's drafts, walked on the matcher
        nonlocal steps, refused, drafts
        tokens = [] if fed is None else fed[: s - 1].tolist()
        if parents is None:  # a chain: one path
            paths = [tokens] if tokens else []
        else:  # a tree: each node's path from the root
            paths, of = [], {0: []}
            for j in range(1, min(s, len(parents))):
                of[j] = of[parents[j]] + [tokens[j - 1]]
                paths.append(of[j])
        steps += 1
        for path in paths:
            taken, no = _walk(self.matcher, path)
            refused += no and taken == len(path) - 1  # refused at its own token, its parent's path allowed
            drafts += taken if parents is None else taken == len(path)  # a chain's drafts, or a node
            self.matcher.rollback(taken)
        return fill(self, s, fed, parents)

    monkeypatch.setattr(GuideState, "fill", checked_fill)
    for i, prompt in enumerate(PROMPTS[:4]):
        decoder.generate(list(prompt.encode()), 60, guide=pipeline.guides.compile(GUIDES[i % 2]))
    assert refused == 0 and drafts > 2 * steps, (refused, drafts, steps)


@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=12, topk=3)], ids=["chain", "tree"])
def test_sampling_follows_the_guided_target(dflash, tree):
    """Sampled under a regex that bars the target's likeliest continuations ('+' after the first
    number), 16 requests a step: each of the first 4 positions' law is the guided target's exact
    one (walked with a fresh matcher's mask after each prefix), drafting chains or guided trees;
    verifying with unmasked p, or a draft chosen under the mask verified with the unmasked q, fails
    it."""
    spec = dflash.decoder_for(16, ScheduleConfig(mode="full"), tree=tree)
    guide = dflash.guides.compile(Guide("regex", r" [0-9]+[-*][0-9]+=[0-9]+;"))
    ends, vocab = dflash.end_ids, dflash.target.vocab_size
    assert_samples_follow_target(dflash.target.model, spec, list(b"Q: 482 + 356\nA:"),
                                 SamplingParams(temperature=1.0, top_k=3), steps=4, guide=guide,
                                 allowed=lambda prefix: _fresh_mask(guide, ends, vocab, prefix))


@pytest.mark.parametrize("guide,message", [
    (("json_schema", "{not json"), "the json_schema guide is not JSON"),
    (("json_schema", '{"type": "wat"}'), "the json_schema guide does not compile"),
    (("regex", "[0-9"), "the regex guide does not compile"),
    (("ebnf_grammar", "root ::= missing"), "the ebnf_grammar guide does not compile"),
    (("regex", ""), "a regex guide needs its text"),
    (("xml", "<a/>"), "guide type 'xml' is not one of json, json_schema, regex, ebnf_grammar"),
    # found fuzzing (2026-12-05): a RecursionError's traceback in the answer, and a schema whose
    # grammar took seconds to build (its cost grows as its depth squared)
    (("json_schema", "[" * 5000 + "]" * 5000), "the json_schema guide is not JSON: nested too deeply"),
    (("json_schema", '{"maxLength": ' + "9" * 5000 + "}"), "the json_schema guide is not JSON: Exceeds the"),
    (("json_schema", '{"type": "array", "items": ' * 129 + "{}" + "}" * 129),
     "the JSON schema nests objects and arrays 130 deep, more than the 128 levels this server compiles"),
])
def test_a_bad_guide_is_refused_by_name(dflash, guide, message):
    with pytest.raises(GuideError, match=re.escape(message)):
        dflash.guides.compile(Guide(*guide))


def test_the_deepest_schema_allowed_compiles_written_compactly_too(dflash):
    schema = '{"type": "array", "items": ' * 127 + '{"type": "integer"}' + "}" * 127  # 128 deep
    assert dflash.guides.compile(Guide("json_schema", schema)) is not None
    kind, grammar = compact_guide("json_schema", schema)
    assert kind == "ebnf_grammar" and grammar
    with pytest.raises(GuideError, match="129 deep"):
        compact_guide("json_schema", '{"type": "array", "items": ' + schema + "}")


def test_json_depth_counts_containers_without_recursing():
    assert [json_text.depth(v) for v in (1, "x", [], {}, [[1]], {"a": [{"b": 2}]}, [1, [2, [3]]])] == \
        [0, 0, 1, 1, 2, 3, 3]
    deep = []
    for _ in range(100_000):  # past any recursion limit
        deep = [deep]
    assert json_text.depth(deep) == 100_001


def test_half_pair_finds_a_lone_surrogate_in_a_string_or_a_key_and_says_which():
    # (where, the text, whether it is a key): a string is found at its own path, a key at the path of
    # the object holding it; a whole pair (an emoji's two halves joined) is a character and passes
    assert json_text.half_pair({"a": [1, "x\ud800"]}) == (("a", 1), "x\ud800", False)
    assert json_text.half_pair({"a": {"\udc00k": 1}}) == (("a",), "\udc00k", True)
    assert json_text.half_pair({"a": ["\U0001f600", {"b": None}], "c": 2.5}) is None


def test_requests_a_guide_cannot_end_are_refused(dflash):
    decoder, compiled = dflash.decoder_for(1), dflash.guides.compile(Guide("json"))
    with pytest.raises(ValueError, match="min_tokens 3 cannot be combined with a guide"):
        decoder.add(Request([1, 2, 3], 5, min_new_tokens=3, guide=compiled))
    with pytest.raises(ValueError, match="ignore_eos leaves a guided request no id that ends it"):
        decoder.add(Request([1, 2, 3], 5, ignore_eos=True, guide=compiled))
    decoder.add(Request([1, 2, 3], 5, ignore_eos=True, stop_ids=(7,), guide=compiled))  # 7 ends it


@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=12, topk=3)], ids=["chains", "trees"])
def test_a_guide_left_no_token_ends_its_request_alone(dflash, tree):
    """Found fuzzing the served path (2026-12-06): a guided request whose guide could only go on with
    a token it ends on (stop_token_ids) or bans (bad_words) emitted token 0 against its guide, and
    the step's error failed every request decoded beside it (a sampled one: NaN from all −inf).
    Now it ends alone, saying why, after the tokens before; the others decode as without it."""
    schema = dflash.guides.compile(Guide("json_schema", json.dumps(SCHEMA)))  # {"answer": ..., "unit": ...}
    digits = dflash.guides.compile(Guide("regex", r"[0-9]+"))
    a = ord("a")
    dead = [Request(list(PROMPTS[0].encode()), 40, guide=schema, stop_ids=(a,)),  # {" then only a
            Request(list(PROMPTS[1].encode()), 40, SamplingParams(temperature=1.0, seed=5, bad_words=((a,),)),
                    guide=schema),
            Request(list(PROMPTS[2].encode()), 40, guide=digits,  # no first token
                    sampling=SamplingParams(bad_words=tuple((d,) for d in b"0123456789")))]
    fine = [Request(list(p.encode()), 40) for p in PROMPTS[3:6]]
    decoder = dflash.decoder_for(6, ScheduleConfig(mode="full"), tree=tree)
    alone = [r.token_ids for r in decoder.generate_batch(fine)]
    decoder.reset()
    ids = [decoder.add(r) for r in dead[:2] + fine[:1] + dead[2:] + fine[1:]]
    done = {}
    while decoder.lives:
        done.update(decoder.step())
    results = [done[i] for i in ids]
    got_dead, got_fine = results[:2] + results[3:4], results[2:3] + results[4:]
    assert [r.token_ids for r in got_fine] == alone and all(r.error is None for r in got_fine)
    for result, causes in zip(got_dead, ["its guide", "its guide and bad_words", "its guide and bad_words"],
                              strict=True):
        n = len(result.token_ids)
        assert result.error.startswith(f"no token may follow the {n} tokens generated: {causes} leave none")
        assert result.finish_reason is None
    assert got_dead[0].token_ids[0] == got_dead[1].token_ids[0] == ord("{") and got_dead[2].token_ids == []
    with pytest.raises(ValueError, match=r"^request 1: no token may follow the \d+ tokens generated"):
        decoder.generate_batch(fine[:1] + dead[:1])


def test_a_guided_dflash_block_and_top_1_tree_take_each_slot_s_masked_best(dflash):
    """A guided greedy row's DFlash drafts, as a block and as a top-1 tree: block slot j + 1's
    argmax among the tokens a fresh matcher allows after the drafts before it (the tree's root
    children from slot 1, not a later slot)."""
    from trtspec.models.dflash_drafter import DFlashDrafter
    from trtspec.models.drafter import DraftRow

    own = dflash.drafter
    d = DFlashDrafter(own.model, own.embed_tokens, own.lm_head)
    d.allocate(1, 256)
    prompt = list(b"Q: 482 + 356\nA:")
    with torch.no_grad():
        hs = dflash.target.model(torch.tensor([prompt[:-1]]), output_hidden_states=True).hidden_states
    d.begin(0, prompt[:-1], torch.cat([hs[i + 1] for i in d.tap_layer_ids], -1)[0])
    compiled = dflash.guides.compile(Guide("regex", r"[a-z0-9 ]+;"))
    ends, vocab = dflash.end_ids, dflash.target.vocab_size
    k = 4

    def row():
        return DraftRow(0, prompt, SamplingParams(), torch.Generator().manual_seed(0),
                        GuideState(compiled, ends, vocab))

    logits = d.draft_logits([row()], k)[0]  # [k, V]

    def best(j, path):  # slot j + 1's argmax among the tokens allowed after path
        return int(logits[j].masked_fill(~_fresh_mask(compiled, ends, vocab, path), float("-inf")).argmax())

    want: list[int] = []
    for j in range(k):
        want.append(best(j, want))
    assert best(1, []) != want[0]  # the root's children from slot 2 would differ
    assert d.propose([row()], k).tokens[0].tolist() == want
    tree = d.propose_tree([row()], TreeConfig(nodes=k, topk=1, depth=k))
    assert tree.sizes == [k] and tree.tokens[0, :k].tolist() == want
    assert tree.parents[0, :k].tolist() == list(range(k))
