"""The OpenAI-compatible frontend of `trtspec serve`, with real clients: the official `openai`
package, curl, `trtspec generate/verify/bench --url openai://`, and NVIDIA-style Triton requests
with TensorRT-LLM's optional inputs. One `trtspec serve` (Triton + frontend, with an API key) for
the module; a second server with a deliberately biased verifier for `verify`'s failing case.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import logging
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import numpy as np
import openai
import pytest
import torch
import tritonclient.grpc as grpcclient
from click.testing import CliRunner
from transformers.utils.chat_template_utils import render_jinja_template
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from trtspec.cli import main
from trtspec.config import load_build_config
from trtspec.openai.model_info import served_model_of_repo
from trtspec.openai.protocol import (
    FLOAT32_MAX,
    FLOAT32_NORMAL,
    MAX_CHOICES,
    MAX_STOP,
    ApiError,
    ChatRequest,
    CompletionRequest,
    check_chat,
    check_common,
    check_completion,
    check_messages,
    check_text,
    compact_json_wanted,
    guide_field,
    guide_of,
    logit_bias_pairs,
    logprobs_wanted,
    parse,
    prediction_text,
    template_variables,
)
from trtspec.openai.server import OpenAIFrontend
from trtspec.openai.streams import triton_error
from trtspec.openai.triton_stream import TritonError
from trtspec.pipeline import load_pipeline
from trtspec.spec.decoder import Request
from trtspec.spec.grammar import Guide
from trtspec.spec.sampling import SamplingParams
from trtspec.triton.client import (
    ClientError,
    GenerateParams,
    array_input,
    grpc_generate,
    grpc_inputs,
    wait_ready,
)
from trtspec.triton.repo import REPO_DIR, write_triton_repo
from trtspec.triton.request import MAX_STOP_WORD_CHARS
from trtspec.triton.server import GRPC_ADMIN_HEADER, TritonServer

from .conftest import (
    REPO,
    free_port,
    free_ports,
    line_within,
    local_target,
    post_json,
    scraped_metric,
    serve_cli,
    triton_ports,
)

CONFIG = REPO / "build_configs" / "tiny-dflash.yaml"
KEY = "test-key-0123"
PROMPTS = ("Q: 482 + 356\nA:", "def parse(self, text):\n", "import os\n")
MAX_TOKENS = 32
CHAT_STOP = "\nQ:"


@pytest.fixture(scope="module")
def config():
    return load_build_config(CONFIG)


@pytest.fixture(scope="module")
def pipeline(config):
    return load_pipeline(config)


def _greedy(pipeline, prompt: str, max_tokens: int = MAX_TOKENS) -> tuple[str, list[int]]:
    text, result = pipeline.generate(prompt, max_tokens)
    return text, result.token_ids


FAILING_MAX_TOKENS = 7  # `biased`'s steps fail while a request of this max_tokens runs


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    """A Triton server whose speculative sampling accepts with min(1, p/2q)
    (test_only.biased_acceptance), started in the background when the module starts: its start
    (the stub importing torch) keeps one core busy, `served`'s start the other. The server, and the
    future of its start."""
    out = tmp_path_factory.mktemp("biased")
    biased = out / "biased.yaml"
    # whole blocks: adaptive speculation may decline to draft on a busy machine, and a server that
    # never drafts cannot show a biased acceptance rule
    text = CONFIG.read_text().replace("path: builtin:tiny-dflash-b16",
                                      "path: builtin:tiny-dflash-b16\n  schedule: {mode: full}")
    text = text.replace("limits:\n", "limits:\n  max_queued: 0\n")  # its 8 slots, none waiting
    biased.write_text(text.replace("builtin:", str(REPO / "trtspec/assets") + "/")
                      + f"test_only: {{biased_acceptance: true, fail_on_max_tokens: {FAILING_MAX_TOKENS}}}\n")
    write_triton_repo(load_build_config(biased), out / "out")
    server = TritonServer(out / "out" / REPO_DIR, ports=triton_ports(), exit_timeout_s=3,
                          env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    # the pool's thread outlives the server: a server dies with the thread that started it (pdeathsig)
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(server.start, timeout_s=240)
        try:
            yield server, started
        finally:
            started.exception()  # waits for the start to end, whichever way
            server.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory, biased):
    """`trtspec serve` itself (the CLI, in a subprocess) with an API key on loopback ports; it
    samples with Gumbel coupling (`sampling.coupling: gumbel`, test_triton's server with rejection).
    `biased`'s server starts beside it. Tool calls under tool_choice auto are found in hermes' format."""
    out = tmp_path_factory.mktemp("openai-build")
    yaml = out.parent / "openai-gumbel.yaml"
    yaml.write_text(CONFIG.read_text() + "sampling:\n  coupling: gumbel\n")
    assert CliRunner().invoke(main, ["build", str(yaml), "--out", str(out)]).exit_code == 0
    with serve_cli(out, KEY, avoid=dataclasses.astuple(biased[0].ports),
                   args=("--tool-call-parser", "hermes")) as served:
        yield served


def test_models_and_health(served):
    models = served.client().models.list()
    assert [m.id for m in models.data] == ["trtspec"]
    with urllib.request.urlopen(f"{served.base}/health", timeout=10) as resp:  # no key needed
        assert resp.status == 200 and json.loads(resp.read()) == {"status": "ready"}
    wait_ready(served.url, "trtspec", 5, KEY)  # listed under /v1/models: ready
    with pytest.raises(ClientError, match=rf"model 'nope' at {served.url} not ready within 1s$"):
        wait_ready(served.url, "nope", 1, KEY)  # answered, not listed: no "connection refused"


def _frontend_metrics(served) -> dict[tuple[str, tuple], float]:
    """The frontend's /metrics (no key needed) as {(name, sorted labels): value}; each family's HELP
    and TYPE checked to come first."""
    with urllib.request.urlopen(f"{served.base}/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    samples, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, labels = series.split("{", 1)
            assert name in typed, line
            pairs = tuple(sorted(tuple(p.split("=", 1)) for p in re.findall(r'\w+="[^"]*"', labels)))
            samples[name, tuple((k, v.strip('"')) for k, v in pairs)] = float(value)
    return samples


def test_the_frontends_own_metrics_count_answers_and_refusals_by_parameter(served):
    """GET /metrics on the API port: answers by route template and status, 4xx refusals by the
    parameter they name (list positions collapsed), a missing key's 401 too; each request adds
    exactly its own counts."""
    def count(name: str, **labels) -> float:
        return _frontend_metrics(served).get((name, tuple(sorted(labels.items()))), 0.0)

    chat, messages = "/v1/chat/completions", "trtspec_frontend_refusals_total"
    before = [count("trtspec_frontend_requests_total", route=chat, status="200"),
              count("trtspec_frontend_requests_total", route=chat, status="400"),
              count(messages, route=chat, param="messages[].content"),
              count("trtspec_frontend_requests_total", route="/v1/responses/{rid}", status="404"),
              count("trtspec_frontend_requests_total", route=chat, status="401")]
    good = {"model": "trtspec", "messages": [{"role": "user", "content": "1 + 2"}], "max_tokens": 2}
    assert _post(f"{served.base}{chat}", good)[0] == 200
    bad = {**good, "messages": [{"role": "user", "content": "1"}, {"role": "user", "content": 5}]}
    for _ in range(2):
        assert _post(f"{served.base}{chat}", bad)[0] == 400
    assert _post(f"{served.base}{chat}", good, key=None)[0] == 401
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(urllib.request.Request(f"{served.base}/v1/responses/resp_nope", headers={
            "Authorization": f"Bearer {KEY}"}), timeout=10)
    assert missing.value.code == 404
    after = [count("trtspec_frontend_requests_total", route=chat, status="200"),
             count("trtspec_frontend_requests_total", route=chat, status="400"),
             count(messages, route=chat, param="messages[].content"),
             count("trtspec_frontend_requests_total", route="/v1/responses/{rid}", status="404"),
             count("trtspec_frontend_requests_total", route=chat, status="401")]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 2, 2, 1, 1]


def test_completions_sync_and_stream_equal_generate(served, pipeline):
    client = served.client()
    for prompt in PROMPTS[:2]:
        text, ids = _greedy(pipeline, prompt)
        got = client.completions.create(model="trtspec", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert got.choices[0].text == text and got.choices[0].finish_reason == "length"
        assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(prompt.encode()), len(ids))
        assert got.usage.total_tokens == len(prompt.encode()) + len(ids)
        figures = got.model_extra["trtspec"]
        assert 0 < figures["accepted_tokens"] <= figures["draft_tokens"]
        assert figures["target_forwards"] == len(ids) - figures["accepted_tokens"]  # no end id among them
        chunks = list(client.completions.create(model="trtspec", prompt=prompt, max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == text
        assert len([c for c in chunks if c.choices]) > 2  # one chunk per decode step, not one at the end
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)


def _chat_expected(pipeline, prompt_text: str, max_tokens: int) -> tuple[str, int]:
    """Greedy text of the rendered chat prompt, cut before the turn's stop, and the tokens the
    server generates: up to the one that completes the stop sequence."""
    text, ids = _greedy(pipeline, prompt_text, max_tokens)
    for n in range(1, len(ids) + 1):
        if CHAT_STOP in pipeline.tokenizer.decode(ids[:n]):
            return text[: text.index(CHAT_STOP)], n
    return text, len(ids)


def test_chat_sync_and_stream_use_the_embedded_template(served, pipeline):
    client = served.client()
    messages = [{"role": "user", "content": "482 + 356"}]
    text, tokens = _chat_expected(pipeline, "Q: 482 + 356\nA: ", 48)
    assert tokens < 48 and text.endswith("= 838")  # the answer ends where the next question starts
    got = client.chat.completions.create(model="trtspec", messages=messages, max_tokens=48, temperature=0)
    assert got.choices[0].message.role == "assistant" and got.choices[0].message.content == text
    assert got.choices[0].finish_reason == "stop"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(b"Q: 482 + 356\nA: "), tokens)
    chunks = list(client.chat.completions.create(model="trtspec", messages=messages, max_tokens=48,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "stop"
    # the next turn (prompt + answer + new text) keeps the K/V of what the server already prefilled
    # (limits.prefix_reuse), and says so as OpenAI and vLLM do
    following = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": "12 + 34"}]
    cached = served.metric("trtspec_cached_prompt_tokens_total")
    again = client.chat.completions.create(model="trtspec", messages=following, max_tokens=8, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= len(b"Q: 482 + 356\nA: ")
    # and Prometheus counts them (Triton's metrics are polled: wait for the count to arrive)
    want = cached + again.usage.prompt_tokens_details.cached_tokens
    for _ in range(50):
        if served.metric("trtspec_cached_prompt_tokens_total") == want:
            break
        time.sleep(0.1)
    assert served.metric("trtspec_cached_prompt_tokens_total") == want
    assert again.model_extra["trtspec"]["cached_tokens"] == again.usage.prompt_tokens_details.cached_tokens
    # a system message and earlier turns, rendered as the model was trained (docs/EMBEDDED_MODEL.md)
    turns = [{"role": "system", "content": "Arithmetic."}, {"role": "user", "content": "12 + 34"},
             {"role": "assistant", "content": "2+4=6; 1+3=4; = 46"}, {"role": "user", "content": "34 * 8"}]
    rendered = "Arithmetic.\nQ: 12 + 34\nA: 2+4=6; 1+3=4; = 46\nQ: 34 * 8\nA: "
    text, tokens = _chat_expected(pipeline, rendered, 40)
    got = client.chat.completions.create(model="trtspec", messages=turns, max_tokens=40, temperature=0)
    assert got.choices[0].message.content == text and got.usage.prompt_tokens == len(rendered.encode())


def test_curl_streams_valid_sse_ending_in_done(served):
    body = json.dumps({"model": "trtspec", "messages": [{"role": "user", "content": "34 * 8"}],
                       "max_tokens": 24, "temperature": 0, "stream": True})
    out = subprocess.run(["curl", "-sN", f"{served.base}/v1/chat/completions", "-H",
                          f"Authorization: Bearer {KEY}", "-H", "Content-Type: application/json", "-d", body],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    events = out.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_eight_streaming_clients_each_sending_every_prompt(served, pipeline):
    """Eight SDK clients streaming at once, each sending every prompt in turn (from a different one)."""
    expected = {p: _greedy(pipeline, p, 24)[0] for p in PROMPTS}

    def user(worker: int) -> list[bool]:
        client = served.client()
        done = []
        for i in range(len(PROMPTS)):
            prompt = PROMPTS[(worker + i) % len(PROMPTS)]
            stream = client.completions.create(model="trtspec", prompt=prompt, max_tokens=24, temperature=0,
                                               stream=True)
            done.append("".join(c.choices[0].text for c in stream if c.choices) == expected[prompt])
        return done

    with ThreadPoolExecutor(8) as pool:
        answers = [a for worker in pool.map(user, range(8)) for a in worker]
    assert len(answers) == 8 * len(PROMPTS) and all(answers)


def test_sixteen_concurrent_streams_some_closed_early_leave_the_server_clean(served, pipeline):
    """16 streams at once through the SDK's async client, completions and chat, every third closed
    after its third chunk: the rest end with a finish_reason and their usage, and
    afterwards nothing is decoding, /health is ready, the log holds no error and greedy text is
    still the target's."""
    import asyncio

    logged = len(Path(served.log).read_text())

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, str | None, object]:
        ask = dict(model="trtspec", max_tokens=48, temperature=1.0, seed=i, stream=True,
                   stream_options={"include_usage": True})
        if i % 2:
            stream = await client.chat.completions.create(messages=[{"role": "user", "content": f"{i} + 7"}],
                                                          **ask)
        else:
            stream = await client.completions.create(prompt=CODE[i % 3], **ask)
        chunks, finish, usage = 0, None, None
        async for chunk in stream:
            chunks += 1
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            usage = chunk.usage or usage
            if i % 3 == 0 and chunks == 3:
                await stream.close()
                return i, None, None
        return i, finish, usage

    async def all_of_them():
        client = openai.AsyncOpenAI(base_url=f"{served.base}/v1", api_key=KEY, max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(16)))
        finally:
            await client.close()

    results = asyncio.run(all_of_them())
    for i, finish, usage in results:
        if i % 3:
            assert finish in ("stop", "length") and 1 <= usage.completion_tokens <= 48, (i, finish, usage)
            assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    deadline = time.monotonic() + 2.0
    while served.metric("trtspec_requests_in_flight") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.metric("trtspec_requests_in_flight") == 0
    assert _request(served, "GET", "/health") == (200, {"status": "ready"})
    got = served.client().completions.create(model="trtspec", prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                             temperature=0)
    assert got.choices[0].text == _greedy(pipeline, PROMPTS[0])[0]
    assert "ERROR" not in Path(served.log).read_text()[logged:]


DROPPING_CLIENT = """
import json, sys, threading, time, urllib.request
body = {"model": "trtspec", "prompt": json.loads(sys.argv[3]), "max_tokens": 2048, "temperature": 0,
        "stream": sys.argv[4] != "whole", "ignore_eos": True}
if len(sys.argv) > 5:  # another route's body
    body = {**json.loads(sys.argv[5]), "stream": sys.argv[4] != "whole"}
req = urllib.request.Request(sys.argv[1], data=json.dumps(body).encode(),
                             headers={"Authorization": "Bearer " + sys.argv[2]})
held = []
if sys.argv[4] == "stream":
    held.append(urllib.request.urlopen(req))
    held[0].readline()
else:  # gone before any answer (whole), or before a slot (queued)
    threading.Thread(target=lambda: held.append(urllib.request.urlopen(req)), daemon=True).start()
    time.sleep(0.5)
print("got", flush=True)
import time; time.sleep(600)
"""


CODE = ["def parse(self, text):\n", "import os\n", "class A:\n"]


@pytest.mark.parametrize("prompt, mode", [(CODE[0], "stream"), (CODE, "stream"), (CODE[:2], "whole")],
                         ids=["one-streamed", "three-streamed", "two-whole"])
def test_client_dropped_mid_stream_is_cancelled(served, pipeline, prompt, mode):
    """A client that goes away mid-answer ends its Triton requests, every choice's: none is still
    decoding 2 s later (a 2,048-token answer takes several seconds here), and the next is served.
    The server logs no error for it (an unanswered request was 'Exception in ASGI application')."""
    logged = len(Path(served.log).read_text())
    proc = subprocess.Popen([sys.executable, "-c", DROPPING_CLIENT, f"{served.base}/v1/completions", KEY,
                             json.dumps(prompt), mode], stdout=subprocess.PIPE, text=True)
    try:
        assert line_within(proc.stdout).strip() == "got"
    finally:
        proc.kill()  # the connection drops without a goodbye
        proc.wait()
    deadline = time.monotonic() + 2.0
    while served.metric("trtspec_requests_in_flight") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.metric("trtspec_requests_in_flight") == 0, "a dropped request is still decoding"
    got = served.client().completions.create(model="trtspec", prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                             temperature=0)
    assert got.choices[0].text == _greedy(pipeline, PROMPTS[0])[0]
    assert "ERROR" not in Path(served.log).read_text()[logged:]


def test_a_client_that_closes_before_its_body_is_whole_is_answered_quietly(served):
    """Found stressing the server (2026-12-06): a Content-Length of 100 and 40 bytes of body, then
    closed: each such connection left a 63-line 'Exception in ASGI application' (starlette's
    ClientDisconnect) in the server's log, uncounted by /metrics. Now a 499, counted, and no error."""
    import socket

    logged = len(Path(served.log).read_text())
    route = "/v1/chat/completions"
    before = _frontend_metrics(served).get(("trtspec_frontend_requests_total",
                                            (("route", route), ("status", "499"))), 0.0)
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", served.openai_port), timeout=10) as sock:
            sock.sendall(f"POST {route} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode()
                         + b'{"model": "trtspec", "messages": [{"role"')
    deadline = time.monotonic() + 10
    counted = before
    while counted < before + 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        counted = _frontend_metrics(served).get(("trtspec_frontend_requests_total",
                                                 (("route", route), ("status", "499"))), 0.0)
    assert counted == before + 3
    assert not re.search(r"ERROR|Traceback", Path(served.log).read_text()[logged:])
    status, body = _post(f"{served.base}{route}", GOOD_CHAT)
    assert status == 200, body


@pytest.mark.parametrize("route", ["responses", "messages"])
def test_a_client_dropped_mid_stream_on_the_newer_apis_is_cancelled(served, route):
    """/v1/responses and Anthropic's /v1/messages stream through the same Triton calls: a client that
    goes away mid-answer (a JSON object with a required string, whose whitespace the model pads
    without end, 2,048 tokens allowed; under a bare object it writes `{}` and is done) ends its
    request, none still decoding 2 s later, and the server logs no error."""
    chat = {"model": "trtspec", "temperature": 0}
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    body = {"responses": {**chat, "input": "1 + 2", "max_output_tokens": 2048,
                          "text": {"format": {"type": "json_schema", "name": "padded", "schema": schema}}},
            "messages": {**chat, "messages": [{"role": "user", "content": "1 + 2"}], "max_tokens": 2048,
                         "output_config": {"format": {"type": "json_schema", "schema": schema}}}}
    logged = len(Path(served.log).read_text())
    proc = subprocess.Popen([sys.executable, "-c", DROPPING_CLIENT, f"{served.base}/v1/{route}", KEY, "null",
                             "stream", json.dumps(body[route])], stdout=subprocess.PIPE, text=True)
    try:
        assert line_within(proc.stdout).strip() == "got"
        assert served.metric("trtspec_requests_in_flight") == 1, "the answer ended before its client left"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 2.0
    while served.metric("trtspec_requests_in_flight") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.metric("trtspec_requests_in_flight") == 0, "a dropped request is still decoding"
    assert "ERROR" not in Path(served.log).read_text()[logged:]


def test_answered_triton_calls_end_by_themselves_only_cut_ones_are_cancelled(served):
    """The frontend's gRPC call per choice: tritonserver 2.51 keeps the state of a stream call
    cancelled after its request's last response for good (cancelling every call grew it by 6.7 KB
    a request, and now and then kept the connection's socket open). A call whose request was
    answered (whole, streamed, or refused with an error) must end with OK, not be cancelled; one
    closed mid-answer (the client went away) is cancelled. The calls' statuses are what a gRPC
    interceptor on the frontend's channel sees."""
    import asyncio

    import grpc

    from trtspec.openai.triton_stream import Generation, TritonError, TritonStream

    class Calls(grpc.aio.StreamStreamClientInterceptor):
        def __init__(self):
            self.calls = []

        async def intercept_stream_stream(self, continuation, details, request_iterator):
            call = await continuation(details, request_iterator)
            self.calls.append(call)
            return call

    async def run() -> list:
        calls = Calls()
        triton = TritonStream(served.grpc, "trtspec")
        triton._channel = grpc.aio.insecure_channel(served.grpc, interceptors=[calls])
        try:
            for gen in (Generation(PROMPTS[0], 8, stream=False),
                        Generation(PROMPTS[1], 16, temperature=0.8, seed=3, logprobs=2)):
                steps = [step async for step in triton.generate(gen)]
                assert steps[-1].final and sum(len(s.ids) for s in steps) == gen.max_tokens
            with pytest.raises(TritonError, match="max_tokens"):
                [step async for step in triton.generate(Generation(PROMPTS[0], 0))]
            cut = triton.generate(Generation(PROMPTS[2], 400, ignore_eos=True))
            assert not (await anext(cut)).final
            await cut.aclose()
            return [await call.code() for call in calls.calls]
        finally:
            await triton.close()

    assert asyncio.run(run()) == [grpc.StatusCode.OK] * 3 + [grpc.StatusCode.CANCELLED]


