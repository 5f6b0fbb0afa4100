"""`TextStream` and `context_of` (`trtspec.triton.request`) on hand-picked cases where the served
model must stop or read its context differently from what the frontend's own trimming hides: a
stop word at the very start, right past min_tokens' text, or across steps beside a shorter one,
and a prompt cut inside a character. Each case was a change to the module that every other fast
test passed (scripts/mutants.py): the text the frontend returns stayed right, the ids the model
generated did not; and the text kept between steps, which bounds each step's search."""

from __future__ import annotations

import random

from trtspec.tokenizer import ByteTokenizer
from trtspec.triton.request import CONTEXT_IDS, CONTEXT_REACH, TextStream, context_of


def test_a_stop_word_that_is_the_first_character_stops_at_once():
    """Without min_tokens nothing is protected: a stop word written by the first id ends the output
    there."""
    tok = ByteTokenizer()
    stream = TextStream(tok.decode, stop_words=("a",))
    delta, kept = stream.push(tok.encode("abc"))
    assert (delta, kept, stream.stopped) == ("a", tok.encode("a"), True)


def test_a_stop_word_ending_one_character_past_min_tokens_text_stops():
    """min_tokens = 2 protects 'ab'; ';' (the third character) ends past it, so the output stops at
    it; so does 'b;', which begins inside the protected text."""
    tok = ByteTokenizer()
    ids = tok.encode("ab;cd")
    for word in (";", "b;"):
        stream = TextStream(tok.decode, stop_words=(word,), min_tokens=2)
        delta, kept = stream.push(ids)
        assert (delta, kept, stream.stopped) == ("ab;", ids[:3], True), word


def test_a_long_stop_word_across_steps_is_found_beside_a_shorter_one():
    """'END' arriving as 'EN' then 'D', beside a one-character stop word: the text kept between
    steps must cover the longest stop word, not the shortest."""
    tok = ByteTokenizer()
    stream = TextStream(tok.decode, stop_words=("x", "END"))
    assert stream.push(tok.encode("abEN")) == ("abEN", tok.encode("abEN")) and not stream.stopped
    delta, kept = stream.push(tok.encode("Dyz"))
    assert (delta, kept, stream.stopped) == ("D", tok.encode("D"), True)


def test_a_prompt_cut_inside_a_character_gives_no_context():
    """A prompt whose ids end inside a character ('a' and two of '€''s three bytes): its last ids are
    no context (their text ends in U+FFFD), so the answer's bytes are read on their own: the '€''s
    last byte alone is U+FFFD, not swallowed into the prompt's character."""
    tok = ByteTokenizer()
    euro = tok.encode("€")
    prompt = tok.encode("a") + euro[:2]
    assert context_of(tok.decode, prompt) == ()
    stream = TextStream(tok.decode, context=context_of(tok.decode, prompt))
    text = stream.push([euro[2], *tok.encode("b")])[0] + stream.finish()
    assert text == "\ufffdb"


def test_the_context_reaches_back_a_bounded_way_and_only_past_a_cut_character():
    """`context_of` reaches back past ids without text, CONTEXT_REACH ids at most (a prompt of 40,000
    special ids is not decoded whole on the serving loop); a U+FFFD inside the last ids' text (a
    literal one, or invalid bytes) keeps the first window: only text that begins inside a character
    makes it reach further."""
    tok = ByteTokenizer()
    decoded: list[int] = []

    def decode(ids: list[int]) -> str:
        decoded.append(len(ids))
        return tok.decode(ids)

    specials = [tok.eos_id] * 40_000
    assert len(context_of(decode, tok.encode("a") + specials)) == CONTEXT_REACH
    assert max(decoded) <= CONTEXT_REACH
    for ids in (tok.encode("some text x\ufffdyz"), list(b"some text x\xffyz")):
        assert context_of(tok.decode, ids) == tuple(ids[-CONTEXT_IDS:]), ids
    cut = tok.encode("some text €bcdef")  # the last 6 ids begin with the '€''s last byte
    assert context_of(tok.decode, cut) == tuple(cut[-CONTEXT_IDS - 2:])  # from the '€' on


