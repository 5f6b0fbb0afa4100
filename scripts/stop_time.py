"""How long `trtspec serve` takes to stop (SIGTERM) while gRPC streams run, and what each stream got.

Serves DIR (a `trtspec build` output) on four ports from --port, starts --streams streamed requests of
2,000 tokens (end ids ignored) straight to Triton's gRPC port, sends SIGTERM once each has text, and
prints the exit code and time, when and how each stream ended, and whether tritonserver had to be
killed (the serve log's "did not stop on SIGTERM").

    .venv/bin/python scripts/stop_time.py DIR [--port 19700] [--streams 4]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from tritonclient.grpc import InferInput

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.triton.client import (  # noqa: E402
    ClientError,
    GenerateParams,
    array_input,
    grpc_generate,
    grpc_inputs,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("build_dir")
    parser.add_argument("--port", type=int, default=19700, help="HTTP port; gRPC, metrics, OpenAI the next")
    parser.add_argument("--streams", type=int, default=4)
    args = parser.parse_args()
    base = args.port
    log = Path(tempfile.mkdtemp(prefix="stop-time-")) / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "trtspec.cli", "serve", args.build_dir, "--http-port",
                                 str(base), "--grpc-port", str(base + 1), "--metrics-port", str(base + 2),
                                 "--openai-port", str(base + 3)], stderr=err)
    while "serving" not in log.read_text():
        if proc.poll() is not None:
            raise SystemExit(f"serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    ended: list[tuple[float, str]] = []
    started = [threading.Event() for _ in range(args.streams)]

    def stream(first: threading.Event) -> None:
        inputs = grpc_inputs("Q: 482 + 356\nA:", GenerateParams(max_tokens=2000, stream=True))
        inputs.append(array_input(InferInput, "ignore_eos", np.array([True])))
        try:
            grpc_generate(f"127.0.0.1:{base + 1}", "trtspec", inputs, lambda text: first.set(), timeout_s=120)
            ended.append((time.monotonic(), "finished"))
        except ClientError as exc:
            ended.append((time.monotonic(), str(exc)))
        first.set()

    threads = [threading.Thread(target=stream, args=(first,)) for first in started]
    for thread in threads:
        thread.start()
    for first in started:
        first.wait(120)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(120)
    print(f"serve exited with {code} {time.monotonic() - sent:.1f} s after SIGTERM")
    for thread in threads:
        thread.join(60)
    for at, how in sorted(ended):
        print(f"  a stream ended at +{at - sent:.1f} s: {how[:120]}")
    killed = "did not stop on SIGTERM" in log.read_text()
    print("tritonserver was killed (it did not stop on SIGTERM)" if killed else
          "tritonserver stopped by itself")


if __name__ == "__main__":
    main()
