"""`trtspec compare`'s judgement of two answers, without servers (served: test_openai)."""

from __future__ import annotations

import json
import math
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trtspec.openai.compare import (
    BUSY_RETRIES,
    DIFFERENT,
    IDENTICAL,
    NEAR_TIE,
    REFUSED,
    Answer,
    Ask,
    Choice,
    Comparison,
    _logprobs,
    _text,
    answer,
    asks,
    compare_deployments,
    judge,
)
from trtspec.triton.client import ClientError


def _answer(tokens: list[str], top: list[dict[str, float]], finish: str = "length") -> Answer:
    return Answer([Choice("".join(tokens), finish, tokens, top)], completion_tokens=len(tokens))


def test_answers_that_part_at_a_near_tie_pass_within_the_tolerance_only():
    """The reference wrote '8' where its log-probabilities put '3' 0.02 nats behind; the served
    deployment wrote '3': a near tie within 0.05 nats, a difference at 0 (and for samples, always)."""
    tie = {"8": math.log(0.505), "3": math.log(0.495)}
    reference = _answer(["=", " ", "8", "3"], [{"=": -0.1}, {" ": -0.2}, tie, {"3": -0.3}])
    served = _answer(["=", " ", "3", "8"], [{"=": -0.1}, {" ": -0.2}, tie, {"8": -0.3}])
    assert judge(served, reference, 0.05)[0] == NEAR_TIE
    assert "parted at token 2 ('3' for '8', 0.0200 nats behind" in judge(served, reference, 0.05)[1]
    assert judge(served, reference, 0.0)[0] == DIFFERENT
    assert judge(served, reference, 0.05, ties=False)[0] == DIFFERENT
    far = _answer(["=", " ", "7", "3"], [{"=": -0.1}, {" ": -0.2}, tie, {"3": -0.3}])  # not in the top 2
    assert judge(far, reference, 1.0)[0] == DIFFERENT
    assert judge(reference, reference, 0.0) == (IDENTICAL, "")
    # found reviewing it: the gap was taken from the likeliest token, not from the reference's own
    # choice. A reference that chose '3' where its (raw, before penalties) log-probabilities put '8'
    # first: a served '8' is no near tie at any tolerance (it is what a server ignoring the
    # penalties writes); an exact tie at tolerance 0 is no near tie either
    chose_second = _answer(["=", " ", "3"], [{"=": -0.1}, {" ": -0.2}, tie])
    ignored = _answer(["=", " ", "8"], [{"=": -0.1}, {" ": -0.2}, tie])
    assert judge(ignored, chose_second, 1.0)[0] == DIFFERENT
    exact = {"8": math.log(0.5), "3": math.log(0.5)}
    assert judge(_answer(["3"], [exact]), _answer(["8"], [exact]), 0.0)[0] == DIFFERENT
    assert judge(_answer(["3"], [exact]), _answer(["8"], [exact]), 1e-9)[0] == NEAR_TIE


def test_refusals_agree_only_when_both_refuse_alike_and_token_counts_must_agree():
    ok = _answer(["a"], [{"a": 0.0}])
    assert judge(Answer(refused=400, message="bad"), Answer(refused=400, message="bad"), 0)[0] == REFUSED
    assert judge(Answer(refused=400), ok, 0)[0] == DIFFERENT
    assert judge(ok, Answer(refused=503), 0)[0] == DIFFERENT
    assert judge(Answer(broken="an error event"), Answer(broken="cut short"), 0)[0] == REFUSED
    assert judge(Answer(broken="cut short"), ok, 0) == (DIFFERENT, "served a broken answer (cut short); the "
                                                              "reference an answer")
    assert judge(Answer(broken="cut short"), Answer(refused=500), 0)[0] == DIFFERENT
    counted = _answer(["a"], [{"a": 0.0}])
    counted.completion_tokens = 2
    assert judge(counted, ok, 0) == (DIFFERENT, "usage.completion_tokens 2 vs the reference's 1")


