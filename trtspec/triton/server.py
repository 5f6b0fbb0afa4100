"""Start and stop the `tritonserver` shipped in the `nvidia-pytriton` wheel on a model repository.

What the wheel needs, as pytriton's own launcher (`pytriton/triton.py`, `server/triton_server.py`)
sets it up:
- `--backend-directory` holding `python/libtriton_python.so`, `triton_python_backend_utils.py` and
  the Python-backend stub built for THIS interpreter's minor version (the wheel keeps one per
  version under `tritonserver/python_backend_stubs/3.X/`; we link it into a private backend folder
  instead of copying the whole distribution);
- `nvidia_pytriton.libs` on `LD_LIBRARY_PATH`, and the interpreter's own libpython folder before
  it, so the stub embeds the same Python the models' environment was built with;
- this environment's `bin/` first on `PATH`: the embedded interpreter finds `python3` there, reads
  its `pyvenv.cfg` and so imports trtspec and torch from this venv (no `EXECUTION_ENV_PATH`);
- numpy < 2 in that environment: with numpy 2 every output tensor comes back empty.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from trtspec.errors import TrtspecError

log = logging.getLogger(__name__)

PYTRITON_PIN = "nvidia-pytriton==0.7.0"
# Triton's administrative APIs (model load/unload, shared memory, trace and log settings): restricted
# to requests carrying ADMIN_HEADER when a key is set (`--http-restricted-api`, `--grpc-restricted-protocol`)
ADMIN_APIS = ("model-repository", "shared-memory", "trace", "logging")
ADMIN_HEADER = "admin-key"
# what Triton 2.51 expects on gRPC: the key prefixed (its own error message names the header)
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"
BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
STUB = "triton_python_backend_stub"


class ServeError(TrtspecError):
    """tritonserver cannot be found, set up, started or reached."""


@dataclass(frozen=True, slots=True)
class TritonInstall:
    """Where the wheel put the server, its backends and its bundled libraries."""

    root: Path  # site-packages/pytriton/tritonserver
    libs: Path  # site-packages/nvidia_pytriton.libs

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    def stub(self, version: str) -> Path:
        return self.root / "python_backend_stubs" / version / STUB


def find_tritonserver() -> TritonInstall:
    try:
        import pytriton
    except ImportError:
        raise ServeError(f"tritonserver is not installed: pip install '{PYTRITON_PIN}'") from None
    pkg = Path(pytriton.__file__).parent
    install = TritonInstall(root=pkg / "tritonserver", libs=pkg.parent / "nvidia_pytriton.libs")
    if not install.binary.is_file():
        raise ServeError(f"{install.binary} is missing: reinstall '{PYTRITON_PIN}'")
    return install


def check_models_environment() -> None:
    """Refuse an environment whose numpy makes the Python backend return empty outputs."""
    import numpy

    if Version(numpy.__version__) >= Version("2"):
        raise ServeError(
            f"numpy {numpy.__version__} in {sys.prefix}: the Python backend of this tritonserver returns "
            "empty outputs with numpy >= 2; install 'numpy<2'"
        )


def prepare_backend_dir(install: TritonInstall, work_dir: Path) -> Path:
    """A backend directory whose Python backend uses the stub built for this interpreter."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = install.stub(version)
    if not stub.is_file():
        raise ServeError(f"no Python-backend stub for Python {version} in {stub.parent.parent}")
    python_dir = work_dir / "backends" / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for name, src in [(n, install.python_backend / n) for n in BACKEND_FILES] + [(STUB, stub)]:
        link = python_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(src)
    return python_dir.parent


def server_env(install: TritonInstall) -> dict[str, str]:
    env = dict(os.environ)
    libpython_dir = sysconfig.get_config_var("LIBDIR")
    lib_path = [p for p in (libpython_dir, str(install.libs), env.get("LD_LIBRARY_PATH")) if p]
    env["LD_LIBRARY_PATH"] = ":".join(lib_path)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    return env


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started the server dies, so a
    killed `trtspec serve` (or test run) never leaves a tritonserver behind (Linux prctl). Linux
    ties this to the *thread* that forked, not its process: a server started from a worker thread
    is stopped when that thread ends, so start it from a thread that lives as long as the server
    (`trtspec serve` starts it from the main thread; tests/test_openai.py's background fixture
    keeps its starting thread alive for this reason)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


