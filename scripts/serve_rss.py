"""Memory of a served deployment under long mixed load: RSS of every process per round of requests.

Starts `trtspec serve BUILD_DIR` on four ports from --port (HTTP, gRPC, metrics, OpenAI), sends
--rounds rounds of --requests requests each (6 client threads; a seeded mix of greedy and sampled,
streamed and not, short and long prompts and outputs, logprobs, echo, `n` > 1, stop sequences,
OpenAI streams closed mid-stream, gRPC requests cancelled mid-stream, HTTP streams dropped, and
requests refused for bad parameters), and after each round (once the server is idle) prints the
RSS of tritonserver, the Python backend stub(s) and the `trtspec serve` process (the OpenAI
frontend runs there), their threads and open files, and the model's Prometheus series and gauges.
Ends with a Markdown table and stops the server.

    python scripts/serve_rss.py out/tiny --port 18120 --rounds 6 --requests 300
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

PROMPTS = ["Q: 482 + 356\nA:", "def parse(self, text):\n", "import os",
           "class Stack:\n    def push(self, x):", "Q: 17 * 23\nA:", "for i in range(10):"]
LONG = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(120))  # about 3,300 bytes


def _pids(serve_pid: int) -> dict[str, list[int]]:
    """tritonserver, its backend stubs and the serve process, from /proc."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        pid, ppid = int(entry.name), int(stat.rsplit(")", 1)[1].split()[1])
        names[pid] = stat[stat.index("(") + 1 : stat.rindex(")")]
        children.setdefault(ppid, []).append(pid)
    found = {"serve (OpenAI frontend)": [serve_pid], "tritonserver": [], "backend stub": []}
    for pid in children.get(serve_pid, []):
        if names[pid] == "tritonserver":
            found["tritonserver"].append(pid)
            found["backend stub"] += children.get(pid, [])
    return found


def _live_sockets() -> set[str]:
    """Inodes of the sockets the kernel lists (TCP, UDP, Unix); a TCP socket closed by its peer
    and then reset is listed no more, but still holds its owner's file descriptor until closed."""
    inodes = set()
    for table, column in (("tcp", 9), ("tcp6", 9), ("udp", 9), ("udp6", 9), ("unix", 6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) > column:
                inodes.add(parts[column])
    return inodes


def _status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "Threads"):
            fields[key] = int(value.split()[0])
    fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    live = _live_sockets()
    fields["fds"] = len(fds)
    fields["dead_sockets"] = sum(fd.startswith("socket:[") and fd[8:-1] not in live for fd in fds)
    return fields


def _metrics(url: str) -> tuple[int, dict[str, float]]:
    text = requests.get(url, timeout=10).text
    series = [line for line in text.splitlines() if line.startswith("trtspec_")]
    values = {}
    for line in series:
        name, _, value = line.rpartition(" ")
        key = re.sub(r"\{.*\}", "", name)
        if key in ("trtspec_requests_in_flight", "trtspec_requests_waiting", "trtspec_requests_total"):
            values[key] = values.get(key, 0.0) + float(value)
        if key == "trtspec_request_errors_total":
            reason = re.search(r'reason="(\w+)"', name).group(1)
            values[f"errors.{reason}"] = float(value)
    return len(series), values


