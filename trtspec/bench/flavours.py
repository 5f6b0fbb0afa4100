"""Engine flavour (onnxruntime on CPU) vs torch flavour: decode tokens/s, same prompts, same run.

    python -m trtspec.bench.flavours build_configs/tiny-dflash.yaml --prompts 4 --max-tokens 128

Four methods (torch/engine × target alone/DFlash) decode every prompt greedily, interleaved
prompt by prompt so machine drift hits each alike; the engine outputs must equal the torch ones
(a mismatch is counted, never averaged away). Decode tokens/s = tokens after the first over the
time after prefill, summed over prompts. Prints a Markdown table and, with --json, the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

from trtspec.config import BuildConfig, load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts


def compare_flavours(config: BuildConfig, tasks: list[str], prompts_per_task: int, max_tokens: int,
                     repeats: int = 1) -> dict:
    """Decode throughput of each (flavour, drafter) pair on the same prompts; see the module doc."""
    methods = {}
    for flavour in ("torch", "engine"):
        cfg = config.model_copy(update={"flavour": flavour})
        for drafter in (False, True):
            methods[(flavour, "dflash" if drafter else "none")] = load_pipeline(cfg, use_drafter=drafter)
    stats = {key: {"tokens": 0, "decode_s": 0.0, "target_calls": 0, "mismatches": 0} for key in methods}
    prompts = [p for task in tasks for p in load_prompts(task)[:prompts_per_task]]
    for _ in range(repeats):
        for prompt in prompts:
            reference = None
            for key, pipeline in methods.items():
                result = pipeline.decoder.generate(pipeline.tokenizer.encode(prompt), max_tokens)
                s = stats[key]
                s["tokens"] += len(result.token_ids) - 1
                s["decode_s"] += result.decode_s
                s["target_calls"] += result.num_target_calls
                reference = reference or result.token_ids
                s["mismatches"] += result.token_ids != reference
    rows = []
    for (flavour, drafter), s in stats.items():
        base = stats[("torch", drafter)]
        tps = s["tokens"] / s["decode_s"]
        rows.append({"flavour": flavour, "drafter": drafter, "decode_tokens_per_s": round(tps, 1),
                     "vs_torch": round(tps / (base["tokens"] / base["decode_s"]), 2),
                     "greedy_mismatches": s["mismatches"], **{k: round(v, 3) for k, v in s.items()
                                                              if k != "mismatches"}})
    return {"prompts": len(prompts), "tasks": tasks, "max_tokens": max_tokens, "repeats": repeats,
            "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
                        "ort_threads": os.environ.get("TRTSPEC_ORT_THREADS", "1")},
            "rows": rows}


def markdown(results: dict) -> str:
    lines = ["| flavour | drafter | decode tok/s | vs torch | greedy mismatches |",
             "|---|---|---:|---:|---:|"]
    for r in results["rows"]:
        lines.append(f"| {r['flavour']} | {r['drafter']} | {r['decode_tokens_per_s']} | {r['vs_torch']}× "
                     f"| {r['greedy_mismatches']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--tasks", default="code,math,chat")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per task")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = compare_flavours(load_build_config(args.config), args.tasks.split(","), args.prompts,
                               args.max_tokens, args.repeats)
    print(json.dumps(results, indent=1) if args.json else markdown(results))


if __name__ == "__main__":
    main()
