"""The client's reading of what a server sends, and what it sends, without a server: an answer's
fields checked by type, a Completion's figures from its responses, a request's inputs and its
int32 limits, the error texts of every way a request fails, and the SSE reader. The served paths
(tests/test_triton.py, test_api_fuzz.py, test_cli_errors.py) reach the same code over the wire."""

from __future__ import annotations

import queue
import time
import urllib.error

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype, serialize_byte_tensor

from trtspec.spec.sampling import SamplingParams
from trtspec.triton.client import (
    INT32_MAX,
    INT32_MIN,
    ClientError,
    Completion,
    GenerateParams,
    _grpc_message,
    _http_outputs,
    _is_refused,
    _outputs_of,
    _stream_failure,
    error_text,
    generate,
    guide_arrays,
    other_server,
    shown,
    split_url,
    sse_events,
    thinking_arrays,
    typed,
    unexpected,
    unreachable,
    wait_ready,
)

from .conftest import free_port

WHERE = "http://h:1/v2/models/m/generate"


def test_shown_cuts_at_its_limit_and_keeps_text_as_written():
    assert shown("é" * 5, limit=7) == '"ééééé"'  # JSON, not "\u00e9" escapes: exactly 7 characters, kept
    assert shown("é" * 6, limit=7) == '"ééééé…'  # 8 characters: cut to 6 and the ellipsis
    assert len(shown(list(range(100)), limit=20)) == 20
    assert shown(b"\xffab") == "\ufffdab" and shown({1, 2}) == "{1, 2}"  # not JSON: its repr


def test_typed_takes_its_kind_and_names_what_is_not():
    answer = {"n": 3, "flag": True, "s": "x", "none": None}
    assert typed(answer, "n", int, "an integer", WHERE) == 3
    assert typed(answer, "flag", bool, "a boolean", WHERE) is True  # a bool is a bool
    assert typed(answer, "none", int, "an integer", WHERE) is None
    assert typed(answer, "missing", int, "an integer", WHERE) is None
    with pytest.raises(ClientError, match=r"has usage\.flag = true; expected an integer$"):
        typed(answer, "flag", int, "an integer", WHERE, at="usage.")  # a bool is no int
    with pytest.raises(ClientError, match=r'has s = "x"; expected an integer$'):
        typed(answer, "s", int, "an integer", WHERE)
    whole = unexpected(WHERE, None, [1], "an object")
    assert str(whole) == f"{WHERE}: the server's answer is [1]; expected an object"


def _responses(*outputs: dict) -> Completion:
    c, t0 = Completion(), time.perf_counter()
    for out in outputs:
        c.add(out, None, t0)
    return c


def test_a_completions_figures_come_from_its_responses():
    c = _responses({"text_output": "ab", "output_ids": [1, 2], "accepted_tokens": 0},
                   {"text_output": "", "output_ids": [], "accepted_tokens": 0},  # a step with nothing new
                   {"output_ids": [3], "accepted_tokens": 2, "draft_tokens": 4, "cached_tokens": 0,
                    "finish_reason": "length", "sampling_seed": 9})
    assert (c.num_responses, c.token_responses, c.num_tokens, c.text) == (3, 2, 3, "ab")
    # the totals come in the last response: the largest seen; a 0 reported is 0, not missing
    assert (c.accepted_tokens, c.draft_tokens, c.cached_tokens, c.reported_forwards) == (2, 4, 0, None)
    assert (c.target_forwards, c.tau, c.finish_reason, c.seed) == (1, 3.0, "length", 9)
    assert all(0 <= at < 5 for at in c.arrivals)  # seconds after the request, not a clock reading
    assert _responses({"accepted_tokens": 5}, {"accepted_tokens": 0}).accepted_tokens == 5  # the largest
    assert Completion().num_tokens == 0 and Completion(token_ids=[]).tau is None


def test_a_completions_rates_and_when_it_has_none():
    # 5 tokens in 2 responses, the first 0.5 s after sending, the last at 2.5 s: 4 tokens in 2 s
    c = Completion(token_ids=[1, 2, 3, 4, 5], first_response_s=0.5, total_s=2.5, arrivals=[0.5, 2.5])
    assert c.decode_tokens_per_s == 2.0 and c.tokens_per_s == 2.0 and c.longest_gap_s == 2.0
    assert Completion(token_ids=[1, 2], first_response_s=0.5, total_s=1.5, arrivals=[0.5, 1.5]) \
        .decode_tokens_per_s == 1.0  # two tokens in two responses: one decoded in 1 s
    for no_decode in (Completion(token_ids=[1, 2], total_s=1.0, arrivals=[0.5, 1.0]),  # no first token
                      Completion(token_ids=[1], first_response_s=0.5, total_s=1.0, arrivals=[0.5, 1.0]),
                      Completion(token_ids=[1, 2], first_response_s=0.5, total_s=1.0, arrivals=[0.5]),
                      Completion(token_ids=[1, 2], first_response_s=1.0, total_s=1.0, arrivals=[1.0, 1.0])):
        assert no_decode.decode_tokens_per_s is None
    assert Completion(token_ids=[1], total_s=0.0).tokens_per_s == 0.0
    assert Completion(token_ids=[1, 2], total_s=0.5).tokens_per_s == 4.0