class Load:
    """One kind of request per method; each returns a short tag of what happened."""

    def __init__(self, port: int, model: str):
        self.http, self.grpc = f"http://127.0.0.1:{port}", f"127.0.0.1:{port + 1}"
        self.openai, self.model = f"http://127.0.0.1:{port + 3}/v1", model

    def _post(self, route: str, body: dict, stream: bool = False):
        return requests.post(f"{self.openai}/{route}", json={"model": self.model, **body}, stream=stream,
                             timeout=120)

    def completion(self, rng: random.Random) -> str:
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": rng.choice([8, 32, 128]),
                "temperature": rng.choice([0, 0.8])}
        if rng.random() < 0.4:
            body["logprobs"] = rng.choice([0, 3])
            body["echo"] = rng.random() < 0.5
        if rng.random() < 0.3:
            body["stop"] = ["\n\n", ")"]
        if rng.random() < 0.2:
            body["prompt"] = [rng.choice(PROMPTS) for _ in range(3)]
        return f"completion {self._post('completions', body).status_code}"

    def long_prompt(self, rng: random.Random) -> str:
        body = {"prompt": LONG[: rng.randrange(1500, len(LONG))], "max_tokens": 8, "temperature": 0}
        if rng.random() < 0.5:
            body |= {"logprobs": 2, "echo": True}
        return f"long {self._post('completions', body).status_code}"

    def stream(self, rng: random.Random) -> str:
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": rng.choice([16, 200]), "stream": True,
                "temperature": rng.choice([0, 1.0]), "stream_options": {"include_usage": True}}
        if rng.random() < 0.4:
            body["logprobs"] = 2
        with self._post("completions", body, stream=True) as r:
            done = any(line == b"data: [DONE]" for line in r.iter_lines())
        return f"stream {r.status_code} {'done' if done else 'cut'}"

    def chat_n(self, rng: random.Random) -> str:
        body = {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}], "n": rng.choice([2, 3]),
                "max_tokens": rng.choice([16, 64]), "temperature": 0.9, "seed": rng.randrange(1000),
                "stream": rng.random() < 0.5}
        if rng.random() < 0.4:
            body |= {"logprobs": True, "top_logprobs": 2}
        with self._post("chat/completions", body, stream=body["stream"]) as r:
            for _ in r.iter_lines():
                pass
        return f"chat_n {r.status_code}"

    def dropped(self, rng: random.Random) -> str:
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": 400, "stream": True, "temperature": 0,
                "ignore_eos": True}
        route = "completions"
        if rng.random() < 0.5:
            messages = [{"role": "user", "content": body.pop("prompt")}]
            route, body = "chat/completions", {**body, "messages": messages, "n": rng.choice([1, 2])}
        r = self._post(route, body, stream=True)
        lines = r.iter_lines()
        for _ in range(rng.randrange(1, 6)):
            next(lines, None)
        r.close()  # the client goes away mid-stream
        return "dropped"

    def bad(self, rng: random.Random) -> str:
        body = rng.choice([{"prompt": "x", "temperature": 5}, {"prompt": "x", "max_tokens": 0},
                           {"prompt": "x", "bogus": 1}, {"prompt": "", "max_tokens": 4},
                           {"prompt": "x", "max_tokens": 10 ** 9}, {"prompt": "x", "logprobs": 99},
                           {"prompt": [10 ** 7], "max_tokens": 4}])
        return f"bad {self._post('completions', body).status_code}"

    def _grpc_inputs(self, prompt: str, max_tokens: int, stream: bool, temperature: float = 0.0):
        from tritonclient.grpc import InferInput

        arrays = {"text_input": np.array([prompt.encode()], dtype=np.object_),
                  "max_tokens": np.array([max_tokens], dtype=np.int32), "stream": np.array([stream]),
                  "temperature": np.array([temperature], dtype=np.float32)}
        inputs = []
        for name, value in arrays.items():
            dtype = {np.dtype(object): "BYTES", np.dtype(np.int32): "INT32", np.dtype(bool): "BOOL",
                     np.dtype(np.float32): "FP32"}[value.dtype]
            tensor = InferInput(name, list(value.shape), dtype)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        return inputs

    def grpc_stream(self, rng: random.Random) -> str:
        """A gRPC stream: to its end, cancelled after a few responses, or refused (max_tokens 0)."""
        import queue

        import tritonclient.grpc as grpcclient

        what = rng.choice(["full", "cancel", "cancel", "bad"])
        max_tokens = {"full": rng.choice([16, 64]), "cancel": 400, "bad": 0}[what]
        got: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(self.grpc)
        answered = False
        try:
            client.start_stream(callback=lambda result, error: got.put((result, error)))
            client.async_stream_infer(self.model, self._grpc_inputs(rng.choice(PROMPTS), max_tokens, True,
                                                                    rng.choice([0.0, 0.7])),
                                      enable_empty_final_response=True)
            for n in range(10_000):
                result, error = got.get(timeout=120)
                if error is not None:
                    answered = True
                    return f"grpc {what} error"
                if result.get_response().parameters["triton_final_response"].bool_param:
                    answered = True
                    return f"grpc {what} final"
                if what == "cancel" and n >= rng.randrange(1, 5):
                    return f"grpc {what} cancelled"
        finally:
            # as trtspec's own client: cancelling a stream after its last response leaks in
            # tritonserver 2.51 (trtspec/openai/triton_stream.py `_end`)
            client.stop_stream(cancel_requests=not answered)
            client.close()
        return f"grpc {what}"

    def triton_http(self, rng: random.Random) -> str:
        """Triton's HTTP generate (whole), or generate_stream dropped after a few events."""
        if rng.random() < 0.5:
            r = requests.post(f"{self.http}/v2/models/{self.model}/generate", timeout=120,
                              json={"text_input": rng.choice(PROMPTS), "max_tokens": 16})
            return f"http {r.status_code}"
        r = requests.post(f"{self.http}/v2/models/{self.model}/generate_stream", stream=True, timeout=120,
                          json={"text_input": rng.choice(PROMPTS), "max_tokens": 400, "stream": True})
        lines = r.iter_lines()
        for _ in range(rng.randrange(1, 6)):
            next(lines, None)
        r.close()
        return "http_stream dropped"


