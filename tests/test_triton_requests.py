"""The frontend's requests to the model, without the model: a Generation's inputs (only what differs
from the model's defaults), the ModelInferRequest built of them, answers whose contents come in the
typed fields, and the figures a step reads. TritonStream's calls (an answered call left to end by
itself, one cut short cancelled) are tested against a real tritonserver in test_openai."""

from __future__ import annotations

import struct

import numpy as np
from tritonclient.grpc import service_pb2

from trtspec.openai.triton_stream import (
    Generation,
    Step,
    _elements,
    _step,
    _tensors,
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


def test_an_answer_with_contents_in_the_typed_fields_reads_as_the_raw_one():
    """Fewer raw contents than outputs (a BYTES one in bytes_contents): read by tritonclient, in the
    same forms, BYTES as a list of its elements."""
    infer = service_pb2.ModelInferResponse()
    infer.outputs.add(name="output_ids", datatype="INT32", shape=[1, 3])
    infer.raw_output_contents.append(np.array([7, 8, 9], dtype=np.int32).tobytes())
    text = infer.outputs.add(name="text_output", datatype="BYTES", shape=[1, 2])
    text.contents.bytes_contents.extend([b"ab", b"c"])
    tensors = _tensors(infer)
    assert isinstance(tensors["output_ids"], np.ndarray) and tensors["output_ids"].tolist() == [[7, 8, 9]]
    assert tensors["text_output"] == [b"ab", b"c"]


def _outputs(response: service_pb2.ModelStreamInferResponse, *outputs) -> None:
    infer = response.infer_response
    for name, datatype, shape, raw in outputs:
        out = infer.outputs.add(name=name, datatype=datatype)
        out.shape.extend(shape)
        infer.raw_output_contents.append(raw)


def _i32(*values) -> bytes:
    return np.array(values, dtype=np.int32).tobytes()


def test_a_step_reads_the_final_figures_and_prompt_log_probs():
    response = service_pb2.ModelStreamInferResponse()
    response.infer_response.parameters["triton_final_response"].bool_param = True
    prompt = np.array([-0.5, -1.5], dtype=np.float32)
    _outputs(response, ("output_ids", "INT32", [1, 2], _i32(3, 4)),
             ("accepted_tokens", "INT32", [1], _i32(5)), ("draft_tokens", "INT32", [1], _i32(6)),
             ("target_forwards", "INT32", [1], _i32(7)), ("cached_tokens", "INT32", [1], _i32(8)),
             ("prediction_tokens", "INT32", [1], _i32(9)),
             ("accepted_prediction_tokens", "INT32", [1], _i32(10)),
             ("finish_reason", "BYTES", [1], struct.pack("<I", 4) + b"stop"),
             ("prompt_log_probs", "FP32", [2], prompt.tobytes()))
    step = _step(response)
    assert step.final and step.ids == [3, 4] and step.finish_reason == "stop"
    assert (step.accepted_tokens, step.draft_tokens, step.target_forwards, step.cached_tokens,
            step.prediction_tokens, step.accepted_prediction_tokens) == (5, 6, 7, 8, 9, 10)
    assert step.prompt_logprobs == prompt.tolist() and step.logprobs == []
    assert step.prompt_top_ids == [[], []] and step.prompt_top_logprobs == [[], []]  # no top ones asked


def test_a_step_with_no_figures_keeps_them_zero():
    response = service_pb2.ModelStreamInferResponse()
    _outputs(response, ("output_ids", "INT32", [1], _i32(3)))
    step = _step(response)
    assert (step.ids, step.final, step.text, step.finish_reason) == ([3], False, "", None)
    assert (step.accepted_tokens, step.target_forwards, step.cached_tokens, step.prediction_tokens) == \
        (0, 0, 0, 0)
