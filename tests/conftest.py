"""Shared fixtures: the shipped embedded models and small seeded random HF models."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# OpenAI Triton kernels run on the CPU through the interpreter; this must be set before anything
# (transformers does) imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")
# `make test` runs the tests in pytest-xdist workers (`-n 2`): one torch thread each, as two workers
# of two threads on two cores spin against each other; set before torch is imported
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# exported graphs and measured cost tables go to a fresh folder per test process, not ~/.cache,
# removed when the process ends (a whole run leaves ~65 MB there); each worker has its own, as two
# processes exporting one checkpoint into one folder at once would swap it under each other
if os.environ.get("TRTSPEC_CACHE_DIR", "") in ("", os.environ.get("TRTSPEC_TEST_CACHE_DIR")):
    import atexit
    import shutil
    import tempfile

    os.environ["TRTSPEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="trtspec-test-cache-")
    os.environ["TRTSPEC_TEST_CACHE_DIR"] = os.environ["TRTSPEC_CACHE_DIR"]  # ours: a worker makes its own
    atexit.register(shutil.rmtree, os.environ["TRTSPEC_CACHE_DIR"], ignore_errors=True)

import pytest
import torch
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from trtspec.config import ASSETS_DIR
from trtspec.spec.decoder import Request
from trtspec.spec.law_check import check_law
from trtspec.tokenizer import ByteTokenizer
from trtspec.triton.verify import exact_marginals

REPO = Path(__file__).resolve().parents[1]
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... in an xdist worker, else None


def assert_matches_golden(produced: dict[str, str], golden: Path) -> None:
    """Generated files (relative path -> text) equal `golden/`; TRTSPEC_UPDATE_GOLDEN=1 rewrites it."""
    if os.environ.get("TRTSPEC_UPDATE_GOLDEN") == "1":
        for rel, text in produced.items():
            (golden / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden / rel).write_text(text)
    expected = {p.relative_to(golden).as_posix(): p.read_text() for p in golden.rglob("*") if p.is_file()}
    assert sorted(produced) == sorted(expected)
    for rel, text in produced.items():
        assert text == expected[rel], f"{rel} differs from {golden / rel}"


LAW_ALPHA = 1e-3  # a correct decoder fails a sampling-law test with probability at most this


def assert_samples_follow_target(model, decoder, prompt: list[int], sampling, steps: int,
                                 n: int = 2000, guide=None, allowed=None, prediction=()) -> None:
    """n seeded requests through `decoder` together (`decoder.max_slots` at a time, each next one
    joining as one ends): the law of each of the first `steps` tokens is the target's exact one, by
    `trtspec verify`'s own test (`trtspec.spec.law_check`: each position's TV against the TV of
    simulated draws from the exact law, Bonferroni over the positions at `LAW_ALPHA`). A fixed TV
    bound let slips of the acceptance rule pass where a position's law is spread over many tokens.
    `guide`: the requests' compiled guide, and `allowed` its tokens after a prefix (`exact_joint`);
    `prediction`: the requests' predicted output (its drafts counted with the drafter's)."""
    laws = exact_marginals(model, prompt, sampling, steps, allowed)
    counts: list[dict[int, int]] = [{} for _ in range(steps)]
    accepted = drafted = 0
    requests = [Request(prompt, steps, sampling.model_copy(update={"seed": seed}), guide=guide,
                        prediction=prediction) for seed in range(n)]
    for result in decoder.generate_batch(requests):
        accepted += result.num_accepted + result.num_prediction_accepted
        drafted += result.num_drafted + result.num_predicted
        for pos, tok in enumerate(result.token_ids[:steps]):
            counts[pos][tok] = counts[pos].get(tok, 0) + 1
    # the test means something only if both accept and reject paths were taken
    assert 0 < accepted < drafted, (accepted, drafted)
    check = check_law(counts, laws, LAW_ALPHA)
    assert check.passed, [(pos, round(c.tv, 4), c.p_value) for pos, c in enumerate(check.positions)]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run scripts/gpu_check.sh on a GPU node)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _torch_threads_given_back():
    """Each test leaves torch's thread count as it found it: `pretrain` sets `threads: 2`, a command run
    in process its config's, and one test's setting leaked into every later test of its process; in an
    xdist worker beside a busy one, two threads on a shared core made test_lookup's laws 10x slower."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_target_dir() -> Path:
    return ASSETS_DIR / "tiny-target"


