"""Client of a served trtspec model: gRPC `ModelStreamInfer` or HTTP `/generate(_stream)`; and the
entry point that also reaches OpenAI-compatible servers (`openai://`, `trtspec.openai.client`).

gRPC goes through tritonclient's stream API (a decoupled model is only reachable over a stream);
tritonclient has no call for Triton's generate extension, so HTTP posts JSON with the standard
library and reads the server-sent events of `/generate_stream` line by line.
"""

from __future__ import annotations

import http.client
import json
import queue
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import numpy as np

from trtspec.errors import TrtspecError

if TYPE_CHECKING:
    from trtspec.spec.sampling import SamplingParams

TextCallback = Callable[[str], None]
# the penalty inputs a request may send (`trtspec.spec.penalties`), each with its value that changes nothing
PENALTY_DEFAULTS = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # the range of the model's integer inputs


class ClientError(TrtspecError):
    """The server refused a request or could not be reached; the message is the server's."""


def shown(value, limit: int = 120) -> str:
    """A value of a server's answer as an error message shows it: its JSON, cut to `limit`."""
    if isinstance(value, bytes):
        text = value.decode("utf-8", errors="replace")
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def answer_json(raw: bytes, where: str):
    """A server's answer (or one event of its stream) read as JSON; a ClientError showing it when it
    is none."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ClientError(f"{where}: the server's answer is not JSON: {shown(raw)}") from None


def unexpected(where: str, field: str | None, value, expected: str) -> ClientError:
    """The error of an answer's field (None: the whole answer) that is not what the API sends there."""
    if field is None:
        return ClientError(f"{where}: the server's answer is {shown(value)}; expected {expected}")
    return ClientError(f"{where}: the server's answer has {field} = {shown(value)}; expected {expected}")


def typed(obj: dict, name: str, kind: type, expected: str, where: str, at: str = ""):
    """`obj[name]` when it is a `kind` (a bool is no int), None when it is missing or null; else a
    ClientError naming it (`at`: where obj sits in the answer)."""
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise unexpected(where, f"{at}{name}", value, expected)
    return value


# the totals' wire names -> Completion fields (`target_forwards` is the property that falls back)
TOTALS = {"accepted_tokens": "accepted_tokens", "draft_tokens": "draft_tokens",
          "target_forwards": "reported_forwards", "cached_tokens": "cached_tokens"}