KINDS = {"completion": 5, "long_prompt": 1, "stream": 4, "chat_n": 2, "dropped": 3, "bad": 2,
         "grpc_stream": 4, "triton_http": 2}  # kind -> weight in the mix


def run_round(load: Load, round_: int, n: int, workers: int, only: list[str]) -> dict[str, int]:
    kinds = only or list(KINDS)
    weights = [KINDS[k] for k in kinds]

    def one(i: int) -> str:
        rng = random.Random(round_ * 100_000 + i)
        kind = rng.choices(kinds, weights)[0]
        try:
            return getattr(load, kind)(rng)
        except Exception as exc:  # noqa: BLE001 - counted, never ends the run
            return f"{kind} raised {type(exc).__name__}: {str(exc)[:80]}"

    tags: dict[str, int] = {}
    with ThreadPoolExecutor(workers) as pool:
        for tag in pool.map(one, range(n)):
            tags[tag] = tags.get(tag, 0) + 1
    return tags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build_dir")
    parser.add_argument("--port", type=int, default=18120, help="HTTP; gRPC, metrics, OpenAI the next three")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--model", default="trtspec")
    parser.add_argument("--kinds", default="",
                        help=f"only these kinds of request (comma-separated: {', '.join(KINDS)})")
    parser.add_argument("--json", default=None, help="also write the series here")
    args = parser.parse_args()
    only = [k for k in args.kinds.split(",") if k]
    if set(only) - set(KINDS):
        parser.error(f"--kinds: unknown {sorted(set(only) - set(KINDS))}; "
                     f"expected some of {', '.join(KINDS)}")

    p = args.port
    log = open(Path(args.build_dir) / "serve_rss.log", "w")  # noqa: SIM115
    serve = subprocess.Popen([sys.executable, "-m", "trtspec.cli", "serve", args.build_dir,
                              "--http-port", str(p), "--grpc-port", str(p + 1), "--metrics-port", str(p + 2),
                              "--openai-port", str(p + 3)], stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        while "serving " not in Path(log.name).read_text():
            if serve.poll() is not None:
                sys.exit(f"trtspec serve stopped: {Path(log.name).read_text()[-2000:]}")
            time.sleep(0.5)
        load = Load(p, args.model)
        pids = _pids(serve.pid)
        print("processes:", json.dumps(pids), flush=True)
        for round_ in range(args.rounds + 1):  # round 0: after start-up, before any request
            t0 = time.monotonic()
            tags = run_round(load, round_, args.requests, args.workers, only) if round_ else {}
            for _ in range(100):  # settle: nothing in flight or waiting
                series, values = _metrics(f"http://127.0.0.1:{p + 2}/metrics")
                busy = values.get("trtspec_requests_in_flight") or values.get("trtspec_requests_waiting")
                if not busy:
                    break
                time.sleep(0.2)
            time.sleep(1.0)
            row = {"round": round_, "seconds": round(time.monotonic() - t0, 1), "series": series, **values,
                   "tags": tags}
            for name, ids in pids.items():
                for pid in ids:
                    row[f"{name} {pid}"] = _status(pid)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
    names = [k for k in rows[0] if isinstance(rows[0][k], dict) and "VmRSS" in rows[0][k]]
    print("\n| round | requests | " + " | ".join(f"{n.rsplit(' ', 1)[0]} RSS (MiB)" for n in names)
          + " | threads | open files | closed sockets held | Prometheus series |")
    print("|---:|---:|" + "---:|" * len(names) + "---|---|---|---:|")
    for row in rows:
        rss = " | ".join(f"{row[n]['VmRSS'] / 1024:.1f}" for n in names)
        threads = "/".join(str(row[n]["Threads"]) for n in names)
        fds = "/".join(str(row[n]["fds"]) for n in names)
        dead = "/".join(str(row[n]["dead_sockets"]) for n in names)
        print(f"| {row['round']} | {row['round'] * args.requests} | {rss} | {threads} | {fds} | {dead} "
              f"| {row['series']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
