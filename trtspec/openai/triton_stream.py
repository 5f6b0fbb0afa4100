"""The frontend's path to the model: one Triton `ModelStreamInfer` call per OpenAI request.

Every request goes through the served model's continuous-batching loop, exactly like a KServe
client's. Requests are built as `ModelInferRequest` protobufs for the async gRPC stub (asyncio,
so one event loop serves every HTTP connection) with `triton_enable_empty_final_response`, so the
end of each request is known even when its last response carries no outputs. Cancelling the call
(the HTTP client went away) cancels the request inside Triton: the model's sender reports it
cancelled and the decoder drops it at its next step. A call whose request was answered is left to
end by itself, never cancelled (`_end`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import numpy as np
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

from trtspec.triton.client import (
    PENALTY_DEFAULTS,
    guide_arrays,
    logit_bias_arrays,
    salt_arrays,
    thinking_arrays,
    word_arrays,
)

# how long an answered stream call may take to end by itself before it is cancelled after all
END_WAIT_S = 5.0


class TritonError(Exception):
    """The model refused the request (a bad parameter) or Triton could not be reached."""

    def __init__(self, message: str, unavailable: bool = False):
        super().__init__(message)
        self.unavailable = unavailable


@dataclass(frozen=True, slots=True)
class Generation:
    """One request's parameters in the served model's inputs."""

    prompt: str  # text ("" when it goes as prompt_ids)
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    min_tokens: int = 0
    stop_words: tuple[str, ...] = ()
    stream: bool = True
    add_special_tokens: bool = True  # false for a rendered chat template: it holds them already
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k: each token's log p and the k most likely tokens'
    prompt_ids: tuple[int, ...] | None = None  # the prompt as token ids (instead of text)
    prompt_logprobs: bool = False  # the prompt's tokens' log p too (with logprobs' k)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)
    guide: tuple[str, str] | None = None  # (guided_decoding_guide_type, guided_decoding_guide)
    bad_words: tuple[str, ...] = ()  # TensorRT-LLM's bad_words input
    thinking: tuple[int, str] | None = None  # a reasoning budget: (tokens, the text that opens the block)
    prediction: str = ""  # predicted outputs: text the answer is expected to repeat
    cache_salt: str = ""  # vLLM's: cached prompts and the lookup pool shared with the same salt only

    def arrays(self) -> dict[str, np.ndarray]:
        if self.prompt_ids is None:
            arrays = {"text_input": np.array([self.prompt.encode("utf-8")], dtype=np.object_)}
        else:
            arrays = {"input_ids": np.array(self.prompt_ids, dtype=np.int32)}
        arrays |= {
            "max_tokens": np.array([self.max_tokens], dtype=np.int32),
            "temperature": np.array([self.temperature], dtype=np.float32),
            "top_p": np.array([self.top_p], dtype=np.float32),
            "top_k": np.array([self.top_k], dtype=np.int32),
            "stream": np.array([self.stream], dtype=bool),
        }
        if self.min_p:
            arrays["min_p"] = np.array([self.min_p], dtype=np.float32)
        if self.seed is not None:
            arrays["random_seed"] = np.array([self.seed], dtype=np.uint64)
        if self.min_tokens:
            arrays["min_tokens"] = np.array([self.min_tokens], dtype=np.int32)
        if self.stop_token_ids:
            arrays["stop_token_ids"] = np.array(self.stop_token_ids, dtype=np.int32)
        if self.ignore_eos:
            arrays["ignore_eos"] = np.array([True], dtype=bool)
        for name, off in PENALTY_DEFAULTS.items():
            if getattr(self, name) != off:
                arrays[name] = np.array([getattr(self, name)], dtype=np.float32)
        arrays |= logit_bias_arrays(self.logit_bias) | guide_arrays(self.guide)
        if self.logprobs is not None:
            arrays["return_log_probs"] = np.array([True], dtype=bool)
            if self.logprobs:
                arrays["num_top_log_probs"] = np.array([self.logprobs], dtype=np.int32)
        if self.prompt_logprobs:
            arrays["return_prompt_log_probs"] = np.array([True], dtype=bool)
        if not self.add_special_tokens:
            arrays["add_special_tokens"] = np.array([False], dtype=bool)
        arrays |= word_arrays(stop_words=self.stop_words, bad_words=self.bad_words)
        if self.prediction:
            arrays["prediction"] = np.array([self.prediction.encode("utf-8")], dtype=np.object_)
        return arrays | thinking_arrays(self.thinking) | salt_arrays(self.cache_salt)


@dataclass(slots=True)
class Step:
    """One response of the model: new text and ids; totals on the last one."""

    text: str = ""
    ids: list[int] = field(default_factory=list)
    accepted_tokens: int = 0
    draft_tokens: int = 0
    target_forwards: int = 0
    cached_tokens: int = 0  # prompt tokens kept from an earlier request (prefix reuse)
    prediction_tokens: int = 0  # with the totals: drafts taken from the request's prediction
    accepted_prediction_tokens: int = 0  # ... and of them accepted
    finish_reason: str | None = None  # with the totals: stop / length
    final: bool = False
    logprobs: list[float] = field(default_factory=list)  # one per id, when the request asked for them
    top_ids: list[list[int]] = field(default_factory=list)  # [n][k]
    top_logprobs: list[list[float]] = field(default_factory=list)  # [n][k]
    # with the first response, when asked: the prompt's tokens after its first, as above
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_top_ids: list[list[int]] = field(default_factory=list)
    prompt_top_logprobs: list[list[float]] = field(default_factory=list)


def infer_request(model: str, arrays: dict[str, np.ndarray], request_id: str):
    """A ModelInferRequest protobuf with `arrays` as raw inputs."""
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    for name, value in arrays.items():
        # data goes in raw_input_contents, in the order of the inputs
        request.inputs.add(name=name, datatype=np_to_triton_dtype(value.dtype), shape=list(value.shape))
        if value.dtype == np.object_:
            serialized = serialize_byte_tensor(value)
            request.raw_input_contents.append(serialized.item() if serialized.size else b"")
        else:
            request.raw_input_contents.append(value.tobytes())
    return request


# the numeric datatypes of the model's outputs, as Triton's gRPC answers lay them out (little-endian)
NUMPY_TYPES = {"INT32": "<i4", "INT64": "<i8", "UINT64": "<u8", "FP32": "<f4", "BOOL": "?"}


def _elements(raw: bytes) -> list[bytes]:
    """A BYTES tensor's elements: each a 4-byte little-endian length, then that many bytes."""
    out, at = [], 0
    while at < len(raw):
        size = int.from_bytes(raw[at : at + 4], "little")
        if at + 4 + size > len(raw):
            raise TritonError(f"a malformed answer from Triton: a BYTES element of {size} bytes at byte {at} "
                              f"of {len(raw)}")
        out.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def _tensors(infer: service_pb2.ModelInferResponse) -> dict:
    """Every output of an answer by name, read in one pass from its raw contents (where Triton's
    gRPC server puts them): BYTES as a list of bytes, numbers as arrays of their shape.
    tritonclient's `InferResult.as_numpy`, called once per output, looks each up by name and turns
    BYTES into object arrays: 30 µs for a streamed answer's outputs against 13 µs here, of about
    320 µs the frontend's process spends per streamed answer (2-core CPU)."""
    if len(infer.raw_output_contents) != len(infer.outputs):  # contents in the typed fields: rare
        result = InferResult(infer)
        return {out.name: result.as_numpy(out.name) if out.datatype != "BYTES" else
                list(result.as_numpy(out.name).reshape(-1)) for out in infer.outputs}
    out = {}
    for tensor, raw in zip(infer.outputs, infer.raw_output_contents, strict=True):
        if tensor.datatype == "BYTES":
            out[tensor.name] = _elements(raw)
        else:
            out[tensor.name] = np.frombuffer(raw, NUMPY_TYPES[tensor.datatype]).reshape(tuple(tensor.shape))
    return out