def test_a_near_tie_at_exactly_the_tolerance_passes_and_a_part_past_the_reported_tokens_differs():
    """The tolerance is inclusive; answers where one's tokens begin the other's, or that part where the
    reference reported no log-probabilities, differ and say so without naming a token."""
    top = {"8": -0.5, "3": -1.0}
    assert judge(_answer(["3"], [top]), _answer(["8"], [top]), 0.5)[0] == NEAR_TIE
    assert judge(_answer(["3"], [top]), _answer(["8"], [top]), 0.25)[0] == DIFFERENT
    shorter, longer = _answer(["a"], [{"a": 0.0}], "stop"), _answer(["a", "b"], [{"a": 0.0}, {"b": 0.0}])
    assert judge(shorter, longer, 1.0) == (DIFFERENT, "choice 0 differs: 'a' (stop) vs the reference's 'ab' "
                                                      "(length)")
    unreported = _answer(["a", "b"], [{"a": 0.0}])  # the reference reported the first token's only
    verdict, why = judge(_answer(["a", "c"], [{"a": 0.0}, {"c": 0.0}]), unreported, 1.0)
    assert (verdict, why.startswith("choice 0 differs at token 1: 'ac'")) == (DIFFERENT, True)


def test_a_comparison_passes_with_no_difference_and_something_answered_and_reports_each_kind():
    ask = Ask("completions", {"prompt": "x"})
    for verdicts, passed in [([IDENTICAL], True), ([NEAR_TIE], True), ([IDENTICAL, NEAR_TIE, REFUSED], True),
                             ([REFUSED], False), ([IDENTICAL, DIFFERENT], False), ([], False)]:
        assert Comparison([ask] * len(verdicts), [(v, v) for v in verdicts]).passed is passed, verdicts
    asks_ = [Ask("completions", {"prompt": str(i)}) for i in range(6)]
    kinds = [DIFFERENT, DIFFERENT, DIFFERENT, NEAR_TIE, NEAR_TIE, IDENTICAL]
    lines = Comparison(asks_, [(k, f"why {i}") for i, k in enumerate(kinds)]).report(shown=2)
    assert lines == [
        "6 requests: 1 identical, 2 parted at a near tie, 3 different, 0 refused by both alike",
        '  DIFFERENT: why 0\n    POST /v1/completions {"prompt": "0"}',
        '  DIFFERENT: why 1\n    POST /v1/completions {"prompt": "1"}',
        "  … and 1 more different",
        '  NEAR TIE: why 3\n    POST /v1/completions {"prompt": "3"}',
        '  NEAR TIE: why 4\n    POST /v1/completions {"prompt": "4"}',
    ]


def test_requests_are_seeded_and_mix_the_features():
    one, again = asks(["Q: 1 + 2\nA:", "def f(x):\n"], 200, 32, "m", seed=3), \
        asks(["Q: 1 + 2\nA:", "def f(x):\n"], 200, 32, "m", seed=3)
    assert one == again and one != asks(["Q: 1 + 2\nA:"], 200, 32, "m", seed=4)
    bodies = [a.body for a in one]
    assert {a.endpoint for a in one} == {"completions", "chat/completions"}
    for feature in ("stop", "presence_penalty", "n", "stream"):
        assert 0 < sum(feature in b for b in bodies) < len(bodies), feature
    assert all(1 <= b["max_tokens"] <= 32 and b["temperature"] == 0 and "seed" not in b for b in bodies)
    sampled = asks(["x"], 10, 8, "m", seed=0, temperature=0.7, chat=False)
    assert all(a.endpoint == "completions" and a.body["seed"] >= 0 for a in sampled)


def test_each_request_asks_for_the_two_likeliest_tokens_and_its_features_in_range():
    """Every request asks for the two likeliest tokens' log-probabilities (chat: logprobs true, top 2);
    a budget of 1 to max_tokens, a seed below 2**31 at a temperature, a stop of 1 or 2 characters of the
    prompt, penalties of two decimals in [0.1, 1], n 2, streams that ask for usage."""
    prompts = ["Q: 12 + 34\nA:", "def fib(n):\n    return"]
    bodies = [(a.endpoint, a.body) for a in asks(prompts, 400, 8, "m", seed=11, temperature=0.5)]
    for endpoint, body in bodies:
        if endpoint == "chat/completions":
            assert body["logprobs"] is True and body["top_logprobs"] == 2
        else:
            assert body["logprobs"] == 2 and "top_logprobs" not in body
        assert 0 <= body["seed"] < 2**31 and body.get("n", 2) == 2
        for stop in body.get("stop", ()):
            assert 1 <= len(stop) <= 2 and any(stop in p for p in prompts), stop
        for name in ("presence_penalty", "frequency_penalty"):
            if name in body:
                assert 0.1 <= body[name] <= 1.0 and body[name] == round(body[name], 2), body[name]
        if "stream" in body:
            assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert {len(s) for _, b in bodies for s in b.get("stop", ())} == {1, 2}
    # one character from inside a prompt too, not only the last one left where two would not fit
    assert any(len(s) == 1 and not any(p.strip().endswith(s) for p in prompts)
               for _, b in bodies for s in b.get("stop", ()))
    assert sum("stream" in b for _, b in bodies) > 0 and sum("n" in b for _, b in bodies) > 0
    assert len({b["seed"] for _, b in bodies}) > 300  # drawn, not fixed
    assert {b["max_tokens"] for b in (a.body for a in asks(prompts, 50, 1, "m", seed=2))} == {1}