def test_integers_are_sent_only_within_the_models_int32_inputs():
    assert (INT32_MIN, INT32_MAX) == (-2147483648, 2147483647)
    for fits in (INT32_MIN, INT32_MAX):
        GenerateParams(max_tokens=fits, top_k=fits, logit_bias=((fits, 1.0),), thinking=(fits, "<t>", "</t>"))
    for name, params in [("max_tokens", {"max_tokens": INT32_MAX + 1}), ("top_k", {"top_k": INT32_MIN - 1}),
                         ("logit_bias id", {"logit_bias": ((INT32_MAX + 1, 1.0),)}),
                         ("thinking_token_budget", {"thinking": (INT32_MAX + 1, "<t>", "</t>")})]:
        with pytest.raises(ClientError, match=f"^{name} .* is past the model's int32 input"):
            GenerateParams(**params)


def test_a_requests_json_carries_what_was_given_and_only_that():
    assert GenerateParams().as_json("hi") == {"text_input": "hi", "max_tokens": 128, "stream": False}
    greedy = GenerateParams.of(SamplingParams(presence_penalty=0.5, logit_bias=((7, -1.0),)), 16)
    assert greedy.as_json("hi") == {"text_input": "hi", "max_tokens": 16, "stream": False,
                                    "presence_penalty": 0.5,  # the other penalties are off: not sent
                                    "logit_bias_ids": [7], "logit_bias_values": [-1.0]}
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, seed=3)
    sampled = GenerateParams.of(sampling, 8, stream=True)
    assert sampled.as_json("hi") == {"text_input": "hi", "max_tokens": 8, "stream": True, "temperature": 0.7,
                                     "top_p": 0.9, "top_k": 5, "min_p": 0.1, "random_seed": 3}
    assert GenerateParams.of(SamplingParams(temperature=0.7), 8).min_p is None  # min_p 0: none sent


def test_thinking_and_guide_inputs():
    two = thinking_arrays((5, "<a>"))  # no end: the model's default
    assert list(two) == ["thinking_token_budget", "thinking_start"]
    assert two["thinking_token_budget"].tolist() == [5] and two["thinking_start"].tolist() == [b"<a>"]
    three = thinking_arrays((5, "<a>", "</a>"))
    assert three["thinking_end"].tolist() == [b"</a>"] and thinking_arrays(None) == {}
    guide = guide_arrays(("regex", "[0-9]+é"))
    assert guide["guided_decoding_guide_type"].tolist() == [b"regex"]
    assert guide["guided_decoding_guide"].tolist() == ["[0-9]+é".encode()]


@pytest.mark.parametrize("url", ["ftp://h:1", "grpc://:1", "grpc://h", "grpc://h:0", "h:1", "grpc://[::1:1"])
def test_a_url_without_a_scheme_host_or_port_is_refused(url):
    with pytest.raises(ClientError, match="expected grpc://HOST:PORT"):
        split_url(url)


def test_an_answers_outputs_are_checked_by_name():
    answer = {"output_ids": 0, "text_output": ["é"], "accepted_tokens": [2], "trtspec": 1}
    # a one-element output may come as its value or as a list of one; what trtspec does not read is left
    assert _http_outputs(answer, WHERE) == {"output_ids": [0], "text_output": "é", "accepted_tokens": 2}
    refused = [({"output_ids": [1, -1]}, r"output_ids = \[1, -1\]; expected token ids$"),
               ({"output_ids": [True]}, r"expected token ids$"),
               ({"text_output": ["a", "b"]}, r'text_output = \["a", "b"\]; expected text \(or a list of one'),
               ({"draft_tokens": [True]}, r"draft_tokens = \[true\]; expected an integer$"),
               ({"finish_reason": 1}, r"finish_reason = 1; expected text$"),
               ({"error": "model gone"}, f"^{WHERE}: model gone$"),
               ({"error": " "}, r"an error without a message"),
               ([], r"the server's answer is \[\]; expected a JSON object of outputs$")]
    for event, says in refused:
        with pytest.raises(ClientError, match=says):
            _http_outputs(event, WHERE)


def _grpc_result(**outputs: np.ndarray) -> grpcclient.InferResult:
    """A ModelInferResponse as tritonserver sends one, its outputs as raw contents."""
    response = service_pb2.ModelInferResponse(id="r")
    for name, value in outputs.items():
        out = response.outputs.add(name=name, datatype=np_to_triton_dtype(value.dtype))
        out.shape.extend(value.shape)
        raw = serialize_byte_tensor(value).item() if value.dtype == np.object_ else value.tobytes()
        response.raw_output_contents.append(raw)
    return grpcclient.InferResult(response)


