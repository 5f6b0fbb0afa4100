"""trtspec/triton/server.py without a running tritonserver: its log reading, the ports it checks, the
command it builds and how it stops a process (found by scripts/mutants.py: changes to these lines that
the served tests never noticed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from trtspec.triton import server
from trtspec.triton.server import Ports, ServeError, TritonServer, log_errors

from .conftest import triton_ports

MODEL_ERROR = "failed to load 'trtspec' version 1: Internal: the drafter does not fit"


def _glog(source: str, message: str) -> str:
    return f'E1130 17:17:52.519599 11760 {source}:245] "{message}"'


def test_a_models_load_error_outranks_other_errors_which_outrank_grpcs_internals():
    """Triton repeats a model's error in its status table and gRPC's internals: only the most telling
    rank is named (model lifecycle or main, then any other source, then chttp2), each once, its
    first line; CPU-only noise and empty messages are no error."""
    model = _glog("model_lifecycle.cc", MODEL_ERROR + "\\nTraceback (most recent call last)")
    other = _glog("backend_model.cc", "a backend error")
    grpc = _glog("chttp2_server.cc", "an http2 error")
    noise = _glog("cuda_driver.cc", "CudaDriverHelper has not been initialized.")
    empty = 'E1130 17:17:52.519599 11760 main.cc:245] ""'
    log = "\n".join(["I1130 17:17:52.1 11760 server.cc:1] \"not an error\"", noise, empty, grpc, other,
                     model, other, model])
    assert log_errors(log) == [MODEL_ERROR]
    assert log_errors("\n".join([noise, empty, grpc, other, grpc])) == ["a backend error"]
    assert log_errors("\n".join([grpc, noise])) == ["an http2 error"]
    assert log_errors("\n".join([noise, empty])) == []
    assert log_errors(_glog("main.cc", "failed to start HTTP service")) == ["failed to start HTTP service"]


def test_only_a_model_py_without_its_class_is_named_with_the_fix(tmp_path):
    error = (f"{MODEL_ERROR.split(':')[0]}: AttributeError: module '1.model' has no attribute "
             "'TritonPythonModel'")
    assert server._with_model_file(error, tmp_path) == (
        f"{error} ({tmp_path / 'trtspec' / '1' / 'model.py'} defines no TritonPythonModel, the class the "
        "Python backend runs: the build is incomplete or was edited; build it again with `trtspec build`)")
    assert server._with_model_file(MODEL_ERROR, tmp_path) == MODEL_ERROR


def test_numpy_2_is_refused_from_2_0_0_on_and_numpy_1_is_not(monkeypatch):
    """numpy 2 in the models' environment returns empty outputs, 2.0.0 already; numpy 1 serves."""
    monkeypatch.setattr(np, "__version__", "2.1.0")
    with pytest.raises(ServeError, match=r"numpy 2.1.0 .* returns empty outputs .*numpy<2"):
        server.check_models_environment()
    monkeypatch.setattr(np, "__version__", "2.0.0")
    with pytest.raises(ServeError, match=r"numpy 2.0.0 "):
        server.check_models_environment()
    monkeypatch.setattr(np, "__version__", "1.26.4")
    server.check_models_environment()


def test_the_server_setup_uses_this_interpreter_and_is_prepared_again_over_a_previous_one(tmp_path):
    """The backend folder's links lead to this interpreter's stub and the Python backend, and a second
    start in the same folder replaces them, a dangling one too (a wheel reinstalled elsewhere); the
    server's PATH starts at this interpreter's folder and its LD_LIBRARY_PATH holds the wheel's libs."""
    install = server.find_tritonserver()
    stub_link = tmp_path / "backends" / "python" / server.STUB
    stub_link.parent.mkdir(parents=True)
    stub_link.symlink_to(tmp_path / "gone")
    for _ in range(2):
        backends = server.prepare_backend_dir(install, tmp_path)
        assert backends == tmp_path / "backends"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        assert stub_link.resolve() == install.stub(version).resolve()
        assert (backends / "python" / "libtriton_python.so").resolve().is_file()
    env = server.server_env(install)
    assert env["PATH"].split(":")[0] == os.path.dirname(sys.executable)
    assert str(install.libs) in env["LD_LIBRARY_PATH"].split(":")


def test_the_server_child_gets_sigterm_when_its_parent_dies():
    """`_die_with_parent` sets the parent-death signal to SIGTERM, and it outlives exec."""
    code = ("import ctypes; v = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); "
            "print(v.value)")
    out = subprocess.run([sys.executable, "-c", code], preexec_fn=server._die_with_parent,
                         capture_output=True, text=True, check=True).stdout
    assert int(out) == 15  # the kernel's own setting (PR_GET_PDEATHSIG)