# glog lines of tritonserver: `E1130 17:17:52.519599 11760 main.cc:245] "failed to start ..."`
_GLOG_ERROR = re.compile(r'^E\d{4} [\d:.]+ +\d+ ([\w.]+):\d+\] "?(.*?)"?$')
_NOISE = ("CudaDriverHelper has not been initialized",)  # every CPU-only start logs it


# what the Python backend's stub logs when it cannot start (no model.py, a broken interpreter)
STUB_FAILED = "Failed to preinitialize Python stub"


# a model.py that imports but holds no model (empty, or edited): Triton names neither the file nor the fix
_NO_MODEL_CLASS = re.compile(r"failed to load '([^']+)' version (\d+): .*module '\d+\.model' has no "
                             r"attribute 'TritonPythonModel'")


def _with_model_file(error: str, repo: Path) -> str:
    """`error`, with the model.py it is about and what to do when it is a model.py that defines no
    TritonPythonModel."""
    match = _NO_MODEL_CLASS.search(error)
    if match is None:
        return error
    name, version = match.groups()
    return (f"{error} ({repo / name / version / 'model.py'} defines no TritonPythonModel, the class the "
            "Python backend runs: the build is incomplete or was edited; build it again with "
            "`trtspec build`)")


def log_errors(text: str) -> list[str]:
    """The most telling errors tritonserver logged, first line of each: a model's own load error
    or a service that could not start when there is one (its status table, the backend's copy and
    gRPC's internals only repeat them), else any other error line."""
    found: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = _GLOG_ERROR.match(line)
        if match is None:
            continue
        source, message = match.groups()
        message = message.replace("\\n", "\n").splitlines()[0].strip() if message else ""
        if not message or any(n in message for n in _NOISE):
            continue
        rank = 0 if source in ("model_lifecycle.cc", "main.cc") else 2 if "chttp2" in source else 1
        found.append((rank, message))
    if not found:
        return []
    best = min(rank for rank, _ in found)
    return list(dict.fromkeys(m for rank, m in found if rank == best))