@dataclass(slots=True)
class Completion:
    text: str = ""
    token_ids: list[int] | None = None  # None: the server sends no ids (OpenAI servers)
    # None: the server reports no speculative figures (an OpenAI server other than trtspec's)
    accepted_tokens: int | None = None
    draft_tokens: int | None = None
    # the target forwards the server says the request took (trtspec's servers since `target_forwards`)
    reported_forwards: int | None = None
    cached_tokens: int | None = None  # prompt tokens the server kept from an earlier request (prefix reuse)
    num_responses: int = 0
    # when each response that carried generated text or ids came, seconds after the request was sent
    arrivals: list[float] = field(default_factory=list)
    first_response_s: float | None = None  # the first response that carries a token (text or ids)
    total_s: float = 0.0
    completion_tokens: int | None = None  # the server's count (OpenAI `usage`), where ids are not sent
    finish_reason: str | None = None  # stop / length, as the server names it
    seed: int | None = None  # trtspec's servers: a sampled request's seed (drawn if none was sent)

    @property
    def token_responses(self) -> int:
        """The responses that carried generated text or ids."""
        return len(self.arrivals)

    @property
    def longest_gap_s(self) -> float | None:
        """The longest wait between two responses that carried tokens (None under two): how long a
        reader of the stream saw nothing new, which a server batching its steps into fewer
        responses (`limits.stream_interval`) lengthens."""
        return max(np.diff(self.arrivals)) if len(self.arrivals) > 1 else None

    def arrived(self, at: float) -> None:
        """A response that carries tokens came, `at` seconds after the request was sent."""
        self.arrivals.append(at)
        if self.first_response_s is None:
            self.first_response_s = at

    @property
    def num_tokens(self) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.token_ids) if self.token_ids is not None else 0

    @property
    def target_forwards(self) -> int | None:
        """Target forwards the request took: as the server counted them, else worked out from the
        draft figures (each forward emits its accepted drafts plus one token; an end id among the
        accepted drafts makes that an undercount); None when the server reports neither."""
        if self.reported_forwards is not None:
            return self.reported_forwards
        if self.accepted_tokens is None:
            return None
        return self.num_tokens - self.accepted_tokens

    @property
    def tau(self) -> float | None:
        """Tokens per target forward; None when the server reports no draft figures."""
        forwards = self.target_forwards
        return self.num_tokens / forwards if forwards else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the time after the first response (the in-process loop's
        `decode_tokens_per_s`, as a client sees it); None unless the tokens came in several
        responses (a non-streamed answer has no decode phase to time)."""
        if self.first_response_s is None or self.num_tokens < 2 or self.token_responses < 2:
            return None
        decode = self.total_s - self.first_response_s
        return (self.num_tokens - 1) / decode if decode > 0 else None

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.total_s if self.total_s > 0 else 0.0

    def fold_totals(self, figures: dict) -> None:
        """The request's speculative totals, by their wire names (Triton outputs or the OpenAI
        frontend's `trtspec` field). They arrive in the only (or the stream's last) response; step
        responses carry zeros, so the largest seen is the total."""
        for name, attr in TOTALS.items():
            if figures.get(name) is not None:
                setattr(self, attr, max(getattr(self, attr) or 0, int(figures[name])))

    def add(self, outputs: dict, on_text: TextCallback | None, t0: float) -> None:
        """Fold one response's outputs in (a streamed step, the stream's last, or the only one)."""
        at = time.perf_counter() - t0  # before on_text prints anything
        self.num_responses += 1
        text = outputs.get("text_output", "")
        if text:
            self.text += text
            if on_text is not None:
                on_text(text)
        ids = outputs.get("output_ids", [])
        if self.token_ids is None:
            self.token_ids = []
        self.token_ids.extend(int(i) for i in ids)
        if text or ids:  # a stream's last response may carry only the totals
            self.arrived(at)
        self.fold_totals(outputs)
        if outputs.get("finish_reason"):
            self.finish_reason = outputs["finish_reason"]
        if outputs.get("sampling_seed") is not None:
            self.seed = int(outputs["sampling_seed"])


@dataclass(frozen=True, slots=True)
class GenerateParams:
    max_tokens: int = 128
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop_words: tuple[str, ...] = ()
    stream: bool = False
    # sent only where given (the server's default: none, or the checkpoint's repetition_penalty)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    guide: tuple[str, str] | None = None  # (guide type, guide): TensorRT-LLM's guided_decoding inputs
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias): the logit_bias_ids / _values inputs
    bad_words: tuple[str, ...] = ()  # TensorRT-LLM's bad_words input (vLLM's request field)
    # a reasoning budget: (thinking_token_budget, thinking_start, thinking_end), trtspec's Triton inputs
    thinking: tuple[int, str, str] | None = None
    cache_salt: str = ""  # vLLM's: cached prompts and the lookup pool shared with the same salt only

    def __post_init__(self) -> None:
        """Refuse an integer the model's int32 inputs cannot hold (numpy and Triton's JSON front end
        both wrap it silently: max_tokens 4294967304 asked for 8 tokens, top_k 4294967297 sampled
        with top_k 1)."""
        ints = {"max_tokens": self.max_tokens, "top_k": self.top_k,
                "thinking_token_budget": self.thinking and self.thinking[0]}
        ints |= {f"logit_bias id {token}": token for token, _ in self.logit_bias}
        for name, value in ints.items():
            if value is not None and not INT32_MIN <= value <= INT32_MAX:
                raise ClientError(f"{name} {value} is past the model's int32 input (at most {INT32_MAX:,})")

    @classmethod
    def of(cls, sampling: SamplingParams, max_tokens: int, stream: bool = False) -> GenerateParams:
        """The request for `sampling`: greedy as the server's default (no sampling field sent), else
        its temperature, top-p, top-k, min-p and seed; and its penalties and logit bias, where it has
        them."""
        penalties = {name: getattr(sampling, name) for name, off in PENALTY_DEFAULTS.items()
                     if getattr(sampling, name) != off} | {"logit_bias": sampling.logit_bias}
        if sampling.greedy:
            return cls(max_tokens=max_tokens, stream=stream, **penalties)
        return cls(max_tokens=max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                   top_k=sampling.top_k, min_p=sampling.min_p or None, seed=sampling.seed, stream=stream,
                   **penalties)

    def penalties(self) -> dict[str, float]:
        """The penalties given, by their input names."""
        return {name: getattr(self, name) for name in PENALTY_DEFAULTS if getattr(self, name) is not None}

    def as_json(self, prompt: str) -> dict:
        body: dict = {"text_input": prompt, "max_tokens": self.max_tokens, "stream": self.stream}
        optional = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                    "min_p": self.min_p, "random_seed": self.seed}
        body.update({k: v for k, v in optional.items() if v is not None})
        body.update(self.penalties())
        if self.logit_bias:
            body["logit_bias_ids"] = [token for token, _ in self.logit_bias]
            body["logit_bias_values"] = [bias for _, bias in self.logit_bias]
        if self.stop_words:
            body["stop_words"] = list(self.stop_words)
        if self.bad_words:
            body["bad_words"] = list(self.bad_words)
        if self.thinking is not None:
            body["thinking_token_budget"], body["thinking_start"], body["thinking_end"] = self.thinking
        if self.guide is not None:
            body["guided_decoding_guide_type"], body["guided_decoding_guide"] = self.guide
        if self.cache_salt:
            body["cache_salt"] = self.cache_salt
        return body


def split_url(url: str) -> tuple[str, str]:
    """`grpc://HOST:PORT`, `http://HOST:PORT` or `openai://HOST:PORT` -> (scheme, "HOST:PORT")."""
    try:
        parsed = urlparse(url)
        port = parsed.port  # raises for a port out of range
    except ValueError:  # e.g. "Invalid IPv6 URL", "Port out of range 0-65535"
        parsed, port = None, None
    if parsed is None or parsed.scheme not in ("grpc", "http", "openai") or not parsed.hostname or not port:
        raise ClientError(f"--url {url!r}: expected grpc://HOST:PORT, http://HOST:PORT (Triton) or "
                          "openai://HOST:PORT (an OpenAI-compatible server)")
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise ClientError(f"--url {url!r}: expected no path after HOST:PORT (the API's paths are the "
                          "client's to add)")
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname  # IPv6, bracketed again
    return parsed.scheme, f"{host}:{port}"


def grpc_inputs(prompt: str | bytes, params: GenerateParams) -> list:
    from tritonclient.grpc import InferInput

    raw = prompt.encode("utf-8") if isinstance(prompt, str) else prompt
    arrays = {
        "text_input": np.array([raw], dtype=np.object_),
        "max_tokens": np.array([params.max_tokens], dtype=np.int32),
        "stream": np.array([params.stream], dtype=bool),
    }
    if params.temperature is not None:
        arrays["temperature"] = np.array([params.temperature], dtype=np.float32)
    if params.top_p is not None:
        arrays["top_p"] = np.array([params.top_p], dtype=np.float32)
    if params.top_k is not None:
        arrays["top_k"] = np.array([params.top_k], dtype=np.int32)
    if params.min_p is not None:
        arrays["min_p"] = np.array([params.min_p], dtype=np.float32)
    if params.seed is not None:
        arrays["random_seed"] = np.array([params.seed], dtype=np.uint64)
    for name, value in params.penalties().items():
        arrays[name] = np.array([value], dtype=np.float32)
    arrays |= logit_bias_arrays(params.logit_bias)
    arrays |= word_arrays(stop_words=params.stop_words, bad_words=params.bad_words)
    arrays |= thinking_arrays(params.thinking) | guide_arrays(params.guide) | salt_arrays(params.cache_salt)
    return [array_input(InferInput, name, value) for name, value in arrays.items()]


def salt_arrays(salt: str) -> dict[str, np.ndarray]:
    """A cache_salt as the model's cache_salt input; "": no input."""
    return {"cache_salt": np.array([salt.encode("utf-8")], dtype=np.object_)} if salt else {}


