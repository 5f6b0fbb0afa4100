"""OpenAI `logprobs` bodies (`trtspec.openai.logprobs.LogprobsBody`) on hand-picked cases the
random property tests of test_text_fidelity do not reach: -inf log p, completions' top_logprobs
with alternatives, the offset of a piece of a character after invalid bytes, and echo of prompts
with fewer ids than characters or whose text does not decode back. Each case was a change to the
module that every other fast test passed (scripts/mutants.py)."""

from __future__ import annotations

import pytest

from trtspec.openai.logprobs import FLOOR, LogprobsBody
from trtspec.tokenizer import ByteTokenizer

from .test_text_fidelity import _tokenizer


def test_minus_infinity_is_sent_as_minus_9999_in_both_bodies():
    """JSON has no infinity: a -inf log p (a token the processed law rules out), chosen or among the
    alternatives, is -9999.0 (vLLM's value) in chat's and completions' bodies."""
    tok = ByteTokenizer()
    a, b = tok.encode("ab")
    inf = float("-inf")
    chat = LogprobsBody(tok, chat=True).body([a], [inf], [[b]], [[inf]])["content"][0]
    assert FLOOR == -9999.0
    assert (chat["logprob"], chat["top_logprobs"][0]["logprob"]) == (-9999.0, -9999.0)
    body = LogprobsBody(tok, chat=False)
    body.follow([], None)
    got = body.body([a], [inf], [[b]], [[inf]])
    assert got["token_logprobs"] == [-9999.0] and got["top_logprobs"] == [{"a": -9999.0, "b": -9999.0}]


def test_completions_top_logprobs_hold_the_chosen_token_then_the_k_best():
    """Completions' top_logprobs[i]: the chosen token with its log p first, then each alternative
    named by its text (the chosen one, given again among the k best, keeps its own value)."""
    tok = ByteTokenizer()
    a, b, x, y = tok.encode("abxy")
    body = LogprobsBody(tok, chat=False)
    body.follow([], None)
    got = body.body([a, b], [-0.5, -0.25], [[a, x], [y, b]], [[-0.4, -1.5], [-0.1, -0.3]])
    assert got["top_logprobs"] == [{"a": -0.5, "x": -1.5}, {"b": -0.25, "y": -0.1}]
    assert [list(top) for top in got["top_logprobs"]] == [["a", "x"], ["b", "y"]]
    assert got["tokens"] == ["a", "b"] and got["text_offset"] == [0, 1]


def test_a_piece_of_a_character_after_an_invalid_byte_is_offset_where_its_character_begins():
    """b'\\xff' then '中' in three byte ids: the text is '\\ufffd中', and each piece of '中' points where
    '中' begins (1), not at the invalid byte's U+FFFD (0), given one id at a time or all at once."""
    tok = ByteTokenizer()
    ids = list(b"\xff" + "中".encode())
    assert tok.decode(ids) == "\ufffd中"
    for steps in ([ids], [[i] for i in ids]):
        body = LogprobsBody(tok, chat=False)
        body.follow([], None)
        offsets = []
        for step in steps:
            offsets += body.body(step, [0.0] * len(step), [[]] * len(step), [[]] * len(step))["text_offset"]
        assert offsets == [0, 1, 1, 1], steps


def _echoed_offsets(tok, prompt_ids: list[int], echo: str, ids: list[int]) -> list[int]:
    body = LogprobsBody(tok, chat=False)
    body.follow(prompt_ids, echo)
    ids = prompt_ids + ids
    rest = len(ids) - 1
    return body.body(ids, [None] + [0.0] * rest, [None] + [[]] * rest, [None] + [[]] * rest)["text_offset"]


def test_echo_of_a_prompt_with_fewer_ids_than_characters_offsets_the_answer_after_it():
    """Echo with the byte-level BPE: '<|begin_of_text|>The answer is' is 8 ids for 13 characters.
    The answer's tokens are offset after the echoed prompt (its first at 13), each where its text
    begins."""
    decode, encode, _, _, tok = _tokenizer("bpe")
    echo = "The answer is"
    prompt_ids = [0] + encode(echo)  # with Llama 3's BOS
    assert len(prompt_ids) < len(echo)
    ids = encode(" 42, or so")
    text = echo + decode(ids)
    offsets = _echoed_offsets(tok, prompt_ids, echo, ids)
    assert offsets[len(prompt_ids)] == len(echo)
    for token_id, offset in zip(prompt_ids[1:] + ids, offsets[1:], strict=True):
        name = tok.token_bytes(token_id).decode()
        assert text[offset : offset + len(name)] == name, (name, offset, text)


def test_echo_of_a_prompt_that_does_not_decode_back_starts_at_its_first_character():
    """A metaspace tokenizer spells '😀' <unk>, which decodes to nothing: 'a😀b' decodes 'ab', which
    does not end the echoed text, so no lead is assumed and the first token, 'a', is offset 0."""
    decode, encode, _, _, tok = _tokenizer("metaspace")
    echo = "a😀b"
    prompt_ids = encode(echo)
    assert not echo.endswith(decode(prompt_ids))
    offsets = _echoed_offsets(tok, prompt_ids, echo, encode(" ok"))
    assert offsets[0] == 0 and echo[offsets[0]] == "a"



@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("short", ["values", "alternatives"])
def test_a_step_whose_lists_differ_in_length_is_an_error_not_a_shorter_body(chat: bool, short: str):
    """ids, their log p and their alternatives come from one step, so lists of different lengths are
    a caller's mistake: both bodies refuse them (ValueError) rather than drop the tokens or the
    alternatives past the shortest list."""
    tok = ByteTokenizer()
    a, b, x = tok.encode("abx")
    step = {"values": ([a, b], [-0.5], [[x], [x]], [[-1.0], [-1.0]]),
            "alternatives": ([a], [-0.5], [[x, b]], [[-1.0]])}[short]
    body = LogprobsBody(tok, chat=chat)
    body.follow([], None)
    with pytest.raises(ValueError):
        body.body(*step)