def _step(response: service_pb2.ModelStreamInferResponse) -> Step:
    if response.error_message:
        raise TritonError(response.error_message)
    infer = response.infer_response
    tensors = _tensors(infer)
    step = Step(final=infer.parameters["triton_final_response"].bool_param)
    if "text_output" in tensors:
        step.text = b"".join(tensors["text_output"]).decode("utf-8", errors="replace")
    if "output_ids" in tensors:
        step.ids = tensors["output_ids"].reshape(-1).tolist()
    if "accepted_tokens" in tensors:
        step.accepted_tokens = int(tensors["accepted_tokens"].reshape(-1)[0])
        step.draft_tokens = int(tensors["draft_tokens"].reshape(-1)[0])
    if "target_forwards" in tensors:
        step.target_forwards = int(tensors["target_forwards"].reshape(-1)[0])
    if "cached_tokens" in tensors:
        step.cached_tokens = int(tensors["cached_tokens"].reshape(-1)[0])
    if "prediction_tokens" in tensors:
        step.prediction_tokens = int(tensors["prediction_tokens"].reshape(-1)[0])
        step.accepted_prediction_tokens = int(tensors["accepted_prediction_tokens"].reshape(-1)[0])
    if "finish_reason" in tensors:
        step.finish_reason = b"".join(tensors["finish_reason"]).decode()
    for prefix, values in (("", "output_log_probs"), ("prompt_", "prompt_log_probs")):
        if values in tensors:
            got = tensors[values].reshape(-1).tolist()
            if f"{prefix}top_log_probs" in tensors:
                top_values = tensors[f"{prefix}top_log_probs"].tolist()
                top_ids = tensors[f"{prefix}top_log_prob_ids"].tolist()
            else:
                top_values, top_ids = [[] for _ in got], [[] for _ in got]
            target = ("logprobs", "top_ids", "top_logprobs") if not prefix else \
                ("prompt_logprobs", "prompt_top_ids", "prompt_top_logprobs")
            for name, value in zip(target, (got, top_ids, top_values), strict=True):
                setattr(step, name, value)
    return step