def test_a_context_in_a_run_of_byte_ids_begins_on_a_character():
    """A byte-fallback prompt ending in characters of 3 and 4 bytes spelt in byte ids ('中' × 40, '😀'):
    no window of 6, 12, 24, 48 or 96 ids begins on a character, and the decoder turns a run cut
    inside one into U+FFFD whole, so the context was none and the answer lost its first space; a
    window up to 3 ids longer begins on one."""
    from .test_text_fidelity import _tokenizer

    decode, encode, _, _, _ = _tokenizer("byte_fallback")
    prompt_ids = encode("中" * 40 + "😀")
    context = context_of(decode, prompt_ids)
    assert context and not decode(list(context)).startswith("\ufffd")
    answer = encode("a b")[1:]  # '▁b': a word's piece, its space stripped when decoded alone
    stream = TextStream(decode, context=context)
    text = stream.push(answer)[0] + stream.finish()
    assert text == decode(prompt_ids + answer)[len(decode(prompt_ids)):] == " b"


def test_an_end_id_that_writes_text_ends_the_output_without_its_text():
    """An id of `end_ids` (a request's stop id may be a plain token, here ';') is kept in the output
    but its own text is left out, as vLLM and TensorRT-LLM leave a stop token's text out, in the
    delta, the stream's text and what finish gives."""
    tok = ByteTokenizer()
    ids = tok.encode("ab;cd")
    stream = TextStream(tok.decode, end_ids=frozenset({ids[2]}))
    delta, kept = stream.push(ids)
    assert (delta, kept, stream.stopped) == ("ab", ids[:3], True)
    assert (stream.text, stream.held, stream.finish()) == ("ab", "", "")


def test_the_context_window_doubles_so_few_windows_are_decoded():
    """`context_of` reaching back past ids without text tries windows twice as long each time (and
    the 3 past each), not every length up to CONTEXT_REACH: over a prompt of special ids that is a
    handful of decodes on the serving loop, and the window it settles on is one of those lengths."""
    tok = ByteTokenizer()
    decoded: list[int] = []

    def decode(ids: list[int]) -> str:
        decoded.append(len(ids))
        return tok.decode(ids)

    assert len(context_of(decode, tok.encode("a") + [tok.eos_id] * 40_000)) == CONTEXT_REACH
    sizes, size = [], CONTEXT_IDS
    while size < CONTEXT_REACH:
        sizes += range(size, size + 4)
        size *= 2
    assert decoded == [*sizes, CONTEXT_REACH]
    prompt = tok.encode("xyz") + [tok.eos_id] * 10  # the windows of 6 to 9 ids hold no text
    assert context_of(tok.decode, prompt) == tuple(prompt[-12:])


def test_the_text_kept_for_stop_words_is_one_character_short_of_the_longest():
    """Between steps a stream keeps only the last (longest stop word - 1) characters of its text, where
    a stop word ending in the next piece may begin: each step searches a bounded window, not the
    whole answer (one-character stop words keep none). Random lowercase text in random pieces, none
    holding a stop word."""
    tok = ByteTokenizer()
    rng = random.Random(0)
    text = "".join(rng.choice("abcdefghij") for _ in range(200))
    ids = tok.encode(text)
    for words in (("x",), ("END", "q"), ("zzzzzz",)):
        stream = TextStream(tok.decode, stop_words=words)
        keep = max(map(len, words)) - 1
        at = 0
        while at < len(ids):
            step = rng.randint(1, 7)
            stream.push(ids[at:at + step])
            at = min(at + step, len(ids))
            assert stream.tail == (text[max(0, at - keep):at] if keep else ""), (words, at)
        assert stream.text == text and not stream.stopped
