"""The edges of a Triton request's checks (`trtspec.triton.request`): each range's own ends are taken,
the first value past them refused naming the input, and the request parameters' errors (an unknown
field, text that is not UTF-8) name the fields, without a server. Each case was a change to the
module that every other fast test passed (scripts/mutants.py)."""

from __future__ import annotations

import numpy as np
import pytest

from trtspec.spec.logprobs import MAX_TOP_LOGPROBS
from trtspec.spec.sampling import MAX_LOGIT_BIAS, MAX_PENALTY, SamplingParams
from trtspec.spec.thinking_budget import ThinkingBudget
from trtspec.triton.request import (
    MAX_SALT_CHARS,
    MAX_STOP_WORD_CHARS,
    MAX_STOP_WORDS,
    RequestError,
    bad_word_ids,
    check_parameters,
    parameters_not_utf8,
    parse_request,
    salt_length_problem,
    tokenized,
)

VOCAB = 264
GOOD = dict(text_input=np.array([b"hi"], dtype=object), max_tokens=np.array([8], dtype=np.int32))


def _parse(vocab_size: int | None = VOCAB, limit: int = 16, **inputs):
    arrays = {k: np.asarray(v) for k, v in {**GOOD, **inputs}.items() if v is not None}
    return parse_request(arrays.get, limit, vocab_size=vocab_size)


def _ids(*ids: int) -> np.ndarray:
    return np.array(ids, dtype=np.int32)


def test_token_id_zero_and_the_last_id_are_taken_everywhere_an_id_is():
    """Token id 0 and vocab_size - 1 are ids of the target: input_ids, end_id and stop_token_ids take
    them (0 is many tokenizers' <unk> or <pad>, a byte tokenizer's NUL), and vocab_size is refused."""
    last = VOCAB - 1
    assert _parse(text_input=None, input_ids=_ids(0, last)).prompt_ids == (0, last)
    assert _parse(end_id=_ids(0)).end_id == 0
    assert _parse(end_id=_ids(last)).end_id == last
    assert _parse(stop_token_ids=_ids(0, last)).stop_token_ids == (0, last)
    with pytest.raises(RequestError, match=r"input_ids must be token ids in \[0, 264\), got 264 at "
                                           "position 2"):
        _parse(text_input=None, input_ids=_ids(0, 5, VOCAB))
    # without a vocabulary size: any id >= 0, 0 included
    assert _parse(None, text_input=None, input_ids=_ids(0)).prompt_ids == (0,)
    assert _parse(None, end_id=_ids(0), stop_token_ids=_ids(0)).stop_token_ids == (0,)


