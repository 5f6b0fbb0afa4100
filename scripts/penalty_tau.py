"""What penalties cost speculation: τ and tokens/s with and without them, side by side.

The verifier applies logit bias and the repetition / frequency / presence penalties to the target's
p at every draft position (`trtspec.spec.penalties`); the drafter drafts without them. This decodes
each held-out prompt four ways, interleaved prompt by prompt (the target alone and speculation,
each with and without the penalties, greedy, whole blocks) and prints τ and the pooled tokens/s.

    python scripts/penalty_tau.py build_configs/tiny-dflash.yaml --presence 0.5 --repetition 1.1
"""

from __future__ import annotations

import argparse
import time

from trtspec.config import ScheduleConfig, load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.runtime import configure_threads
from trtspec.spec.decoder import SpeculativeDecoder
from trtspec.spec.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="build config of the target and drafter")
    parser.add_argument("--tasks", default="code,math,chat", help="held-out prompt sets")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per task")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per request")
    parser.add_argument("--presence", type=float, default=0.5, help="presence_penalty")
    parser.add_argument("--frequency", type=float, default=0.0, help="frequency_penalty")
    parser.add_argument("--repetition", type=float, default=1.1, help="repetition_penalty")
    args = parser.parse_args()

    config = load_build_config(args.config)
    configure_threads(config)
    pipeline = load_pipeline(config)
    # no prefix reuse: each prompt runs twice, and a reused prefill would favour the penalized run
    spec = pipeline.decoder_for(1, ScheduleConfig(mode="full"), prefix_reuse=False)
    alone = SpeculativeDecoder(spec.target, None, spec.end_ids)
    penalized = SamplingParams(presence_penalty=args.presence, frequency_penalty=args.frequency,
                               repetition_penalty=args.repetition)
    ways = {"target alone": (alone, SamplingParams()), "target alone, penalized": (alone, penalized),
            "speculation": (spec, SamplingParams()), "speculation, penalized": (spec, penalized)}
    totals = {name: [0, 0, 0.0] for name in ways}  # tokens, target forwards, seconds
    changed = 0
    prompts = [p for task in args.tasks.split(",") for p in load_prompts(task)[: args.prompts]]
    for decoder, sampling in ways.values():  # one untimed run each
        decoder.generate(pipeline.tokenizer.encode(prompts[0]), 16, sampling)
    for prompt in prompts:
        ids = pipeline.tokenizer.encode(prompt)
        texts = {}
        for name, (decoder, sampling) in ways.items():
            start = time.perf_counter()
            result = decoder.generate(ids, args.max_tokens, sampling)
            seconds = time.perf_counter() - start
            texts[name] = result.token_ids
            total = totals[name]
            total[0] += len(result.token_ids)
            total[1] += result.num_target_calls
            total[2] += seconds
        assert texts["speculation"] == texts["target alone"], prompt
        assert texts["speculation, penalized"] == texts["target alone, penalized"], prompt
        changed += texts["target alone"] != texts["target alone, penalized"]
    print(f"{len(prompts)} prompts, {args.max_tokens} tokens each; presence {args.presence:g}, frequency "
          f"{args.frequency:g}, repetition {args.repetition:g} changed {changed} of the texts")
    print("| decoding | τ | tokens/s | over the target alone |")
    print("|---|---|---|---|")
    for name, (tokens, forwards, seconds) in totals.items():
        base = totals["target alone, penalized" if "penalized" in name else "target alone"]
        print(f"| {name} | {tokens / forwards:.2f} | {tokens / seconds:.1f} | "
              f"{(tokens / seconds) / (base[0] / base[2]):.2f}× |")


if __name__ == "__main__":
    main()
