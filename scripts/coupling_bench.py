"""Rejection sampling against Gumbel coupling (`trtspec.spec.coupling`) on the embedded models: τ and
tokens/s of each drafter, chain and tree, at temperature T (held-out prompts, every prompt seeded,
R requests at a time under the config's schedule), and whether each sampled text is what the target
alone samples with its seed. The two couplings run interleaved, prompt set by prompt set.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/coupling_bench.py [--temperature 1.0] [--concurrency 1,8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.config import TreeConfig, load_build_config  # noqa: E402
from trtspec.pipeline import load_pipeline  # noqa: E402
from trtspec.prompts import load_prompts  # noqa: E402
from trtspec.spec.decoder import Request  # noqa: E402
from trtspec.spec.sampling import SamplingParams  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ["tiny-dflash", "tiny-dspark", "tiny-eagle3", "tiny-draft-model"]
TREE = TreeConfig(nodes=12, topk=4)


def _requests(prompts: list[str], tokenizer, max_tokens: int, temperature: float,
              coupling: str) -> list[Request]:
    return [Request(tokenizer.encode(p), max_tokens,
                    SamplingParams(temperature=temperature, seed=1000 + i, coupling=coupling))
            for i, p in enumerate(prompts)]


def _run(decoder, requests: list[Request]) -> tuple[float, int, int, list[list[int]]]:
    start = time.perf_counter()
    results = decoder.generate_batch(requests)
    seconds = time.perf_counter() - start
    return (seconds, sum(len(r.token_ids) for r in results), sum(r.num_target_calls for r in results),
            [r.token_ids for r in results])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--prompts", type=int, default=6, help="per task (code, math, chat)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    prompts = [p for task in ("code", "math", "chat") for p in load_prompts(task)[: args.prompts]]
    slots = [int(r) for r in args.concurrency.split(",")]
    plain = load_pipeline(load_build_config(REPO / "build_configs" / "tiny-dflash.yaml"), use_drafter=False)
    alone_decoder = plain.decoder_for(1)
    alone = _run(alone_decoder, _requests(prompts, plain.tokenizer, args.max_tokens, args.temperature,
                                          "gumbel"))[3]
    print(f"temperature {args.temperature}, {len(prompts)} prompts x {args.max_tokens} tokens, "
          f"{args.repeats} interleaved repeats; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads\n")
    print("| drafter | shape | R | τ rejection | τ gumbel | tokens/s rejection | tokens/s gumbel | "
          "gumbel / rejection | gumbel texts = target alone's |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in CONFIGS:
        pipeline = load_pipeline(load_build_config(REPO / "build_configs" / f"{name}.yaml"))
        for tree in (None, TREE):
            for r in slots:
                decoder = pipeline.decoder_for(r, tree=tree)
                totals = {c: [0.0, 0, 0] for c in ("rejection", "gumbel")}
                equal = 0
                for _ in range(args.repeats):
                    for coupling in totals:
                        reqs = _requests(prompts, pipeline.tokenizer, args.max_tokens, args.temperature,
                                         coupling)
                        seconds, tokens, calls, texts = _run(decoder, reqs)
                        t = totals[coupling]
                        t[0], t[1], t[2] = t[0] + seconds, t[1] + tokens, t[2] + calls
                        if coupling == "gumbel":
                            equal = sum(a == b for a, b in zip(texts, alone, strict=True))
                tau = {c: t[1] / t[2] for c, t in totals.items()}
                tps = {c: t[1] / t[0] for c, t in totals.items()}
                shape = "chain" if tree is None else f"tree N={tree.nodes} K={tree.topk}"
                print(f"| {pipeline.drafter.method} | {shape} | {r} | {tau['rejection']:.2f} | "
                      f"{tau['gumbel']:.2f} | {tps['rejection']:.1f} | {tps['gumbel']:.1f} | "
                      f"{tps['gumbel'] / tps['rejection']:.2f}× | {equal}/{len(prompts)} |", flush=True)


if __name__ == "__main__":
    main()