def test_log_probabilities_and_text_are_read_from_chat_completions_and_stream_chunks():
    chat = {"message": {"content": "Hi"}, "logprobs": {"content": [
        {"token": "H", "logprob": -0.1, "top_logprobs": [{"token": "H", "logprob": -0.1},
                                                         {"token": "h", "logprob": -2.5}]},
        {"token": "i", "logprob": -0.2, "top_logprobs": None}]}}
    got = Choice()
    _logprobs(chat, got)
    assert (got.tokens, got.top) == (["H", "i"], [{"H": -0.1, "h": -2.5}, {}])
    completion = {"text": "Hi", "logprobs": {"tokens": ["H", "i"], "top_logprobs": [{"H": -0.1}, None]}}
    got = Choice()
    _logprobs(completion, got)
    assert (got.tokens, got.top) == (["H", "i"], [{"H": -0.1}, {}])
    for nothing in ({}, {"logprobs": None}, {"logprobs": {"content": None}}, {"logprobs": {"tokens": []}}):
        got = Choice()
        _logprobs(nothing, got)
        assert (got.tokens, got.top) == ([], [])
    read = (chat, completion, {"delta": {"content": "i"}}, {"delta": {}}, {"text": None}, {"message": {}})
    assert [_text(c) for c in read] == ["Hi", "Hi", "i", "", "", ""]


class _Scripted(BaseHTTPRequestHandler):
    """Answers each POST with the next of the server's `script`: (status, headers, body bytes)."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status, headers, body = self.server.script.pop(0)
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


def test_a_busy_server_is_asked_again_and_a_stream_cut_short_is_a_broken_answer():
    """Found reviewing it: a bounded deployment's 503 (limits.max_queued) counted as a difference,
    and a stream cut mid-body ended the whole run in a traceback."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"openai://127.0.0.1:{server.server_address[1]}"
    whole = json.dumps({"choices": [{"index": 0, "text": "3", "finish_reason": "stop"}],
                        "usage": {"completion_tokens": 1}}).encode()
    busy = json.dumps({"error": {"message": "the server is busy: …"}}).encode()
    try:
        again = (503, {"Retry-After": "0"}, busy)
        server.script = [again, again, (200, {}, whole)]
        got = answer(url, Ask("completions", {"prompt": "Q: 1 + 2\nA:"}))
        assert ([c.text for c in got.choices], got.completion_tokens, server.script) == (["3"], 1, [])
        server.script = [again] * BUSY_RETRIES + [(200, {}, whole)]  # asked again up to BUSY_RETRIES times
        assert [c.text for c in answer(url, Ask("completions", {})).choices] == ["3"]
        server.script = [again] * (BUSY_RETRIES + 1) + [(200, {}, whole)]  # then its 503 is the answer
        got = answer(url, Ask("completions", {}))
        assert (got.refused, got.message, len(server.script)) == (503, "the server is busy: …", 1)
        server.script = [(503, {}, busy)]  # no Retry-After: an answer as it is
        assert answer(url, Ask("completions", {})).refused == 503
        cut = b'data: {"choices": [{"index": 0, "text": "3"}]}\n\ndata: {"choi'
        longer = {"Content-Length": str(len(cut) + 50), "Content-Type": "text/event-stream"}  # than it sends
        server.script = [(200, longer, cut)]
        got = answer(url, Ask("completions", {"stream": True}), timeout_s=10)
        assert got.broken is not None and got.broken.startswith("cut short or unreadable")
    finally:
        server.shutdown()


