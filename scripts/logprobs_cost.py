"""What log-probabilities cost a decode step (`trtspec.spec.logprobs.step_logprobs`): R requests
that ask for them, each verifying a block of 16 drafts (17 target rows), on a real vocabulary
(Qwen3's 151,936 tokens), against a plain argmax over the same logits (what greedy verification
reads anyway). Random logits; CPU float32 unless --device says otherwise.

    .venv/bin/python scripts/logprobs_cost.py [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.spec.logprobs import step_logprobs  # noqa: E402

VOCAB = 151_936  # Qwen3
ROWS = 17  # the last token and 16 drafts


def _timed(fn, reps: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"| requests asking | top k | argmax ms | log-probabilities ms ({args.device}) |")
    print("|---:|---:|---:|---:|")
    for r in (1, 8, 32):
        logits = torch.randn(r, ROWS, VOCAB, device=args.device)
        emitted = [list(range(5))] * r  # five tokens emitted per request
        positions = [list(range(5))] * r
        for top in (0, 5):
            argmax = _timed(lambda: logits.argmax(-1).tolist(), args.reps)  # noqa: B023
            cost = _timed(lambda: step_logprobs(logits, positions, emitted, [top] * r), args.reps)  # noqa: B023
            print(f"| {r} | {top} | {argmax:.2f} | {cost:.2f} |")


if __name__ == "__main__":
    main()
