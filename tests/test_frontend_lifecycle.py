"""The OpenAI frontend's thread started and stopped (`trtspec.openai.server.OpenAIFrontend`), with no
Triton behind it (its answers are test_openai's): a start that cannot bind fails at once saying
why, and `stop()` ends the thread. Each case was a change to the module that the fast tests passed
(scripts/mutants.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from trtspec.config import load_build_config
from trtspec.openai.model_info import served_model
from trtspec.openai.server import FrontendError, OpenAIFrontend

from .conftest import REPO, free_ports

CONFIG = REPO / "build_configs" / "tiny-dflash.yaml"


@pytest.fixture(scope="module")
def model():
    return served_model(load_build_config(CONFIG))


def test_a_frontend_on_a_taken_port_fails_at_once_saying_it_did_not_start(model):
    """uvicorn exits when it cannot bind: start() says so as soon as its thread has ended, not when
    its 30 s are up, and says why in words (it said "did not start: 3", uvicorn's exit status)."""
    triton_port, port = free_ports(2)
    with socket.create_server(("127.0.0.1", port)):
        frontend = OpenAIFrontend(model, f"127.0.0.1:{triton_port}", "127.0.0.1", port)
        started = time.monotonic()
        with pytest.raises(FrontendError) as failed:
            frontend.start()
        assert time.monotonic() - started < 10
    said = f"OpenAI frontend on 127.0.0.1:{port} did not start: it exited (is the port taken?)"
    assert str(failed.value) == said
    assert not frontend.running


def test_stop_ends_the_frontends_thread_at_once_when_nothing_is_in_flight(model):
    """Started, the frontend runs; stop() with no request in flight ends its thread without waiting
    out the grace."""
    triton_port, port = free_ports(2)
    frontend = OpenAIFrontend(model, f"127.0.0.1:{triton_port}", "127.0.0.1", port).start(timeout_s=60)
    assert frontend.running and frontend.url == f"http://127.0.0.1:{port}"
    started = time.monotonic()
    frontend.stop()
    assert not frontend.running and time.monotonic() - started < 4


def test_a_frontend_left_running_does_not_keep_its_process_alive():
    """The frontend serves in a daemon thread: a process that ends without stop() (an error path
    past its `finally`) exits instead of serving on, unseen."""
    triton_port, port = free_ports(2)
    code = ("from trtspec.config import load_build_config\n"
            "from trtspec.openai.model_info import served_model\n"
            "from trtspec.openai.server import OpenAIFrontend\n"
            f"model = served_model(load_build_config({str(CONFIG)!r}))\n"
            f"f = OpenAIFrontend(model, '127.0.0.1:{triton_port}', '127.0.0.1', {port}).start(timeout_s=60)\n"
            "print(f.running)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 0 and run.stdout == "True\n", run.stderr