def word_arrays(**lists: Sequence[str]) -> dict[str, np.ndarray]:
    """Inputs that list words (stop_words, bad_words), UTF-8; an empty list: no input."""
    return {name: np.array([w.encode("utf-8") for w in words], dtype=np.object_)
            for name, words in lists.items() if words}


def thinking_arrays(thinking: tuple[int, str] | tuple[int, str, str] | None) -> dict[str, np.ndarray]:
    """A reasoning budget, (budget, start) or (budget, start, end), as the thinking_token_budget,
    thinking_start and thinking_end inputs (no end: the model's default, `</think>`); None: none."""
    if thinking is None:
        return {}
    arrays = {"thinking_token_budget": np.array([thinking[0]], dtype=np.int32)}
    for name, text in zip(("thinking_start", "thinking_end"), thinking[1:], strict=False):
        arrays[name] = np.array([text.encode("utf-8")], dtype=np.object_)
    return arrays


def guide_arrays(guide: tuple[str, str] | None) -> dict[str, np.ndarray]:
    """A guide (its type and text) as TensorRT-LLM's guided_decoding inputs; none: no inputs."""
    if guide is None:
        return {}
    return {"guided_decoding_guide_type": np.array([guide[0].encode()], dtype=np.object_),
            "guided_decoding_guide": np.array([guide[1].encode("utf-8")], dtype=np.object_)}