def check_port_free(host: str, port: int, kind: str, option: str) -> None:
    """Refuse a port something already listens on, naming it and its option."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            sock.bind((host, port))
        except socket.gaierror as exc:
            raise ServeError(f"cannot bind to host {host!r}: {exc.strerror} (--host)") from None
        except OSError as exc:
            raise ServeError(f"the {kind} port {port} on {host} is not available ({exc.strerror}): stop "
                             f"what holds it or choose another ({option})") from None


def check_ports_free(host: str, ports: Ports) -> None:
    """Refuse a taken port before starting the server: Triton would report it after loading every
    model, and gRPC may even share a port silently."""
    for kind, port in (("HTTP", ports.http), ("gRPC", ports.grpc), ("metrics", ports.metrics)):
        check_port_free(host, port, kind, f"--{kind.lower()}-port")


@dataclass(slots=True)
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> Ports:
        """Three distinct free ports: each held until all three are chosen (a port let go at once may
        be handed out again: 6 triples in 20,000 here repeated one, and tritonserver refused to start
        with its gRPC and metrics ports the same)."""
        with contextlib.ExitStack() as held:
            sockets = [held.enter_context(socket.socket()) for _ in range(3)]
            for sock in sockets:
                sock.bind((host, 0))
            return cls(*(sock.getsockname()[1] for sock in sockets))


# the file `TritonServer.stop` writes, before its SIGTERM, with the time (time.time()) by which the
# served model ends the requests it has not finished (`TritonPythonModel._stop_due`): Triton waits for
# every request's final response before it exits, and tells a Python model nothing until then
STOP_FILE_ENV = "TRTSPEC_STOP_FILE"


@dataclass(slots=True)
class TritonServer:
    """One tritonserver process on `repo`; use as a context manager or call start()/stop()."""

    repo: Path
    host: str = "127.0.0.1"
    ports: Ports = field(default_factory=Ports)
    log_path: Path | None = None  # server stdout/stderr; a temp file when None
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the server and its stubs
    exit_timeout_s: int = 10  # how long tritonserver lets in-flight requests finish on SIGTERM
    admin_key: str | None = None  # when set, the admin APIs need header `admin-key: <key>`
    _proc: subprocess.Popen | None = None
    _work: tempfile.TemporaryDirectory | None = None

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"grpc://{self.host}:{self.ports.grpc}"

    @property
    def local_grpc_address(self) -> str:
        """HOST:PORT to reach the gRPC endpoint from this machine (loopback for a wildcard bind)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"{host}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports.metrics}/metrics"

    def command(self, install: TritonInstall, backend_dir: Path) -> list[str]:
        restricted = []
        if self.admin_key is not None:
            rule = f"{','.join(ADMIN_APIS)}:{ADMIN_HEADER}={self.admin_key}"
            restricted = [f"--http-restricted-api={rule}", f"--grpc-restricted-protocol={rule}"]
        return [
            str(install.binary),
            f"--model-repository={self.repo}",
            f"--backend-directory={backend_dir}",
            f"--http-address={self.host}",
            f"--http-port={self.ports.http}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.ports.metrics}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--strict-readiness=true",
            "--exit-on-error=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            *restricted,
        ]

    def start(self, timeout_s: float = 120.0) -> TritonServer:
        if not self.repo.is_dir():
            raise ServeError(f"model repository {self.repo} does not exist: run `trtspec build` first")
        check_models_environment()
        install = find_tritonserver()
        check_ports_free(self.host, self.ports)
        self._work = tempfile.TemporaryDirectory(prefix="trtspec-triton-")
        backend_dir = prepare_backend_dir(install, Path(self._work.name))
        if self.log_path is None:
            self.log_path = Path(self._work.name) / "tritonserver.log"
        shown = " ".join(self.command(install, backend_dir))
        log.info("starting %s", shown if self.admin_key is None else shown.replace(self.admin_key, "***"))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as out:
            # own process group: a terminal's Ctrl-C reaches us, and we stop the server in order
            self._proc = subprocess.Popen(
                self.command(install, backend_dir),
                env={**server_env(install), **self.env, STOP_FILE_ENV: str(self._stop_file)}, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent,
            )
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServeError(f"tritonserver exited with {self._proc.returncode}: {self.failure()}")
            stub = self._stub_failure()
            if stub:  # the backend would wait for the stub minutes before it says so
                raise ServeError(f"tritonserver cannot start a model's Python stub: {stub}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200 and self._proc.poll() is None:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        raise ServeError(f"tritonserver not ready after {timeout_s:g}s: {self.failure()}")

    def _stub_failure(self) -> str:
        """The stub's own line when it could not start (a model.py missing): tritonserver only gives
        up on it after its stub timeout."""
        if self.log_path is None or not self.log_path.is_file():
            return ""
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        at = text.find(STUB_FAILED)
        return "" if at < 0 else text[at:].splitlines()[0].strip()

    def failure(self) -> str:
        """Why the server stopped or is not ready, in its own words (its first logged errors), with
        the log's path; the last log line when it logged no error."""
        has_log = self.log_path is not None and self.log_path.is_file()
        text = self.log_path.read_text(encoding="utf-8", errors="replace") if has_log else ""
        errors = log_errors(text)
        lines = [line for line in text.splitlines() if line.strip() and not line.startswith(("|", "+"))]
        reason = "; ".join(_with_model_file(e, self.repo) for e in errors) if errors else \
            (lines[-1] if lines else "no log output")
        keep = self.log_path is not None and self._work is not None and self.log_path.parent != Path(
            self._work.name)
        return reason + (f" (log: {self.log_path})" if keep else "")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self) -> int:
        return self._proc.wait()

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM (tritonserver unloads models and ends their stubs), then SIGKILL the group."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                # the model ends what it has not finished a second before Triton's own exit timeout
                self._stop_file.write_text(str(time.time() + max(self.exit_timeout_s - 1, 0)))
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout_s if timeout_s is not None else self.exit_timeout_s + 15)
                except subprocess.TimeoutExpired:
                    log.warning("tritonserver did not stop on SIGTERM; killing its process group")
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # stubs left behind by a hung server
            except ProcessLookupError:
                pass
            proc.wait()
        if self._work is not None:
            self._work.cleanup()
            self._work = None
            if self.log_path is not None and not self.log_path.exists():
                self.log_path = None

    @property
    def _stop_file(self) -> Path:
        return Path(self._work.name) / "stopping"

    def __enter__(self) -> TritonServer:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