def test_logit_bias_may_name_every_token_of_the_vocabulary_once():
    """As many logit_bias_ids as the vocabulary holds, each once, at both ends of the bias range, are
    taken; one more is refused before any id is looked at, and an id of vocab_size is named."""
    ids, values = list(range(VOCAB)), [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS] * (VOCAB // 2)
    bias = dict(logit_bias_ids=np.array(ids, dtype=np.int32),
                logit_bias_values=np.array(values, dtype=np.float32))
    assert _parse(**bias).sampling.logit_bias == tuple(zip(ids, map(float, values), strict=True))
    with pytest.raises(RequestError, match=f"logit_bias_ids holds {VOCAB + 1} ids; the vocabulary has "):
        _parse(logit_bias_ids=np.arange(VOCAB + 1, dtype=np.int32),
               logit_bias_values=np.zeros(VOCAB + 1, dtype=np.float32))
    with pytest.raises(RequestError, match=r"logit_bias_ids must be token ids in \[0, 264\), got 264 "
                                           "at position 1"):
        _parse(logit_bias_ids=_ids(0, VOCAB), logit_bias_values=np.array([1, 2], dtype=np.float32))


def test_max_tokens_takes_one_and_the_deployments_limit():
    """max_tokens lies in [1, limit]: both ends taken, limit + 1 refused."""
    assert _parse(max_tokens=_ids(1)).max_tokens == 1
    assert _parse(max_tokens=_ids(16)).max_tokens == 16
    with pytest.raises(RequestError, match=r"max_tokens must be in \[1, 16\], got 17"):
        _parse(max_tokens=_ids(17))


def test_min_p_takes_both_ends_of_zero_to_one():
    """min_p lies in [0, 1]: 0 (off) and 1 (only the likeliest tokens' ties) are taken; past 1 and NaN
    refused."""
    f32 = lambda v: np.array([v], dtype=np.float32)  # noqa: E731
    assert _parse(min_p=f32(0.0)).sampling.min_p == 0.0
    assert _parse(min_p=f32(1.0)).sampling.min_p == 1.0
    for bad in (1.5, float("nan")):
        with pytest.raises(RequestError, match=r"min_p must be in \[0, 1\] \(0 = off\)"):
            _parse(min_p=f32(bad))


def test_penalties_take_both_ends_of_their_range():
    """presence_penalty and frequency_penalty lie in [-MAX_PENALTY, MAX_PENALTY] (OpenAI's [-2, 2]):
    both ends taken, just past them refused naming the input."""
    f32 = lambda v: np.array([v], dtype=np.float32)  # noqa: E731
    for name in ("presence_penalty", "frequency_penalty"):
        for end in (-MAX_PENALTY, MAX_PENALTY):
            assert getattr(_parse(**{name: f32(end)}).sampling, name) == end, (name, end)
        for past in (-MAX_PENALTY - 0.5, MAX_PENALTY + 0.5):
            with pytest.raises(RequestError, match=rf"^{name} must be in \[-2, 2\], got {past}"):
                _parse(**{name: f32(past)})


def test_a_thinking_budget_of_zero_is_taken():
    """thinking_token_budget lies in [0, ...): 0 (close the block at once) is a budget, -1 is refused."""
    budget = lambda n: np.array([n], dtype=np.int32)  # noqa: E731
    assert _parse(thinking_token_budget=budget(0)).thinking == (0, "", "</think>")
    with pytest.raises(RequestError, match="thinking_token_budget must be >= 0, got -1"):
        _parse(thinking_token_budget=budget(-1))


def test_log_probabilities_asked_off_are_off():
    """return_log_probs=false and return_prompt_log_probs=false (what NVIDIA's clients send by
    default) return none: logprobs and prompt_logprobs stay None, not 0 (each token's own log p);
    true returns them, with num_top_log_probs' k best, which takes MAX_TOP_LOGPROBS and no more."""
    no, yes, top = np.array([False]), np.array([True]), lambda k: np.array([k], dtype=np.int32)
    req = _parse(return_log_probs=no, return_prompt_log_probs=no)
    assert (req.logprobs, req.prompt_logprobs) == (None, None)
    req = _parse(return_log_probs=yes, return_prompt_log_probs=yes)
    assert (req.logprobs, req.prompt_logprobs) == (0, 0)
    req = _parse(num_top_log_probs=top(MAX_TOP_LOGPROBS), return_prompt_log_probs=yes)
    assert (req.logprobs, req.prompt_logprobs) == (MAX_TOP_LOGPROBS, MAX_TOP_LOGPROBS)
    assert _parse(num_top_log_probs=top(3), return_prompt_log_probs=no).prompt_logprobs is None
    assert _parse(num_top_log_probs=top(0), return_log_probs=no).logprobs is None
    with pytest.raises(RequestError, match=rf"num_top_log_probs must be in \[0, {MAX_TOP_LOGPROBS}\], got "
                                           rf"{MAX_TOP_LOGPROBS + 1}"):
        _parse(num_top_log_probs=top(MAX_TOP_LOGPROBS + 1))


def test_cache_salt_takes_up_to_its_limit():
    """cache_salt: MAX_SALT_CHARS characters taken, one more refused naming it; "" is none. The
    OpenAI frontend's and `generate --cache-salt`'s check (salt_length_problem) has the same ends, and
    refuses "" (a client that names a salt names one)."""
    salt = lambda n: np.array([b"s" * n], dtype=object)  # noqa: E731
    assert _parse(cache_salt=salt(MAX_SALT_CHARS)).cache_salt == "s" * MAX_SALT_CHARS
    assert _parse(cache_salt=salt(0)).cache_salt == ""
    with pytest.raises(RequestError, match=f"cache_salt has {MAX_SALT_CHARS + 1} characters; at most "
                                           f"{MAX_SALT_CHARS}"):
        _parse(cache_salt=salt(MAX_SALT_CHARS + 1))
    assert salt_length_problem("s") is None and salt_length_problem("s" * MAX_SALT_CHARS) is None
    assert salt_length_problem("") == "expected 1 to 1,024 characters, got 0"
    assert salt_length_problem("s" * (MAX_SALT_CHARS + 1)) == "expected 1 to 1,024 characters, got 1,025"


def test_only_the_id_parameter_is_taken_and_unknown_ones_are_named():
    """A request parameter but `id` (what /generate sets) is refused, every unknown one named in
    order, 'field' for one and 'fields' for several."""
    check_parameters({})
    check_parameters({"id": "r1"})
    with pytest.raises(RequestError, match=r"^unknown request field 'foo'; this model takes text_input, "):
        check_parameters({"id": "r1", "foo": 1})
    with pytest.raises(RequestError, match=r"^unknown request fields 'max_token', 'temprature'; "):
        check_parameters({"temprature": 0.5, "max_token": 4})


def test_parameters_not_utf8_names_the_fields_that_hold_bad_bytes():
    """The bytes Triton could not decode (its JSON, as it hands it over) are read back to name the
    fields that hold them: in the value or the name, the lowest and highest non-ASCII bytes alike
    (0x80, 0xff), one field 'is', several 'are'; JSON that is no object names none."""
    body = lambda text: text.encode("latin-1")  # noqa: E731  (a str of code points < 256 -> those bytes)
    assert parameters_not_utf8(body('{"id": "a", "best_of": "\x80"}')) == \
        "request field 'best_of' is not valid UTF-8"
    assert parameters_not_utf8(body('{"n": ["\xff"], "id": "ok"}')) == "request field 'n' is not valid UTF-8"
    assert parameters_not_utf8(body('{"a\xff": 1, "b": "\x80", "id": "ok"}')) == \
        "request fields 'a\ufffd', 'b' are not valid UTF-8"
    generic = "a request field (a parameter) is not valid UTF-8"
    assert parameters_not_utf8(body('["\xff"]')) == generic
    assert parameters_not_utf8(b'{"id": "\xff') == generic  # cut short: not JSON


def test_the_prompt_is_named_by_the_input_it_came_in():
    """`prompt_input` names the input a too-long prompt is refused by (the served model's context
    check): text_input for text, input_ids for token ids."""
    assert _parse().prompt_input == "text_input"
    assert _parse(text_input=None, input_ids=_ids(5, 6)).prompt_input == "input_ids"


def test_flags_sent_false_are_off_and_add_special_tokens_is_on_by_default():
    """ignore_eos and add_special_tokens as sent, true or false; absent, ignore_eos is off and
    add_special_tokens on (the prompt encoded as tokenizer(text) does, Llama's BOS)."""
    yes, no = np.array([True]), np.array([False])
    assert (_parse().ignore_eos, _parse().add_special_tokens) == (False, True)
    assert (_parse(ignore_eos=no).ignore_eos, _parse(ignore_eos=yes).ignore_eos) == (False, True)
    assert _parse(add_special_tokens=yes).add_special_tokens
    assert not _parse(add_special_tokens=no).add_special_tokens


def test_min_tokens_may_be_max_tokens():
    """min_tokens lies in [0, max_tokens]: all of max_tokens taken (no end before the last), one more
    refused."""
    assert _parse(min_tokens=_ids(8)).min_tokens == 8
    with pytest.raises(RequestError, match=r"min_tokens must be in \[0, max_tokens=8\], got 9"):
        _parse(min_tokens=_ids(9))


def test_stop_and_bad_words_take_their_limits():
    """stop_words and bad_words take MAX_STOP_WORDS words of MAX_STOP_WORD_CHARS characters; one
    word more, or one character more, is refused naming the input (and the word's place)."""
    words = lambda n, chars: np.array([b"%03d" % i + b"x" * (chars - 3) for i in range(n)],  # noqa: E731
                                        dtype=object)
    for name in ("stop_words", "bad_words"):
        assert len(getattr(_parse(**{name: words(MAX_STOP_WORDS, 3)}), name)) == MAX_STOP_WORDS
        longest = getattr(_parse(**{name: words(2, MAX_STOP_WORD_CHARS)}), name)
        assert [len(w) for w in longest] == [MAX_STOP_WORD_CHARS] * 2
        with pytest.raises(RequestError, match=f"^{name} holds {MAX_STOP_WORDS + 1} words; at most "):
            _parse(**{name: words(MAX_STOP_WORDS + 1, 3)})
        with pytest.raises(RequestError, match=rf"^{name}\[1\] has {MAX_STOP_WORD_CHARS + 1} characters"):
            _parse(**{name: np.array([b"ok", b"x" * (MAX_STOP_WORD_CHARS + 1)], dtype=object)})


def test_bad_words_are_banned_as_written_and_after_a_space():
    """`bad_word_ids`: each bad word's ids as it stands and after a space (how a BPE writes a word
    inside the text), leading spaces dropped first, each sequence once; `tokenized` puts them and a
    reasoning budget's tags into the sampling parameters in ids."""
    encode = lambda text: list(text.encode())  # noqa: E731
    assert bad_word_ids(encode, ["ab", "  ab", " c"]) == ((97, 98), (32, 97, 98), (99,), (32, 99))
    assert bad_word_ids(encode, []) == ()
    sampling = tokenized(SamplingParams(), encode, ["ab"], (3, "<t>", "</t>"))
    assert sampling.bad_words == ((97, 98), (32, 97, 98))
    assert sampling.thinking == ThinkingBudget(budget=3, start=tuple(b"<t>"), end=tuple(b"</t>"))
    assert tokenized(SamplingParams(), encode) == SamplingParams()
