"""How `trtspec serve` stops on SIGTERM (a Ctrl-C, a Kubernetes rollout): requests in flight finish,
those still running after the frontend's grace end with an error event, and the exit code is 0."""

from __future__ import annotations

import http.client
import json
import signal
import threading

import numpy as np
from click.testing import CliRunner
from tritonclient.grpc import InferInput

from trtspec.cli import main
from trtspec.triton.client import ClientError, GenerateParams, array_input, grpc_generate, grpc_inputs

from .conftest import serve_cli

# the target alone, answers up to 4,000 tokens: a token a step, so the long streams outlast the stop's
# deadlines on any machine (tiny-dflash's drafter wrote 2,000 tokens of arithmetic in under 14 s, and a
# stream that ended first had no error to get)
CONFIG_TEXT = "target: {path: builtin:tiny-target}\nlimits: {max_tokens: 4000}\n"


class _Stream:
    """A streamed completion read line by line in a thread; `started` once its first event came."""

    def __init__(self, port: int, max_tokens: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        body = {"model": "trtspec", "prompt": "Q: 482 + 356\nA:", "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        self.conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        self.events: list = []
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self) -> None:
        response = self.conn.getresponse()
        assert response.status == 200
        for line in response:  # ends when the server ends the response (or cuts it)
            if line.startswith(b"data: "):
                data = line[6:].strip()
                self.events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
                self.started.set()
        self.started.set()


class _GrpcStream:
    """A streamed request straight to Triton's gRPC port (4,000 tokens, end ids ignored) in a thread;
    `started` once text came, `error` the client's error when it ended in one."""

    def __init__(self, address: str):
        self.started, self.error = threading.Event(), None
        self.thread = threading.Thread(target=self._run, args=(address,))
        self.thread.start()

    def _run(self, address: str) -> None:
        inputs = grpc_inputs("Q: 482 + 356\nA:", GenerateParams(max_tokens=4000, stream=True))
        inputs.append(array_input(InferInput, "ignore_eos", np.array([True])))
        try:
            grpc_generate(address, "trtspec", inputs, lambda text: self.started.set(), timeout_s=120)
        except ClientError as exc:
            self.error = str(exc)
        self.started.set()


def test_sigterm_finishes_requests_in_flight_and_ends_the_rest_with_an_error(tmp_path):
    """An idle keep-alive connection, a short request and one too long for the grace (4,000 tokens,
    about 40 s on a 2-core CPU, against 5 s) are open when SIGTERM comes: the short one gets its
    whole answer, the long one an error event saying why and [DONE] (it was a cut connection and a
    CancelledError traceback in the log), and serve exits 0. A gRPC stream to Triton itself, still
    running when Triton's own 10 s end, gets an error saying why too (found stressing the server,
    2026-12-06: the model never answered it, so Triton waited until it was killed 15 s later and the
    stream was cut with GOAWAY, the whole stop taking 25-31 s)."""
    config = tmp_path / "alone.yaml"
    config.write_text(CONFIG_TEXT)
    assert CliRunner().invoke(main, ["build", str(config), "--out", str(tmp_path / "out")]).exit_code == 0
    with serve_cli(tmp_path / "out") as served:
        idle = http.client.HTTPConnection("127.0.0.1", served.openai_port, timeout=60)
        idle.request("GET", "/v1/models")
        assert idle.getresponse().read()  # answered; the connection stays open, idle
        short, long = _Stream(served.openai_port, 100), _Stream(served.openai_port, 4000)
        direct = _GrpcStream(served.grpc)
        assert short.started.wait(120) and long.started.wait(120) and direct.started.wait(120)
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=60) == 0, open(served.log).read()
        short.thread.join(60)
        long.thread.join(60)
        direct.thread.join(60)
    assert direct.error is not None and "the server is shutting down: this request was not finished" \
        in direct.error, direct.error
    assert "did not stop on SIGTERM" not in open(served.log).read()
    assert short.events[-1] == "[DONE]"
    assert short.events[-2]["usage"]["completion_tokens"] == 100
    assert [e["choices"][0]["finish_reason"] for e in short.events[:-2]][-1] == "length"
    assert long.events[-1] == "[DONE]"
    error = long.events[-2]["error"]
    assert error["code"] == "unavailable" and error["message"].startswith("the server is shutting down: ")
    assert "Traceback" not in open(served.log).read()
