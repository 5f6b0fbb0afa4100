"""Guides at their edges (`spec.grammar`), over the byte tokenizer's own vocabulary: the longest guide
text allowed, compact JSON's whitespace, the tagged grammar's two argument styles, and `guide_ebnf`'s
language for each guide type."""

from __future__ import annotations

import json

import pytest
import torch

from trtspec.spec import grammar
from trtspec.spec.grammar import (
    Guide,
    GuideCompiler,
    GuideError,
    GuideState,
    choose_drafts,
    compact_guide,
    compact_json_grammar,
    guide_ebnf,
    tagged_json_grammar,
)
from trtspec.tokenizer import ByteTokenizer

END = 256  # the byte tokenizer's eos
TOKENIZER = ByteTokenizer()
COMPILER = GuideCompiler(TOKENIZER, TOKENIZER.vocab_size, [END])
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
          "required": ["n", "s"]}


def _accepts(guide: Guide, text: str) -> bool:
    """Whether `guide` allows all of `text`, then its end."""
    state = GuideState(COMPILER.compile(guide), [END], TOKENIZER.vocab_size)
    ids = list(text.encode()) + [END]
    return state.allowed_prefix(ids) == ids


def test_a_guide_text_of_max_guide_chars_is_allowed_one_more_is_refused():
    Guide("regex", "a" * grammar.MAX_GUIDE_CHARS)
    with pytest.raises(GuideError, match=f"has {grammar.MAX_GUIDE_CHARS + 1} characters"):
        Guide("regex", "a" * (grammar.MAX_GUIDE_CHARS + 1))
    assert grammar.MAX_GUIDE_CHARS == 1 << 20  # a MiB of schema: the largest a client may send


def test_compact_json_is_written_as_json_dumps_writes_it():
    """The compact grammar allows `json.dumps`'s spacing and no other whitespace."""
    guide = Guide("ebnf_grammar", compact_json_grammar(SCHEMA))
    assert _accepts(guide, json.dumps({"n": 3, "s": "hi"}))
    for spaced in ('{"n": 3,  "s": "hi"}', '{"n" : 3, "s": "hi"}', '{ "n": 3, "s": "hi"}',
                   '{"n": 3, "s": "hi"}\n'):
        assert not _accepts(guide, spaced), spaced


def test_compact_guide_writes_json_guides_compactly_and_leaves_others():
    kind, text = compact_guide("json", "")
    assert kind == "ebnf_grammar"
    assert _accepts(Guide(kind, text), '[1, {"a": null}]') and not _accepts(Guide(kind, text), '[1 ]')
    assert not _accepts(Guide(kind, text), '"text"')
    kind, text = compact_guide("json_schema", json.dumps(SCHEMA))
    assert _accepts(Guide(kind, text), '{"n": 3, "s": "hi"}') and not _accepts(Guide(kind, text), '[1]')
    assert compact_guide("regex", "(ab|cd)e;") == ("regex", "(ab|cd)e;")


def _tagged(style: str) -> Guide:
    text = tagged_json_grammar([("<f>", SCHEMA, "</f>")], "<f>", once=True, style=style)
    return Guide("ebnf_grammar", text)


def test_tagged_arguments_are_compact_json_or_qwen_xml_parameters_by_style():
    """json: the arguments as compact JSON; qwen_xml: a `<parameter=NAME>` block each, whitespace
    runs between them of one character at most."""
    as_json = 'say <f>{"n": 3, "s": "hi"}</f>'
    as_xml = "say <f><parameter=n>\n3\n</parameter>\n<parameter=s>\nhi\n</parameter></f>"
    assert _accepts(_tagged("json"), as_json) and not _accepts(_tagged("json"), as_xml)
    assert _accepts(_tagged("qwen_xml"), as_xml) and not _accepts(_tagged("qwen_xml"), as_json)
    assert not _accepts(_tagged("qwen_xml"), as_xml.replace("</parameter>\n<", "</parameter>\n\n<"))


@pytest.mark.parametrize("guide, good, bad", [
    (Guide("json_schema", json.dumps(SCHEMA)), '{ "n" : 3 ,\n"s": "hi" }', '{"n": "3", "s": "hi"}'),
    (Guide("json"), '[1, {"a": null}]', '"text"'),
    (Guide("regex", "(ab|cd)e;"), "cde;", "ace;"),
    (Guide("ebnf_grammar", 'root ::= ("yes" | "no") "."'), "no.", "yes"),
])
def test_guide_ebnf_is_the_language_of_each_guide_type(guide, good, bad):
    """`guide_ebnf`'s text, compiled as an ebnf_grammar guide, allows what `guide` allows (a
    json_schema with any whitespace) and refuses what it refuses."""
    ebnf = Guide("ebnf_grammar", guide_ebnf(guide))
    for text, allowed in ((good, True), (bad, False)):
        assert _accepts(guide, text) is allowed and _accepts(ebnf, text) is allowed, text


def test_guide_ebnf_refuses_a_schema_deeper_than_max_schema_depth_by_name():
    deep = {"type": "array"}
    for _ in range(grammar.MAX_SCHEMA_DEPTH):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GuideError, match="nests objects and arrays"):
        guide_ebnf(Guide("json_schema", json.dumps(deep)))


