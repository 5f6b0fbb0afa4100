"""Does the machine move what speculation saves? The verify-to-decode cost ratio over time.

A speedup at R = 1 rests on T(k + 1 tokens) / T(1 token) of the target: what verifying a block costs
against one plain step. This times the two back to back (one request, its context cached, the
block rewound after each forward) for --seconds, and prints per --window seconds the medians and
their ratio, beside the garbage collector's passes in that window (a full pass with torch loaded
takes about a second: if one landed in a method's timed steps, it would show here).

    python scripts/step_cost_drift.py build_configs/tiny-dflash.yaml --seconds 200
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from trtspec.config import load_build_config
from trtspec.models.target import Chunk
from trtspec.pipeline import load_pipeline
from trtspec.runtime import configure_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="build config whose target is timed")
    parser.add_argument("--seconds", type=float, default=200.0, help="how long to measure")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per printed line")
    parser.add_argument("--tokens", type=int, default=17, help="tokens of the verify forward (k + 1)")
    parser.add_argument("--context", type=int, default=200, help="tokens cached before the forwards")
    args = parser.parse_args()

    config = load_build_config(args.config)
    configure_threads(config)
    target = load_pipeline(config).target
    target.allocate(1, args.context + args.tokens + 1)
    vocab = min(256, target.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    target.forward([Chunk(0, torch.randint(0, vocab, (args.context,), generator=gen))],
                   logits_at=torch.zeros(1, dtype=torch.long))

    def forward(n: int) -> float:
        chunk = Chunk(0, torch.randint(0, vocab, (n,), generator=gen))
        t0 = time.perf_counter()
        target.forward([chunk])
        seconds = time.perf_counter() - t0
        target.rewind(0, n)
        return seconds

    passes = [0, 0, 0]  # garbage collections by generation, this window
    gc.callbacks.append(lambda phase, info: phase == "stop" and passes.__setitem__(
        info["generation"], passes[info["generation"]] + 1))
    print(f"torch threads {torch.get_num_threads()}; context {args.context}; T({args.tokens}) / T(1)")
    ratios = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        plain, verify = [], []
        window_end = time.monotonic() + args.window
        while time.monotonic() < window_end:
            plain.append(forward(1))
            verify.append(forward(args.tokens))
        t1, tk = statistics.median(plain), statistics.median(verify)
        ratios.append(tk / t1)
        print(f"{time.strftime('%H:%M:%S')}  T(1) {t1 * 1e3:6.2f} ms  T({args.tokens}) {tk * 1e3:6.2f} ms  "
              f"ratio {tk / t1:.3f}  pairs {len(plain)}  gc passes {passes}", flush=True)
        passes[:] = [0, 0, 0]
    print(f"ratio over {len(ratios)} windows: {min(ratios):.3f}–{max(ratios):.3f}, "
          f"median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