def test_a_grpc_responses_outputs_are_read_as_https():
    result = _grpc_result(text_output=np.array([b"h", "é".encode()], dtype=np.object_),
                          output_ids=np.array([[4]], dtype=np.int32),
                          accepted_tokens=np.array([3], dtype=np.int32),
                          output_log_probs=np.array([1], dtype=np.int32))  # not read
    assert _outputs_of(result, WHERE) == {"text_output": "hé", "output_ids": [4], "accepted_tokens": 3}
    assert _outputs_of(_grpc_result(output_ids=np.array([], dtype=np.int32)), WHERE) == {"output_ids": []}
    with pytest.raises(ClientError, match=r"draft_tokens = \[1, 2\]; expected an integer \(or a list of one"):
        _outputs_of(_grpc_result(draft_tokens=np.array([1, 2], dtype=np.int32)), WHERE)


def test_grpc_failures_say_where_and_what_port_it_may_be():
    assert _grpc_message(InferenceServerException("Socket closed"), "h:1") == "Socket closed"
    refused = _grpc_message(InferenceServerException("failed to connect to all addresses"), "h:1")
    assert refused == "cannot reach grpc://h:1: failed to connect to all addresses"
    http_ports = ("Connection refused; Trying to connect an http1.x server",  # uvicorn's answer to HTTP/2
                  "connection refused: socket closed")  # Triton's HTTP port closing the socket
    for said in http_ports:
        assert _grpc_message(said, "h:1").endswith("; is it an HTTP port? (http://HOST:PORT for Triton's, "
                                                   "openai://HOST:PORT for the OpenAI API)")
    done: queue.Queue = queue.Queue()
    done.put((object(), None))  # a response before the failure
    done.put((None, InferenceServerException("Connection refused")))
    assert _stream_failure(done, "h:1") == "cannot reach grpc://h:1: Connection refused"


def test_http_failures_say_where_and_what_port_it_may_be():
    assert error_text(b"") == "an empty answer" and error_text(b"<html>") == "<html>"
    assert error_text(b'{"error": {"message": "bad top_k"}}') == "bad top_k"
    assert error_text(b'{"error": " "}') == '{"error": " "}'  # no message: the answer as it came
    hint = "; is it the OpenAI API's port? (openai://HOST:PORT for it)"
    assert other_server(404, b"Not Found", "triton") == hint
    assert other_server(400, b"Not Found", "triton") == ""
    assert other_server(404, b'{"error": "unknown model"}', "triton") == ""
    reset = unreachable(WHERE, urllib.error.URLError(ConnectionResetError("reset by peer")))
    assert reset == f"{WHERE}: no HTTP answer came (ConnectionResetError \"reset by peer\"); is it a gRPC " \
                    "port? (grpc://HOST:PORT for Triton's)"
    assert unreachable(WHERE, urllib.error.URLError(ConnectionRefusedError("refused"))) == \
        f"cannot reach {WHERE}: refused"


def test_server_sent_events_and_an_openai_stream_cut_short():
    lines = [b": keep-alive\n", b"data: {\"a\": 1}\n", b"\n", b"data:[2]\n", b"data: [DONE]\n", b"data: 3\n"]
    assert list(sse_events(iter(lines), WHERE, until_done=True)) == [{"a": 1}, [2]]
    assert list(sse_events(iter(lines[:4]), WHERE)) == [{"a": 1}, [2]]  # Triton's: no [DONE]
    with pytest.raises(ClientError, match=r"ended without its `data: \[DONE\]` \(cut short\)"):
        list(sse_events(iter(lines[:4]), WHERE, until_done=True))
    with pytest.raises(ClientError, match=r"the server's answer is not JSON: \[DONE\]"):
        list(sse_events(iter(lines), WHERE))  # [DONE] means nothing to Triton's stream


def test_a_failed_request_says_which_api_it_tried():
    port = free_port()
    with pytest.raises(ClientError, match=f"^cannot reach grpc://127.0.0.1:{port}: "):
        generate(f"grpc://127.0.0.1:{port}", "m", "hi", GenerateParams(max_tokens=1), timeout_s=5)
    with pytest.raises(ClientError, match=f"^cannot reach http://127.0.0.1:{port}/v2/models/m/generate: "):
        generate(f"http://127.0.0.1:{port}", "m", "hi", GenerateParams(max_tokens=1), timeout_s=5)
    with pytest.raises(ClientError, match="chat needs an OpenAI-compatible server"):
        generate(f"http://127.0.0.1:{port}", "m", "hi", GenerateParams(), chat=True)


def test_waiting_for_a_server_that_never_listens_says_so():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ClientError, match=r"not ready within 1s: nothing answered at .* \(connection"):
        wait_ready(url, "m", timeout_s=1)
    with pytest.raises(ClientError, match=r"not ready within 0s$"):  # no poll: nothing known to say
        wait_ready(url, "m", timeout_s=0)
    assert _is_refused(ConnectionRefusedError())
    assert _is_refused(urllib.error.URLError(ConnectionRefusedError()))  # as urllib wraps it
    assert _is_refused(InferenceServerException("failed to connect: Connection refused"))
    assert not _is_refused(InferenceServerException("model not found")) and not _is_refused(TimeoutError())