# -- a proposal's drafts ----------------------------------------------------------------------

def _state(regex: str = "(ab|cd)e;") -> GuideState:
    return GuideState(COMPILER.compile(Guide("regex", regex)), [END], TOKENIZER.vocab_size)


def test_a_refused_draft_ends_the_guided_drafts():
    """After a draft the guide refuses, the drafts after it go unguided (their logits unmasked)
    and are not taken: the allowed prefix of a chain stops at its first refused token, even where
    a later one would be allowed after the earlier allowed ones."""
    state = _state()
    assert state.allowed_prefix(list(b"axb")) == list(b"a")
    assert state.allowed_prefix(list(b"cde;") + [END, ord("a")]) == list(b"cde;") + [END]
    state.take_draft(ord("a"))
    state.take_draft(ord("x"))
    logits = torch.zeros(TOKENIZER.vocab_size)
    state.mask_draft(logits)
    assert bool((logits == 0).all())
    state.end_drafts()
    state.mask_draft(logits)
    assert sorted(torch.nonzero(logits == 0).flatten().tolist()) == [ord("a"), ord("c")]


def test_a_greedy_draft_is_the_argmax_the_guide_allows_and_is_taken():
    """The unmasked argmax itself where the guide allows it, else the masked logits' argmax; each
    taken, so the next is chosen after it."""
    state = _state()
    logits = torch.zeros(TOKENIZER.vocab_size)
    logits[ord("x")], logits[ord("c")], logits[ord("a")] = 3.0, 2.0, 1.0
    assert state.greedy_draft(logits, ord("x")) == ord("c")
    assert state.greedy_draft(logits, ord("d")) == ord("d")
    assert state.greedy_draft(logits, ord("x")) == ord("e")  # all the guide allows after "cd"
    assert bool(logits[ord("x")] == 3.0)  # the logits are not written
    state.end_drafts()
    assert _next(state) == b"ac"


def _allowed_rows(logits: torch.Tensor) -> list[bytes]:
    return [bytes(i for i in torch.nonzero(row == 0).flatten().tolist() if i < 256) for row in logits]


def _next(state: GuideState) -> bytes:
    """The bytes the guide allows after the committed tokens."""
    return bytes(i for i in torch.nonzero(state.allowed()).flatten().tolist() if i < 256)


def test_a_step_of_one_draft_masks_its_position_and_no_drafts_masks_the_first_alone():
    """mask: position 1 after the one draft fed; without drafts fed only position 0 is masked."""
    state = _state()
    logits = torch.zeros(2, TOKENIZER.vocab_size)
    state.mask(logits, torch.tensor([ord("c")]))
    assert _allowed_rows(logits) == [b"ac", b"d"]
    logits = torch.zeros(3, TOKENIZER.vocab_size)
    state.mask(logits)
    assert _allowed_rows(logits)[0] == b"ac" and bool((logits[1:] == 0).all())


def test_paths_refused_or_ended_have_no_children():
    """mask_paths: a path refused partway or ending in an end id scores −inf throughout; an allowed
    one its guide's next tokens; the matcher is left where it stood."""
    state = _state()
    scores = torch.zeros(4, TOKENIZER.vocab_size)
    state.mask_paths(scores, [list(b"ax"), list(b"ab"), list(b"cde;") + [END], []])
    assert bool(torch.isneginf(scores[0]).all()) and bool(torch.isneginf(scores[2]).all())
    assert _allowed_rows(scores[[1, 3]]) == [b"e", b"ac"]
    assert _next(state) == b"ac"


def test_guided_chain_drafts_mask_sampled_rows_and_take_greedy_rows_masked_argmax():
    """choose_drafts: a sampling row draws from its masked law (q zero where the guide refuses), a
    greedy row beside it drafts its masked argmax with a one-hot q on it; each draft is taken."""
    from trtspec.models.drafter import DraftRow
    from trtspec.spec.sampling import SamplingParams

    vocab = TOKENIZER.vocab_size
    logits = torch.zeros(2, vocab)
    logits[:, ord("x")] = 9.0
    logits[:, ord("c")] = 1.0
    rows = [DraftRow(0, [1], SamplingParams(temperature=1.0), torch.Generator().manual_seed(0), _state()),
            DraftRow(1, [1], SamplingParams(), torch.Generator().manual_seed(0), _state())]
    tokens, q = choose_drafts(logits, rows, 0)
    assert tokens.tolist()[1] == ord("c") and tokens.tolist()[0] in (ord("a"), ord("c"))
    assert bool(logits[:, ord("x")].eq(9.0).all())  # not written
    assert q is not None and set(torch.nonzero(q[0]).flatten().tolist()) == {ord("a"), ord("c")}
    assert torch.equal(q[1], torch.nn.functional.one_hot(torch.tensor(ord("c")), vocab).to(q.dtype))
    for row, token in zip(rows, tokens.tolist(), strict=True):
        assert _next(row.grammar) == (b"b" if token == ord("a") else b"d")