async def _end(call, answered: bool) -> None:
    """End a stream call: one whose request was answered ends by itself (Triton closes it once the
    request is complete), so wait for that; only a call cut short is cancelled. tritonserver 2.51
    keeps the state of a stream cancelled after its last response for good: cancelling every call
    grew the server by 6.7 KB a request (2.0 MB per 300 streamed requests of 32 tokens, against
    0.06-0.18 MB left alone; README, "Memory under long load")."""
    if answered:
        try:
            await asyncio.wait_for(call.code(), END_WAIT_S)
            return
        except TimeoutError:
            pass
    call.cancel()


class TritonStream:
    """Async client of one served model over gRPC; one channel, one stream call per request."""

    def __init__(self, address: str, model: str):
        self.address, self.model = address, model
        self._channel: grpc.aio.Channel | None = None
        self._calls: set = set()  # the stream calls in flight
        self._aborted: str | None = None  # why every request in flight was cut (see `abort`)

    @property
    def stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        if self._channel is None:  # created inside the serving event loop
            self._channel = grpc.aio.insecure_channel(self.address)
        return service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def ready(self) -> bool:
        try:
            reply = await self.stub.ModelReady(service_pb2.ModelReadyRequest(name=self.model), timeout=5)
        except grpc.aio.AioRpcError:
            return False
        return reply.ready

    async def generate(self, gen: Generation) -> AsyncIterator[Step]:
        """The model's responses for `gen`, the last with `final`; closing the iterator early
        cancels the request in Triton."""
        request = infer_request(self.model, gen.arrays(), uuid.uuid4().hex)
        # write and read the call directly: `async for` over it (and a request iterator) would run
        # gRPC's own async generators, which a client leaving mid-stream left unfinished, and
        # Python 3.11's clean-up of those at garbage collection failed now and then with
        # "aclose(): asynchronous generator is already running" in the server log
        if self._aborted is not None:
            raise TritonError(self._aborted, unavailable=True)
        call = self.stub.ModelStreamInfer()
        self._calls.add(call)
        answered = False  # the model sent the request's last response (or its error)
        try:
            await call.write(request)
            await call.done_writing()
            while (response := await call.read()) is not grpc.aio.EOF:
                answered = bool(response.error_message) or \
                    response.infer_response.parameters["triton_final_response"].bool_param
                step = _step(response)
                yield step
                if step.final:
                    return
            raise TritonError("the model's stream ended before its final response", unavailable=True)
        except grpc.aio.AioRpcError as exc:
            raise TritonError(f"Triton at {self.address}: {exc.details()}", unavailable=True) from None
        except asyncio.CancelledError:
            # the call cancelled by `abort`, not this task (a client that went away)
            if self._aborted is None or asyncio.current_task().cancelling():
                raise
            raise TritonError(self._aborted, unavailable=True) from None
        finally:
            self._calls.discard(call)
            await _end(call, answered)

    def abort(self, why: str) -> None:
        """Cut every request in flight, and refuse new ones, with `why`: each caller gets a
        TritonError (a streamed answer an error event, a whole one a 503), and Triton cancels the
        requests. Call in the serving event loop."""
        self._aborted = why
        for call in list(self._calls):
            call.cancel()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