@pytest.fixture
def tiny_target_config(tiny_target_dir):
    """The embedded target's config.json, fresh for each test to change."""
    return AutoConfig.from_pretrained(tiny_target_dir)


@pytest.fixture(scope="session")
def tiny_draft_dir() -> Path:
    return ASSETS_DIR / "tiny-draft"


def _small_kwargs(seed: int) -> dict:
    torch.manual_seed(seed)
    return dict(
        vocab_size=264, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        tie_word_embeddings=False, **ByteTokenizer().config_entries(),
    )


@pytest.fixture(scope="session")
def random_qwen3_dir(tmp_path_factory) -> Path:
    """A seeded random 3-layer Qwen3 saved like any HF checkpoint."""
    path = tmp_path_factory.mktemp("qwen3")
    Qwen3ForCausalLM(Qwen3Config(**_small_kwargs(1))).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def random_llama_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(LlamaConfig(**_small_kwargs(2))).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def noisy_qwen3_dir(tmp_path_factory, random_qwen3_dir) -> Path:
    """The random Qwen3 with noise on every weight: a drafter whose q is near p but not p."""
    model = Qwen3ForCausalLM.from_pretrained(random_qwen3_dir)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * param.std() * torch.randn(param.shape, generator=gen))
    path = tmp_path_factory.mktemp("qwen3-noisy")
    model.save_pretrained(path)
    return path


def draft_rows(*committed: list[int], sampling=None, seed: int = 0):
    """`DraftRow`s for slots 0, 1, … with these committed tokens (greedy unless `sampling`)."""
    from trtspec.models.drafter import DraftRow
    from trtspec.spec.sampling import SamplingParams

    sampling = sampling or SamplingParams()
    return [DraftRow(slot, list(c), sampling, torch.Generator().manual_seed(seed + slot))
            for slot, c in enumerate(committed)]


def with_slots(drafter, num_slots: int = 1, capacity: int = 256):
    """A drafter with its slot buffers allocated."""
    drafter.allocate(num_slots, capacity)
    return drafter


def post_json(url: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    """POST a JSON body (with `Authorization: Bearer key`); the status and the JSON answer."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class Served:
    """A running `trtspec serve`: its Triton ports and OpenAI frontend."""

    def __init__(self, ports, openai_port: int, log: str, key: str | None):
        self.ports, self.openai_port, self.log, self.key = ports, openai_port, log, key
        self.base = f"http://127.0.0.1:{openai_port}"
        self.url = f"openai://127.0.0.1:{openai_port}"
        self.grpc = f"127.0.0.1:{ports.grpc}"
        self.http = f"http://127.0.0.1:{ports.http}"

    def client(self, key: str | None = None):
        import openai

        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=key or self.key or "none", max_retries=0,
                             timeout=120)

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        """POST to the frontend (`/tokenize`, `/v1/completions`, ...) with the server's key."""
        return post_json(self.base + path, body, self.key)

    def metric(self, name: str) -> float:
        return scraped_metric(f"http://127.0.0.1:{self.ports.metrics}/metrics", name)


def scraped_metric(url: str, name: str, **labels: str) -> float:
    """The sum of metric `name`'s series with `labels` (every series without) at the Prometheus
    endpoint `url`."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()))


def tritonserver_pids(marker: str) -> list[int]:
    """The running tritonserver processes whose command line holds `marker` (a repository path)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if marker in line and "tritonserver" in line]


@contextlib.contextmanager
def triton_serving(config, out: Path, while_starting=lambda: None, timeout_s: float = 180):
    """A real tritonserver on free loopback ports serving `config`'s repository, written into `out`,
    with one torch thread in the model (the test's clients and reference share the same 2 cores);
    `while_starting()` runs as the backend's stub loads (a reference decoding in this process).
    Stopped, and checked gone, at the end even when a test fails. The start runs on a pool thread
    that outlives the server: a server dies with the thread that started it (pdeathsig)."""
    from concurrent.futures import ThreadPoolExecutor

    from trtspec.triton.repo import REPO_DIR, write_triton_repo
    from trtspec.triton.server import TritonServer

    write_triton_repo(config, out)
    server = TritonServer(out / REPO_DIR, ports=triton_ports(), exit_timeout_s=3,
                          env={"OMP_NUM_THREADS": "1"})
    try:
        with ThreadPoolExecutor(1) as pool:
            started = pool.submit(server.start, timeout_s=timeout_s)
            while_starting()
            started.result()
            yield server
    finally:
        server.stop()
        assert tritonserver_pids(str(out)) == [], "tritonserver still running after stop()"