def test_a_streamed_request_whose_client_left_while_queued_never_decodes(served):
    """A streaming client that goes away before its first response (queued behind the 8 decoder
    slots here) cancels its Triton request then: it never takes a slot. It was admitted and
    prefilled once the slots freed (the frontend only learnt of it when its first chunk was sent).
    And it leaves the queue while the slots are still busy: it was counted in
    `trtspec_requests_waiting` until a slot freed."""
    def client(prompt, mode: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", DROPPING_CLIENT, f"{served.base}/v1/completions", KEY,
                                 json.dumps(prompt), mode], stdout=subprocess.PIPE, text=True)
        assert line_within(proc.stdout).strip() == "got"
        return proc

    def settle(name: str, value: float) -> float:
        deadline = time.monotonic() + 30
        while served.metric(name) != value and time.monotonic() < deadline:
            time.sleep(0.05)
        return served.metric(name)

    logged = len(Path(served.log).read_text())
    occupier = client((CODE * 3)[:8], "stream")  # 8 choices of 2,048 tokens each, end ids ignored
    try:
        assert settle("trtspec_requests_in_flight", 8) == 8
        queued = client(CODE[0], "queued")
        assert settle("trtspec_requests_waiting", 1) == 1
        admitted = served.metric("trtspec_queue_seconds_count")
        queued.kill()  # gone while queued
        queued.wait()
        time.sleep(1.0)  # let the frontend cancel it before the slots free
        assert settle("trtspec_requests_waiting", 0) == 0
        assert served.metric("trtspec_requests_in_flight") == 8  # the slots are still busy
    finally:
        occupier.kill()
        occupier.wait()
    assert settle("trtspec_requests_in_flight", 0) == 0 and settle("trtspec_requests_waiting", 0) == 0
    assert served.metric("trtspec_queue_seconds_count") == admitted, "the queued request took a slot"
    assert "ERROR" not in Path(served.log).read_text()[logged:]


GOOD_COMPLETION = {"model": "trtspec", "prompt": "Q: 1 + 2\nA:", "max_tokens": 4}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"]}
ECHO = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 12}}, "required": ["text"]}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD}},
         {"type": "function", "function": {"name": "echo", "parameters": ECHO}}]
