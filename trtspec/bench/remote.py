"""`trtspec bench --url`: the same prompts against a running server, as its users see it.

R client threads each stream their share of the prompts one request after another over gRPC
(`ModelStreamInfer`) or HTTP (`/generate_stream`). Per request we record, as genai-perf does:

    TTFT = time from sending to the first streamed response
    ITL  = (end-to-end time − TTFT) / (tokens − 1)   (per-token latency after the first)

and per concurrency level the mean TTFT and ITL, the per-user decode speed 1 / ITL, and the
total tokens/s of all clients over the wall time of the level.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

from trtspec.prompts import load_prompts
from trtspec.triton.client import Completion, GenerateParams, generate


def _itl(c: Completion) -> float | None:
    if len(c.token_ids) < 2 or c.first_response_s is None:
        return None
    return (c.total_s - c.first_response_s) / (len(c.token_ids) - 1)


def run_remote(url: str, model: str, tasks: list[str], prompts_per_task: int, max_tokens: int,
               concurrency: list[int]) -> dict:
    prompts = [p for t in tasks for p in load_prompts(t)[:prompts_per_task]]
    params = GenerateParams(max_tokens=max_tokens, stream=True)
    levels: dict[str, dict] = {}
    with tqdm(total=len(prompts) * len(concurrency), desc=f"bench {url}", unit="request") as bar:
        for r in concurrency:
            levels[str(r)] = _level(url, model, prompts, params, r, bar)
    return {"url": url, "model": model, "max_tokens": max_tokens, "prompts": len(prompts), "levels": levels}


def _level(url: str, model: str, prompts: list[str], params: GenerateParams, r: int, bar) -> dict:
    """R clients, each sending its share of the prompts one after another."""

    def client(share: list[str]) -> list[Completion]:
        done = []
        for prompt in share:
            done.append(generate(url, model, prompt, params))
            bar.update(1)
        return done

    shares = [prompts[i::r] for i in range(r)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(r) as pool:
        completions = [c for share in pool.map(client, shares) for c in share]
    wall = time.perf_counter() - t0
    itls = [x for x in map(_itl, completions) if x]
    tokens = sum(len(c.token_ids) for c in completions)
    return {
        "ttft_ms": round(1e3 * statistics.fmean(c.first_response_s for c in completions), 2),
        "itl_ms": round(1e3 * statistics.fmean(itls), 3) if itls else None,
        "per_user_tokens_per_s": round(1 / statistics.fmean(itls), 2) if itls else 0.0,
        "total_tokens_per_s": round(tokens / wall, 2),
        "tau": round(statistics.fmean(c.tau for c in completions), 3),
        "tokens": tokens,
        "wall_s": round(wall, 3),
    }


def remote_table(remote: dict) -> str:
    lines = ["| R | TTFT (ms) | ITL (ms) | tokens/s per user | total tokens/s | τ |",
             "|---|---|---|---|---|---|"]
    for r, row in remote["levels"].items():
        itl = "–" if row["itl_ms"] is None else f"{row['itl_ms']:.2f}"
        lines.append(f"| {r} | {row['ttft_ms']:.1f} | {itl} | {row['per_user_tokens_per_s']:.1f} | "
                     f"{row['total_tokens_per_s']:.1f} | {row['tau']:.2f} |")
    return "\n".join(lines)