def logit_bias_arrays(pairs: tuple[tuple[int, float], ...]) -> dict[str, np.ndarray]:
    """(token id, bias) pairs as the model's logit_bias_ids and logit_bias_values inputs; none: no inputs."""
    if not pairs:
        return {}
    return {"logit_bias_ids": np.array([token for token, _ in pairs], dtype=np.int32),
            "logit_bias_values": np.array([bias for _, bias in pairs], dtype=np.float32)}


def array_input(cls, name: str, value: np.ndarray):
    from tritonclient.utils import np_to_triton_dtype

    tensor = cls(name, list(value.shape), np_to_triton_dtype(value.dtype))
    tensor.set_data_from_numpy(value)
    return tensor


def _outputs_of(result, where: str) -> dict:
    """One gRPC response's outputs as Completion.add takes them, checked as HTTP's answers are
    (`_http_outputs`); outputs trtspec does not read (another server's log-probabilities) are left."""
    event = {}
    for out in result.get_response().outputs:
        if out.name not in _HTTP_OUTPUTS and out.name != "output_ids":
            continue
        values = result.as_numpy(out.name).reshape(-1).tolist()
        if values and all(isinstance(v, bytes) for v in values):
            event[out.name] = b"".join(values).decode("utf-8", errors="replace")
        else:
            event[out.name] = values if out.name == "output_ids" or len(values) != 1 else values[0]
    return _http_outputs(event, where)


def grpc_generate(address: str, model: str, inputs: list, on_text: TextCallback | None = None,
                  timeout_s: float = 300.0) -> Completion:
    """One request over a gRPC stream; returns once the model sent its final response."""
    return grpc_generate_many(address, model, [inputs], on_text, timeout_s)[0]


