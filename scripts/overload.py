"""A burst of requests past what a served model decodes at once, with and without a queue bound.

Builds CONFIG twice (as it is, and with limits.max_queued --bound), serves each with tritonserver on
free ports, sends --burst requests of --max-tokens tokens (end ids ignored) at once over gRPC, and
prints per build how many were served and how many refused as busy, and when their answers came.

    .venv/bin/python scripts/overload.py build_configs/tiny-dflash.yaml [--bound 8] [--burst 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml
from tritonclient.grpc import InferInput

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.config import load_build_config  # noqa: E402
from trtspec.errors import SERVER_BUSY  # noqa: E402
from trtspec.triton.client import ClientError, GenerateParams, array_input, grpc_generate, grpc_inputs  # noqa: E402
from trtspec.triton.repo import REPO_DIR, write_triton_repo  # noqa: E402
from trtspec.triton.server import Ports, TritonServer  # noqa: E402


def burst(address: str, requests: int, max_tokens: int) -> list[tuple[str, float]]:
    """(served / busy / the error, seconds from the burst's start to the answer) per request."""
    outcomes: list[tuple[str, float]] = []
    t0 = time.monotonic()

    def one() -> None:
        inputs = grpc_inputs("Q: 482 + 356\nA:", GenerateParams(max_tokens=max_tokens))
        inputs.append(array_input(InferInput, "ignore_eos", np.array([True])))
        try:
            grpc_generate(address, "trtspec", inputs, timeout_s=600)
            outcomes.append(("served", time.monotonic() - t0))
        except ClientError as exc:
            outcomes.append(("busy" if SERVER_BUSY in str(exc) else str(exc), time.monotonic() - t0))

    threads = [threading.Thread(target=one) for _ in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def summary(outcomes: list[tuple[str, float]]) -> str:
    served = sorted(s for how, s in outcomes if how == "served")
    busy = [s for how, s in outcomes if how == "busy"]
    other = [how for how, _ in outcomes if how not in ("served", "busy")]
    text = f"served {len(served)}"
    if served:
        p95 = served[min(len(served) - 1, int(0.95 * len(served)))]
        text += (f" (answers at {statistics.median(served):.1f} s median, {p95:.1f} s p95, "
                 f"{served[-1]:.1f} s last)")
    text += f"; busy {len(busy)}" + (f" (refused within {max(busy) * 1000:.0f} ms)" if busy else "")
    return text + (f"; other errors {len(other)}: {other[0][:120]}" if other else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("--bound", type=int, default=8, help="limits.max_queued of the bounded build")
    parser.add_argument("--burst", type=int, default=64, help="requests sent at once")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    raw = yaml.safe_load(Path(args.config).read_text())
    work = Path(tempfile.mkdtemp(prefix="overload-"))
    for label, bound in (("no bound", None), (f"limits.max_queued {args.bound}", args.bound)):
        limits = {**raw.get("limits", {}), **({"max_queued": bound} if bound is not None else {})}
        path = work / f"{len(label)}.yaml"
        path.write_text(yaml.safe_dump({**raw, "limits": limits}))
        # builtin: paths are read from the assets wherever the yaml is
        config = load_build_config(path)
        out = work / f"build-{len(label)}"
        write_triton_repo(config, out)
        server = TritonServer(out / REPO_DIR, ports=Ports.free(), exit_timeout_s=3)
        server.start(timeout_s=300)
        try:
            burst(server.local_grpc_address, config.limits.max_concurrency, 8)  # warm-up, not counted
            outcomes = burst(server.local_grpc_address, args.burst, args.max_tokens)
        finally:
            server.stop()
        print(f"{label} ({config.limits.max_concurrency} decoding at once), {args.burst} requests of "
              f"{args.max_tokens} tokens at once: {summary(outcomes)}", flush=True)


if __name__ == "__main__":
    main()
