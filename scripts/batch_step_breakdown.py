"""Where a decode step's time goes with R requests in flight: the target's forward, the drafter's
proposal and the rest of the loop (verification, bookkeeping, Python), per step, for the target
alone, DFlash's whole blocks and the adaptive schedule, on the shipped tiny models (greedy, the
same 8 prompts of math and code for each).

    python scripts/batch_step_breakdown.py --concurrency 1,8
"""

from __future__ import annotations

import argparse
import time

import torch

from trtspec.bench.loop_overhead import timed_calls
from trtspec.config import ScheduleConfig, load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.spec.decoder import Request

CONFIG = "build_configs/tiny-dflash.yaml"


def breakdown(pipeline, r: int, schedule: str | None, prompts: list[list[int]], max_tokens: int) -> dict:
    """ms per step in the forward, the proposal and the rest; tokens per step and per second."""
    decoder = pipeline.decoder_for(r, ScheduleConfig(mode=schedule or "full"),
                                   use_drafter=schedule is not None)
    decoder.generate_batch([Request(p, 16) for p in prompts[:r]])  # warm-up, not counted
    forward_s: list[float] = []
    propose_s: list[float] = []
    decoder.target.forward = timed_calls(decoder.target.forward, forward_s, "cpu")
    decoder.drafter.propose = timed_calls(decoder.drafter.propose, propose_s, "cpu")
    steps = decoder.num_steps
    start = time.perf_counter()
    results = decoder.generate_batch([Request(p, max_tokens) for p in prompts])
    wall = time.perf_counter() - start
    steps = decoder.num_steps - steps
    tokens = sum(len(result.token_ids) for result in results)
    forward, propose = sum(forward_s), sum(propose_s)
    return {"forward": 1e3 * forward / steps, "propose": 1e3 * propose / steps,
            "rest": 1e3 * (wall - forward - propose) / steps, "tokens_per_step": tokens / steps,
            "tokens_per_s": tokens / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,8", help="comma-separated R")
    parser.add_argument("--max-tokens", type=int, default=192)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pipeline = load_pipeline(load_build_config(CONFIG))
    prompts = [list(p.encode()) for p in load_prompts("math")[:4] + load_prompts("code")[:4]]
    print("| R | method | forward, ms/step | proposal, ms/step | rest, ms/step | tokens/step | tokens/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in (int(x) for x in args.concurrency.split(",")):
        for name, schedule in (("none", None), ("dflash", "full"), ("dflash+adaptive", "adaptive")):
            b = breakdown(pipeline, r, schedule, prompts, args.max_tokens)
            print(f"| {r} | {name} | {b['forward']:.2f} | {b['propose']:.2f} | {b['rest']:.2f} | "
                  f"{b['tokens_per_step']:.2f} | {b['tokens_per_s']:.0f} |")


if __name__ == "__main__":
    main()
