"""How `trtspec serve` stops on SIGTERM (a Ctrl-C, a Kubernetes rollout): requests in flight finish,
those still running after the frontend's grace end with an error event, and the exit code is 0."""

from __future__ import annotations

import http.client
import json
import signal
import threading

from click.testing import CliRunner

from trtspec.cli import main

from .conftest import REPO, serve_cli

CONFIG = REPO / "build_configs" / "tiny-dflash.yaml"


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


def test_sigterm_finishes_requests_in_flight_and_ends_the_rest_with_an_error(tmp_path):
    """An idle keep-alive connection, a short request and one too long for the grace (2048 tokens,
    about 20 s on a 2-core CPU, against 5 s) are open when SIGTERM comes: the short one gets its
    whole answer, the long one an error event saying why and [DONE] (it was a cut connection and a
    CancelledError traceback in the log), and serve exits 0."""
    assert CliRunner().invoke(main, ["build", str(CONFIG), "--out", str(tmp_path)]).exit_code == 0
    with serve_cli(tmp_path) as served:
        idle = http.client.HTTPConnection("127.0.0.1", served.openai_port, timeout=60)
        idle.request("GET", "/v1/models")
        assert idle.getresponse().read()  # answered; the connection stays open, idle
        short, long = _Stream(served.openai_port, 100), _Stream(served.openai_port, 2048)
        assert short.started.wait(120) and long.started.wait(120)
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=60) == 0, open(served.log).read()
        short.thread.join(60)
        long.thread.join(60)
    assert short.events[-1] == "[DONE]"
    assert short.events[-2]["usage"]["completion_tokens"] == 100
    assert [e["choices"][0]["finish_reason"] for e in short.events[:-2]][-1] == "length"
    assert long.events[-1] == "[DONE]"
    error = long.events[-2]["error"]
    assert error["code"] == "unavailable" and error["message"].startswith("the server is shutting down: ")
    assert "Traceback" not in open(served.log).read()