def local_target(tmp_path: Path, config, template: str):
    """`config` with its target's files linked into tmp_path beside `template`, its chat template."""
    target = tmp_path / "target"
    target.mkdir()
    for path in config.target.resolved_path.iterdir():
        if path.name != "chat_template.jinja":
            (target / path.name).symlink_to(path)
    (target / "chat_template.jinja").write_text(template)
    return config.model_copy(update={"target": config.target.model_copy(update={"path": str(target)})})


def default_ctrl_c() -> None:
    """A subprocess's preexec_fn: SIGINT as a terminal's foreground job has it, where a background
    job's (a CI runner's `make test &`) ignores it and its children inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def line_within(pipe, seconds: float = 180) -> str:
    """The next line a child process writes to `pipe`, waiting at most `seconds` for it to begin: a
    child (or the server it talks to) that hung silently fails the test instead of hanging the suite,
    which has no per-test timeout."""
    assert select.select([pipe], [], [], seconds)[0], f"nothing came from the child in {seconds:.0f} s"
    return pipe.readline()


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports, each held until all are chosen: a port let go at once may be
    handed out again, so two `free_port()` calls in a row (or `Ports.free()` and one) gave the same
    port about 2 times in 10,000 here: the OpenAI frontend then could not bind beside its tritonserver,
    or a frontend's "Triton nowhere" address was its own port. In a pytest-xdist worker only ports of
    its own share (`_workers_port`): a port is let go before its server binds it, and another worker
    choosing in between could take the same one."""
    with contextlib.ExitStack() as held:
        chosen: list[int] = []
        while len(chosen) < count:
            sock = held.enter_context(socket.socket())  # held to the end, taken or not: no port twice
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if _workers_port(port):
                chosen.append(port)
        return chosen


def _workers_port(port: int) -> bool:
    """Whether `port` is this xdist worker's: port // 2 (Linux hands bind() odd ports) modulo the
    worker count is the worker's index. Any port outside xdist."""
    if not XDIST_WORKER:
        return True
    return (port // 2) % int(os.environ["PYTEST_XDIST_WORKER_COUNT"]) == int(XDIST_WORKER.removeprefix("gw"))


def free_port() -> int:
    return free_ports(1)[0]


def triton_ports():
    """tritonserver's three ports (`Ports.free` as `free_ports` chooses)."""
    from trtspec.triton.server import Ports

    return Ports(*free_ports(3))


@contextlib.contextmanager
def serve_cli(build_dir: Path, key: str | None = None, avoid: tuple[int, ...] = (),
              args: tuple[str, ...] = ()):
    """`trtspec serve BUILD_DIR [ARGS]` itself (the CLI, in a subprocess) on free loopback ports, none
    of `avoid` (a server starting beside it has not bound its own yet), with an OpenAI frontend (and
    API key); stopped by SIGTERM, which must end it cleanly: exit 0 and no tritonserver left behind."""
    from trtspec.triton.server import Ports

    *three, openai_port = free_ports(4)
    while set(avoid) & {*three, openai_port}:
        *three, openai_port = free_ports(4)
    ports = Ports(*three)
    log = build_dir / "serve.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "trtspec.cli", "serve", str(build_dir), "--http-port", str(ports.http),
               "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics), "--openai-port",
               str(openai_port), *args] + (["--api-key", key] if key else [])
    with open(log, "w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        deadline = time.monotonic() + 240
        while "serving" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
        assert f"http://127.0.0.1:{openai_port}/v1" in log.read_text()
        served = Served(ports, openai_port, str(log), key)
        served.proc = proc
        yield served
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert tritonserver_pids(str(build_dir)) == [], "tritonserver still running after `serve` exited"
