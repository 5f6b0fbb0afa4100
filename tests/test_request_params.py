"""The edges of a Triton request's checks (`trtspec.triton.request`): each range's own ends are taken,
the first value past them refused naming the input, and the request parameters' errors (an unknown
field, text that is not UTF-8) name the fields, without a server. Each case was a change to the
module that every other fast test passed (scripts/mutants.py)."""

from __future__ import annotations

import numpy as np
import pytest

from trtspec.spec.sampling import MAX_LOGIT_BIAS
from trtspec.triton.request import (
    RequestError,
    parse_request,
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
