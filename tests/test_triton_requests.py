"""The frontend's requests to the model, without the model: a Generation's inputs (only what differs
from the model's defaults) and the ModelInferRequest built of them; a Step before any answer. How
answers are read: test_triton_stream. TritonStream's calls (an answered call left to end by itself,
one cut short cancelled) are tested against a real tritonserver in test_openai."""

from __future__ import annotations

import numpy as np

from trtspec.openai.triton_stream import (
    Generation,
    Step,
    _elements,
    infer_request,
)


def test_a_plain_generation_sends_only_the_models_required_inputs():
    arrays = Generation("1+2=", 8).arrays()
    assert list(arrays) == ["text_input", "max_tokens", "temperature", "top_p", "top_k", "stream"]
    assert arrays["text_input"].tolist() == [b"1+2="] and arrays["max_tokens"].tolist() == [8]
    assert arrays["temperature"].tolist() == [0.0] and arrays["top_p"].tolist() == [1.0]
    assert arrays["top_k"].tolist() == [0] and arrays["stream"].tolist() == [True]


def test_a_generation_sends_what_differs_from_the_defaults():
    arrays = Generation("", 8, prompt_ids=(5, 6), min_tokens=2, ignore_eos=True, presence_penalty=0.5,
                        logprobs=0, prompt_logprobs=True, add_special_tokens=False, stream=False).arrays()
    assert "text_input" not in arrays and arrays["input_ids"].tolist() == [5, 6]
    assert arrays["min_tokens"].tolist() == [2] and arrays["ignore_eos"].tolist() == [True]
    assert arrays["presence_penalty"].tolist() == [0.5]
    assert "frequency_penalty" not in arrays and "repetition_penalty" not in arrays  # at their defaults
    assert arrays["return_log_probs"].tolist() == [True] and "num_top_log_probs" not in arrays  # logprobs=0
    assert arrays["return_prompt_log_probs"].tolist() == [True]
    assert arrays["add_special_tokens"].tolist() == [False] and arrays["stream"].tolist() == [False]
    assert Generation("", 8, logprobs=3).arrays()["num_top_log_probs"].tolist() == [3]


def test_a_step_starts_empty_and_not_final():
    step = Step()
    assert (step.text, step.ids, step.finish_reason, step.final) == ("", [], None, False)
    assert (step.accepted_tokens, step.draft_tokens, step.target_forwards, step.cached_tokens,
            step.prediction_tokens, step.accepted_prediction_tokens) == (0, 0, 0, 0, 0, 0)


def test_a_request_asks_for_an_empty_final_response_and_carries_its_inputs_raw():
    arrays = Generation("é+1", 4, stop_words=("\n", "ab")).arrays()
    request = infer_request("trtspec", arrays, "r1")
    assert request.parameters["triton_enable_empty_final_response"].bool_param is True
    assert (request.model_name, request.id) == ("trtspec", "r1")
    assert [i.name for i in request.inputs] == list(arrays)
    raw = dict(zip(list(arrays), request.raw_input_contents, strict=True))
    assert _elements(raw["text_input"]) == ["é+1".encode()]  # BYTES: length-prefixed elements
    assert _elements(raw["stop_words"]) == [b"\n", b"ab"]
    assert np.frombuffer(raw["max_tokens"], np.int32).tolist() == [4]
