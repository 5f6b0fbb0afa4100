"""The frontend's reader of Triton's gRPC answers: every output tensor as tritonclient reads it.

Answers are built as Triton's gRPC server lays them out (`raw_output_contents`, BYTES elements
length-prefixed), with random shapes, values and byte strings (empty ones, invalid UTF-8), and read
by tritonclient's own `InferResult.as_numpy` beside ours."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tritonclient.grpc import InferResult, service_pb2

from trtspec.openai.triton_stream import NUMPY_TYPES, TritonError, _elements, _step, _tensors


def _answer(rng: np.random.Generator, final: bool = True) -> service_pb2.ModelStreamInferResponse:
    response = service_pb2.ModelStreamInferResponse()
    infer = response.infer_response
    infer.parameters["triton_final_response"].bool_param = final
    for i, datatype in enumerate([*NUMPY_TYPES, "BYTES", "BYTES"] * 2):
        shape = tuple(int(n) for n in rng.integers(0, 4, size=rng.integers(1, 3)))
        out = infer.outputs.add()
        out.name, out.datatype = f"out{i}", datatype
        out.shape.extend(shape)
        size = int(np.prod(shape))
        if datatype == "BYTES":
            items = [rng.bytes(int(rng.integers(0, 9))) for _ in range(size)]
            infer.raw_output_contents.append(b"".join(struct.pack("<I", len(b)) + b for b in items))
        elif datatype == "BOOL":
            infer.raw_output_contents.append(rng.integers(0, 2, size=size).astype(bool).tobytes())
        else:
            dtype = np.dtype(NUMPY_TYPES[datatype])
            values = rng.integers(-1000, 1000, size=size) if dtype.kind in "iu" else rng.normal(size=size)
            infer.raw_output_contents.append(np.abs(values).astype(dtype).tobytes() if dtype.kind == "u"
                                             else values.astype(dtype).tobytes())
    return response


@pytest.mark.parametrize("seed", range(20))
def test_every_output_reads_as_tritonclient_reads_it(seed):
    infer = _answer(np.random.default_rng(seed)).infer_response
    theirs, ours = InferResult(infer), _tensors(infer)
    assert list(ours) == [out.name for out in infer.outputs]
    for out in infer.outputs:
        want = theirs.as_numpy(out.name)
        if out.datatype == "BYTES":
            assert ours[out.name] == list(want.reshape(-1)), out.name
        else:
            assert ours[out.name].dtype == want.dtype and ours[out.name].shape == want.shape, out.name
            np.testing.assert_array_equal(ours[out.name], want)


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


def test_a_step_reads_the_models_outputs():
    rng = np.random.default_rng(3)
    response = service_pb2.ModelStreamInferResponse()
    infer = response.infer_response
    infer.parameters["triton_final_response"].bool_param = False
    text = "é" * int(rng.integers(1, 5)) + "x"
    ids = rng.integers(0, 259, size=3).astype(np.int32)
    logprobs = -rng.random(3).astype(np.float32)
    top = -rng.random((3, 2)).astype(np.float32)
    outputs = [("text_output", "BYTES", [1], struct.pack("<I", len(text.encode())) + text.encode()),
               ("output_ids", "INT32", [3], ids.tobytes()),
               ("accepted_tokens", "INT32", [1], np.int32(7).tobytes()),
               ("draft_tokens", "INT32", [1], np.int32(9).tobytes()),
               ("finish_reason", "BYTES", [1], struct.pack("<I", 6) + b"length"),
               ("output_log_probs", "FP32", [3], logprobs.tobytes()),
               ("top_log_probs", "FP32", [3, 2], top.tobytes()),
               ("top_log_prob_ids", "INT32", [3, 2], np.arange(6, dtype=np.int32).tobytes())]
    _outputs(response, *outputs)
    step = _step(response)
    assert (step.text, step.ids, step.accepted_tokens, step.draft_tokens, step.finish_reason, step.final) == \
        (text, ids.tolist(), 7, 9, "length", False)
    assert step.logprobs == logprobs.tolist() and step.top_logprobs == top.tolist()
    assert step.top_ids == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize("raw", [b"\x05\x00\x00\x00abc", b"\x01\x00", b"\x00\x00\x00\x00\x02\x00\x00\x00a"])
def test_a_cut_bytes_tensor_is_refused_not_read_short(raw):
    with pytest.raises(TritonError, match="malformed answer"):
        _elements(raw)


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