def grpc_generate_many(address: str, model: str, requests: list[list], on_text: TextCallback | None = None,
                       timeout_s: float = 300.0) -> list[Completion]:
    """Send every request on ONE stream (the server queues them); results in request order."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    done: queue.Queue = queue.Queue()
    ids = [uuid.uuid4().hex for _ in requests]
    completions = {rid: Completion() for rid in ids}
    t0 = time.perf_counter()

    def callback(result, error) -> None:
        done.put((result, error))

    client = grpcclient.InferenceServerClient(address)
    pending = set(ids)
    try:
        client.start_stream(callback=callback)
        for rid, inputs in zip(ids, requests, strict=True):
            try:
                client.async_stream_infer(model, inputs, request_id=rid, enable_empty_final_response=True)
            except InferenceServerException as exc:
                # a broken stream (server unreachable, gone): its cause went to the callback
                raise ClientError(_stream_failure(done, address) or exc.message()) from None
        while pending:
            try:
                result, error = done.get(timeout=timeout_s)
            except queue.Empty:
                raise ClientError(f"no response from {address} within {timeout_s:g}s") from None
            if error is not None:
                raise ClientError(_grpc_message(error, address))
            response = result.get_response()
            completion = completions[response.id]
            if response.outputs:
                completion.add(_outputs_of(result, f"grpc://{address}"), on_text, t0)
            if response.parameters["triton_final_response"].bool_param:
                completion.total_s = time.perf_counter() - t0
                pending.discard(response.id)
    finally:
        # a stream whose requests all ended is left to close by itself: tritonserver 2.51 keeps
        # the state of a stream cancelled after its last response for good (`triton_stream._end`)
        client.stop_stream(cancel_requests=bool(pending))
        client.close()
    return [completions[rid] for rid in ids]


def _grpc_message(error, address: str) -> str:
    text = error.message() if hasattr(error, "message") else str(error)
    lowered = text.lower()
    if "failed to connect" in lowered or "connection refused" in lowered:
        # an HTTP server's port: uvicorn answers HTTP/2's preface as HTTP/1.x, Triton's closes the socket
        http_port = "http1.x server" in lowered or "socket closed" in lowered
        hint = "; is it an HTTP port? (http://HOST:PORT for Triton's, openai://HOST:PORT for the OpenAI " \
               "API)" if http_port else ""
        return f"cannot reach grpc://{address}: {text}{hint}"
    return text


def _stream_failure(done: queue.Queue, address: str) -> str | None:
    """The error the stream's callback received, if any arrives within a moment."""
    try:
        while True:
            _result, error = done.get(timeout=2)
            if error is not None:
                return _grpc_message(error, address)
    except queue.Empty:
        return None


def _post(url: str, body: dict, timeout_s: float):
    data = json.dumps(body).encode("utf-8")
    return post_json(urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}),
                     timeout_s)


# what a 404 that is not the API's own error (no such route: the port of another server) may mean
_OTHER_SERVER = {
    "triton": "is it the OpenAI API's port? (openai://HOST:PORT for it)",
    "openai": "no OpenAI API there: is it Triton's HTTP port? (http://HOST:PORT for Triton's; `trtspec "
              "serve` puts the OpenAI API on --openai-port, 9000 by default)",
}


def post_json(req: urllib.request.Request, timeout_s: float, api: str = "triton"):
    """Send `req` to `api` (Triton's HTTP API, or an OpenAI-compatible server): the open response,
    or a ClientError with the server's own error, the network's, or a port that answers no HTTP."""
    url = req.full_url
    try:
        return urllib.request.urlopen(req, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        raise ClientError(f"{url}: HTTP {exc.code}: {error_text(raw)}{other_server(exc.code, raw, api)}") \
            from None
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError) as exc:
        raise ClientError(unreachable(url, exc)) from None


