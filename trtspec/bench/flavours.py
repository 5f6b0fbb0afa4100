"""Engine flavour (onnxruntime on CPU) vs torch flavour: decode tokens/s, same prompts, same run.

    python -m trtspec.bench.flavours build_configs/tiny-dflash.yaml --prompts 4 --max-tokens 128 \
        --float16 --concurrency 4

The methods (torch/engine, and engine-fp16 with --float16, × target alone/the config's drafter)
decode every prompt greedily, interleaved prompt by prompt so machine drift hits each alike;
outputs are compared with the torch flavour's (a mismatch is counted, never averaged away;
float16 may legitimately differ from float32). Decode tokens/s = tokens after the first over the
time after prefill, summed over prompts. With --concurrency R, each flavour with the drafter also
serves the prompts R at a time (one packed target forward per step); total tokens/s over the whole
run. Both verify whole blocks: this compares runtimes, not schedules. Prints Markdown tables and,
with --json, the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

from trtspec.config import BuildConfig, ScheduleConfig, load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.runtime import configure_threads
from trtspec.spec.decoder import Request

FULL = ScheduleConfig(mode="full")


def _variants(config: BuildConfig, float16: bool) -> dict[str, BuildConfig]:
    out = {flavour: config.model_copy(update={"flavour": flavour}) for flavour in ("torch", "engine")}
    if float16:
        target = config.target.model_copy(update={"dtype": "float16"})
        out["engine-fp16"] = config.model_copy(update={"flavour": "engine", "target": target})
    return out


def compare_flavours(config: BuildConfig, tasks: list[str], prompts_per_task: int, max_tokens: int,
                     repeats: int = 1, float16: bool = False, concurrency: int = 0) -> dict:
    """Decode throughput of each (flavour, drafter) pair on the same prompts; see the module doc."""
    method = config.drafter.method if config.drafter else "none"
    methods = {}
    for flavour, cfg in _variants(config, float16).items():
        for drafter in (False, True):
            methods[(flavour, method if drafter else "none")] = load_pipeline(cfg, use_drafter=drafter)
    decoders = {key: p.decoder_for(1, FULL) for key, p in methods.items()}
    stats = {key: {"tokens": 0, "decode_s": 0.0, "target_calls": 0, "mismatches": 0} for key in methods}
    prompts = [p for task in tasks for p in load_prompts(task)[:prompts_per_task]]
    for _ in range(repeats):
        for prompt in prompts:
            reference = None
            for key, pipeline in methods.items():
                result = decoders[key].generate(pipeline.tokenizer.encode(prompt), max_tokens)
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
    batched = _batched(methods, method, prompts, max_tokens, concurrency) if concurrency > 1 else []
    return {"prompts": len(prompts), "tasks": tasks, "max_tokens": max_tokens, "repeats": repeats,
            "concurrency": concurrency, "batched_rows": batched,
            "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
                        "torch_threads": torch.get_num_threads(),
                        "ort_threads": os.environ.get("TRTSPEC_ORT_THREADS", "1")},
            "rows": rows}


def _batched(methods: dict, method: str, prompts: list[str], max_tokens: int, concurrency: int) -> list[dict]:
    """Each flavour with the drafter serving the prompts `concurrency` at a time."""
    rows, reference = [], None
    for (flavour, name), pipeline in methods.items():
        if name != method:
            continue
        decoder = pipeline.decoder_for(concurrency, FULL)
        tokens, wall, outputs = 0, 0.0, []
        for start in range(0, len(prompts), concurrency):
            chunk = prompts[start : start + concurrency]
            group = [Request(pipeline.tokenizer.encode(p), max_tokens) for p in chunk]
            t0 = time.perf_counter()
            results = decoder.generate_batch(group)
            wall += time.perf_counter() - t0
            tokens += sum(len(r.token_ids) for r in results)
            outputs += [r.token_ids for r in results]
        reference = reference or outputs
        rows.append({"flavour": flavour, "drafter": method, "concurrency": concurrency,
                     "total_tokens_per_s": round(tokens / wall, 1),
                     "greedy_mismatches": sum(a != b for a, b in zip(outputs, reference, strict=True))})
    base = rows[0]["total_tokens_per_s"]
    for row in rows:
        row["vs_torch"] = round(row["total_tokens_per_s"] / base, 2)
    return rows


def markdown(results: dict) -> str:
    lines = ["| flavour | drafter | decode tok/s | vs torch | greedy mismatches |",
             "|---|---|---:|---:|---:|"]
    for r in results["rows"]:
        lines.append(f"| {r['flavour']} | {r['drafter']} | {r['decode_tokens_per_s']} | {r['vs_torch']}× "
                     f"| {r['greedy_mismatches']} |")
    if results["batched_rows"]:
        lines += ["", "| flavour | drafter | concurrency | total tok/s | vs torch | greedy mismatches |",
                  "|---|---|---:|---:|---:|---:|"]
        for r in results["batched_rows"]:
            lines.append(f"| {r['flavour']} | {r['drafter']} | {r['concurrency']} "
                         f"| {r['total_tokens_per_s']} | {r['vs_torch']}× | {r['greedy_mismatches']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--tasks", default="code,math,chat")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per task")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--float16", action="store_true", help="also the engine flavour in float16")
    parser.add_argument("--concurrency", type=int, default=0, help="also serve R prompts at a time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    config = load_build_config(args.config)
    configure_threads(config)
    results = compare_flavours(config, args.tasks.split(","), args.prompts, args.max_tokens, args.repeats,
                               args.float16, args.concurrency)
    print(json.dumps(results, indent=1) if args.json else markdown(results))


if __name__ == "__main__":
    main()