def test_a_free_port_is_bindable_on_ipv4_and_ipv6_hosts():
    """A free port passes on either address family (an IPv6 host needs its own socket family); a taken
    one is named."""
    for host, family in (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)):
        with socket.socket(family) as held:
            try:
                held.bind((host, 0))
            except OSError:  # a machine without IPv6 loopback: nothing to check there
                assert family == socket.AF_INET6
                continue
            port = held.getsockname()[1]
            held.listen()
            with pytest.raises(ServeError, match=rf"the gRPC port {port} on {host} is not available"):
                server.check_port_free(host, port, "gRPC", "--grpc-port")
        server.check_port_free(host, port, "gRPC", "--grpc-port")


def test_a_server_that_cannot_start_raises_from_its_context_manager(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = triton_ports()
        ports.metrics = taken.getsockname()[1]
        with pytest.raises(ServeError, match="the metrics port"), TritonServer(tmp_path, ports=ports):
            pass


@pytest.mark.parametrize("host, local", [("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1"), ("", "127.0.0.1"),
                                         ("127.0.0.2", "127.0.0.2"), ("10.1.2.3", "10.1.2.3")])
def test_a_wildcard_bind_is_reached_on_loopback_and_any_other_host_as_it_is(tmp_path, host, local):
    served = TritonServer(tmp_path, host=host, ports=Ports(1, 2, 3))
    assert served.local_grpc_address == f"{local}:2"


def test_the_stub_failure_is_its_own_first_line_wherever_the_log_has_it(tmp_path):
    log = tmp_path / "tritonserver.log"
    assert TritonServer(tmp_path)._stub_failure() == ""  # no log yet
    assert TritonServer(tmp_path, log_path=log)._stub_failure() == ""  # its file not written yet
    for before in ("", "I1130 loading\n"):
        log.write_text(f"{before}{server.STUB_FAILED}: Python model file not found  \nnext line\n")
        assert TritonServer(tmp_path, log_path=log)._stub_failure() == (
            f"{server.STUB_FAILED}: Python model file not found")
    log.write_text("I1130 all well\n")
    assert TritonServer(tmp_path, log_path=log)._stub_failure() == ""


def test_a_failure_without_errors_is_the_last_plain_log_line_and_a_kept_log_is_named(tmp_path):
    """Without error lines the reason is the last line that is neither blank nor the status table;
    the log's path is named only when it is not the server's own temporary one."""
    work = tempfile.TemporaryDirectory()
    try:
        assert TritonServer(tmp_path, _work=work).failure() == "no log output"
        kept = tmp_path / "serve.log"
        kept.write_text("first\nsecond\nthe last words\n+----+\n| table |\n+----+\n\n")
        assert TritonServer(tmp_path, log_path=kept, _work=work).failure() == f"the last words (log: {kept})"
        assert TritonServer(tmp_path, log_path=kept).failure() == "the last words"
        own = tmp_path / "own.log"
        own.write_text("")
        assert TritonServer(tmp_path, log_path=own, _work=work).failure() == "no log output (log: " \
            f"{own})"
        inside = work.name + "/tritonserver.log"
        with open(inside, "w") as out:
            out.write(_glog("main.cc", "failed to start") + "\n")
        assert TritonServer(tmp_path, log_path=Path(inside), _work=work).failure() == "failed to start"
    finally:
        work.cleanup()


def test_stop_keeps_a_log_outside_its_folder_and_forgets_its_own(tmp_path):
    kept = tmp_path / "serve.log"
    kept.write_text("x")
    served = TritonServer(tmp_path, log_path=kept, _work=tempfile.TemporaryDirectory())
    served.stop()
    assert served.log_path == kept and served._work is None and not served.running
    work = tempfile.TemporaryDirectory()
    served = TritonServer(tmp_path, log_path=Path(work.name) / "tritonserver.log", _work=work)
    served.stop()
    assert served.log_path is None


def test_a_server_on_an_empty_repository_logs_where_asked_in_its_own_process_group(tmp_path):
    """The one test here that starts tritonserver (about 1.5 s: no model to load), as only a real start
    shows these: a log file in folders not made yet, a process group of its own (a terminal's Ctrl-C
    reaches `trtspec serve`, which stops the server in order; `stop` kills the group's stubs), readiness
    noticed, and a SIGTERM it exits from by itself."""
    (tmp_path / "repo").mkdir()
    log = tmp_path / "logs" / "new" / "tritonserver.log"
    served = TritonServer(tmp_path / "repo", ports=triton_ports(), log_path=log, exit_timeout_s=1)
    try:
        proc = served.start(timeout_s=20)._proc
        assert served.running and os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
        assert "Started HTTPService" in log.read_text()
    finally:
        served.stop()
    assert proc.returncode == 0 and not served.running and served.log_path == log