def other_server(code: int, raw: bytes, api: str) -> str:
    """"; " and a hint where an HTTP error `code` with body `raw` is no error of `api` but a 404 of
    another server (a wrong port); "" for the API's own errors."""
    return f"; {_OTHER_SERVER[api]}" if code == 404 and not _api_error(raw, api) else ""


def unreachable(url: str, exc: urllib.error.URLError | http.client.HTTPException | ConnectionError) -> str:
    """Why `url` gave no HTTP answer: the network's reason, or (a server that took the connection and
    answered no HTTP: bytes that are none, or a close while the request was still being sent) a gRPC
    port."""
    if isinstance(exc, urllib.error.URLError):
        if not _closed_on_us(exc.reason):
            return f"cannot reach {url}: {exc.reason}"
        exc = exc.reason
    return f"{url}: no HTTP answer came ({type(exc).__name__} {shown(str(exc), 60)}); is it a gRPC port? " \
           "(grpc://HOST:PORT for Triton's)"


def _closed_on_us(reason: object) -> bool:
    """Whether a request failed while being sent because the server, having taken the connection,
    closed it (a gRPC port does after its HTTP/2 greeting): a refused connection is no such close."""
    return isinstance(reason, ConnectionError) and not isinstance(reason, ConnectionRefusedError)


def _api_error(raw: bytes, api: str) -> bool:
    """Whether `raw` is an error as `api` words one: Triton's `{"error": "..."}`, OpenAI's
    `{"error": {"message": ...}}` (or vLLM's and SGLang's `{"object": "error", "message": ...}`)."""
    try:
        answer = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return False
    if not isinstance(answer, dict):
        return False
    if api == "openai":
        return isinstance(answer.get("error"), dict) or answer.get("object") == "error"
    return isinstance(answer.get("error"), str)


def error_text(raw: bytes) -> str:
    """An error answer's message (`error_of`): Triton's, OpenAI's; an answer that is no JSON shown
    as it came."""
    try:
        return error_of(json.loads(raw), raw)
    except (ValueError, UnicodeDecodeError):
        return shown(raw, 500) or "an empty answer"


def error_of(answer, raw) -> str:
    """The message of an error answer, Triton's `{"error": "..."}` or OpenAI's `{"error":
    {"message"}}`; anything else is `raw` (the answer as it came) shown."""
    error = answer.get("error") if isinstance(answer, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) and message.strip() else shown(raw, 500)


# the outputs of one response of a generate endpoint: (JSON type, as an error names it); a
# one-element output may come back as a value or as a list of one
_HTTP_OUTPUTS = {"text_output": (str, "text"), "finish_reason": (str, "text"),
                 **{name: (int, "an integer") for name in (*TOTALS, "sampling_seed")}}


def _http_outputs(event, where: str) -> dict:
    """One answer (or stream event) of Triton's generate endpoint as Completion.add takes it; a
    ClientError naming an output that is not what trtspec's model sends."""
    if not isinstance(event, dict):
        raise unexpected(where, None, event, "a JSON object of outputs")
    if "error" in event:
        error = event["error"]
        raise ClientError(f"{where}: {error}" if isinstance(error, str) and error.strip()
                          else f"{where}: an error without a message: {shown(event)}")
    outputs = {}
    ids = event.get("output_ids")
    if ids is not None:
        ids = ids if isinstance(ids, list) else [ids]
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise unexpected(where, "output_ids", event["output_ids"], "token ids")
        outputs["output_ids"] = ids
    for name, (kind, expected) in _HTTP_OUTPUTS.items():
        value = event.get(name)
        if isinstance(value, list):
            if len(value) != 1:
                raise unexpected(where, name, value, f"{expected} (or a list of one)")
            value = value[0]
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise unexpected(where, name, event[name], expected)
        if value is not None:
            outputs[name] = value
    return outputs