GOOD_CHAT = {"model": "trtspec", "messages": [{"role": "user", "content": "1 + 2"}], "max_tokens": 4}
BAD = [
    ("completions", {"n": 0}, "n"),
    ("completions", {"prompt": ["a", "b"], "n": 40}, "prompt"),  # 80 choices
    ("completions", {"logit_bias": {"a65": 5}}, "logit_bias"),
    ("completions", {"logit_bias": {"264": 5}}, "logit_bias"),  # outside the vocabulary
    ("completions", {"logit_bias": {"65": 100.5}}, "logit_bias"),
    ("completions", {"foo": 1}, "foo"),
    ("completions", {"temperature": -1}, "temperature"),
    ("completions", {"top_p": 0}, "top_p"),
    ("chat/completions", {"top_p": 7e-46}, "top_p"),  # 0 as the float32 the model takes
    ("completions", {"top_k": -2}, "top_k"),
    ("completions", {"min_p": 1.5}, "min_p"),
    ("completions", {"max_tokens": 0}, "max_tokens"),
    ("completions", {"max_tokens": 5000}, "max_tokens"),
    ("completions", {"stop": [f"s{i}" for i in range(33)]}, "stop"),
    ("completions", {"stop": ["ok", "x" * 1025]}, "stop"),  # longer than stop_words takes
    ("completions", {"logprobs": 21}, "logprobs"),
    ("completions", {"prompt": ["a", ""]}, "prompt[1]"),
    ("completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("completions", {"frequency_penalty": -3}, "frequency_penalty"),
    ("completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": [1, 2, 264]}, "prompt"),  # a token id outside the vocabulary
    ("completions", {"prompt": [[1, 2], [3, -1]]}, "prompt[1]"),
    ("completions", {"prompt": "x" * 5000}, "prompt"),  # over the 4,096-token context
    ("completions", {"seed": -1}, "seed"),
    ("completions", {"stop_token_ids": [10, -3]}, "stop_token_ids"),
    ("completions", {"min_tokens": 9}, "min_tokens"),
    ("completions", {"stream_options": {"bogus": True}}, "stream_options.bogus"),
    ("chat/completions", {"messages": []}, "messages"),
    ("chat/completions", {"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    # tool calling (tests/test_tools.py has the rest): a tool message answers a call, a guided choice
    # takes no other format, a schema the frontend cannot compile, a function's name the model refuses
    ("chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ("chat/completions", {"tools": [{"type": "retrieval"}], "tool_choice": "required"}, "tools[0].type"),
    ("chat/completions", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "sub"}}},
     "tool_choice.function.name"),
    ("chat/completions", {"tools": TOOLS, "tool_choice": "required",
                          "response_format": {"type": "json_object"}}, "response_format"),
    ("chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "[0-9"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools[0].function.parameters"),
    ("chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"enum": ["x" * (1 << 20)]}}}}}],  # a guide over 1 MiB
        "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools[0].function.parameters"),
    ("chat/completions", {"max_completion_tokens": 5000}, "max_completion_tokens"),
    # alone (GOOD_CHAT's max_tokens dropped), 0 generated to the end of the context
    ("chat/completions", {"max_tokens": None, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("chat/completions", {"response_format": {"type": "xml"}}, "response_format.type"),
    ("chat/completions", {"response_format": {"type": ["json_object"]}}, "response_format.type"),  # was a 500
    ("chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
     "response_format.json_schema.schema"),
    # a regex the model compiles and refuses
    ("completions", {"response_format": {"type": "regex", "regex": "[0-9"}}, "response_format"),
    ("completions", {"response_format": {"type": "regex", "pattern": "a"}}, "response_format.pattern"),
    ("completions", {"response_format": {"type": "json_object"}, "min_tokens": 2}, "min_tokens"),
    # vLLM's structured outputs: one field, one kind, the model's refusal named as the request named it
    ("completions", {"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ("completions", {"structured_outputs": {}}, "structured_outputs"),
    ("completions", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ("completions", {"structured_outputs": {"whitespace_pattern": " "}},
     "structured_outputs.whitespace_pattern"),
    ("completions", {"guided_choice": []}, "guided_choice"),
    ("completions", {"response_format": {"type": "json_object"},
                     "structured_outputs": {"disable_any_whitespace": "yes"}},
     "structured_outputs.disable_any_whitespace"),
    ("completions", {"guided_grammar": "root ::= missing"}, "guided_grammar"),
    ("chat/completions", {"structured_outputs": {"json": 5}}, "structured_outputs.json"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ("chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("chat/completions", {"chat_template_kwargs": {"add_generation_prompt": False}},
     "chat_template_kwargs.add_generation_prompt"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    # malformed content: neither text nor a list of parts, and a part that is not one
    ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, 1]}]},
     "messages[0].content[1]"),
    # OpenAI and vLLM: stream_options only with stream: true
    ("completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("chat/completions", {"stream_options": {"include_usage": True}, "stream": False}, "stream_options"),
    # a token id outside the 264-token vocabulary
    ("completions", {"stop_token_ids": [999]}, "stop_token_ids"),
    ("chat/completions", {"stop_token_ids": [10, 264]}, "stop_token_ids"),
    # a JSON value of another type is refused, not converted (test_a_value_of_another_json_type_...)
    ("completions", {"max_tokens": True}, "max_tokens"),
    ("chat/completions", {"stream": "yes"}, "stream"),
    ("completions", {"prompt": [1, "a"]}, "prompt"),
    # chat's metadata fields are not the legacy Completions API's (test_chat_accepts_...)
    ("completions", {"metadata": {"run": "a"}}, "metadata"),
    ("chat/completions", {"thinking_token_budget": 5}, "thinking_token_budget"),  # no reasoning parser here
    ("completions", {"store": False}, "store"),
    ("completions", {"service_tier": "auto"}, "service_tier"),
    ("completions", {"prompt_cache_key": "k"}, "prompt_cache_key"),
    # chat's newer fields whose other values trtspec cannot honour
    ("chat/completions", {"verbosity": "low"}, "verbosity"),
    ("chat/completions", {"prediction": {"type": "text", "content": "838"}}, "prediction.type"),
    ("chat/completions", {"prediction": {"type": "content", "content": [{"type": "image"}]}},
     "prediction.content"),
    ("chat/completions", {"prediction": {"type": "content", "content": "8", "cache": 1}}, "prediction.cache"),
    ("chat/completions", {"prompt_cache_retention": "1h"}, "prompt_cache_retention"),
]


def _post(url: str, body: dict, key: str | None = KEY) -> tuple[int, dict]:
    return post_json(url, body, key)


def test_a_guide_its_own_stop_ids_leave_no_token_fails_that_request_alone(served, pipeline):
    """Found fuzzing the served path (2026-12-06): a json_schema whose key needs `a` beside
    stop_token_ids [97] ended its guide's tokens, and the step's error failed every request decoded
    with it ("generation failed: token 0 was emitted against the request's guide", 400 to both)."""
    innocent = {"model": "trtspec", "prompt": "Q: 482 + 356\nA:", "max_tokens": 200, "temperature": 0}
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    question = [{"role": "user", "content": "Describe the difference between a tuple and a list."}]
    dead = {"model": "trtspec", "messages": question, "max_tokens": 64, "temperature": 0,
            "stop_token_ids": [ord("a")],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_post, f"{served.base}/v1/completions", innocent)
        time.sleep(0.3)  # decoding by now: the dead end comes in its steps
        status, body = _post(f"{served.base}/v1/chat/completions", dead)
        assert status == 400 and body["error"]["message"].startswith("no token may follow the "), body
        assert "its guide leave none there" in body["error"]["message"]
        status, answer = first.result()
    assert status == 200, answer
    assert answer["choices"][0]["text"] == _greedy(pipeline, innocent["prompt"], 200)[0]


@pytest.mark.parametrize("endpoint, change, param", BAD, ids=[f"{e}-{p}" for e, _, p in BAD])
def test_bad_parameter_is_a_400_naming_it_and_the_next_request_is_served(served, endpoint, change, param):
    good = GOOD_CHAT if endpoint.startswith("chat") else GOOD_COMPLETION
    status, body = _post(f"{served.base}/v1/{endpoint}", {**good, **change})
    assert status == 400, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error"
    assert param.split(".")[0].split("[")[0] in body["error"]["message"]
    status, body = _post(f"{served.base}/v1/{endpoint}", good)
    assert status == 200 and body["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("content, param, expected", [
    (5, "messages[0].content", "expected a string or a list of content parts like"),
    ([{"type": "text", "text": "a"}, 1], "messages[0].content[1]", "expected a content part like"),
    ([{"text": "no type"}], "messages[0].content[0]", "expected a content part like"),
])
def test_malformed_content_says_what_content_is(content, param, expected):
    """pydantic named only the string branch of the union ('Input should be a valid string')."""
    with pytest.raises(ApiError) as caught:
        parse(ChatRequest, {**GOOD_CHAT, "messages": [{"role": "user", "content": content}]})
    assert caught.value.param == param and expected in str(caught.value), str(caught.value)
    assert '{"type": "text", "text": "..."}' in str(caught.value)


@pytest.mark.parametrize("endpoint, change, param, expected", [
    ("completions", {"max_tokens": True}, "max_tokens", "expected an integer, got a boolean"),
    ("completions", {"logprobs": True}, "logprobs", "expected an integer, got a boolean"),
    ("chat/completions", {"n": 2.0}, "n", "expected an integer, got a decimal number"),
    ("chat/completions", {"stream": "true"}, "stream", "expected a boolean, got a string"),
    ("chat/completions", {"temperature": "0.5"}, "temperature", "expected a number, got a string"),
    ("chat/completions", {"stream": True, "stream_options": {"include_usage": 1}},
     "stream_options.include_usage", "expected a boolean, got an integer"),
    ("completions", {"prompt": [1, "a"]}, "prompt", "expected a string, an array of strings, an array of"),
    ("completions", {"stop": ["a", None]}, "stop", "expected a string or an array of strings"),
    ("completions", {"max_tokens": {"a": 1}}, "max_tokens", "expected an integer, got an object"),
    # a message's other fields are not its content: their refusal says what they take
    ("chat/completions", {"messages": [{"role": 5, "content": "x"}]}, "messages[0].role",
     "expected a string, got an integer"),
])
def test_a_value_of_another_json_type_is_refused_not_converted(endpoint, change, param, expected):
    """pydantic's lax mode read `max_tokens: true` as 1, `logprobs: true` as 1 top token, `n: 2.0` as
    2 and `stream: "true"` as true; OpenAI refuses them ('Invalid type for ...'), so does trtspec
    now. A union's refusal names what it takes, not only its first member ('a valid string')."""
    model = ChatRequest if endpoint.startswith("chat") else CompletionRequest
    good = GOOD_CHAT if model is ChatRequest else GOOD_COMPLETION
    with pytest.raises(ApiError) as caught:
        parse(model, {**good, **change})
    error = caught.value
    assert (error.param, error.code) == (param, "invalid_type") and expected in error.message, error.message
    assert f"'{param}'" in error.message
    assert parse(model, {**good, "temperature": 1}).temperature == 1.0  # an integer is a number


@pytest.mark.parametrize("top_p, taken", [(1e-45, True), (7.1e-46, True), (7e-46, False), (1e-300, False)])
def test_top_p_is_refused_where_its_float32_is_0(top_p, taken):
    """A top_p over 0 but under half float32's smallest reached the model as 0, which refused it
    ("got 0.0", its error naming no parameter); the frontend refuses it naming 'top_p' now. From
    half that smallest up it arrives as a positive float32 and is served (the most likely token)."""
    request = parse(ChatRequest, {**GOOD_CHAT, "top_p": top_p})
    assert (np.float32(top_p) > 0) == taken
    if taken:
        check_common(request, vocab_size=264)
        return
    with pytest.raises(ApiError) as caught:
        check_common(request, vocab_size=264)
    assert caught.value.param == "top_p" and "as a float32" in caught.value.message, caught.value.message


def test_a_number_past_what_a_float_holds_is_out_of_range_not_of_another_type():
    with pytest.raises(ApiError) as caught:
        parse(CompletionRequest, {**GOOD_COMPLETION, "temperature": 10**400})
    assert (caught.value.param, caught.value.code) == ("temperature", "invalid_value")
    assert "out of range" in caught.value.message


def test_a_missing_prompt_is_named_and_a_lone_surrogate_found_where_it_is():
    """A completion without `prompt` (a union's field, whose error location is its name alone) is a
    missing parameter named `prompt`; check_text passes a body of whole characters and names where
    half a surrogate pair is."""
    with pytest.raises(ApiError) as caught:
        parse(CompletionRequest, {"model": "trtspec"})
    assert (caught.value.param, caught.value.code) == ("prompt", "missing_required_parameter")
    check_text({**GOOD_CHAT, "stop": ["\u00e9t\u00e9"]})
    with pytest.raises(ApiError) as caught:
        check_text({**GOOD_COMPLETION, "stop": ["ok", "a\ud800"]})
    assert caught.value.param == "stop[1]" and "\\ud800" in caught.value.message, caught.value.message


def _checked(endpoint: str, change: dict) -> str | None:
    """The parameter check_chat or check_completion refuses in GOOD_CHAT or GOOD_COMPLETION with
    `change` (None: taken), over the test model's 264-token vocabulary."""
    chat = endpoint.startswith("chat")
    good = GOOD_CHAT if chat else GOOD_COMPLETION
    request = parse(ChatRequest if chat else CompletionRequest, {**good, **change})
    try:
        (check_chat if chat else check_completion)(request, 264)
    except ApiError as exc:
        return exc.param
    return None


EDGES = [  # (endpoint, field, values taken, values refused naming it): each bound and a step past it
    ("completions", "n", [1, MAX_CHOICES], [0, MAX_CHOICES + 1]),
    ("chat/completions", "temperature", [0, 2], [-0.5, 2.5]),
    ("completions", "min_p", [0, 0.5, 1], [-0.5, 1.5]),
    ("completions", "seed", [0, 2**64 - 1], [-1, 2**64]),
    ("chat/completions", "repetition_penalty", [FLOAT32_NORMAL, 1, FLOAT32_MAX],
     [0, FLOAT32_NORMAL / 2, FLOAT32_MAX * 2]),
    ("completions", "presence_penalty", [-2, 2], [-2.5, 2.5]),
    ("chat/completions", "frequency_penalty", [-2, 2], [-2.5, 2.5]),
    ("completions", "top_k", [-1, 0, 1, 10**30], [-2]),
    ("completions", "stop_token_ids", [[0, 263]], [[264], [-1]]),
    ("completions", "stop", [[f"s{i}" for i in range(MAX_STOP)], ["x" * MAX_STOP_WORD_CHARS]],
     [[f"s{i}" for i in range(MAX_STOP + 1)], ["x" * (MAX_STOP_WORD_CHARS + 1)], ["a", ""]]),
    ("completions", "logit_bias", [{"0": -100, "263": 100, "7": 2.5}], [{"7": -100.5}, {"264": 1}]),
    ("completions", "logprobs", [0, 20], [-1, 21]),
    ("chat/completions", "top_logprobs", [0, 20], [-1, 21]),
]


@pytest.mark.parametrize("endpoint, field, taken, refused", EDGES, ids=[f"{e}-{f}" for e, f, _, _ in EDGES])
def test_each_ranges_bounds_are_taken_and_a_step_past_them_refused(endpoint, field, taken, refused):
    """The request checks take every value up to and at the ends of each parameter's range (n up to
    MAX_CHOICES, temperature 0 and 2, seed 0 and 2^64 - 1, token id 0, 32 stops of 1,024 characters, a
    bias of -100, 0 top logprobs, ...) and refuse one past them, naming the parameter."""
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    for value in taken:
        assert _checked(endpoint, {field: value, **extra}) is None, value
    for value in refused:
        assert _checked(endpoint, {field: value, **extra}) == field, value


def test_what_the_request_checks_hand_on():
    """What the checks give the server besides their refusals: the prompts (one token id's prompt
    is one prompt), the (id, bias) pairs, how many top logprobs (chat's logprobs alone: 0), the
    template's variables (reasoning_effort beside chat_template_kwargs, whose own wins), a predicted
    output's text, the guide and the field that asked for it, JSON's compactness; a stop sequence
    is cut from the text unless asked to stay."""
    def chat(**change):
        return parse(ChatRequest, {**GOOD_CHAT, **change})

    def completion(**change):
        return parse(CompletionRequest, {**GOOD_COMPLETION, **change})

    for prompt, prompts in (([7], [[7]]), ([[1, 2], [3]], [[1, 2], [3]]), ("a", ["a"]), (["a", "b"],) * 2):
        assert check_completion(completion(prompt=prompt), 264) == prompts
    assert logit_bias_pairs({"0": -100, "263": 100, "7": 2.5}, 264) == ((0, -100.0), (263, 100.0), (7, 2.5))
    assert logprobs_wanted(chat(logprobs=True)) == 0
    assert logprobs_wanted(chat(logprobs=True, top_logprobs=3)) == 3
    assert logprobs_wanted(chat()) is None and logprobs_wanted(chat(logprobs=False, top_logprobs=0)) is None
    assert logprobs_wanted(completion(logprobs=2)) == 2 and logprobs_wanted(completion()) is None
    assert template_variables(chat()) is None
    kwargs = {"enable_thinking": False}
    assert template_variables(chat(chat_template_kwargs=kwargs)) == kwargs
    assert template_variables(chat(reasoning_effort="low")) == {"reasoning_effort": "low"}
    own = {"reasoning_effort": "high"}
    assert template_variables(chat(reasoning_effort="low", chat_template_kwargs=own)) == own
    parts = [{"type": "text", "text": "83"}, {"type": "text", "text": "8"}]
    assert prediction_text(chat(prediction={"type": "content", "content": parts})) == "838"
    for content in ([{"type": "text", "text": 5}], [{"type": "text", "text": "a", "x": 1}], ["a"],
                    [{"type": "image", "text": "a"}]):
        with pytest.raises(ApiError) as caught:
            prediction_text(chat(prediction={"type": "content", "content": content}))
        assert caught.value.param == "prediction.content", content
    plain = chat(response_format={"type": "text"})
    assert guide_of(plain) is None and guide_field(plain) is None
    beside = chat(response_format={"type": "text"}, guided_regex="[0-9]+")
    assert guide_of(beside) == ("regex", "[0-9]+") and guide_field(beside) == "guided_regex"
    assert guide_of(chat(structured_outputs={"json_object": True})) == ("json", "")
    for change, param in (({"guided_regex": ""}, "guided_regex"), ({"guided_grammar": ""}, "guided_grammar"),
                          ({"guided_regex": "a", "guided_grammar": "root ::= \"a\"", "guided_choice": ["a"]},
                           "guided_choice")):
        with pytest.raises(ApiError) as caught:
            guide_of(chat(**change))
        assert caught.value.param == param, change
    assert compact_json_wanted(chat(structured_outputs={"json_object": True, "disable_any_whitespace": True}))
    assert compact_json_wanted(chat(structured_outputs={"json_object": True})) is None
    assert compact_json_wanted(chat()) is None
    assert chat(stop=["\n"]).include_stop_str_in_output is False


def test_a_conversations_messages_as_the_template_gets_them():
    """check_messages hands an assistant's tool calls on with their arguments as objects (its
    content "" where null, kept where given) and its reasoning as reasoning_content; it refuses by
    name tool calls or reasoning on another role's message, a call without a function, a field it
    does not serve (while a null one is absent) and a content part's unknown field."""
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    handed = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}

    def messages(*given):
        return check_messages(parse(ChatRequest, {**GOOD_CHAT, "messages": list(given)}).messages, None)

    user = {"role": "user", "content": "1 + 2"}
    assert messages(user, {"role": "assistant", "content": None, "tool_calls": [call]})[1] == \
        {"role": "assistant", "content": "", "tool_calls": [handed]}
    assert messages(user, {"role": "assistant", "content": "adding", "tool_calls": [call]})[1] == \
        {"role": "assistant", "content": "adding", "tool_calls": [handed]}
    assert messages(user, {"role": "assistant", "content": "3", "reasoning": "1 + 2 = 3"})[1] == \
        {"role": "assistant", "content": "3", "reasoning_content": "1 + 2 = 3"}
    assert messages({**user, "refusal": None, "annotations": []}) == [user]
    for given, param in (({**user, "tool_calls": [call]}, "messages[0].tool_calls"),
                         ({**user, "reasoning": "x"}, "messages[0].reasoning"),
                         ({"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
                          "messages[0].tool_calls[0]"),
                         ({**user, "audio": {"id": "a1"}}, "messages[0].audio"),
                         ({"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {}}]},
                          "messages[0].content[0].cache_control")):
        with pytest.raises(ApiError) as caught:
            messages(given)
        assert caught.value.param == param, given


def test_a_top_k_past_the_vocabulary_keeps_every_token(served):
    """top_k 2^31 or 10^30 (vLLM takes any k) overflowed the model's int32 input: a 500 'Internal
    Server Error' with an OverflowError in the log. Any k at or past the 264-token vocabulary is
    every token, as 0 is: under Gumbel coupling the same seed gives the same text."""
    ask = dict(model="trtspec", prompt=PROMPTS[1], max_tokens=12, temperature=1.0, seed=7)
    client = served.client()
    every = client.completions.create(**ask, extra_body={"top_k": 0}).choices[0].text
    for k in (264, 2**31, 10**30):
        assert client.completions.create(**ask, extra_body={"top_k": k}).choices[0].text == every, k


def test_a_messages_name_reaches_the_chat_template_as_in_vllm():
    """OpenAI's `name` (the participant's) was accepted and dropped; vLLM hands it to the template,
    which may write it (this one does) or leave it out (most do, as tiny-dflash's)."""
    template = "{% for m in messages %}{{ m.name or m.role }}: {{ m.content }}\n{% endfor %}"
    body = {**GOOD_CHAT, "messages": [{"role": "user", "content": "hi", "name": "ada"},
                                      {"role": "assistant", "content": "hello"}]}
    messages = check_messages(parse(ChatRequest, body).messages, None)
    assert messages == [{"role": "user", "content": "hi", "name": "ada"},
                        {"role": "assistant", "content": "hello"}]
    assert render_jinja_template([messages], chat_template=template)[0][0] == "ada: hi\nassistant: hello\n"
    with pytest.raises(ApiError) as caught:
        parse(ChatRequest, {**GOOD_CHAT, "messages": [{"role": "user", "content": "hi", "name": 5}]})
    assert caught.value.param == "messages[0].name"


def test_unknown_model_is_a_404(served):
    status, body = _post(f"{served.base}/v1/completions", {**GOOD_COMPLETION, "model": "gpt-4"})
    assert status == 404 and body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"


def _request(served, method: str, path: str) -> tuple[int, dict]:
    """A bodiless request with the server's key: the status and the JSON answer."""
    req = urllib.request.Request(served.base + path, method=method,
                                 headers={"Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_retrieve_model_and_unknown_routes_answer_in_openais_shape(served):
    """`client.models.retrieve` (GET /v1/models/{id}) is the listed card; an unknown id, an unknown
    route and a wrong method keep their status and answer {"error": {...}} as every other error."""
    client = served.client()
    card = client.models.retrieve("trtspec")
    assert card.model_dump() == client.models.list().data[0].model_dump()
    assert card.id == "trtspec" and card.model_extra["max_model_len"] == 4096
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    error = missing.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model" and "gpt-4" in error["message"]
    for method, path, status in [("GET", "/v1/nowhere", 404), ("POST", "/v1/embeddings", 404),
                                 ("GET", "/v1/completions", 405), ("DELETE", "/v1/models/trtspec", 405)]:
        got, body = _request(served, method, path)
        assert got == status, (method, path, body)
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["type"] == "invalid_request_error" and path in body["error"]["message"]
    # a trailing slash is the path without it, answered there (Starlette answered a 307 to it: a
    # redirect a client re-sending its body may not follow, naming the URL the server saw)
    assert _request(served, "GET", "/v1/models/") == _request(served, "GET", "/v1/models")
    body = {"model": "trtspec", "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
    (status, slashed), (_, plain) = (_post(f"{served.base}/v1/completions{end}", body) for end in ("/", ""))
    assert status == 200 and slashed["choices"] == plain["choices"]


def _post_bytes(served, path: str, data: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    req = urllib.request.Request(served.base + path, data=data, headers={
        "Content-Type": content_type, "Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("data, expected", [
    (b'{"model": "trtspec", "prompt": "a"', "not valid JSON: Expecting"),
    (b'{"model": "\xc3\x28"}', "not UTF-8"),
    (b"[1, 2]", "must be a JSON object"),
    # json.loads recursed past Python's limit: a 500 'Internal Server Error' in plain text and a
    # RecursionError traceback in the server log
    (b"[" * 100_000, "nested too deeply"),
    (b'{"model": "trtspec", "metadata": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001, "nested too deeply"),
    # json.loads refuses an integer past 4,300 digits with a ValueError: it was a 500 too
    (b'{"model": "trtspec", "n": 1' + b"0" * 5000 + b"}", "an integer of more than 4,300 digits"),
])
def test_a_body_that_is_no_json_object_is_a_400_in_openais_shape(served, data, expected):
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize"):
        status, body = _post_bytes(served, path, data)
        assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}, body
        assert expected in body["error"]["message"], body
    status, body = _post(f"{served.base}/v1/completions", GOOD_COMPLETION)
    assert status == 200 and body["usage"]["completion_tokens"] >= 1


def test_a_json_body_is_read_whatever_its_content_type(served):
    """`curl -d` without -H sends application/x-www-form-urlencoded: the JSON is read all the same
    (vLLM answers 415); a body that is no JSON says how it came."""
    body = json.dumps(GOOD_COMPLETION).encode()
    for kind in ("application/x-www-form-urlencoded", "text/plain", "application/json; charset=utf-8"):
        status, answer = _post_bytes(served, "/v1/completions", body, kind)
        assert status == 200 and answer["usage"]["completion_tokens"] >= 1, (kind, answer)
    status, answer = _post_bytes(served, "/v1/completions", b"model=trtspec&prompt=a",
                                 "application/x-www-form-urlencoded")
    assert status == 400 and "Content-Type application/x-www-form-urlencoded" in answer["error"]["message"]


def test_chat_accepts_and_ignores_openais_metadata_fields(served):
    """`metadata`, `store`, `service_tier`, `user`, `parallel_tool_calls`, `prompt_cache_key`,
    `prompt_cache_retention`, `safety_identifier` and `verbosity` "medium" on chat completions change
    nothing (the README says so; /v1/completions refuses the first three, see BAD)."""
    plain = served.client().chat.completions.create(**{**GOOD_CHAT, "temperature": 0})
    got = served.client().chat.completions.create(
        **{**GOOD_CHAT, "temperature": 0}, metadata={"run": "a"}, store=False, service_tier="auto",
        user="u1", parallel_tool_calls=False, prompt_cache_key="thread-1", prompt_cache_retention="24h",
        safety_identifier="u1", verbosity="medium")
    assert got.choices[0].message.content == plain.choices[0].message.content


def test_a_predicted_output_drafts_the_answer_it_does_not_change(served):
    """OpenAI's `prediction`: the answer with it is the answer without (greedy; whole and streamed,
    text or text parts), and `usage.completion_tokens_details` counts its tokens accepted and
    rejected; the answer's own text as the prediction is accepted for the most part (the content
    leaves out what the template's turn begins with, and the end token), in fewer target forwards."""
    client = served.client()
    ask = {"model": "trtspec", "messages": [{"role": "user", "content": "482 + 356"}], "max_tokens": 64,
           "temperature": 0}
    plain = client.chat.completions.create(**ask)
    text = plain.choices[0].message.content
    edited = text[:10] + "an edit" + text[14:]
    for prediction in ({"type": "content", "content": text},
                       {"type": "content", "content": [{"type": "text", "text": edited[:20]},
                                                       {"type": "text", "text": edited[20:]}]}):
        got = client.chat.completions.create(**ask, prediction=prediction)
        details = got.usage.completion_tokens_details
        assert got.choices[0].message.content == text
        assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens >= 0
        chunks = list(client.chat.completions.create(**ask, prediction=prediction, stream=True,
                                                     stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
        assert chunks[-1].usage.completion_tokens_details == details
    exact = client.chat.completions.create(**ask, prediction={"type": "content", "content": text})
    usage = exact.usage
    assert 2 * usage.completion_tokens_details.accepted_prediction_tokens > usage.completion_tokens
    assert exact.trtspec["target_forwards"] < plain.trtspec["target_forwards"]
    assert plain.usage.completion_tokens_details is None  # no prediction: no counts of one


def test_an_answer_sent_back_as_the_sdk_dumps_it_continues_the_conversation(served):
    """`messages.append(answer.choices[0].message.model_dump())` sends every field of the SDK's
    message, the unset ones null (`refusal`, `annotations`, `audio`, `function_call`,
    `tool_calls`): they are absent, as vLLM takes them (it was a 400 on `messages[1].annotations`);
    a field with a value trtspec does not serve (the deprecated function_call) is refused by name."""
    client = served.client()
    question = {"role": "user", "content": "482 + 356"}
    answer = client.chat.completions.create(model="trtspec", messages=[question], max_tokens=8, temperature=0)
    dumped = answer.choices[0].message.model_dump()
    assert {"refusal", "annotations", "tool_calls"} <= {k for k, v in dumped.items() if v is None}
    plain = {"role": "assistant", "content": answer.choices[0].message.content}
    follow = {"role": "user", "content": "1 + 1"}
    expected, got = (client.chat.completions.create(model="trtspec", messages=[question, sent, follow],
                                                    max_tokens=8, temperature=0) for sent in (plain, dumped))
    assert got.choices[0].message.content == expected.choices[0].message.content
    assert got.usage.prompt_tokens == expected.usage.prompt_tokens
    call = {"name": "f", "arguments": "{}"}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="trtspec", max_tokens=8,
                                       messages=[question, {**dumped, "function_call": call}])
    assert refused.value.param == "messages[1].function_call"


def test_non_text_content_part_is_refused_as_such(served):
    """An image (or any non-text) part: a 400 naming messages[i].content that says only text parts
    are served, on chat and on /tokenize, which render messages alike."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "system", "content": "Arithmetic."},
                {"role": "user", "content": [{"type": "text", "text": "1 + 2"}, image]}]
    for path, body in [("/v1/chat/completions", {**GOOD_CHAT, "messages": messages}),
                       ("/tokenize", {"messages": messages})]:
        status, answer = _post(served.base + path, body)
        assert status == 400, answer
        error = answer["error"]
        assert error["param"] == "messages[1].content" and "'messages[1].content'" in error["message"]
        assert "image_url" in error["message"] and "only text content parts" in error["message"]


def test_text_parts_are_joined_one_a_line_as_vllm_joins_them(served):
    """A content given as text parts is the parts one a line, as vLLM and trtllm-serve render them
    (they were joined with nothing: ["1 + 2", "3 + 4"] rendered as "1 + 23 + 4"), on /tokenize and
    on chat, whose usage counts the same prompt."""
    parts = [{"type": "text", "text": "1 + 2"}, {"type": "text", "text": "3 + 4"}]
    status, answer = _post(f"{served.base}/tokenize", {"messages": [{"role": "user", "content": parts}]})
    assert status == 200 and answer["tokens"] == list(b"Q: 1 + 2\n3 + 4\nA: ")
    client = served.client()
    as_parts, as_text = (client.chat.completions.create(
        model="trtspec", messages=[{"role": "user", "content": content}], max_tokens=4, temperature=0)
        for content in (parts, "1 + 2\n3 + 4"))
    assert as_parts.usage.prompt_tokens == as_text.usage.prompt_tokens == answer["count"]
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content


def test_usage_counts_each_prompt_once_and_every_choice(served, pipeline):
    """OpenAI's and vLLM's usage: prompt_tokens = each prompt's length once, whatever `n`;
    completion_tokens = all choices' tokens; total = their sum. Sync and streamed, completions and chat."""
    client = served.client()
    prompt, other = "Q: 2 + 3\nA:", PROMPTS[2]
    each = {p: len(_greedy(pipeline, p, 5)[1]) for p in (prompt, other)}
    ask = dict(model="trtspec", max_tokens=5, n=2, temperature=0)

    def check(usage, prompt_tokens: int, completion_tokens: int) -> None:
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == \
            (prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)

    check(client.completions.create(**ask, prompt=prompt).usage, 11, 2 * each[prompt])
    check(client.completions.create(**ask, prompt=[prompt, other]).usage, 11 + len(other),
          2 * each[prompt] + 2 * each[other])
    chunks = list(client.completions.create(**ask, prompt=prompt, stream=True,
                                            stream_options={"include_usage": True}))
    check(chunks[-1].usage, 11, 2 * each[prompt])
    rendered = "Q: 2 + 3\nA: "
    tokens = _chat_expected(pipeline, rendered, 5)[1]
    messages = [{"role": "user", "content": "2 + 3"}]
    check(client.chat.completions.create(**ask, messages=messages).usage, len(rendered), 2 * tokens)
    chunks = list(client.chat.completions.create(**ask, messages=messages, stream=True,
                                                 stream_options={"include_usage": True}))
    check(chunks[-1].usage, len(rendered), 2 * tokens)
    # vLLM's continuous_usage_stats: every chunk carries its choice's usage so far (it was accepted
    # and ignored: usage null until the last chunk)
    chunks = list(client.chat.completions.create(**ask, messages=messages, stream=True, stream_options={
        "include_usage": True, "continuous_usage_stats": True}))
    check(chunks[-1].usage, len(rendered), 2 * tokens)
    so_far = {0: 0, 1: 0}
    for chunk in chunks[:-1]:
        choice = chunk.choices[0]
        assert chunk.usage.completion_tokens >= so_far[choice.index]
        so_far[choice.index] = chunk.usage.completion_tokens
        check(chunk.usage, len(rendered), so_far[choice.index])
    assert so_far == {0: tokens, 1: tokens}


def _cross_origin(url: str, method: str = "GET", headers: dict | None = None,
                  body: dict | None = None) -> tuple[int, dict, bytes]:
    """A request as a browser sends it for a page's script: the status, the headers, the body."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def test_allowed_origins_let_a_pages_script_call_the_api_from_a_browser(served, config):
    """--allowed-origin: the browser's preflight (OPTIONS, no key) is answered for an allowed page's
    origin and refused for another; answers to an allowed page — a completion, a stream, a 401 — name
    its origin in Access-Control-Allow-Origin (else the browser hides them from the script); `*`
    allows any page. Without it (the default) nothing is allowed: no CORS header, and a preflight is
    refused as any request without the key."""
    from trtspec.openai.model_info import served_model

    page = "http://localhost:5173"
    preflight = {"Origin": page, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    body = {"model": "trtspec", "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
    ask = {"Origin": page, "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    model = served_model(config)
    for origins in ((page, "https://app.example.com"), ("*",)):
        frontend = OpenAIFrontend(model, f"127.0.0.1:{served.ports.grpc}", "127.0.0.1", free_port(), KEY,
                                  allowed_origins=origins).start()
        allowed = "*" if origins == ("*",) else page
        try:
            url = f"{frontend.url}/v1/completions"
            status, headers, _ = _cross_origin(url, "OPTIONS", preflight)
            assert status == 200 and headers["access-control-allow-origin"] == allowed, (origins, headers)
            assert "POST" in headers["access-control-allow-methods"]
            assert "authorization" in headers["access-control-allow-headers"].lower()
            status, headers, _ = _cross_origin(url, "OPTIONS", {**preflight, "Origin": "http://evil.example"})
            assert (status == 400) == (origins != ("*",)), origins
            status, headers, answer = _cross_origin(url, "POST", ask, body)
            assert status == 200 and headers["access-control-allow-origin"] == allowed
            assert json.loads(answer)["choices"][0]["text"]
            status, headers, answer = _cross_origin(url, "POST", ask, {**body, "stream": True})
            assert status == 200 and headers["access-control-allow-origin"] == allowed
            assert answer.endswith(b"data: [DONE]\n\n")
            status, headers, _ = _cross_origin(url, "POST", {**ask, "Authorization": "Bearer nope"}, body)
            assert status == 401 and headers["access-control-allow-origin"] == allowed
        finally:
            frontend.stop()
    status, headers, answer = _cross_origin(f"{served.base}/v1/completions", "OPTIONS", preflight)
    assert status == 401 and "access-control-allow-origin" not in headers  # a preflight carries no key
    assert json.loads(answer)["error"]["code"] == "invalid_api_key"
    status, headers, _ = _cross_origin(f"{served.base}/v1/completions", "POST", ask, body)
    assert status == 200 and "access-control-allow-origin" not in headers


def test_wrong_or_missing_api_key_is_a_401_and_runs_nothing(served):
    before = served.metric("trtspec_requests_total")
    for key in (None, "wrong"):
        status, body = _post(f"{served.base}/v1/completions", GOOD_COMPLETION, key)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        served.client("wrong").completions.create(model="trtspec", prompt="Q: 1 + 2\nA:", max_tokens=4)
    assert served.metric("trtspec_requests_total") == before


def test_triton_admin_apis_need_the_key(served):
    url = f"{served.http}/v2/repository/index"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=10)
    assert refused.value.code in (401, 403)
    allowed = urllib.request.Request(url, data=b"{}", headers={"admin-key": KEY})
    with urllib.request.urlopen(allowed, timeout=10) as resp:
        assert [m["name"] for m in json.loads(resp.read())] == ["trtspec"]
    with grpcclient.InferenceServerClient(served.grpc) as client:
        with pytest.raises(InferenceServerException, match="(?i)restricted|permission|admin-key"):
            client.get_model_repository_index()
        index = client.get_model_repository_index(headers={GRPC_ADMIN_HEADER: KEY})
        assert index.models[0].name == "trtspec"
        assert client.is_model_ready("trtspec")  # inference and health stay open to Triton's clients


def _trtllm_request(served, **inputs) -> tuple:
    arrays = {"text_input": np.array([b"Q: 482 + 356\nA:"], dtype=object),
              "max_tokens": np.array([60], dtype=np.int32), **inputs}  # text_input=None: input_ids instead
    given = [array_input(InferInput, k, v) for k, v in arrays.items() if v is not None]
    return grpc_generate(served.grpc, "trtspec", given, timeout_s=60)


def test_triton_takes_tensorrt_llm_inputs(served, pipeline):
    """What NVIDIA's clients send a TensorRT-LLM model: honoured where the decoder can, refused
    by name and value otherwise, defaults pass."""
    prompt = "Q: 482 + 356\nA:"
    text, ids = _greedy(pipeline, prompt, 60)
    got = _trtllm_request(served, exclude_input_in_output=np.array([False]),
                          beam_width=np.array([1], dtype=np.int32), pad_id=np.array([0], dtype=np.int32),
                          repetition_penalty=np.array([1.0], dtype=np.float32))
    assert got.text == prompt + text and got.token_ids == list(prompt.encode()) + ids
    got = _trtllm_request(served, text_input=None, input_ids=np.array(list(prompt.encode()), dtype=np.int32),
                          exclude_input_in_output=np.array([False]))  # the prompt's text decoded from its ids
    assert got.text == prompt + text and got.token_ids == list(prompt.encode()) + ids
    newline = ord("\n")
    got = _trtllm_request(served, end_id=np.array([newline], dtype=np.int32))
    assert got.token_ids == ids[: ids.index(newline) + 1]
    at_least = ids.index(newline) + 2  # the end id is removed from p before that many tokens
    got = _trtllm_request(served, end_id=np.array([newline], dtype=np.int32),
                          min_length=np.array([at_least], dtype=np.int32))
    want = pipeline.decoder.generate_batch([Request(list(prompt.encode()), 60, min_new_tokens=at_least,
                                                    end_id=newline)])[0].token_ids
    assert got.token_ids == want and newline not in want[:at_least] and want != ids
    # vLLM's ignore_eos: the end id no longer ends it; a stop_token_id still does
    got = _trtllm_request(served, end_id=np.array([newline], dtype=np.int32), ignore_eos=np.array([True]))
    assert got.token_ids == ids
    got = _trtllm_request(served, ignore_eos=np.array([True]),
                          stop_token_ids=np.array([newline], dtype=np.int32))
    assert got.token_ids == ids[: ids.index(newline) + 1]
    with pytest.raises(ClientError, match="beam_width=4 is not supported by trtspec"):
        _trtllm_request(served, beam_width=np.array([4], dtype=np.int32))
    assert _trtllm_request(served).token_ids == ids  # and the next request is served


def test_generate_and_bench_cli_over_openai(served, pipeline, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    result = CliRunner().invoke(main, ["generate", "--url", served.url, "--stream", "--json", "--prompt",
                                       PROMPTS[0], "--max-tokens", str(MAX_TOKENS)])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["text"] == _greedy(pipeline, PROMPTS[0])[0] and answer["tokens"] == MAX_TOKENS
    assert answer["tau"] > 1 and answer["finish_reason"] == "length" and answer["decode_tokens_per_s"] > 0
    assert answer["token_ids"] is None  # the OpenAI API sends no ids
    result = CliRunner().invoke(main, ["generate", "--url", served.url, "--json", "--prompt", PROMPTS[0],
                                       "--max-tokens", "8"])
    assert result.exit_code == 0, result.output
    whole = json.loads(result.output)
    assert whole["tokens"] == 8 and whole["finish_reason"] == "length" and whole["token_ids"] is None
    assert whole["decode_tokens_per_s"] is None  # one response: no decode phase to time
    # no warm-up: after one more chat request the fresh server's adaptive schedule decoded a level
    # of these without a draft accepted (48 tokens in 48 forwards), and τ is what this carries
    result = CliRunner().invoke(main, ["bench", "--url", served.url, "--tasks", "math", "--prompts", "2",
                                       "--max-tokens", "24", "--concurrency", "1,2", "--chat",
                                       "--warmup", "0", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    remote = json.loads((tmp_path / "results.json").read_text())["remote"]
    assert remote["endpoint"] == "chat" and set(remote["levels"]) == {"1", "2"}
    for row in remote["levels"].values():
        assert row["tokens"] > 4 and row["tau"] >= 1 and 0 < row["ttft_ms"] < 1e3 * row["wall_s"]
        assert row["per_user_tokens_per_s"] == pytest.approx(1e3 / row["itl_ms"], rel=0.01)
    # drafts reached the table: at one level at least (the shared server's adaptive schedule, which
    # learns from every earlier request, can leave one level plain; run after the 400s alone, it did)
    assert max(row["tau"] for row in remote["levels"].values()) > 1
    # sampled: each prompt seeded, the server's coupling verifying
    result = CliRunner().invoke(main, ["bench", "--url", served.url, "--tasks", "math", "--prompts", "2",
                                       "--max-tokens", "24", "--temperature", "1", "--seed", "40",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    remote = json.loads((tmp_path / "results.json").read_text())["remote"]
    assert remote["decoding"].startswith("sampling at temperature 1") and remote["levels"]["1"]["tokens"] > 4
    # penalties reach the server: the target's own text under them (last: a penalized request is
    # accepted less, which the adaptive schedule learns from, and the benches above need drafts)
    penalties = ["--presence-penalty", "0.6", "--frequency-penalty", "0.3", "--repetition-penalty", "1.2"]
    result = CliRunner().invoke(main, ["generate", "--url", served.url, "--json", "--prompt", PROMPTS[1],
                                       "--max-tokens", str(MAX_TOKENS), *penalties])
    assert result.exit_code == 0, result.output
    sampling = SamplingParams(presence_penalty=0.6, frequency_penalty=0.3, repetition_penalty=1.2)
    want = pipeline.decoder.generate(list(PROMPTS[1].encode()), MAX_TOKENS, sampling).token_ids
    assert json.loads(result.output)["text"] == bytes(want).decode() != _greedy(pipeline, PROMPTS[1])[0]


def test_a_url_of_the_other_servers_port_says_which_port_it_may_be(served):
    """Found auditing the docs (2026-12-06): openai:// at Triton's HTTP port answered "HTTP 404: Not
    Found" alone. A 404 that is not the API's own error (no such route) now says which port it may
    be; an unknown model, the API's own 404, is left as the server words it."""
    grpc_port = served.grpc.rsplit(":", 1)[1]
    for url, key, expected in (
            (f"openai://127.0.0.1:{served.ports.http}", KEY, "no OpenAI API there: is it Triton's HTTP"),
            (served.http, None, None),  # Triton's own generate endpoint: it answers
            (served.base, None, "is it the OpenAI API's port? (openai://HOST:PORT for it)"),
            (f"grpc://127.0.0.1:{served.openai_port}", None, "is it an HTTP port?"),
            (f"grpc://127.0.0.1:{served.ports.http}", None, "is it an HTTP port?"),  # was: "Socket closed"
            (f"grpc://127.0.0.1:{grpc_port}", None, None)):
        args = ["generate", "--url", url, "--prompt", "Q: 1 + 2\nA:", "--max-tokens", "4"]
        result = CliRunner().invoke(main, args + (["--api-key", key] if key else []))
        if expected is None:
            assert result.exit_code == 0, result.output
        else:
            assert result.exit_code == 1 and expected in result.output, result.output
    result = CliRunner().invoke(main, ["generate", "--url", served.url, "--api-key", KEY, "--model", "nope",
                                       "--prompt", "hi", "--max-tokens", "4"])
    assert result.exit_code == 1 and "The model `nope` does not exist." in result.output
    assert "is it" not in result.output


def test_an_end_on_the_last_allowed_token_finishes_as_a_stop(served, pipeline):
    """The model's finish_reason, not a count: the same max_tokens tokens are a length, or a stop
    when the last is a stop_token_id."""
    _, ids = _greedy(pipeline, PROMPTS[0])
    n = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    client = served.client()
    for stop, reason in (([], "length"), ([ids[n]], "stop")):
        for stream in (False, True):
            ask = {"model": "trtspec", "prompt": PROMPTS[0], "max_tokens": n + 1, "temperature": 0,
                   "extra_body": {"stop_token_ids": stop}}
            if stream:
                chunks = list(client.completions.create(**ask, stream=True))
                assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reason
            else:
                assert client.completions.create(**ask).choices[0].finish_reason == reason


def test_local_chat_is_the_served_chat(served):
    """`trtspec generate --config --chat` renders the template and stops at the turn's end as the
    server's /v1/chat/completions does."""
    for question in ("482 + 356", "Explain what a generator is."):
        choice = served.client().chat.completions.create(
            model="trtspec", messages=[{"role": "user", "content": question}], max_tokens=48,
            temperature=0).choices[0]
        local = CliRunner().invoke(main, ["generate", "--config", str(CONFIG), "--chat", "--json", "--prompt",
                                          question, "--max-tokens", "48"])
        assert local.exit_code == 0, local.output
        assert json.loads(local.output)["text"] == choice.message.content
        assert json.loads(local.output)["finish_reason"] == choice.finish_reason


def test_verify_over_openai_passes_on_the_server(served, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    result = CliRunner().invoke(main, ["verify", "--url", served.url, "--config", str(CONFIG), "--max-tokens",
                                       "24", "--samples", "300"])
    assert result.exit_code == 0, result.output
    assert result.output.count("greedy  identical") == 5 and result.output.count("penalty identical") == 5
    assert result.output.count("guided  identical") == 5 and "PASS: lossless" in result.output
    assert result.output.count("sample  token 1:") == 4 and "guided by regex '[^" in result.output
    assert "min-p 0.2, presence 0.5, frequency 0.3, repetition 1.2, logit_bias {" in result.output
    # the fourth law under the bad word alone: /v1/completions takes no reasoning budget
    assert "top-p 0.9, bad word 'mp'\n" in result.output
    assert "not tested: the sampled law under a reasoning budget: /v1/completions takes none" in result.output
    # not the first prompt (its first tokens are near-certain: any server passes): 'import os\n'
    assert "law of the first 3 tokens of 'import os\\n'" in result.output
    # one token per text: the prefill's, which no draft decides; the certificate says so
    short = CliRunner().invoke(main, ["verify", "--url", served.url, "--config", str(CONFIG), "--max-tokens",
                                      "1", "--samples", "0"])
    assert short.exit_code == 0 and "PASS: lossless" in short.output, short.output
    assert "not tested: speculation in the served texts (--max-tokens 1: each is its prompt's first token" \
        in short.output


def test_verify_certifies_gumbel_coupled_samples_by_identity(served, tmp_path, monkeypatch):
    """This server samples with Gumbel coupling: `verify` with its config also holds every prompt's
    seeded sample to the target alone's, text for text."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    gumbel = tmp_path / "gumbel.yaml"
    gumbel.write_text(CONFIG.read_text() + "sampling:\n  coupling: gumbel\n")
    result = CliRunner().invoke(main, ["verify", "--url", served.url, "--config", str(gumbel), "--max-tokens",
                                       "24", "--samples", "0"])
    assert result.exit_code == 0, result.output
    assert result.output.count("sampled identical") == 5 and "PASS: lossless" in result.output


@contextlib.contextmanager
def _frontend_of(biased):
    """An OpenAI frontend over `biased`'s server, once it has started."""
    server, started = biased
    started.result()
    frontend = OpenAIFrontend(served_model_of_repo(server.repo), server.local_grpc_address, "127.0.0.1",
                              free_port()).start()
    try:
        yield frontend
    finally:
        frontend.stop()


def test_verify_over_openai_fails_on_a_biased_server(biased):
    """A server whose speculative sampling accepts with min(1, p/2q) (test_only.biased_acceptance):
    greedy is still identical, the sampling law test must fail it."""
    with _frontend_of(biased) as frontend:
        url = f"openai://127.0.0.1:{frontend.port}"
        result = CliRunner().invoke(main, ["verify", "--url", url, "--config", str(CONFIG), "--max-tokens",
                                           "24", "--samples", "300"])
    assert result.exit_code == 1, result.output
    assert result.output.count("identical") == 15 and "FAIL: the deployment is not lossless" in result.output
    assert "FAIL\n" in result.output  # a sampling position over its bound


def test_compare_passes_lossless_deployments_and_fails_samples_they_do_not_couple(served, biased):
    """`trtspec compare`: `served` (Gumbel coupling) and `biased` (rejection sampling) both answer
    greedy requests as the target alone does, so every answer agrees; their seeded samples are drawn
    differently, so compare fails them, naming a request that parted."""
    with _frontend_of(biased) as frontend:
        both = ["compare", "--url", served.url, "--api-key", KEY, "--reference-url",
                f"openai://127.0.0.1:{frontend.port}", "--max-tokens", "24"]
        greedy = CliRunner().invoke(main, [*both, "--requests", "24"])
        assert greedy.exit_code == 0, greedy.output
        assert "24 requests: 24 identical, 0 parted at a near tie, 0 different" in greedy.output
        assert greedy.output.rstrip().endswith("PASS: every answer the reference's")
        sampled = CliRunner().invoke(main, [*both, "--requests", "12", "--temperature", "1"])
    assert sampled.exit_code == 1 and "FAIL: answers differ" in sampled.output, sampled.output
    assert "DIFFERENT: choice 0 differs at token " in sampled.output and '"seed": ' in sampled.output


def test_a_failed_step_is_a_500_its_traceback_is_logged_and_the_server_serves_on(biased):
    """A step that fails for a reason of the model's own (test_only.fail_on_max_tokens): the requests
    running get "generation failed" as Triton's INTERNAL and the OpenAI API's 500
    server_error (it was a 400 invalid_request_error, blaming the request), the model logs the
    traceback into the server's log, and the next request is served."""
    server = biased[0]
    with _frontend_of(biased) as frontend:
        generate = f"{server.http_url}/v2/models/trtspec/generate"
        status, body = post_json(generate, {"text_input": "Q: 1 + 2\nA:", "max_tokens": FAILING_MAX_TOKENS})
        # Triton's generate endpoint answers 400 for any error of a model's (its gRPC API says INTERNAL)
        assert status == 400 and body["error"].startswith("generation failed: test_only.fail_on_max_tokens")
        failing = {**GOOD_COMPLETION, "max_tokens": FAILING_MAX_TOKENS}
        status, body = _post(f"{frontend.url}/v1/completions", failing, None)
        assert status == 500, body
        assert (body["error"]["type"], body["error"]["code"]) == ("server_error", "internal_error")
        assert body["error"]["message"].startswith("generation failed: test_only.fail_on_max_tokens")
        status, body = _post(f"{frontend.url}/v1/completions", GOOD_COMPLETION, None)
        assert status == 200 and body["usage"]["completion_tokens"] >= 1
    log = server.log_path.read_text(encoding="utf-8")
    assert "decoding step failed" in log and "Traceback (most recent call last)" in log
    assert log.count("RuntimeError: test_only.fail_on_max_tokens") == 2


def test_a_request_past_the_queue_bound_is_refused_at_once_as_busy(biased):
    """`biased` lets no request wait (limits.max_queued 0): with its 8 decoder slots taken, one more is
    refused at once, as busy rather than bad: the OpenAI API's 503 server_error (its SDK retries one),
    Anthropic's overloaded_error, a gRPC or HTTP client's error; each counted as server_busy. Once the slots
    are free the next request is served. Without a bound it waited for a slot, however long. A request
    of more choices than the bound ever holds is a 400."""
    server = biased[0]
    busy = ("the server is busy: its 8 decoder slots are taken and 0 requests wait already "
            "(limits.max_queued 0)")

    def settle(name: str, value: float) -> float:
        deadline = time.monotonic() + 30
        while scraped_metric(server.metrics_url, name) != value and time.monotonic() < deadline:
            time.sleep(0.05)
        return scraped_metric(server.metrics_url, name)

    with _frontend_of(biased) as frontend:
        # 9 choices: more than the deployment ever holds (each choice a request), refused by name: a
        # 503 "retry later" would never come true
        status, body = _post(f"{frontend.url}/v1/completions", {**GOOD_COMPLETION, "n": 9}, None)
        assert (status, body["error"]["param"]) == (400, "n"), body
        assert body["error"]["message"].startswith("Invalid 'n': 9 choices, more than the 8 requests the "
                                                   "deployment holds at once (limits.max_concurrency and")
        # 8 choices of 2,048 tokens each, end ids ignored, read no further than their first chunk
        occupier = subprocess.Popen([sys.executable, "-c", DROPPING_CLIENT, f"{frontend.url}/v1/completions",
                                     "none", json.dumps((CODE * 3)[:8]), "stream"], stdout=subprocess.PIPE,
                                    text=True)
        try:
            assert line_within(occupier.stdout).strip() == "got"
            assert settle("trtspec_requests_in_flight", 8) == 8
            client = openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="none", max_retries=0)
            with pytest.raises(openai.APIStatusError) as refused:  # the SDK would retry it after a second
                client.completions.create(**GOOD_COMPLETION)
            assert (refused.value.status_code, refused.value.response.headers["retry-after"]) == (503, "1")
            error = refused.value.body
            assert (error["type"], error["code"]) == ("server_error", "unavailable")
            assert error["message"].startswith(busy)
            status, body = _post(f"{frontend.url}/v1/messages", {**GOOD_CHAT, "max_tokens": 4}, None)
            assert (status, body["error"]["type"]) == (503, "overloaded_error"), body
            status, body = post_json(f"{server.http_url}/v2/models/trtspec/generate",
                                     {"text_input": "Q: 1 + 2\nA:", "max_tokens": 4})
            # Triton's generate endpoint answers 400 for any error of a model's, UNAVAILABLE too (upstream)
            assert status == 400 and body["error"].startswith(busy), (status, body)
            with pytest.raises(ClientError, match=re.escape(busy)):
                grpc_generate(server.local_grpc_address, "trtspec",
                              grpc_inputs("Q: 1 + 2\nA:", GenerateParams(max_tokens=4)), timeout_s=60)
        finally:
            occupier.kill()
            occupier.wait()
        assert settle("trtspec_requests_in_flight", 0) == 0
        status, body = _post(f"{frontend.url}/v1/completions", GOOD_COMPLETION, None)
        assert status == 200 and body["usage"]["completion_tokens"] >= 1, body
    assert scraped_metric(server.metrics_url, "trtspec_request_errors_total", reason="server_busy") == 4


def test_the_models_refusals_are_told_apart_by_whose_fault_they_are():
    """A gRPC stream's error carries no code, only the model's message: a busy or stopping server is a
    503 (retry later or elsewhere; the model's "shutting down" was a 400 invalid_value), a failed
    step a 500, anything else the request's fault, a 400."""
    for message, status, code in (
            ("the server is busy: its 8 decoder slots are taken and 3 wait already", 503, "unavailable"),
            ("the server is shutting down: this request was not finished", 503, "unavailable"),
            ("generation failed: CUDA error", 500, "internal_error"),
            ("prompt: 5000 tokens exceed the 4096 positions", 400, "invalid_value")):
        error = triton_error(TritonError(message))
        assert (error.status, error.code, error.message) == (status, code, message)


def test_frontend_unavailable_triton_is_a_503(tmp_path, config):
    """The frontend up while Triton is not: /health says so, requests get a 503, nothing hangs."""
    from trtspec.openai.model_info import served_model

    triton_port, port = free_ports(2)
    nowhere = f"127.0.0.1:{triton_port}"
    frontend = OpenAIFrontend(served_model(config), nowhere, "127.0.0.1", port).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as unavailable:
            urllib.request.urlopen(f"{frontend.url}/health", timeout=10)
        assert unavailable.value.code == 503
        status, body = _post(f"{frontend.url}/v1/completions", GOOD_COMPLETION, None)
        assert status == 503 and body["error"]["type"] == "server_error"
    finally:
        frontend.stop()


def test_connections_that_send_no_request_are_closed_and_capped(config):
    """Found stressing the server (2026-12-06): a connection that sends nothing, or half a request
    head, was never closed, and 20,500 of them took every file descriptor: requests and /health timed
    out and asyncio logged 5,000 errors a second. Now a head must come whole within the head timeout
    (after the connection opens, or after its last response), and connections past the cap are
    closed as they come; the frontend answers throughout. Triton is not running: /health's 503 is
    the frontend's own answer."""
    import socket

    from trtspec.openai.model_info import served_model

    triton_port, port = free_ports(2)
    frontend = OpenAIFrontend(served_model(config), f"127.0.0.1:{triton_port}", "127.0.0.1", port,
                              head_timeout_s=3.0, max_connections=6).start()
    held = []
    try:
        def connect(first: bytes = b"") -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", frontend.port), timeout=10)
            sock.sendall(first)
            held.append(sock)
            return sock

        def whole(sock: socket.socket) -> bytes:  # what the server sends until it closes the connection
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            return data

        silent = [connect() for _ in range(3)]
        half = connect(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        kept = http.client.HTTPConnection("127.0.0.1", frontend.port, timeout=10)  # answered, kept alive
        kept.request("GET", "/v1/models")
        assert kept.getresponse().read().startswith(b'{"object":"list"')
        held.append(kept.sock)
        kept.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and half of its next head
        time.sleep(0.2)  # the server has taken the 5 connections above: the 6th is the last let in
        sixth = connect(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        seventh = connect()
        started = time.monotonic()
        assert seventh.recv(1) == b"" and time.monotonic() - started < 1.5  # closed at once, not timed out
        for sock in [*silent, half, kept.sock]:
            assert whole(sock) == b""  # closed by the server when their (next) heads did not come
        assert whole(sixth).startswith(b"HTTP/1.1 200")  # answered, then closed as it sent no more
        assert time.monotonic() - started < 8
        with urllib.request.urlopen(f"{frontend.url}/v1/models", timeout=10) as resp:
            assert resp.status == 200
    finally:
        for sock in held:
            sock.close()
        frontend.stop()


def test_the_frontend_raises_its_file_limit_and_caps_connections_below_it():
    """The soft limit on open files goes up to the hard one and SPARE_FILES stay for the rest of the
    process; a hard limit under SPARE_FILES still lets 16 connections in (each case in a child
    process, whose limits are its own)."""
    from trtspec.openai.connections import SPARE_FILES

    def child(soft: int, hard: int) -> list[int]:
        code = ("import resource; from trtspec.openai.connections import raise_file_limit; "
                f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
                "cap = raise_file_limit(); print(cap, *resource.getrlimit(resource.RLIMIT_NOFILE))")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
        assert run.returncode == 0, run.stderr
        return [int(x) for x in run.stdout.split()]

    assert child(300, 1024) == [1024 - SPARE_FILES, 1024, 1024]
    assert child(1024, 1024) == [1024 - SPARE_FILES, 1024, 1024]
    assert child(100, 200) == [16, 200, 200]


def test_a_body_over_max_request_bytes_is_a_413_before_it_is_read(config):
    """limits.max_request_bytes bounds what the frontend reads: a body over it is a 413 in the route's
    shape whether its Content-Length says so or it comes in chunks, and the frontend stays up
    (an authenticated client's 2 GB body would have been read whole into memory). Triton is not
    running: the answers come from the frontend alone."""
    import http.client

    from trtspec.openai.model_info import served_model

    limits = config.limits.model_copy(update={"max_request_bytes": 65_536})
    triton_port, port = free_ports(2)
    nowhere = f"127.0.0.1:{triton_port}"
    frontend = OpenAIFrontend(served_model(config.model_copy(update={"limits": limits})), nowhere,
                              "127.0.0.1", port).start()
    big = json.dumps({**GOOD_COMPLETION, "prompt": "x" * 70_000}).encode()
    try:
        for path in ("/v1/completions", "/v1/messages"):
            for chunked in (False, True):
                conn = http.client.HTTPConnection("127.0.0.1", frontend.port, timeout=30)
                headers = {"Content-Type": "application/json"}
                if chunked:  # no Content-Length: counted as the chunks arrive
                    conn.request("POST", path, body=iter([big[i:i + 4096] for i in range(0, len(big), 4096)]),
                                 headers=headers, encode_chunked=True)
                else:
                    conn.request("POST", path, body=big, headers=headers)
                resp = conn.getresponse()
                body = json.loads(resp.read())
                conn.close()
                assert resp.status == 413, (path, chunked, body)
                error = body["error"]
                assert "more than 65,536 bytes" in error["message"] and "limits.max_request_bytes" in \
                    error["message"]
                if path == "/v1/messages":  # Anthropic's shape, and its own type for a 413
                    assert (body["type"], error["type"]) == ("error", "request_too_large")
                else:
                    assert error["code"] == "request_too_large"
        # under the limit the request goes on: to a Triton that is not there
        under = {**GOOD_COMPLETION, "prompt": "x" * 60_000}
        status, body = post_json(f"{frontend.url}/v1/completions", under)
        assert status in (400, 503), body  # refused by the model's bounds, or Triton unavailable
        assert "max_request_bytes" not in body["error"]["message"]
    finally:
        frontend.stop()


def test_a_prompt_over_max_input_tokens_is_a_400_naming_it_before_triton(config):
    """With `limits.max_input_tokens`, the frontend knows the deployment's bounds: a longer prompt
    is a 400 naming `prompt` / `messages` (it reached the model, which refused it naming
    `text_input`, param null), and /v1/models reports max_input_tokens + max_tokens as
    max_model_len, what a request may use (it reported the target's 4,096 positions). Triton is
    not running: the answer comes from the frontend alone."""
    from trtspec.openai.model_info import served_model

    limited = config.model_copy(update={"limits": config.limits.model_copy(
        update={"max_tokens": 64, "max_input_tokens": 8})})
    triton_port, port = free_ports(2)
    nowhere = f"127.0.0.1:{triton_port}"
    frontend = OpenAIFrontend(served_model(limited), nowhere, "127.0.0.1", port).start()
    try:
        client = openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="none", max_retries=0)
        assert client.models.retrieve("trtspec").model_extra["max_model_len"] == 8 + 64
        for call, param in ((lambda: client.completions.create(model="trtspec", prompt=PROMPTS[0]), "prompt"),
                            (lambda: client.chat.completions.create(
                                model="trtspec", messages=[{"role": "user", "content": "482 + 356"}]),
                             "messages")):
            with pytest.raises(openai.BadRequestError) as refused:
                call()
            assert refused.value.param == param and refused.value.code == "context_length_exceeded"
            assert "limits.max_input_tokens" in refused.value.message
    finally:
        frontend.stop()


def test_the_served_model_takes_its_context_from_the_target_or_the_limits(config, random_qwen3_dir,
                                                                          tmp_path, caplog):
    """What the frontend bounds requests by without loading weights: the target's positions, or
    max_input_tokens + max_tokens where fewer; structured outputs' JSON spaced unless `serve
    --compact-json`; a target without a chat template served with a warning naming its folder."""
    from trtspec.config import load_build_config
    from trtspec.openai.model_info import served_model

    model = served_model(config)
    assert (model.context_length, model.max_tokens, model.compact_json) == (4096, 2048, False)
    limited = config.model_copy(update={"limits": config.limits.model_copy(update={"max_input_tokens": 8})})
    assert served_model(limited).context_length == 8 + 2048
    assert model.chat is not None and "no chat template" not in caplog.text
    plain = tmp_path / "plain.yaml"
    plain.write_text(json.dumps({"name": "plain", "target": {"path": str(random_qwen3_dir)}}))  # YAML too
    with caplog.at_level(logging.WARNING, logger="trtspec.openai.model_info"):
        assert served_model(load_build_config(plain)).chat is None
    assert f"{random_qwen3_dir} has no chat template" in caplog.text


def test_shipped_chat_template_is_the_recipes():
    from trtspec.config import ASSETS_DIR
    from trtspec.train.corpus import CHAT_STOP, CHAT_TEMPLATE, CHAT_TEMPLATE_FILE

    for model in ("tiny-target", "tiny-draft"):
        assert (ASSETS_DIR / model / CHAT_TEMPLATE_FILE).read_text() == CHAT_TEMPLATE
        config = json.loads((ASSETS_DIR / model / "config.json").read_text())
        assert tuple(config["trtspec_chat_stop"]) == CHAT_STOP


def test_min_tokens_holds_stop_sequences_back_as_it_holds_stop_token_ids(served, pipeline):
    """vLLM checks `stop` only past min_tokens, as it holds back the end and stop ids: a stop
    sequence written by the first min_tokens tokens is part of the answer. It ended the request
    there: `stop: [";"]` with min_tokens 20 answered ' 2+6=8' after 7 tokens, where
    `stop_token_ids` [59] (';') with min_tokens 20 decoded on."""
    prompt, semicolon = PROMPTS[0], pipeline.tokenizer.encode(";", add_special_tokens=False)[0]
    text, ids = _greedy(pipeline, prompt, 30)
    min_tokens = 20
    protected = len(pipeline.tokenizer.decode(ids[:min_tokens]))
    assert 0 <= text.index(";") < protected <= text.index(";", protected)  # a ';' before, one past
    client = served.client()
    for stream in (False, True):
        ask = {"model": "trtspec", "prompt": prompt, "max_tokens": 30, "temperature": 0,
               "extra_body": {"min_tokens": min_tokens}}
        if stream:
            chunks = [c for c in client.completions.create(**ask, stop=[";"], stream=True) if c.choices]
            got, finish = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            choice = client.completions.create(**ask, stop=[";"]).choices[0]
            got, finish = choice.text, choice.finish_reason
        assert (got, finish) == (text[: text.index(";", protected)], "stop"), stream
        held = client.completions.create(**{**ask, "extra_body": {"min_tokens": min_tokens,
                                                                   "stop_token_ids": [semicolon]}})
        assert held.usage.completion_tokens > min_tokens


def _raw_logprobs(pipeline, prompt_ids: list[int], ids: list[int]) -> torch.Tensor:
    """The target's own log_softmax at the positions that predict `ids` [n, V]."""
    with torch.inference_mode():
        logits = pipeline.target.model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), -1)


def test_logprobs_are_the_targets_raw_log_p(served, pipeline):
    """completions `logprobs: 3` and chat `logprobs` / `top_logprobs: 2`, sync and streamed, greedy
    and sampled: every token's value and its best alternatives are log_softmax(model(ids)) there."""
    client, tok = served.client(), pipeline.tokenizer
    name = {i: tok.token_bytes(i).decode("utf-8", errors="replace") for i in range(256)}
    prompt = PROMPTS[0]
    _, ids = _greedy(pipeline, prompt)
    want = _raw_logprobs(pipeline, list(prompt.encode()), ids)
    got = client.completions.create(model="trtspec", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                    logprobs=3).choices[0].logprobs
    assert got.tokens == [name[i] for i in ids]
    assert np.allclose(got.token_logprobs, want[torch.arange(len(ids)), ids].numpy(), atol=1e-4)
    assert got.text_offset == [sum(len(name[i]) for i in ids[:n]) for n in range(len(ids))]
    for n, top in enumerate(got.top_logprobs):  # the chosen token and the best 3 (greedy: the same one first)
        best = want[n].topk(3)
        assert list(top) == [name[i] for i in best.indices.tolist()]
        assert np.allclose(list(top.values()), best.values.numpy(), atol=1e-4)
    chunks = list(client.completions.create(model="trtspec", prompt=prompt, max_tokens=MAX_TOKENS,
                                            temperature=0, logprobs=3, stream=True))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert len(streamed) > 2 and sum((s.tokens for s in streamed), []) == got.tokens
    # the same values up to float rounding: the schedule may verify other block lengths this time
    assert np.allclose(sum((s.token_logprobs for s in streamed), []), got.token_logprobs, atol=1e-4)
    assert sum((s.text_offset for s in streamed), []) == got.text_offset

    # chat, sampled: the bytes name each byte-level id exactly
    messages = [{"role": "user", "content": "482 + 356"}]
    asked = dict(model="trtspec", messages=messages, max_tokens=40, temperature=0.9, seed=11, logprobs=True,
                 top_logprobs=2)
    by_bytes = {tuple(tok.token_bytes(i)): i for i in range(pipeline.target.vocab_size)}

    def check(content) -> None:
        ids = [by_bytes[tuple(c.bytes)] for c in content]
        assert len(ids) > 5
        want = _raw_logprobs(pipeline, list(b"Q: 482 + 356\nA: "), ids)
        assert np.allclose([c.logprob for c in content], want[torch.arange(len(ids)), ids].numpy(), atol=1e-4)
        for n, c in enumerate(content):
            best = want[n].topk(2)
            assert [by_bytes[tuple(t.bytes)] for t in c.top_logprobs] == best.indices.tolist()
            assert np.allclose([t.logprob for t in c.top_logprobs], best.values.numpy(), atol=1e-4)

    check(client.chat.completions.create(**asked).choices[0].logprobs.content)
    chunks = list(client.chat.completions.create(**asked, stream=True))
    check(sum((c.choices[0].logprobs.content for c in chunks if c.choices[0].logprobs), []))
    plain = client.chat.completions.create(**{**asked, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None


def _lm_eval_loglikelihood(choice: dict, ctxlen: int) -> tuple[float, bool]:
    """lm-evaluation-harness's `LocalCompletionsAPI.parse_logprobs` for one choice: the
    continuation's summed log p (the last token is the one generated) and whether each of its
    tokens was the most likely."""
    values = choice["logprobs"]["token_logprobs"][ctxlen:-1]
    tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
    return sum(values), all(v == max(top.values()) for v, top in zip(values, tops, strict=True))


def test_token_prompts_several_prompts_and_echo_with_prompt_logprobs(served, pipeline):
    """vLLM's completions extras: token-id prompts, a choice per prompt, and echo, whose logprobs
    score the prompt's tokens too (its first null): what lm-evaluation-harness's local-completions
    sends for a loglikelihood task, and what it computes from the answer."""
    client, tok = served.client(), pipeline.tokenizer
    texts = [PROMPTS[0], PROMPTS[1], "x"]
    alone = [_greedy(pipeline, p, 12) for p in texts]
    ids = [list(p.encode()) for p in texts]
    got = client.completions.create(model="trtspec", prompt=ids, max_tokens=12, temperature=0)
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert [c.text for c in got.choices] == [text for text, _ in alone]
    assert got.usage.prompt_tokens == sum(map(len, ids))
    assert got.usage.completion_tokens == sum(len(i) for _, i in alone)
    mixed = client.completions.create(model="trtspec", prompt=[texts[2], texts[0]], max_tokens=12,
                                      temperature=0)
    assert [c.text for c in mixed.choices] == [alone[2][0], alone[0][0]]
    # streamed: the choices' chunks interleave, each tagged with its index, one finish each, usage summed
    chunks = list(client.completions.create(model="trtspec", prompt=ids, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    by_index: dict[int, str] = {}
    for c in chunks[:-1]:
        by_index[c.choices[0].index] = by_index.get(c.choices[0].index, "") + c.choices[0].text
    assert by_index == {i: text for i, (text, _) in enumerate(alone)}
    finishes = sorted(c.choices[0].index for c in chunks[:-1] if c.choices[0].finish_reason)
    assert finishes == [0, 1, 2] and chunks[-1].usage.completion_tokens == got.usage.completion_tokens
    assert len({c.choices[0].index for c in chunks[:4]}) > 1, "the choices' steps interleave"

    # echo with logprobs, the way lm-eval asks: token ids, greedy, one token, one alternative
    name = {i: tok.token_bytes(i).decode("utf-8", errors="replace") for i in range(256)}
    contexts = [list(b"Q: 482 + 356\nA: "), list(b"def parse(self, ")]
    continuations = [list(b"838"), list(b"text):")]
    status, body = _post(f"{served.base}/v1/completions", {
        "model": "trtspec", "prompt": [c + x for c, x in zip(contexts, continuations, strict=True)],
        "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True})
    assert status == 200, body
    for choice, context, continuation in zip(body["choices"], contexts, continuations, strict=True):
        whole = context + continuation
        generated = _greedy(pipeline, bytes(whole).decode(), 1)[1]
        assert choice["text"] == bytes(whole).decode() + tok.decode(generated)
        logprobs = choice["logprobs"]
        assert logprobs["tokens"] == [name[i] for i in whole + generated]
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        want = _raw_logprobs(pipeline, whole[:1], whole[1:] + generated)  # every position after the first
        chosen = want[torch.arange(len(whole) - 1 + 1), whole[1:] + generated]
        assert np.allclose(logprobs["token_logprobs"][1:], chosen.numpy(), atol=1e-4)
        assert logprobs["text_offset"] == list(range(len(whole) + 1))  # one byte a token
        total, greedy = _lm_eval_loglikelihood(choice, len(context))
        at = torch.arange(len(context) - 1, len(whole) - 1)
        assert abs(total - float(want[at, torch.tensor(continuation)].sum())) < 1e-3
        assert greedy == bool((want[at].argmax(-1) == torch.tensor(continuation)).all())
    # a one-token prompt: nothing scores it, so its only entry is null
    one = client.completions.create(model="trtspec", prompt="x", max_tokens=3, temperature=0, echo=True,
                                    logprobs=2).choices[0]
    assert one.text == "x" + alone[2][0][:3] and one.logprobs.tokens[0] == "x"
    assert one.logprobs.token_logprobs[0] is None and len(one.logprobs.tokens) == 4
    # streamed echo: the prompt comes first, with its log-probabilities
    chunks = list(client.completions.create(model="trtspec", prompt=texts[0], max_tokens=8, temperature=0,
                                            echo=True, logprobs=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == texts[0] + alone[0][0][:8]
    first = chunks[0].choices[0].logprobs
    assert first.tokens[: len(ids[0])] == [name[i] for i in ids[0]] and first.token_logprobs[0] is None


def test_vllm_tokenizer_routes(served, pipeline):
    """/tokenize (a prompt, or messages as chat renders them), /detokenize and /tokenizer_info, as
    vLLM serves them (lm-eval's remote tokenizer reads them); behind the API key."""
    prompt = "Q: 482 + 356\nA:"
    status, body = _post(f"{served.base}/tokenize", {"prompt": prompt, "return_token_strs": True})
    assert status == 200 and body["tokens"] == list(prompt.encode()) and body["count"] == len(prompt)
    assert body["max_model_len"] == 4096 and "".join(body["token_strs"]) == prompt
    status, body = _post(f"{served.base}/tokenize", {"model": "trtspec",
                                                      "messages": [{"role": "user", "content": "482 + 356"}]})
    assert status == 200 and body["tokens"] == list(b"Q: 482 + 356\nA: ")
    status, body = _post(f"{served.base}/detokenize", {"tokens": list(prompt.encode())})
    assert (status, body) == (200, {"prompt": prompt})
    status, body = _post(f"{served.base}/detokenize", {"tokens": [65, 9999]})
    assert status == 400 and body["error"]["param"] == "tokens" and "9999" in body["error"]["message"]
    status, body = _post(f"{served.base}/tokenize", {"prompt": "a", "messages": []})
    assert status == 400 and body["error"]["param"] == "prompt"
    status, body = _post(f"{served.base}/tokenize", {"prompt": "a", "model": "gpt-4"})
    assert status == 404
    req = urllib.request.Request(f"{served.base}/tokenizer_info", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        info = json.loads(resp.read())
    assert info["model_max_length"] == 4096 and info["vocab_size"] == 264 and "eos_token" in info
    assert "Q: " in info["chat_template"]
    assert _post(f"{served.base}/tokenize", {"prompt": "a"}, key=None)[0] == 401


def test_seeded_samples_are_what_the_target_alone_samples_under_load(served, config):
    """Gumbel coupling served: seeded sampled choices, two prompts × n = 3 decoded side by side
    (choice j seeded s + j) and streamed or not, are each token for token what the target alone
    samples with that seed, one request at a time in process."""
    alone = load_pipeline(config, use_drafter=False)  # each request says its coupling
    prompts = [PROMPTS[1], PROMPTS[2]]
    expected = []
    for p in prompts:
        for j in range(3):
            sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=21 + j, coupling="gumbel")
            expected.append(alone.generate(p, 24, sampling)[0])
    assert len(set(expected)) == 6  # the seeds really sample different texts
    client = served.client()
    got = client.completions.create(model="trtspec", prompt=prompts, n=3, seed=21, max_tokens=24,
                                    temperature=0.9, top_p=0.95)
    assert [c.text for c in got.choices] == expected
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(model="trtspec", prompt=prompts, n=3, seed=21, max_tokens=24,
                                           temperature=0.9, top_p=0.95, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[i] for i in range(6)] == expected
    # vLLM's min_p reaches the sampler: what the target alone samples under it, not without it
    sampling = SamplingParams(temperature=1.5, min_p=0.2, seed=5, coupling="gumbel")
    want = alone.generate(PROMPTS[1], 24, sampling)[0]
    assert want != alone.generate(PROMPTS[1], 24, sampling.model_copy(update={"min_p": 0.0}))[0]
    got = client.completions.create(model="trtspec", prompt=PROMPTS[1], seed=5, max_tokens=24,
                                    temperature=1.5, extra_body={"min_p": 0.2})
    assert got.choices[0].text == want


def test_an_unseeded_sample_reports_the_seed_that_samples_it_again(served):
    """A sampled request without a seed gets one, reported as `trtspec.seed` (in the response, and
    in the streamed choices' last chunks); sent back as `seed` it samples every choice again (Gumbel
    coupling: exactly). Greedy requests report none."""
    client = served.client()
    ask = dict(model="trtspec", prompt=[PROMPTS[1], PROMPTS[2]], n=2, max_tokens=24, temperature=1.0)
    first, second = (client.completions.create(**ask) for _ in range(2))
    seeds = [first.model_extra["trtspec"]["seed"], second.model_extra["trtspec"]["seed"]]
    assert seeds[0] != seeds[1] and [c.text for c in first.choices] != [c.text for c in second.choices]
    again = client.completions.create(**ask, seed=seeds[0])
    assert [c.text for c in again.choices] == [c.text for c in first.choices]
    assert again.model_extra["trtspec"]["seed"] == seeds[0]
    finals = [c for c in client.completions.create(**ask, stream=True) if c.choices[0].finish_reason]
    assert len({c.model_extra["trtspec"]["seed"] for c in finals}) == 1 and len(finals) == 4
    greedy = client.completions.create(model="trtspec", prompt=PROMPTS[1], max_tokens=8, temperature=0)
    assert "seed" not in greedy.model_extra["trtspec"]


def test_n_choices_per_prompt(served, pipeline):
    """`n`: choices per prompt in vLLM's order (prompt × n + j), each its own request: sampled, a
    prompt's choices differ; greedy, each is the greedy text; chat and completions, streamed or not."""
    client = served.client()
    prompts = [PROMPTS[1], PROMPTS[2]]  # code: two samples differ
    got = client.completions.create(model="trtspec", prompt=prompts, n=2, seed=7, max_tokens=16,
                                    temperature=1.0)
    assert [c.index for c in got.choices] == [0, 1, 2, 3]
    assert got.choices[0].text != got.choices[1].text and got.choices[2].text != got.choices[3].text
    greedy = client.completions.create(model="trtspec", prompt=prompts, n=3, max_tokens=16, temperature=0)
    assert [c.text for c in greedy.choices] == [_greedy(pipeline, p, 16)[0] for p in prompts for _ in "abc"]
    messages = [{"role": "user", "content": "12 + 34"}]
    text, _ = _chat_expected(pipeline, "Q: 12 + 34\nA: ", 24)
    chat = client.chat.completions.create(model="trtspec", messages=messages, n=3, max_tokens=24,
                                          temperature=0)
    assert [c.message.content for c in chat.choices] == [text] * 3
    chunks = list(client.chat.completions.create(model="trtspec", messages=messages, n=3, max_tokens=24,
                                                 temperature=0, stream=True))
    streamed: dict[int, str] = {}
    for c in chunks:
        i = c.choices[0].index
        streamed[i] = streamed.get(i, "") + (c.choices[0].delta.content or "")
    assert streamed == {0: text, 1: text, 2: text}


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
def test_a_stream_whose_client_left_mid_send_is_closed_when_its_response_ends(spec_version):
    """Starlette leaves the event generator of a client that left mid-send suspended at its yield
    (before ASGI 2.4 it cancels the send on the disconnect message, from 2.4 the send raises
    OSError): its clean-up, which cancels the Triton requests, then waited for garbage collection,
    where it raced the clean-up of the generator it reads from ("aclose(): asynchronous generator is
    already running", 48 times in an 8-minute soak). The response now closes it as it ends."""
    import asyncio

    from starlette.requests import ClientDisconnect

    from trtspec.openai.streams import ClosingStreamingResponse

    cleaned = []

    async def events():
        try:
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"
        finally:
            cleaned.append(True)

    async def serve_one() -> None:
        first_body = asyncio.Event()

        async def receive():
            await first_body.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.body":
                first_body.set()
                if spec_version == "2.4":
                    raise OSError("connection reset by peer")
                await asyncio.Event().wait()  # the client is gone: this write never completes

        scope = {"type": "http", "asgi": {"spec_version": spec_version}}
        response = ClosingStreamingResponse(events(), media_type="text/event-stream")
        try:
            await response(scope, receive, send)
        except ClientDisconnect:
            pass
        assert cleaned == [True]  # closed while `response` still holds it: not left to the collector

    asyncio.run(serve_one())


def test_response_format_is_the_guided_targets_own_text(served, pipeline):
    """response_format over the API (OpenAI's json_schema and json_object, TensorRT-LLM's regex and
    ebnf) and TensorRT-LLM's guided_decoding inputs over gRPC: the text is the guided target's own
    greedy one, in the guide's language, and differs from the unguided text."""
    schema = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}
    regex, ebnf = r" [0-9]+[-*][0-9]+=[0-9]+;", 'root ::= " " ("yes" | "no") "."'
    formats = [({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
                Guide("json_schema", json.dumps(schema))),
               ({"type": "regex", "regex": regex}, Guide("regex", regex)),
               ({"type": "ebnf", "ebnf": ebnf}, Guide("ebnf_grammar", ebnf)),
               ({"type": "json_object"}, Guide("json"))]
    prompt, client = PROMPTS[0], served.client()
    unguided = _greedy(pipeline, prompt)[0]
    for response_format, guide in formats:
        want, result = pipeline.generate(prompt, MAX_TOKENS, guide=guide)
        assert want != unguided, guide
        for stream in (False, True):
            got = client.completions.create(model="trtspec", prompt=prompt, max_tokens=MAX_TOKENS,
                                            temperature=0, stream=stream,
                                            extra_body={"response_format": response_format})
            text = "".join(c.choices[0].text for c in got) if stream else got.choices[0].text
            assert text == want, response_format
    got = client.chat.completions.create(model="trtspec", messages=[{"role": "user", "content": prompt}],
                                         max_tokens=MAX_TOKENS, temperature=0,
                                         response_format={"type": "json_object"})
    if got.choices[0].finish_reason == "stop":
        json.loads(got.choices[0].message.content)
    want, result = pipeline.generate(prompt, 60, guide=Guide("regex", regex))
    assert re.fullmatch(regex, want) and result.finish_reason == "stop"
    got = _trtllm_request(served, guided_decoding_guide_type=np.array([b"regex"], dtype=object),
                          guided_decoding_guide=np.array([regex.encode()], dtype=object))
    assert got.text == want
    # vLLM's structured_outputs and its older guided_* fields
    choices = ["yes", 'no "way"', "café"]
    for body, guide in (({"structured_outputs": {"regex": regex}}, formats[1][1]),
                        ({"guided_regex": regex}, formats[1][1]),
                        ({"structured_outputs": {"json": schema}}, formats[0][1]),
                        ({"guided_json": json.dumps(schema)}, formats[0][1]),
                        ({"guided_grammar": ebnf}, formats[2][1]),
                        ({"structured_outputs": {"json_object": True}}, formats[3][1])):
        got = client.completions.create(model="trtspec", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                        extra_body=body)
        assert got.choices[0].text == pipeline.generate(prompt, MAX_TOKENS, guide=guide)[0], body
    for body in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
        got = client.chat.completions.create(model="trtspec", messages=[{"role": "user", "content": prompt}],
                                             max_tokens=MAX_TOKENS, temperature=0, extra_body=body)
        assert got.choices[0].message.content in choices and got.choices[0].finish_reason == "stop"
    # trtspec generate --url openai:// sends its guide as response_format
    for args, guide in ((["--guide-type", "regex", "--guide", regex], formats[1][1]),
                        (["--guide-type", "json_schema", "--guide", json.dumps(schema)], formats[0][1])):
        result = CliRunner().invoke(main, ["generate", "--url", served.url, "--api-key", KEY, "--json",
                                           "--prompt", prompt, "--max-tokens", str(MAX_TOKENS), *args])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["text"] == pipeline.generate(prompt, MAX_TOKENS, guide=guide)[0]


def test_compact_json_ends_what_any_whitespace_pads(served, pipeline, config):
    """A JSON schema's guide lets whitespace between any two tokens, which the embedded model pads
    without end (its 256 tokens spent, mostly on whitespace). Written compactly — a
    request's structured_outputs.disable_any_whitespace (vLLM's), or the server's --compact-json for
    every request that does not say otherwise — the answer is the target's own greedy text under the
    compact grammar, and ends: JSON that parses. json_object too; Responses' text.format too."""
    from trtspec.openai.model_info import served_model
    from trtspec.spec.grammar import ANY_JSON, compact_json_grammar

    schema = PADDED["schema"]
    chat = {"model": "trtspec", "messages": [{"role": "user", "content": "1 + 2"}], "max_tokens": 256,
            "temperature": 0}
    prompt = served_model(config).chat.render(chat["messages"])
    want = {kind: pipeline.generate(prompt, 256, guide=Guide("ebnf_grammar", compact_json_grammar(shape)))[0]
            for kind, shape in (("json_schema", schema), ("json_object", ANY_JSON))}
    assert json.loads(want["json_schema"]).keys() == {"a"} and json.loads(want["json_object"]) is not None
    formats = {"json_schema": PADDED_FORMAT,
               "json_object": {"type": "json_object"}}

    def answer(base: str, kind: str, **extra) -> tuple[str, str]:
        status, body = post_json(f"{base}/v1/chat/completions",
                                 {**chat, "response_format": formats[kind], **extra}, KEY)
        assert status == 200, body
        return body["choices"][0]["message"]["content"], body["choices"][0]["finish_reason"]

    padded, finish = answer(served.base, "json_schema")
    assert finish == "length" and sum(c.isspace() for c in padded) > len(padded) / 2
    compact = {"structured_outputs": {"disable_any_whitespace": True}}
    for kind in formats:
        assert answer(served.base, kind, **compact) == (want[kind], "stop"), kind
    frontend = OpenAIFrontend(dataclasses.replace(served_model(config), compact_json=True),
                              f"127.0.0.1:{served.ports.grpc}", "127.0.0.1", free_port(), KEY).start()
    try:
        for kind in formats:
            assert answer(frontend.url, kind) == (want[kind], "stop"), kind
        anyhow = {"structured_outputs": {"disable_any_whitespace": False}}  # the request's word wins
        assert answer(frontend.url, "json_schema", **anyhow)[1] == "length"
        status, body = post_json(f"{frontend.url}/v1/responses", {
            "model": "trtspec", "input": "1 + 2", "max_output_tokens": 256, "temperature": 0,
            "text": {"format": {"type": "json_schema", **PADDED}}}, KEY)
        assert status == 200 and body["status"] == "completed", body
        assert _output_text(body) == want["json_schema"]
    finally:
        frontend.stop()


def test_penalties_and_logit_bias_are_the_targets_own_under_them(served, pipeline):
    """OpenAI's presence/frequency penalties and logit_bias and vLLM's repetition_penalty, over the
    API and as TensorRT-LLM's inputs over gRPC: the text is the target's own greedy one under them,
    which differs from the unpenalized text (on code: the tiny target's arithmetic is too sure of
    itself for penalties of this size to move it). Last in the file: penalized requests are accepted
    less, and the server's adaptive schedule, which learns from every request, then drafts less for
    the tests that need drafts."""
    prompt = PROMPTS[1]
    sampling = SamplingParams(presence_penalty=0.6, frequency_penalty=0.3, repetition_penalty=1.2,
                              logit_bias=((ord("e"), -5.0), (ord(" "), 1.5)))
    want = pipeline.decoder.generate(list(prompt.encode()), MAX_TOKENS, sampling).token_ids
    assert want != _greedy(pipeline, prompt)[1]
    client = served.client()
    for stream in (False, True):
        got = client.completions.create(model="trtspec", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                        presence_penalty=0.6, frequency_penalty=0.3,
                                        logit_bias={str(ord("e")): -5, str(ord(" ")): 1.5},
                                        extra_body={"repetition_penalty": 1.2}, stream=stream)
        text = "".join(c.choices[0].text for c in got) if stream else got.choices[0].text
        assert text == bytes(want).decode()
    got = _trtllm_request(served, text_input=None, input_ids=np.array(list(prompt.encode()), dtype=np.int32),
                          max_tokens=np.array([MAX_TOKENS], dtype=np.int32),
                          presence_penalty=np.array([0.6], dtype=np.float32),
                          frequency_penalty=np.array([0.3], dtype=np.float32),
                          repetition_penalty=np.array([1.2], dtype=np.float32),
                          logit_bias_ids=np.array([ord("e"), ord(" ")], dtype=np.int32),
                          logit_bias_values=np.array([-5, 1.5], dtype=np.float32))
    assert got.token_ids == want
    # bad words (vLLM's field, TensorRT-LLM's input): the target's greedy text with them banned
    from trtspec.triton.request import bad_word_ids

    prompt, words = PROMPTS[0], ["+", "carry"]
    banned = SamplingParams(bad_words=bad_word_ids(lambda text: list(text.encode()), words))
    want = pipeline.decoder.generate(list(prompt.encode()), MAX_TOKENS, banned).token_ids
    assert want != _greedy(pipeline, prompt)[1] and b"+" not in bytes(t for t in want if t < 256)
    for stream in (False, True):
        got = client.completions.create(model="trtspec", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                        extra_body={"bad_words": words}, stream=stream)
        text = "".join(c.choices[0].text for c in got) if stream else got.choices[0].text
        assert text == bytes(t for t in want if t < 256).decode()
    got = _trtllm_request(served, text_input=np.array([prompt.encode()], dtype=object),
                          max_tokens=np.array([MAX_TOKENS], dtype=np.int32),
                          bad_words=np.array([w.encode() for w in words], dtype=object))
    assert got.token_ids == want


def _tool_answer(client, stream: bool, max_tokens: int = 64, tools: list = TOOLS, pieces: list | None = None,
                 **ask) -> tuple[dict, str]:
    """A chat answer's message (tool calls' ids dropped) and finish_reason; streamed, its deltas merged
    as a client merges them, each call's first delta checked to carry its id, type and name, and the
    number of deltas that carried each call's arguments appended to `pieces`."""
    got = client.chat.completions.create(model="trtspec", messages=[{"role": "user", "content": "482 + 356"}],
                                         max_tokens=max_tokens, temperature=0, tools=tools, stream=stream,
                                         **ask)
    if not stream:
        message = got.choices[0].message.model_dump(exclude_none=True)
        for call in message.get("tool_calls", ()):
            assert call.pop("id").startswith("call_")
        return message, got.choices[0].finish_reason
    content, calls, finish = "", [], None
    pieces = [] if pieces is None else pieces
    for chunk in got:
        if not chunk.choices:
            continue
        delta, finish = chunk.choices[0].delta, chunk.choices[0].finish_reason or finish
        content += delta.content or ""
        for part in delta.tool_calls or ():
            if part.index == len(calls):
                assert part.id.startswith("call_") and part.type == "function" and part.function.name
                calls.append({"type": "function", "function": {"name": part.function.name, "arguments": ""}})
                pieces.append(0)
            calls[part.index]["function"]["arguments"] += part.function.arguments or ""
            pieces[part.index] += bool(part.function.arguments)
    message = {"role": "assistant", **({"content": content} if content or not calls else {})}
    return message | ({"tool_calls": calls} if calls else {}), finish


def test_tool_calls_are_the_guided_targets_own_text(served, pipeline):
    """A named function, "required" and "auto" (hermes' format, here forced by a regex of the
    request's own): each call is what the target alone writes under the same guide, streamed or not,
    speculation drafting; "none" is the plain chat answer."""
    from trtspec.openai.tools import tool_plan

    client, prompt = served.client(), "Q: 482 + 356\nA: "
    named = {"type": "function", "function": {"name": "add"}}
    want = pipeline.generate(prompt, 64, guide=Guide(*tool_plan(TOOLS, named, None, None).guide))[0]
    assert set(json.loads(want)) == {"a", "b"}
    for stream in (False, True):
        message, finish = _tool_answer(client, stream, tool_choice=named)
        assert message == {"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": want}}]} and finish == "stop"
    # required, one call: vLLM's array of {name, parameters}; the arguments as json.dumps writes them
    want = pipeline.generate(prompt, 64, guide=Guide(*tool_plan(TOOLS, "required", False, None).guide))[0]
    (call,) = json.loads(want)
    for stream in (False, True):
        pieces: list[int] = []
        message, finish = _tool_answer(client, stream, tool_choice="required", parallel_tool_calls=False,
                                       pieces=pieces)
        assert message == {"role": "assistant", "tool_calls": [{"type": "function", "function": {
            "name": call["name"], "arguments": json.dumps(call["parameters"])}}]} and finish == "tool_calls"
    assert pieces[0] > 1  # streamed as the guide has it written, not whole at its end
    regex = (r'Sure\.\n<tool_call>\n\{"name": "add", "arguments": \{"a": [0-9]{1,3}, "b": [0-9]{1,3}\}\}'
             r'\n</tool_call>')
    want = pipeline.generate(prompt, 90, guide=Guide("regex", regex))[0]
    arguments = json.loads(want[want.index("{"): want.rindex("}") + 1])["arguments"]
    for stream in (False, True):
        pieces = []
        message, finish = _tool_answer(client, stream, 90, pieces=pieces, extra_body={"guided_regex": regex})
        assert message == {"role": "assistant", "content": "Sure.\n", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": json.dumps(arguments)}}]}
        assert finish == "tool_calls"
    assert pieces[0] > 1  # an unguided hermes call too streams once its start is written
    text, _ = _chat_expected(pipeline, prompt, 64)
    for stream in (False, True):
        answer = _tool_answer(client, stream, tool_choice="none")
        assert answer == ({"role": "assistant", "content": text}, "stop")
    # auto with a strict tool: its blocks guided, the text around them free, the guided target's own
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
    want = pipeline.generate(prompt, 64, guide=Guide(*tool_plan(strict, "auto", None, "hermes").guide))[0]
    want = want[: want.index(CHAT_STOP)] if CHAT_STOP in want else want
    for stream in (False, True):
        assert _tool_answer(client, stream, tools=strict)[0] == {"role": "assistant", "content": want}


THINKING_TEMPLATE = (  # the embedded model's Q/A turns, the answer's opening as Qwen3's templates write it
    "{% for m in messages %}{{ 'Q: ' if m.role == 'user' else 'A: ' }}{{ m.content }}\n{% endfor %}A: "
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% elif enable_thinking is defined %}<think>\n{% endif %}")


EFFORT_TEMPLATE = (  # gpt-oss's templates write the effort into the system turn; this one, a line
    "{% if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}\n{% endif %}"
    "{% for m in messages %}Q: {{ m.content }}\n{% endfor %}A: ")


def test_reasoning_effort_is_the_chat_templates_variable(served, tmp_path, config):
    """chat's reasoning_effort, Responses' reasoning.effort and Messages' output_config.effort reach
    the chat template as its `reasoning_effort` variable (gpt-oss's reads it; Qwen3's does not, and
    ignores it), chat_template_kwargs' own winning; the answer is the target alone's behind that
    prompt; a level that is none of the API's is a 400 naming its parameter."""
    from trtspec.openai.model_info import served_model

    frontend = OpenAIFrontend(served_model(local_target(tmp_path, config, EFFORT_TEMPLATE)),
                              f"127.0.0.1:{served.ports.grpc}", "127.0.0.1", free_port()).start()
    client = openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="none")
    anthropic_client = anthropic.Anthropic(base_url=frontend.url, api_key="none", max_retries=0)
    ask = {"model": "trtspec", "max_tokens": 16, "temperature": 0}
    try:
        def chat(**extra):
            return client.chat.completions.create(messages=[{"role": "user", "content": "1 + 2"}], **ask,
                                                  **extra)

        plain, low = chat(), chat(reasoning_effort="low")
        assert low.usage.prompt_tokens == plain.usage.prompt_tokens + len("Reasoning: low\n")
        completion = client.completions.create(prompt="Reasoning: low\nQ: 1 + 2\nA: ", **ask)
        assert low.choices[0].message.content == completion.choices[0].text  # the target alone's there
        high = {"chat_template_kwargs": {"reasoning_effort": "high"}}
        kwargs = chat(reasoning_effort="low", extra_body=high)
        assert kwargs.usage.prompt_tokens == plain.usage.prompt_tokens + len("Reasoning: high\n")
        response = client.responses.create(model="trtspec", input="1 + 2", max_output_tokens=16,
                                           temperature=0, reasoning={"effort": "low"})
        assert (response.usage.input_tokens, response.output_text) == \
            (low.usage.prompt_tokens, low.choices[0].message.content)
        assert response.reasoning.effort == "low"
        count = anthropic_client.messages.count_tokens(model="trtspec", messages=[{"role": "user",
                                                                                     "content": "1 + 2"}],
                                                       output_config={"effort": "max"})
        assert count.input_tokens == plain.usage.prompt_tokens + len("Reasoning: max\n")
        for call, param in ((lambda: chat(reasoning_effort="extreme"), "reasoning_effort"),
                            (lambda: client.responses.create(model="trtspec", input="1", reasoning={
                                "effort": "extreme"}), "reasoning.effort")):
            with pytest.raises(openai.BadRequestError) as refused:
                call()
            assert refused.value.body["param"] == param
    finally:
        frontend.stop()


def _reasoning_answer(client, stream: bool, max_tokens: int = 24, **ask) -> tuple[str | None, str | None]:
    """A chat answer's (reasoning_content, content); streamed, its deltas joined."""
    got = client.chat.completions.create(model="trtspec", messages=[{"role": "user", "content": "482 + 356"}],
                                         max_tokens=max_tokens, temperature=0, stream=stream, **ask)
    if not stream:
        message = got.choices[0].message
        return getattr(message, "reasoning_content", None), message.content
    parts = ["", ""]
    for chunk in got:
        for choice in chunk.choices:
            parts[0] += getattr(choice.delta, "reasoning_content", None) or ""
            parts[1] += choice.delta.content or ""
    return parts[0] or None, parts[1] or None


def test_a_reasoning_parser_gives_the_block_apart_and_guides_the_text_after_it(served, pipeline, tmp_path,
                                                                              config):
    """`--reasoning-parser qwen3` behind a template that opens the block (enable_thinking true), closes
    it (false) or leaves it to the model (unset): each answer is the target alone's text, the block's
    part as reasoning_content, streamed or not; a guided answer is the target's under the guide that
    holds the text after the block (not under the request's guide alone)."""
    from trtspec.openai.model_info import served_model
    from trtspec.openai.reasoning import REASONING, ReasoningParser, answer_start, reasoning_guide
    from trtspec.spec.thinking_budget import ThinkingBudget

    model = served_model(local_target(tmp_path, config, THINKING_TEMPLATE))
    model.reasoning_parser = "qwen3"
    frontend = OpenAIFrontend(model, f"127.0.0.1:{served.ports.grpc}", "127.0.0.1", free_port()).start()
    client = openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="none")
    anthropic_client = anthropic.Anthropic(base_url=frontend.url, api_key="none", max_retries=0)
    try:
        openings = {True: "<think>\n", False: "<think>\n\n</think>\n\n", None: ""}  # the template's
        for thinking, start in ((True, "reasoning"), (False, "content"), (None, "opens_tag")):
            prompt = "Q: 482 + 356\nA: " + openings[thinking]
            assert answer_start("qwen3", prompt) == start
            text, _ = _chat_expected(pipeline, prompt, 24)
            parser = ReasoningParser(start)
            want = tuple(a + b or None for a, b in zip(parser.push(text), parser.finish(), strict=True))
            assert want[0 if thinking else 1] is not None  # the block, or the content
            kwargs = {} if thinking is None else {"chat_template_kwargs": {"enable_thinking": thinking}}
            for stream in (False, True):
                assert _reasoning_answer(client, stream, extra_body=kwargs) == want, (thinking, stream)
            hidden = _reasoning_answer(client, False, extra_body={**kwargs, "include_reasoning": False})
            assert hidden == (None, want[1])
            for stream in (False, True):  # /v1/responses: a reasoning item, then the message
                response, events = _response(client, stream, input="482 + 356", max_output_tokens=24,
                                             extra_body=kwargs)
                reasoning = "".join(part["text"] for item in response["output"] if item["type"] == "reasoning"
                                    for part in item["content"])
                assert (reasoning or None, _output_text(response) or None) == want, (thinking, stream)
                assert (response["usage"]["output_tokens_details"]["reasoning_tokens"] > 0) == bool(reasoning)
                deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
                assert deltas == (reasoning if stream else "")
            # the message's logprobs where the answer is the message alone (the template closed the block)
            logprobs = {"input": "482 + 356", "max_output_tokens": 24, "temperature": 0, "extra_body": kwargs,
                        "include": ["message.output_text.logprobs"]}
            if thinking is False:
                chat = client.chat.completions.create(model="trtspec", max_tokens=24, temperature=0,
                                                      logprobs=True, extra_body=kwargs,
                                                      messages=[{"role": "user", "content": "482 + 356"}])
                got = client.responses.create(model="trtspec", **logprobs).output[-1].content[0].logprobs
                assert _same_logprobs([t.model_dump() for t in got],
                                      [t.model_dump() for t in chat.choices[0].logprobs.content])
            else:
                with pytest.raises(openai.BadRequestError) as refused:
                    client.responses.create(model="trtspec", **logprobs)
                assert refused.value.body["param"] == "include"
            if thinking is None:
                continue
            for stream in (False, True):  # /v1/messages: a thinking block, then the text
                ask = {"thinking": {"type": "adaptive"} if thinking else {"type": "disabled"}}
                message, _ = _message(anthropic_client, stream, messages=[
                    {"role": "user", "content": "482 + 356"}], max_tokens=24, **ask)
                thought = "".join(b["thinking"] for b in message["content"] if b["type"] == "thinking")
                assert (thought or None, _text_of(message) or None) == want, (thinking, stream)
        # a reasoning budget: the block's end forced after 5 tokens, the rest the budgeted target's own
        budgeted = SamplingParams(thinking=ThinkingBudget(budget=5, end=tuple(b"</think>")))
        ids = pipeline.decoder.generate(list(b"Q: 482 + 356\nA: <think>\n"), 24, budgeted).token_ids
        text = bytes(t for t in ids if t < 256).decode()
        text = text[: text.index(CHAT_STOP)] if CHAT_STOP in text else text
        parser = ReasoningParser(REASONING)
        want = tuple(a + b or None for a, b in zip(parser.push(text), parser.finish(), strict=True))
        free = _chat_expected(pipeline, "Q: 482 + 356\nA: <think>\n", 24)[0]
        assert len(want[0]) == 5 and want[0] == free[:5] and want[1]  # the block cut, an answer after it
        thinking = {"chat_template_kwargs": {"enable_thinking": True}, "thinking_token_budget": 5}
        for stream in (False, True):
            assert _reasoning_answer(client, stream, extra_body=thinking) == want, stream
        response, _ = _response(client, False, input="482 + 356", max_output_tokens=24, extra_body=thinking)
        assert _output_text(response) == want[1]
        # Anthropic's budget_tokens is the same budget (the model here ends its turn long before 1,024)
        message, _ = _message(anthropic_client, False, messages=[{"role": "user", "content": "482 + 356"}],
                              max_tokens=1100, thinking={"type": "enabled", "budget_tokens": 1024})
        thought = "".join(b["thinking"] for b in message["content"] if b["type"] == "thinking")
        assert thought == _reasoning_answer(client, False, max_tokens=1100, extra_body={
            **thinking, "thinking_token_budget": 1024})[0]
        # a function call and its output sent back as items: the conversation chat sends as messages
        call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
        chat = client.chat.completions.create(
            model="trtspec", max_tokens=16, temperature=0, tools=TOOLS, tool_choice="none", messages=[
                {"role": "user", "content": "1 + 2"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "3"}])
        response = client.responses.create(
            model="trtspec", max_output_tokens=16, temperature=0, tools=FLAT_TOOLS, tool_choice="none",
            input=[
                {"role": "user", "content": "1 + 2"},
                {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 1}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "3"}])
        assert chat.usage.prompt_tokens == response.usage.input_tokens
        assert response.output_text == chat.choices[0].message.content
        # an output answers a call before it, in this input or the conversation it continues; one that
        # answers no call made is refused in OpenAI's words
        again = {"type": "function_call_output", "call_id": "call_1", "output": "4"}
        continued = client.responses.create(model="trtspec", max_output_tokens=4, temperature=0,
                                            previous_response_id=response.id, input=[again])
        assert continued.usage.input_tokens > response.usage.input_tokens
        with pytest.raises(openai.BadRequestError) as orphan:
            client.responses.create(model="trtspec", max_output_tokens=4, input=[again])
        assert orphan.value.body["param"] == "input"
        assert orphan.value.body["message"].startswith("No tool call found for function call output with "
                                                       "call_id call_1 ")
        regex = ("regex", "[0-9]{3}")
        prompt = "Q: 482 + 356\nA: <think>\n"
        text = pipeline.generate(prompt, 24, guide=Guide(*reasoning_guide(regex, "reasoning")))[0]
        assert text != pipeline.generate(prompt, 24, guide=Guide(*regex))[0]
        text = text[: text.index(CHAT_STOP)] if CHAT_STOP in text else text
        ask = {"chat_template_kwargs": {"enable_thinking": True}, "guided_regex": regex[1]}
        for stream in (False, True):
            assert _reasoning_answer(client, stream, extra_body=ask) == (text, None)
    finally:
        frontend.stop()


def test_serve_hands_its_parsers_to_the_frontend(served, tmp_path):
    """`trtspec serve --reasoning-parser deepseek-r1 --tool-call-parser qwen3_coder` (TensorRT-LLM's
    spelling of the reasoning parser): the flags reach the frontend. The embedded model never closes
    a block, so under deepseek_r1 its answer is all reasoning; tools under tool_choice auto (the
    default) are taken, as only a server with a tool-call parser takes them. So do --served-model-name
    (the names it answers to, the first in its answers), --compact-json (a JSON schema's answer ends)
    and --allowed-origin (a browser's preflight is answered)."""
    out = tmp_path / "build"
    assert CliRunner().invoke(main, ["build", str(CONFIG), "--out", str(out)]).exit_code == 0
    args = ("--reasoning-parser", "deepseek-r1", "--tool-call-parser", "qwen3_coder", "--served-model-name",
            "claude-haiku-4-5", "--served-model-name", "trtspec", "--compact-json", "--allowed-origin",
            "http://localhost:5173")
    with serve_cli(out, avoid=(*dataclasses.astuple(served.ports), served.openai_port), args=args) as other:
        client = other.client()
        ask = {"model": "trtspec", "messages": [{"role": "user", "content": "482 + 356"}], "max_tokens": 24,
               "temperature": 0}
        message = client.chat.completions.create(**ask).choices[0].message
        assert message.content is None and message.reasoning_content.startswith("2+6=8")
        message = client.chat.completions.create(**ask, tools=TOOLS).choices[0].message
        assert message.reasoning_content and not message.tool_calls
        answer = client.completions.create(model="claude-haiku-4-5", prompt="Q: 1 + 2\nA:", max_tokens=256,
                                           temperature=0, extra_body={"response_format": PADDED_FORMAT})
        assert answer.model == "claude-haiku-4-5" and answer.choices[0].finish_reason == "stop"
        json.loads(answer.choices[0].text)
        assert [card.id for card in client.models.list()] == ["claude-haiku-4-5", "trtspec"]
        status, headers, _ = _cross_origin(f"{other.base}/v1/completions", "OPTIONS", {
            "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"})
        assert status == 200 and headers["access-control-allow-origin"] == "http://localhost:5173"


def test_served_model_names_are_the_names_the_api_answers_to(served, config):
    """--served-model-name, as vLLM's: a request may name any of them (and no other: the model's own
    name is then refused as any unknown one), every API's answer carries the first; /v1/models lists
    them all."""
    from trtspec.openai.model_info import served_model

    names = ("gpt-4o-mini", "claude-haiku-4-5", "org/model")
    frontend = OpenAIFrontend(dataclasses.replace(served_model(config), served_names=names),
                              f"127.0.0.1:{served.ports.grpc}", "127.0.0.1", free_port(), KEY).start()
    try:
        client = openai.OpenAI(base_url=f"{frontend.url}/v1", api_key=KEY, max_retries=0)
        assert [card.id for card in client.models.list()] == list(names)
        assert client.models.retrieve("org/model").id == "org/model"
        chat = {"messages": [{"role": "user", "content": "1 + 2"}], "max_tokens": 4, "temperature": 0}
        for name in names:
            assert client.chat.completions.create(model=name, **chat).model == "gpt-4o-mini"
        response = client.responses.create(model="claude-haiku-4-5", input="1 + 2", max_output_tokens=4)
        assert response.model == "gpt-4o-mini"
        message = anthropic.Anthropic(base_url=frontend.url, api_key=KEY, max_retries=0).messages.create(
            model="claude-haiku-4-5", max_tokens=4, messages=chat["messages"])
        assert message.model == "gpt-4o-mini"
        with pytest.raises(openai.NotFoundError, match="trtspec"):
            client.chat.completions.create(model="trtspec", **chat)
    finally:
        frontend.stop()


def test_qwen3_coder_calls_are_the_guided_targets_own_text(served, pipeline, config):
    """A frontend with `--tool-call-parser qwen3_coder` beside the module's Triton: an auto answer in
    Qwen3-Coder's XML format (forced by a regex of the request's own) becomes its calls, typed by
    the tools' schemas, streamed or not; with a strict tool the free text is the target's under the
    strict XML guide."""
    from trtspec.openai.model_info import served_model
    from trtspec.openai.tools import tool_plan

    model = served_model(config)
    model.tool_parser = "qwen3_coder"
    frontend = OpenAIFrontend(model, f"127.0.0.1:{served.ports.grpc}", "127.0.0.1", free_port()).start()
    client, prompt = openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="none"), "Q: 482 + 356\nA: "
    try:
        regex = (r"Sure\.\n<tool_call>\n<function=add>\n<parameter=a>\n[0-9]{1,3}\n</parameter>\n"
                 r"<parameter=b>\n[0-9]{1,3}\n</parameter>\n</function>\n</tool_call>")
        want = pipeline.generate(prompt, 160, guide=Guide("regex", regex))[0]
        assert re.fullmatch(regex, want), want  # the whole call, ended
        a, b = (int(v) for v in re.findall(r"<parameter=[ab]>\n([0-9]+)", want))
        for stream in (False, True):
            message, finish = _tool_answer(client, stream, 160, extra_body={"guided_regex": regex})
            assert message == {"role": "assistant", "content": "Sure.\n", "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})}}]}
            assert finish == "tool_calls"
        strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
        guide = Guide(*tool_plan(strict, "auto", None, "qwen3_coder").guide)
        want = pipeline.generate(prompt, 64, guide=guide)[0]
        want = want[: want.index(CHAT_STOP)] if CHAT_STOP in want else want
        for stream in (False, True):
            assert _tool_answer(client, stream, tools=strict)[0] == {"role": "assistant", "content": want}
    finally:
        frontend.stop()


def test_without_a_tool_call_parser_auto_is_refused_and_tokenize_shows_the_tools(tmp_path, config):
    """A frontend whose server has no --tool-call-parser refuses tool_choice auto (the default with
    tools) by name; /tokenize renders a conversation with tool calls and the tools through the
    target's chat template (here one that writes them, beside the embedded model's files). Triton
    is not running: both answers come from the frontend alone."""
    from trtspec.openai.model_info import served_model

    local = local_target(tmp_path, config, (
        "{% for tool in tools or [] %}{{ tool.function.name }}: {{ tool.function.parameters | tojson }}\n"
        "{% endfor %}{% for m in messages %}{{ m.role }}: {{ m.content }}{% for c in m.tool_calls or [] %}"
        "{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}{{ '\\n' }}{% endfor %}"))
    triton_port, port = free_ports(2)
    nowhere = f"127.0.0.1:{triton_port}"
    frontend = OpenAIFrontend(served_model(local), nowhere, "127.0.0.1", port).start()
    try:
        status, body = _post(f"{frontend.url}/v1/chat/completions", {**GOOD_CHAT, "tools": TOOLS}, None)
        assert status == 400 and body["error"]["param"] == "tool_choice"
        assert "--tool-call-parser" in body["error"]["message"]
        messages = [{"role": "user", "content": "1 + 2"},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "3"}]
        status, body = _post(f"{frontend.url}/tokenize", {"messages": messages, "tools": TOOLS}, None)
        assert status == 200, body
        text = bytes(body["tokens"]).decode()
        assert text == (f"add: {json.dumps(ADD)}\necho: {json.dumps(ECHO)}\n"
                        'user: 1 + 2\nassistant: add{"a": 1, "b": 2}\ntool: 3\n'), text
    finally:
        frontend.stop()


FLAT_TOOLS = [{"type": "function", **tool["function"], "strict": False} for tool in TOOLS]  # Responses' shape


def _response(client, stream: bool, **ask) -> tuple[dict, list[dict]]:
    """A response (as a dict) and, streamed, its events: numbered 0, 1, … and ending in the response
    they built (completed or incomplete), whose deltas join to its text."""
    ask = {"model": "trtspec", "temperature": 0, **ask}
    if not stream:
        return client.responses.create(**ask).model_dump(), []
    events = [event.model_dump() for event in client.responses.create(**ask, stream=True)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    final = events[-1]
    assert final["type"] == f"response.{final['response']['status']}"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "".join(part["text"] for item in final["response"]["output"] if item["type"] == "message"
                           for part in item["content"])
    return final["response"], events


def _output_text(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"])


def test_a_response_is_the_chat_answer_streamed_or_not(served):
    """/v1/responses over the chat path: a text input, or items (instructions, text parts, an earlier
    answer as the SDK gives it back) is the chat answer to the conversation they stand for, its
    usage chat's; incomplete where chat's finish_reason is length; sampled with a seed, under
    Gumbel coupling, the same text as chat's with that seed (temperature, top_k and seed reach the
    model); the SDK's own stream helper builds the same response from the events."""
    client = served.client()
    history = [{"role": "system", "content": "Arithmetic."}, {"role": "user", "content": "1 + 2"},
               {"role": "assistant", "content": "3"}, {"role": "user", "content": "482 + 356"}]
    items = [{"role": "user", "content": [{"type": "input_text", "text": "1 + 2"}]},
             {"type": "message", "role": "assistant", "id": "msg_0", "status": "completed",
              "content": [{"type": "output_text", "text": "3", "annotations": []}]},
             {"role": "user", "content": "482 + 356"}]
    cases = [({"input": "482 + 356"}, [history[-1]], {}),
             ({"input": "def parse(self):", "max_output_tokens": 8},
              [{"role": "user", "content": "def parse(self):"}], {}),
             ({"input": items, "instructions": "Arithmetic."}, history, {}),
             ({"input": "482 + 356", "temperature": 0.8, "extra_body": {"seed": 5, "top_k": 8}},
              [history[-1]], {"temperature": 0.8, "seed": 5, "extra_body": {"top_k": 8}})]
    for ask, messages, sampling in cases:
        chat = client.chat.completions.create(model="trtspec", messages=messages,
                                              max_tokens=ask.get("max_output_tokens", MAX_TOKENS),
                                              **{"temperature": 0, **sampling})
        want, finish = chat.choices[0].message.content, chat.choices[0].finish_reason
        for stream in (False, True):
            response, _ = _response(client, stream, **{"max_output_tokens": MAX_TOKENS, **ask})
            assert _output_text(response) == want, (ask, stream)
            assert response["status"] == ("incomplete" if finish == "length" else "completed")
            assert (response["incomplete_details"] or {}).get("reason") == \
                ("max_output_tokens" if finish == "length" else None)
            usage = response["usage"]
            assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == \
                (chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens)
            assert usage["output_tokens_details"]["reasoning_tokens"] == 0  # no reasoning parser: none
            assert response["trtspec"]["target_forwards"] >= 1
    with client.responses.stream(model="trtspec", input="1 + 2", max_output_tokens=MAX_TOKENS,
                                 temperature=0) as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == client.chat.completions.create(
        model="trtspec", messages=[{"role": "user", "content": "1 + 2"}], max_tokens=MAX_TOKENS,
        temperature=0).choices[0].message.content


def test_truncation_auto_drops_the_oldest_turns_until_the_conversation_fits(served):
    """A conversation past the context (six turns of 900 bytes, the embedded model's context 4,096)
    is a 400 naming `input`; with `truncation: "auto"` its oldest turns are dropped, whole (a user
    message and its answer), until it fits: the answer is chat's to the longest tail of turns that
    fits, the instructions kept; the response says truncation auto. The same through a stored
    conversation (previous_response_id)."""
    client = served.client()
    turns = [[{"role": "user", "content": f"{k} " + "x" * 900}, {"role": "assistant", "content": "ok"}]
             for k in range(6)]
    history = [m for turn in turns for m in turn] + [{"role": "user", "content": "482 + 356"}]
    ask = {"model": "trtspec", "max_output_tokens": 16, "temperature": 0, "instructions": "Arithmetic."}
    status, body = _post(f"{served.base}/v1/responses", {**ask, "input": history})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["param"] == "input"

    def chat(kept: int) -> tuple[int, dict]:  # the last `kept` turns and the question
        messages = [{"role": "system", "content": "Arithmetic."}, *history[len(history) - 1 - 2 * kept:]]
        return _post(f"{served.base}/v1/chat/completions", {"model": "trtspec", "messages": messages,
                                                             "max_tokens": 16, "temperature": 0})

    kept = next(k for k in range(6, -1, -1) if chat(k)[0] == 200)
    assert 0 < kept < 6 and chat(kept + 1)[1]["error"]["code"] == "context_length_exceeded"
    want = chat(kept)[1]
    truncated = client.responses.create(**ask, input=history, truncation="auto")
    assert truncated.truncation == "auto"
    assert truncated.output_text == want["choices"][0]["message"]["content"]
    assert truncated.usage.input_tokens == want["usage"]["prompt_tokens"]
    first = client.responses.create(**ask, input=history[:-1] + [{"role": "user", "content": "1"}],
                                    truncation="auto")
    continued = client.responses.create(**ask, input="482 + 356", previous_response_id=first.id,
                                        truncation="auto")
    assert continued.status in ("completed", "incomplete")
    assert continued.usage.input_tokens + 16 <= 4096


def test_stored_responses_continue_their_conversation_and_can_be_read_and_deleted(served):
    """previous_response_id continues a stored response's conversation (its input and output, not its
    instructions) as chat continues those messages; GET returns the response as it was answered,
    streamed or not; DELETE drops it (then a 404, and a 404 naming previous_response_id); store
    false keeps nothing."""
    client = served.client()
    first = client.responses.create(model="trtspec", input="482 + 356", instructions="Arithmetic.",
                                    max_output_tokens=16, temperature=0)
    second = client.responses.create(model="trtspec", input="1 + 1", previous_response_id=first.id,
                                     max_output_tokens=16, temperature=0)
    messages = [{"role": "user", "content": "482 + 356"}, {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "1 + 1"}]
    chat = client.chat.completions.create(model="trtspec", messages=messages, max_tokens=16, temperature=0)
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens and second.previous_response_id == first.id
    assert client.responses.retrieve(second.id).model_dump() == second.model_dump()
    listed = client.responses.input_items.list(second.id)  # the SDK's page: newest first
    assert [(i.type, i.role, i.content[0].text) for i in listed.data] == [("message", "user", "1 + 1")]
    status, page = _request(served, "GET", f"/v1/responses/{second.id}/input_items?limit=x")
    assert status == 400 and page["error"]["param"] == "limit"
    streamed, _ = _response(client, True, input="1 + 1", previous_response_id=first.id, max_output_tokens=16)
    assert client.responses.retrieve(streamed["id"]).model_dump() == streamed
    assert _output_text(streamed) == second.output_text
    assert _request(served, "DELETE", f"/v1/responses/{second.id}") == \
        (200, {"id": second.id, "object": "response", "deleted": True})  # OpenAI's answer (the SDK drops it)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.create(model="trtspec", input="2 + 2", previous_response_id=second.id)
    assert gone.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model="trtspec", input="1 + 1", store=False, max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def _finished(client, rid: str, timeout_s: float = 120) -> dict:
    """A background response polled until it ends."""
    deadline = time.monotonic() + timeout_s
    while (response := client.responses.retrieve(rid).model_dump())["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline, response["status"]
        time.sleep(0.05)
    return response


def _deltas(events: list[dict]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


# a JSON object with a required string, whose whitespace the model pads without end: 2,048 tokens,
# several seconds here (under a bare object it writes `{}` and is done)
PADDED = {"type": "json_schema", "name": "padded", "schema": {
    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}
# the same as chat's response_format
PADDED_FORMAT = {"type": "json_schema", "json_schema": {"name": "padded", "schema": PADDED["schema"]}}


def test_a_background_response_runs_apart_and_its_events_stream_again(served):
    """`background`: answered at once, queued; GET shows it as it stands until it ends, with the text,
    status and usage of the same request answered in the foreground. Its events are kept: GET
    ?stream=true sends them all (numbered from 0: created and queued, in_progress, …, the end) or
    those after a sequence_number, the tail of the same events. A client that leaves a background
    stream leaves it decoding, and reading on from its last event's number gives the rest: the
    events it saw and those it read on are one stream whose deltas are the final text."""
    client = served.client()
    ask = {"model": "trtspec", "input": "482 + 356", "max_output_tokens": MAX_TOKENS, "temperature": 0}
    plain = client.responses.create(**ask)
    queued = client.responses.create(**ask, background=True)
    assert (queued.status, queued.background, queued.output) == ("queued", True, [])
    done = _finished(client, queued.id)
    assert (done["status"], _output_text(done)) == (plain.status, plain.output_text)
    assert done["usage"]["output_tokens"] == plain.usage.output_tokens and done["background"]
    events = [e.model_dump() for e in client.responses.retrieve(queued.id, stream=True)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [(e["type"], e["response"]["status"]) for e in events[:3]] == [
        ("response.created", "queued"), ("response.queued", "queued"),
        ("response.in_progress", "in_progress")]
    assert events[-1]["type"] == f"response.{done['status']}" and events[-1]["response"]["id"] == queued.id
    assert _deltas(events) == plain.output_text
    k = len(events) // 2
    assert [e.model_dump() for e in client.responses.retrieve(queued.id, stream=True, starting_after=k)] == \
        events[k + 1:]

    stream = client.responses.create(model="trtspec", input="1 + 2", max_output_tokens=2048, temperature=0,
                                     text={"format": PADDED}, background=True, stream=True)
    seen = []
    for event in stream:
        seen.append(event.model_dump())
        if event.type == "response.output_text.delta":
            break
    stream.close()  # the client leaves
    rid = seen[0]["response"]["id"]
    time.sleep(0.3)
    assert served.metric("trtspec_requests_in_flight") == 1, "a background response left by its client ended"
    assert client.responses.retrieve(rid).status == "in_progress"
    rest = [e.model_dump() for e in client.responses.retrieve(rid, stream=True,
                                                               starting_after=seen[-1]["sequence_number"])]
    whole = seen + rest
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    final = whole[-1]["response"]
    assert whole[-1]["type"] == "response.incomplete" and final["usage"]["output_tokens"] == 2048
    assert _deltas(whole) == _output_text(final) == _output_text(client.responses.retrieve(rid).model_dump())


def test_a_background_response_is_cancelled_or_deleted_while_it_runs(served):
    """POST /v1/responses/{id}/cancel stops a running background response: its Triton request ends at
    once, it is stored cancelled as it stood (its text so far, its usage), cancelling it again
    answers the same, and it continues no conversation. DELETE stops one too. What cannot be
    cancelled or streamed again is a 400 naming why; the server logs no error."""
    client = served.client()
    logged = len(Path(served.log).read_text())
    long = {"model": "trtspec", "input": "1 + 2", "max_output_tokens": 2048, "temperature": 0,
            "text": {"format": PADDED}, "background": True}

    def running() -> str:
        rid = client.responses.create(**long).id
        while not _output_text(now := client.responses.retrieve(rid).model_dump()):
            assert now["status"] in ("queued", "in_progress"), now["status"]
            time.sleep(0.02)
        assert served.metric("trtspec_requests_in_flight") == 1
        return rid

    def stopped() -> None:
        deadline = time.monotonic() + 2.0
        while served.metric("trtspec_requests_in_flight") > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert served.metric("trtspec_requests_in_flight") == 0, "a stopped background response is decoding"

    rid = running()
    cancelled = client.responses.cancel(rid).model_dump()
    stopped()
    assert cancelled["status"] == "cancelled" and 0 < cancelled["usage"]["output_tokens"] < 2048
    assert _output_text(cancelled).startswith("{")
    assert client.responses.cancel(rid).model_dump() == cancelled
    assert client.responses.retrieve(rid).model_dump() == cancelled
    events = [e.model_dump() for e in client.responses.retrieve(rid, stream=True)]
    assert _deltas(events) == _output_text(cancelled)
    assert not [e for e in events if e["type"] in ("response.completed", "response.incomplete")]
    status, body = _post(f"{served.base}/v1/responses", {"model": "trtspec", "input": "x",
                                                          "previous_response_id": rid})
    assert status == 400 and body["error"]["param"] == "previous_response_id" and "cancelled" in \
        body["error"]["message"]

    rid = running()
    client.responses.delete(rid)
    stopped()
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(rid)

    done = client.responses.create(model="trtspec", input="1", max_output_tokens=4, background=True)
    _finished(client, done.id)
    plain = client.responses.create(model="trtspec", input="1", max_output_tokens=4)
    for path, param, says in ((f"/v1/responses/{done.id}/cancel", None, "has ended (incomplete)"),
                              (f"/v1/responses/{plain.id}/cancel", None, "not created with 'background'"),
                              (f"/v1/responses/{plain.id}?stream=true", "stream", "not created with"),
                              (f"/v1/responses/{done.id}?stream=true&starting_after=x", "starting_after",
                               "sequence_number"),
                              (f"/v1/responses/{done.id}?stream=true&starting_after=%D9%A3", "starting_after",
                               "sequence_number"),  # an Arabic-Indic 3: a digit to Python, not to the API
                              (f"/v1/responses/{done.id}/input_items?limit=%C2%B2", "limit", "1 to 100"),
                              (f"/v1/responses/{done.id}?stream=yes", "stream", "true or false")):
        method = "POST" if path.endswith("/cancel") else "GET"
        status, body = _request(served, method, path)
        assert status == 400 and body["error"]["param"] == param and says in body["error"]["message"], path
    assert "ERROR" not in Path(served.log).read_text()[logged:]


def _same_logprobs(got: list[dict], want: list[dict]) -> bool:
    """The same tokens and alternatives, their log p to 1e-4."""
    def values(tokens: list[dict]) -> list[float]:
        return [v for t in tokens for v in (t["logprob"], *(a["logprob"] for a in t["top_logprobs"]))]

    def names(tokens: list[dict]) -> list:
        return [(t["token"], t["bytes"], [(a["token"], a["bytes"]) for a in t["top_logprobs"]])
                for t in tokens]

    return names(got) == names(want) and np.allclose(values(got), values(want), rtol=0, atol=1e-4)


def test_a_responses_logprobs_are_chats(served):
    """include message.output_text.logprobs: the message's tokens with their log-probabilities and
    top_logprobs alternatives, as chat gives them for the same request (greedy, a seeded sample, a
    stop sequence's cut), whole or streamed: each text delta carries its tokens', their join is the
    done event's and the final response's (an added part starts empty). Log p to 1e-4: a prompt
    served from the prefix cache is computed in other pieces."""


    client = served.client()
    include = ["message.output_text.logprobs"]
    for ask in ({"input": "482 + 356", "top_logprobs": 3}, {"input": "def parse(self):", "top_logprobs": 0},
                {"input": "482 + 356", "temperature": 0.9, "top_logprobs": 1, "extra_body": {"seed": 11}},
                {"input": "import os\n", "top_logprobs": 2, "extra_body": {"stop": ["os"]}}):
        extra = ask.get("extra_body", {})
        chat = client.chat.completions.create(
            model="trtspec", messages=[{"role": "user", "content": ask["input"]}], max_tokens=MAX_TOKENS,
            temperature=ask.get("temperature", 0), logprobs=True, top_logprobs=ask["top_logprobs"],
            seed=extra.get("seed"), stop=extra.get("stop"))
        want = [token.model_dump() for token in chat.choices[0].logprobs.content]
        assert want and all(len(token["top_logprobs"]) == ask["top_logprobs"] for token in want)
        whole, _ = _response(client, False, max_output_tokens=MAX_TOKENS, include=include, **ask)
        assert _output_text(whole) == chat.choices[0].message.content, ask
        assert _same_logprobs(whole["output"][-1]["content"][0]["logprobs"], want), ask
        streamed, events = _response(client, True, max_output_tokens=MAX_TOKENS, include=include, **ask)
        assert _same_logprobs(streamed["output"][-1]["content"][0]["logprobs"], want), ask
        deltas = [token for e in events if e["type"] == "response.output_text.delta"
                  for token in e["logprobs"]]
        (done,) = [e for e in events if e["type"] == "response.output_text.done"]
        assert deltas == done["logprobs"] and _same_logprobs(deltas, want), ask
        assert [e["part"]["logprobs"] for e in events if e["type"] == "response.content_part.added"] == [[]]
    plain, _ = _response(client, False, input="1 + 2", max_output_tokens=4)
    assert plain["output"][-1]["content"][0]["logprobs"] == []


def test_a_conversation_keeps_its_items_and_responses_continue_it(served):
    """The Conversations API: a conversation's items kept (created with some, added, listed newest
    first or in pages, read and dropped one by one), its metadata replaced; a response created with
    `conversation` is the chat answer to the conversation's messages then its input, streamed or
    not, in the background too, and its input and output are added to it as items (the output
    with the response's own ids). Deleted, it is a 404, named `conversation` in a response's request."""
    client = served.client()
    ask = {"model": "trtspec", "max_output_tokens": MAX_TOKENS, "temperature": 0}
    conversation = client.conversations.create(items=[{"role": "system", "content": "Arithmetic."}],
                                               metadata={"topic": "sums"})
    assert client.conversations.retrieve(conversation.id) == conversation
    assert conversation.metadata == {"topic": "sums"}
    first = client.responses.create(**ask, input="482 + 356", conversation=conversation.id)
    assert first.conversation.id == conversation.id
    history = [{"role": "system", "content": "Arithmetic."}, {"role": "user", "content": "482 + 356"}]
    chat = client.chat.completions.create(model="trtspec", messages=history, max_tokens=MAX_TOKENS,
                                          temperature=0)
    assert first.output_text == chat.choices[0].message.content
    listed = [item.model_dump() for item in client.conversations.items.list(conversation.id, order="asc")]
    assert [(item["type"], item["role"]) for item in listed] == \
        [("message", "system"), ("message", "user"), ("message", "assistant")]
    assert listed[2]["id"] == first.output[0].id
    assert [(part["type"], part["text"]) for part in listed[1]["content"]] == [("input_text", "482 + 356")]
    history += [{"role": "assistant", "content": first.output_text}, {"role": "user", "content": "1 + 1"}]
    want = client.chat.completions.create(model="trtspec", messages=history, max_tokens=MAX_TOKENS,
                                          temperature=0).choices[0].message.content
    streamed, _ = _response(client, True, **ask, input="1 + 1", conversation={"id": conversation.id})
    assert _output_text(streamed) == want
    queued = client.responses.create(**ask, input="2 + 2", conversation=conversation.id, background=True)
    assert _finished(client, queued.id)["status"] in ("completed", "incomplete")
    listed = [item.id for item in client.conversations.items.list(conversation.id)]  # newest first
    assert len(listed) == 7 and listed[0] == client.responses.retrieve(queued.id).output[0].id
    page = client.conversations.items.list(conversation.id, limit=2, after=listed[1])
    assert [item.id for item in page.data] == listed[2:4] and page.has_more
    assert client.conversations.items.retrieve(listed[3], conversation_id=conversation.id).id == listed[3]
    client.conversations.items.delete(listed[3], conversation_id=conversation.id)
    assert listed[3] not in [item.id for item in client.conversations.items.list(conversation.id)]
    added = client.conversations.items.create(conversation.id, items=[
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"}])
    assert [item.type for item in added.data] == ["message", "function_call"]
    assert added.data[0].content[0].text == "hi" and added.data[0].status == "completed"
    # an output answers a call among the conversation's items: added after it, not one it lacks; its
    # call deleted, a response continuing the conversation is refused, naming it
    output = {"type": "function_call_output", "call_id": "c1", "output": "3"}
    client.conversations.items.create(conversation.id, items=[output])
    status, body = _post(f"{served.base}/v1/conversations/{conversation.id}/items",
                         {"items": [{**output, "call_id": "c9"}]})
    assert status == 400 and body["error"]["param"] == "items" and "call_id c9" in body["error"]["message"]
    client.conversations.items.delete(added.data[1].id, conversation_id=conversation.id)
    continued = {**ask, "input": "x", "conversation": conversation.id}
    status, body = _post(f"{served.base}/v1/responses", continued)
    assert (status, body["error"]["param"]) == (400, "conversation")
    assert "call_id c1" in body["error"]["message"]
    # items can still be added (the call again, say), read from the items themselves
    call = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"}
    client.conversations.items.create(conversation.id, items=[call, {"role": "user", "content": "and 4?"}])
    updated = client.conversations.update(conversation.id, metadata={"topic": "more"})
    assert updated.metadata == {"topic": "more"}
    assert client.conversations.delete(conversation.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)
    status, body = _post(f"{served.base}/v1/responses",
                         {**ask, "input": "x", "conversation": conversation.id})
    assert status == 404 and body["error"]["param"] == "conversation"


BAD_CONVERSATIONS = [
    ("/v1/conversations", {"items": [{"role": "robot", "content": "x"}]}, "items[0].role"),
    ("/v1/conversations", {"items": [{"role": "user", "content": "x"}] * 21}, "items"),
    ("/v1/conversations", {"metadata": {"a": 1}}, "metadata.a"),
    ("/v1/conversations", {"metadata": {str(k): "v" for k in range(17)}}, "metadata"),
    ("/v1/conversations", {"tools": []}, "tools"),
    ("/v1/conversations/{cid}", {"items": []}, "items"),
    ("/v1/conversations/{cid}/items", {}, "items"),
    ("/v1/conversations/{cid}/items", {"items": [{"type": "item_reference", "id": "x"}]}, "items[0].type"),
    ("/v1/responses", {"model": "trtspec", "input": "x", "conversation": 5}, "conversation"),
    ("/v1/responses", {"model": "trtspec", "input": "x", "conversation": "{cid}",
                       "previous_response_id": "r"}, "previous_response_id"),
]


@pytest.mark.parametrize("path, body, param", BAD_CONVERSATIONS,
                         ids=[f"{path}:{param}" for path, _, param in BAD_CONVERSATIONS])
def test_a_bad_conversation_request_is_a_400_naming_its_parameter(served, path, body, param):
    cid = served.client().conversations.create().id
    body = json.loads(json.dumps(body).replace("{cid}", cid))
    status, answer = _post(f"{served.base}{path.replace('{cid}', cid)}", body)
    assert status == 400 and answer["error"]["param"] == param, answer
    assert served.client().conversations.items.list(cid).data == []  # nothing half added


def test_response_tools_and_text_formats_are_chats(served):
    """Flat function tools: a named tool_choice and "required" answer function_call items whose
    arguments are chat's calls'; tools are strict unless they say otherwise (auto's text is chat's
    under strict tools); text.format json_schema is chat's response_format, streamed or not."""
    client = served.client()
    ask = {"input": "482 + 356", "max_output_tokens": 64}
    chat_ask = {"model": "trtspec", "messages": [{"role": "user", "content": "482 + 356"}], "max_tokens": 64,
                "temperature": 0}
    strict = [{"type": "function", "function": {**tool["function"], "strict": True}} for tool in TOOLS]
    cases = [({"tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "add"}},
              {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "add"}}}),
             ({"tools": FLAT_TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
              {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}),
             ({"tools": [{k: v for k, v in tool.items() if k != "strict"} for tool in FLAT_TOOLS]},
              {"tools": strict}),
             ({"text": {"format": {"type": "json_schema", "name": "sum", "schema": ADD}}},
              {"response_format": {"type": "json_schema", "json_schema": {"name": "sum", "schema": ADD}}})]
    for tools, chat_tools in cases:
        message = client.chat.completions.create(**chat_ask, **chat_tools).choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]
        for stream in (False, True):
            response, events = _response(client, stream, **ask, **tools)
            got = [(item["name"], item["arguments"]) for item in response["output"]
                   if item["type"] == "function_call"]
            assert got == calls and _output_text(response) == (message.content or ""), (tools, stream)
            assert all(item["call_id"].startswith("call_") for item in response["output"]
                       if item["type"] == "function_call")
    assert calls == [] and message.content.startswith("{")  # the schema's, last (its whitespace free)
    assert response["text"]["format"]["type"] == "json_schema"
    # a named call cut by max_output_tokens (was a 400, a stream without its last event): incomplete,
    # its arguments chat's, and the conversation goes on without it
    named = {"tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "add"}, "max_output_tokens": 6}
    cut = client.chat.completions.create(**{**chat_ask, "max_tokens": 6}, tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": "add"}}).choices[0].message.tool_calls[0].function.arguments
    for stream in (False, True):
        response, _ = _response(client, stream, input="482 + 356", **named)
        assert (response["status"], response["incomplete_details"]) == ("incomplete",
                                                                         {"reason": "max_output_tokens"})
        (call,) = response["output"]
        assert (call["status"], call["arguments"]) == ("incomplete", cut) and not cut.endswith("}")
        follow = client.responses.create(model="trtspec", previous_response_id=response["id"], input="again",
                                         max_output_tokens=4, temperature=0)
        assert follow.status in ("completed", "incomplete")


BAD_RESPONSES = [
    ({"foo": 1}, "foo"),
    ({"prompt_cache_retention": "1h"}, "prompt_cache_retention"),
    ({"background": True, "store": False}, "background"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"tools": [{"type": "file_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f", "parameters": []}]}, "tools[0].parameters"),
    ({"tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"text": {"format": {"type": "regex"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"max_output_tokens": 10**6}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"include": ["file_search_call.results"]}, "include[0]"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without include
    ({"top_logprobs": 21, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
    ({"include": ["message.output_text.logprobs"], "tools": FLAT_TOOLS}, "include"),
    ({"truncation": "middle"}, "truncation"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"input": "x" * 5000}, "input"),  # past the context
]


@pytest.mark.parametrize("change, param", BAD_RESPONSES, ids=[p for _, p in BAD_RESPONSES])
def test_a_bad_response_request_is_a_400_naming_its_parameter(served, change, param):
    good = {"model": "trtspec", "input": "1 + 2", "max_output_tokens": 4}
    status, body = _post(f"{served.base}/v1/responses", {**good, **change})
    assert status == 400, body
    assert body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error"
    assert param.split(".")[0].split("[")[0] in body["error"]["message"]
    words = set(re.findall(r"\w+", body["error"]["message"]))  # chat's names are not this request's
    assert not {"messages", "max_completion_tokens", "response_format"} & words
    status, body = _post(f"{served.base}/v1/responses", good)
    assert status == 200 and body["usage"]["output_tokens"] >= 1


ANTHROPIC_TOOLS = [{"name": tool["function"]["name"], "description": tool["function"].get("description", ""),
                    "input_schema": tool["function"]["parameters"]} for tool in TOOLS]


def _anthropic(served, key: str | None = KEY):
    return anthropic.Anthropic(base_url=served.base, api_key=key, max_retries=0, timeout=120)


def _message(client, stream: bool, **ask) -> tuple[dict, list[dict]]:
    """A Messages answer (as a dict) and, streamed, its events: message_start first, then the blocks'
    events, message_delta and message_stop, the answer as Anthropic's SDK builds it from them."""
    ask = {"model": "trtspec", "max_tokens": MAX_TOKENS, "extra_body": {"temperature": 0}, **ask}
    if not stream:
        return client.messages.create(**ask).model_dump(), []
    with client.messages.stream(**ask) as events:
        seen = [event.model_dump() for event in events]
        final = events.get_final_message().model_dump()
    raw = [e for e in seen if e["type"] in ("message_start", "content_block_start", "content_block_delta",
                                            "content_block_stop", "message_delta", "message_stop")]
    assert [e["type"] for e in raw[:1] + raw[-2:]] == ["message_start", "message_delta", "message_stop"]
    assert raw[-2]["delta"]["stop_reason"] == final["stop_reason"]
    return final, raw


def _text_of(message: dict) -> str:
    return "".join(block["text"] for block in message["content"] if block["type"] == "text")


def test_a_message_is_the_chat_answer_streamed_or_not(served):
    """/v1/messages over the chat path with Anthropic's own SDK (its x-api-key header): a conversation
    (system, text blocks, an earlier answer) is the chat answer to the messages it stands for; its
    stop_reason chat's finish_reason (max_tokens, end_turn, stop_sequence with the sequence); usage
    chat's, the prompt's prefix-cache reads apart; streamed, the SDK builds the same message from the
    events; count_tokens counts the prompt chat counts."""
    client, chat = _anthropic(served), served.client()
    history = [{"role": "system", "content": "Arithmetic."}, {"role": "user", "content": "1 + 2\n3 + 4"},
               {"role": "assistant", "content": "3"}, {"role": "user", "content": "482 + 356"}]
    parts = [{"type": "text", "text": "1 + 2"}, {"type": "text", "text": "3 + 4"}]
    blocks = [{"role": "user", "content": parts},
              {"role": "assistant", "content": [{"type": "text", "text": "3"}]},
              {"role": "user", "content": "482 + 356"}]
    cases = [({"messages": [history[-1]]}, [history[-1]], {}),
             ({"messages": blocks, "system": [{"type": "text", "text": "Arithmetic."}]}, history, {}),
             ({"messages": [history[-1]], "stop_sequences": [";"]}, [history[-1]], {"stop": [";"]}),
             ({"messages": [{"role": "user", "content": "def parse(self):"}], "max_tokens": 8},
              [{"role": "user", "content": "def parse(self):"}], {"max_tokens": 8})]
    read_from_cache = 0  # streamed answers whose prompt the earlier ones left in a slot
    for ask, messages, chat_ask in cases:
        answer = chat.chat.completions.create(model="trtspec", messages=messages, temperature=0,
                                              **{"max_tokens": MAX_TOKENS, **chat_ask})
        want, finish = answer.choices[0].message.content, answer.choices[0].finish_reason
        reason = {"length": "max_tokens"}.get(finish, "stop_sequence" if "stop" in chat_ask else "end_turn")
        for stream in (False, True):
            message, events = _message(client, stream, **ask)
            assert _text_of(message) == want, (ask, stream)
            assert (message["stop_reason"], message["stop_sequence"]) == \
                (reason, ";" if reason == "stop_sequence" else None)
            usage = message["usage"]
            assert usage["input_tokens"] + usage["cache_read_input_tokens"] == answer.usage.prompt_tokens
            assert usage["output_tokens"] == answer.usage.completion_tokens
            if stream:  # message_start already knows what the prompt read from the prefix cache
                start = events[0]["message"]["usage"]
                assert (start["input_tokens"], start["cache_read_input_tokens"]) == \
                    (usage["input_tokens"], usage["cache_read_input_tokens"])
                read_from_cache += usage["cache_read_input_tokens"] > 0
        count = client.messages.count_tokens(model="trtspec", **{k: v for k, v in ask.items() if k in (
            "messages", "system")})
        assert count.input_tokens == answer.usage.prompt_tokens
    assert events[0]["message"]["content"] == [] and events[0]["message"]["stop_reason"] is None
    assert read_from_cache > 0


def test_codex_and_claude_code_requests_are_served_as_chat(served):
    """The requests of the agent clients as they send them (Codex CLI 0.171 over /v1/responses,
    Claude Code 2.1.332 over /v1/messages; their shapes captured from the clients themselves, texts
    shortened): Codex's per-turn `client_metadata`, a `namespace` of function tools and hosted web
    search beside its function tools, `reasoning.summary`, `store: false`, `include`,
    `prompt_cache_key`; Claude Code's telemetry system block, a system message after the user's,
    `context_management`'s clear_thinking, `output_config.effort`, adaptive thinking not displayed,
    `metadata.user_id`. Each answer, streamed as the clients read them, is chat's answer to the
    conversation it stands for (the embedded template shows no tools)."""
    client, chat = served.client(), served.client()
    command = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
    codex = dict(
        model="trtspec", stream=True, temperature=0, max_output_tokens=MAX_TOKENS,
        input=[{"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}
               for role, text in (("developer", "Be brief."), ("user", "482 + 356"))],
        tools=[{"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
                "parameters": command},
               {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
                   {"type": "function", "name": "spawn_agent", "description": "Start one.", "strict": False,
                    "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}]},
               {"type": "web_search", "external_web_access": False}],
        tool_choice="auto", parallel_tool_calls=True, reasoning={"summary": "auto"}, store=False,
        include=["reasoning.encrypted_content"], prompt_cache_key="thread-1",
        extra_body={"client_metadata": {"turn_id": "t-1", "x-codex-window-id": "thread-1:0"}})
    events = list(client.responses.create(**codex))
    assert events[-1].type in ("response.completed", "response.incomplete")
    want = chat.chat.completions.create(model="trtspec", temperature=0, max_tokens=MAX_TOKENS, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "482 + 356"}])
    assert events[-1].response.output_text == want.choices[0].message.content
    billing = "x-anthropic-billing-header: cc_version=2.1.332.34c; cc_entrypoint=sdk-cli;"
    reminder = "<system-reminder>\nq\n</system-reminder>"
    claude_code = dict(
        system=[{"type": "text", "text": billing},
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": reminder},
                                               {"type": "text", "text": "482 + 356"}]},
                  {"role": "system", "content": [{"type": "text", "text": "# Environment",
                                                  "cache_control": {"type": "ephemeral"}}]}],
        tools=[{"name": "Bash", "description": "Run a command.", "input_schema": command}],
        metadata={"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
        thinking={"type": "adaptive", "display": "omitted"}, output_config={"effort": "high"},
        extra_body={"temperature": 0, "context_management": {"edits": [{"type": "clear_thinking_20251015",
                                                                         "keep": "all"}]}})
    message, _ = _message(_anthropic(served), True, **claude_code)
    want = chat.chat.completions.create(model="trtspec", temperature=0, max_tokens=MAX_TOKENS, messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"{reminder}\n482 + 356"},
        {"role": "system", "content": "# Environment"}])
    assert _text_of(message) == want.choices[0].message.content


def test_message_tools_are_chats(served):
    """tool_choice tool (a named function) and any (chat's required; disable_parallel_tool_use: one
    call) answer tool_use blocks whose input is chat's calls' arguments, stop_reason tool_use,
    streamed or not; auto without a call is text; output_config.format is chat's json_schema."""
    client, chat = _anthropic(served), served.client()
    ask = {"messages": [{"role": "user", "content": "482 + 356"}], "max_tokens": 64, "tools": ANTHROPIC_TOOLS}
    chat_ask = {"model": "trtspec", "messages": [{"role": "user", "content": "482 + 356"}], "max_tokens": 64,
                "temperature": 0, "tools": TOOLS}
    cases = [({"tool_choice": {"type": "tool", "name": "add"}},
              {"tool_choice": {"type": "function", "function": {"name": "add"}}}),
             ({"tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
              {"tool_choice": "required", "parallel_tool_calls": False}),
             ({"tool_choice": {"type": "auto"}}, {})]
    for tools, chat_tools in cases:
        message = chat.chat.completions.create(**chat_ask, **chat_tools).choices[0].message
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]
        for stream in (False, True):
            answer, _ = _message(client, stream, **ask, **tools)
            got = [(b["name"], b["input"]) for b in answer["content"] if b["type"] == "tool_use"]
            assert got == calls and _text_of(answer) == (message.content or ""), (tools, stream)
            assert answer["stop_reason"] == ("tool_use" if calls else "end_turn")
    assert calls == []  # auto wrote text, last
    # no text and no call begun (max_tokens 1 cut the forced call): one empty text block, whole or
    # streamed (where the SDK builds it from that block's own events)
    for stream in (False, True):
        cut, _ = _message(client, stream, **{**ask, "max_tokens": 1}, tool_choice={"type": "any"})
        assert [(b["type"], b["text"]) for b in cut["content"]] == [("text", "")], stream
        assert cut["stop_reason"] == "max_tokens"
    schema = {"format": {"type": "json_schema", "schema": ADD}}
    plain = {key: value for key, value in chat_ask.items() if key != "tools"}
    want = chat.chat.completions.create(**plain, response_format={
        "type": "json_schema", "json_schema": {"name": "output", "schema": ADD}}).choices[0].message.content
    answer, _ = _message(client, False, messages=ask["messages"], max_tokens=64, output_config=schema)
    assert _text_of(answer) == want and want.startswith("{")


def test_messages_errors_are_anthropics(served):
    """A refused Messages request is Anthropic's error shape naming the field (a chat refusal of the
    translated request named as this request names it: max_tokens, tools[0].input_schema); a missing
    or wrong key is an authentication_error, an unknown model a not_found_error; the server serves
    on."""
    good = {"model": "trtspec", "messages": [{"role": "user", "content": "1 + 2"}], "max_tokens": 4}
    for change, says in (({"max_tokens": 10**6}, "'max_tokens'"), ({"foo": 1}, "foo"),
                         ({"tools": [{"name": "f", "input_schema": []}]}, "tools[0].input_schema"),
                         ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
                         ({"messages": [{"role": "user", "content": [{"type": "image"}]}]},
                          "messages[0].content[0].type"),
                         ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.budget_tokens"),
                         ({"stop_sequences": [""]}, "'stop_sequences'"),
                         # a tool result answers a tool_use before it, as Anthropic requires
                         ({"messages": [{"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": "toolu_9", "content": "3"}]}]},
                          "toolu_9")):
        status, body = _post(f"{served.base}/v1/messages", {**good, **change})
        assert status == 400 and body["type"] == "error", body
        assert body["error"]["type"] == "invalid_request_error" and says in body["error"]["message"], body
        assert "max_completion_tokens" not in body["error"]["message"]
    assert _post(f"{served.base}/v1/messages", good, key=None)[1]["error"]["type"] == "authentication_error"
    status, body = _post(f"{served.base}/v1/messages", {**good, "model": "nope"})
    assert status == 404 and body["error"]["type"] == "not_found_error"
    status, body = _post(f"{served.base}/v1/messages", good)
    assert status == 200 and body["usage"]["output_tokens"] >= 1 and body["type"] == "message"