def test_a_streamed_answer_is_gathered_by_choice_with_its_last_finish_reason():
    """Chunks without an index continue choice 0; a finish reason sent once is kept through chunks
    that say none, and the stream is read to its [DONE]."""
    chunks = [{"choices": [{"index": 0, "text": "3", "finish_reason": None}]},
              {"choices": [{"text": "8", "finish_reason": None}]},
              {"choices": [{"index": 1, "text": "x", "finish_reason": "length"}]},
              {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
              {"choices": [{"index": 0, "text": "", "finish_reason": None}],
               "usage": {"completion_tokens": 3}}]
    stream = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    server, url = _scripted([(200, {"Content-Type": "text/event-stream"}, stream)])
    try:
        got = answer(url, Ask("completions", {"stream": True}), timeout_s=10)
    finally:
        server.shutdown()
    assert [(c.text, c.finish_reason) for c in got.choices] == [("38", "stop"), ("x", "length")]
    assert got.completion_tokens == 3 and got.broken is None


def _scripted(script: list) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    server.script = script
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"openai://127.0.0.1:{server.server_address[1]}"


def test_a_wrong_port_or_reference_is_an_error_not_a_verdict():
    """Found auditing compare against live servers: a gRPC port given as openai:// printed the HTTP/2
    bytes it sent ("cannot reach …: \\x00\\x00\\x18\\x04"), Triton's HTTP port gave a verdict
    ("DIFFERENT: served HTTP 404: Not Found ... FAIL: answers differ"), and a --reference-model typo
    blamed the deployment; each is now an error naming the port or the option, as the other
    commands' are."""
    grpc_like = socket.create_server(("127.0.0.1", 0))

    def send_http2_settings() -> None:
        conn, _ = grpc_like.accept()
        conn.sendall(bytes.fromhex("000018040000000000000400400000000500400000000600002000fe0300000001"))
        conn.close()

    threading.Thread(target=send_http2_settings, daemon=True).start()
    ask = Ask("completions", {"model": "m", "prompt": "Q: 1 + 2\nA:", "max_tokens": 1})
    with pytest.raises(ClientError, match=r"no HTTP answer came .*; is it a gRPC port\?") as grpc_port:
        answer(f"openai://127.0.0.1:{grpc_like.getsockname()[1]}", ask, timeout_s=10)
    grpc_like.close()
    assert "\x00" not in str(grpc_port.value)
    # a server that takes the connection and resets it: whether the reset meets the request while it is
    # sent (urllib's URLError: CI once saw "cannot reach …: [Errno 32] Broken pipe" here) or while the
    # answer is read, it is a port that answered no HTTP, not an unreachable one
    resets = socket.create_server(("127.0.0.1", 0))

    def reset_at_once() -> None:
        for _ in range(2):
            conn, _ = resets.accept()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    threading.Thread(target=reset_at_once, daemon=True).start()
    for _ in range(2):
        with pytest.raises(ClientError, match=r"no HTTP answer came \((ConnectionReset|BrokenPipe)Error"):
            answer(f"openai://127.0.0.1:{resets.getsockname()[1]}", ask, timeout_s=10)
    resets.close()
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(ClientError, match=r"^cannot reach .*refused"):
        answer(f"openai://127.0.0.1:{port}", ask, timeout_s=10)
    whole = json.dumps({"choices": [{"index": 0, "text": "3", "finish_reason": "length"}],
                        "usage": {"completion_tokens": 1}}).encode()
    not_found = json.dumps({"error": {"message": "The model 'nosuch' does not exist.", "param": "model",
                                      "type": "invalid_request_error", "code": "model_not_found"}}).encode()
    triton, triton_url = _scripted([(404, {}, b'{"error":"Not Found"}')])
    served, served_url = _scripted([(200, {}, whole)] * 3)
    reference, reference_url = _scripted([(404, {}, not_found)] * 3)
    try:
        with pytest.raises(ClientError, match="no OpenAI API there: is it Triton's HTTP port?"):
            answer(triton_url, ask)
        with pytest.raises(ClientError) as wrong_reference:
            compare_deployments(served_url, reference_url, [ask] * 3, concurrency=1, reference_model="nosuch")
        said = str(wrong_reference.value)
        assert said.startswith(f"the reference at {reference_url} refused every request the deployment")
        assert "(the first: HTTP 404: The model 'nosuch' does not exist.)" in said
        assert "--reference-model" in said
        # a refusal both give alike is a verdict (nothing answered: no PASS), not the reference's fault
        served.script, reference.script = [(404, {}, not_found)] * 2, [(404, {}, not_found)] * 2
        alike = compare_deployments(served_url, reference_url, [ask] * 2, concurrency=1)
        assert alike.count(REFUSED) == 2 and not alike.passed
    finally:
        for server in (triton, served, reference):
            server.shutdown()
