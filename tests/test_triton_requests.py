"""The frontend's requests to the model and its stream calls, without the model: a Generation's
inputs (only what differs from the model's defaults), the ModelInferRequest built of them, answers
whose contents come in the typed fields, the figures a step reads, and TritonStream against an
in-process gRPC server that answers as Triton does (a call answered left to end by itself, one cut
short cancelled, an abort turned into an error)."""

from __future__ import annotations

import asyncio
import struct

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from trtspec.openai.triton_stream import (
    Generation,
    Step,
    TritonError,
    TritonStream,
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


def _answer(text: str, final: bool) -> service_pb2.ModelStreamInferResponse:
    response = service_pb2.ModelStreamInferResponse()
    response.infer_response.parameters["triton_final_response"].bool_param = final
    _outputs(response, ("text_output", "BYTES", [1], struct.pack("<I", len(text)) + text.encode()))
    return response


class _Model(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers as the model named: "answer" two responses, the second final, then keeps the call open
    a moment as Triton does before it closes it; "refuse" an error; "stall" one response, then
    nothing; "silent" no response at all; "cut" one response, then the call ends. `cancelled`: the
    models whose call was cancelled."""

    def __init__(self):
        self.cancelled: list[str] = []
        self.reading = asyncio.Event()

    async def ModelReady(self, request, context):  # noqa: N802 - gRPC's name
        return service_pb2.ModelReadyResponse(ready=request.name == "answer")

    async def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - gRPC's name
        request = await anext(aiter(request_iterator))
        model = request.model_name
        try:
            if model == "silent":
                self.reading.set()
                await asyncio.sleep(30)
            if model == "refuse":
                yield service_pb2.ModelStreamInferResponse(error_message="the prompt is too long")
            else:
                yield _answer("1+", final=False)
            if model == "answer":
                yield _answer("2=3", final=True)
            self.reading.set()
            if model in ("answer", "refuse"):
                await asyncio.sleep(0.2)
            elif model == "stall":
                await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.append(model)
            raise


async def _served(body):
    server = grpc.aio.server()
    model = _Model()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(model, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    triton = TritonStream(f"127.0.0.1:{port}", "answer")
    try:
        return await asyncio.wait_for(body(triton, model), 10)
    finally:
        await triton.close()
        await server.stop(None)


def _run(body):
    return asyncio.run(_served(body))


def _as(triton: TritonStream, model: str) -> TritonStream:
    triton.model = model
    return triton


def test_an_answered_call_is_left_to_end_by_itself():
    async def body(triton, model):
        steps = [s async for s in triton.generate(Generation("1+2=", 8))]
        await asyncio.sleep(0.3)
        return steps, model.cancelled

    steps, cancelled = _run(body)
    assert [(s.text, s.final) for s in steps] == [("1+", False), ("2=3", True)]
    assert cancelled == []  # cancelling it would keep its state in tritonserver for good


def test_a_refusal_is_an_error_and_its_call_left_to_end_by_itself():
    async def body(triton, model):
        with pytest.raises(TritonError, match="the prompt is too long") as refused:
            async for _ in _as(triton, "refuse").generate(Generation("1+2=", 8)):
                pass
        await asyncio.sleep(0.3)
        return refused.value, model.cancelled

    refusal, cancelled = _run(body)
    assert not refusal.unavailable and cancelled == []


@pytest.mark.parametrize("model", ["stall", "silent"])
def test_a_call_cut_short_is_cancelled_at_once(model):
    """Cut after a first response, or before any: not waited on to end by itself."""
    name = model

    async def body(triton, model):
        loop = asyncio.get_running_loop()
        reader = asyncio.ensure_future(_drain(_as(triton, name)))
        await model.reading.wait()
        start = loop.time()
        reader.cancel()  # the HTTP client went away
        with pytest.raises(asyncio.CancelledError):
            await reader
        took = loop.time() - start
        await asyncio.sleep(0.1)
        return took, model.cancelled

    took, cancelled = _run(body)
    assert took < 1 and cancelled == [name]


async def _drain(triton: TritonStream) -> list[Step]:
    return [s async for s in triton.generate(Generation("1+2=", 8))]


def test_an_abort_cuts_the_calls_in_flight_with_its_reason_and_refuses_new_ones():
    async def body(triton, model):
        reader = asyncio.ensure_future(_drain(_as(triton, "stall")))
        await model.reading.wait()
        triton.abort("the server is shutting down")
        with pytest.raises(TritonError, match="shutting down") as cut:
            await reader
        with pytest.raises(TritonError, match="shutting down") as refused:
            await _drain(triton)
        return cut.value, refused.value

    cut, refused = _run(body)
    assert cut.unavailable and refused.unavailable


def test_a_stream_ending_before_its_final_response_is_unavailable():
    async def body(triton, model):
        with pytest.raises(TritonError, match="ended before its final response") as ended:
            await _drain(_as(triton, "cut"))
        return ended.value

    assert _run(body).unavailable


def test_readiness_is_the_models_and_an_unreachable_triton_is_not_ready():
    async def body(triton, model):
        dead = TritonStream("127.0.0.1:1", "answer")
        try:
            return await triton.ready(), await _as(triton, "stall").ready(), await dead.ready()
        finally:
            await dead.close()

    assert _run(body) == (True, False, False)