def sse_events(lines: Iterator[bytes], where: str, until_done: bool = False) -> Iterator:
    """The JSON of each `data:` line of a server-sent event stream; `until_done`: an OpenAI API's
    stream, which ends with `data: [DONE]` (a ClientError when it does not: cut short)."""
    for line in lines:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[len(b"data:") :].strip()
        if until_done and data == b"[DONE]":
            return
        yield answer_json(data, where)
    if until_done:
        raise ClientError(f"{where}: the stream ended without its `data: [DONE]` (cut short)")


def http_generate(address: str, model: str, prompt: str, params: GenerateParams,
                  on_text: TextCallback | None = None, timeout_s: float = 300.0) -> Completion:
    """`/generate` (one JSON answer) or, with params.stream, `/generate_stream` (server-sent events)."""
    completion, t0 = Completion(), time.perf_counter()
    endpoint = "generate_stream" if params.stream else "generate"
    url = f"http://{address}/v2/models/{model}/{endpoint}"
    with _post(url, params.as_json(prompt), timeout_s) as resp:
        if params.stream:
            for event in sse_events(resp, url):
                completion.add(_http_outputs(event, url), on_text, t0)
        else:
            completion.add(_http_outputs(answer_json(resp.read(), url), url), on_text, t0)
    completion.total_s = time.perf_counter() - t0
    return completion


def generate(url: str, model: str, prompt: str, params: GenerateParams,
             on_text: TextCallback | None = None, timeout_s: float = 300.0, chat: bool = False,
             api_key: str | None = None) -> Completion:
    """Send one request to a served model at `url`: grpc:// or http:// (Triton), or openai://
    (`/v1/completions`, or `/v1/chat/completions` with `chat`: the prompt as one user message)."""
    scheme, address = split_url(url)
    if scheme == "openai":
        from trtspec.openai.client import openai_generate

        return openai_generate(url, model, prompt, params, on_text, timeout_s, chat, api_key)
    if chat:
        raise ClientError(f"{url}: chat needs an OpenAI-compatible server (openai://HOST:PORT)")
    if scheme == "grpc":
        return grpc_generate(address, model, grpc_inputs(prompt, params), on_text, timeout_s)
    return http_generate(address, model, prompt, params, on_text, timeout_s)


def _model_ready(scheme: str, address: str, model: str, api_key: str | None = None) -> bool:
    if scheme == "openai":
        from trtspec.openai.client import openai_ready

        return openai_ready(f"openai://{address}", model, api_key)
    if scheme == "grpc":
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(address) as client:
            return client.is_model_ready(model)
    with urllib.request.urlopen(f"http://{address}/v2/models/{model}/ready", timeout=5) as resp:
        return resp.status == 200


def wait_ready(url: str, model: str, timeout_s: float, api_key: str | None = None) -> None:
    """Poll the server at `url` until `model` is ready (a server still loading its models)."""
    scheme, address = split_url(url)
    deadline = time.monotonic() + timeout_s
    refused = False  # the last poll found nothing listening
    while time.monotonic() < deadline:
        try:
            if _model_ready(scheme, address, model, api_key):
                return
            refused = False
        except Exception as exc:  # noqa: BLE001 - not listening yet, or still loading
            refused = _is_refused(exc)
        time.sleep(0.5)
    why = f": nothing answered at {address} (connection refused)" if refused else ""
    raise ClientError(f"model {model!r} at {url} not ready within {timeout_s:g}s{why}")


def _is_refused(exc: Exception) -> bool:
    """Whether a readiness poll failed because nothing listens at the address: urllib's
    ConnectionRefusedError, or gRPC's "Connection refused" in tritonclient's message."""
    if any(isinstance(e, ConnectionRefusedError) for e in (exc, getattr(exc, "reason", None))):
        return True  # urllib wraps it in URLError.reason
    text = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
    return "connection refused" in text.lower()
