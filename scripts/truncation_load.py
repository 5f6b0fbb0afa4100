"""How long a Responses request with `truncation: "auto"` over a long conversation takes, and how
long the frontend's other clients wait meanwhile (`GET /health` polled every 0.2 s from another
thread): each candidate conversation is rendered and tokenized on the frontend's event loop.

    trtspec serve BUILD_DIR --openai-port 9000 &
    python scripts/truncation_load.py http://127.0.0.1:9000 400 1600 3200

A conversation of N turns is N × (a 20-character user message, "ok") then "1 + 1", far past the
embedded model's context, so truncation drops most of it. Measured 2026-12-06 (tiny-dflash, 2-core
CPU, one build each side): 1,600 turns took 17.2 s with /health blocked 17.07 s when each dropped
turn was one more try (f09cb6c); 0.1 s and 0.05 s with bisection (7ea7dac); 3,200 turns 0.2 s.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request


def _post(base: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{base}/v1/responses", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def measure(base: str, turns: int) -> tuple[int, float, float]:
    """(status, seconds the request took, the longest /health wait meanwhile)."""
    history = []
    for _ in range(turns):
        history += [{"role": "user", "content": "y" * 20}, {"role": "assistant", "content": "ok"}]
    body = {"model": "trtspec", "input": [*history, {"role": "user", "content": "1 + 1"}],
            "truncation": "auto", "max_output_tokens": 8, "temperature": 0, "store": False}
    waits: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            start = time.monotonic()
            urllib.request.urlopen(f"{base}/health", timeout=600).read()
            waits.append(time.monotonic() - start)
            time.sleep(0.2)

    poller = threading.Thread(target=poll)
    poller.start()
    start = time.monotonic()
    status, _ = _post(base, body)
    took = time.monotonic() - start
    done.set()
    poller.join()
    return status, took, max(waits, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the OpenAI frontend's address, e.g. http://127.0.0.1:9000")
    parser.add_argument("turns", type=int, nargs="+", help="conversation lengths to try")
    args = parser.parse_args()
    base = args.base.rstrip("/")
    try:
        urllib.request.urlopen(f"{base}/health", timeout=10).read()
    except (urllib.error.URLError, OSError) as exc:
        raise SystemExit(f"no OpenAI frontend answers at {base}/health ({exc}): start `trtspec serve` "
                         "first") from None
    for turns in args.turns:
        status, took, wait = measure(base, turns)
        print(f"{turns} turns: status {status} in {took:.1f} s; /health waited up to {wait:.2f} s",
              flush=True)


if __name__ == "__main__":
    main()
