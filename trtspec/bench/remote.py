"""`trtspec bench --url`: the same prompts against a running server, as its users see it.

R client threads each stream their share of the prompts one request after another over gRPC
(`ModelStreamInfer`), HTTP (`/generate_stream`) or an OpenAI-compatible API (`openai://`: SSE of
`/v1/completions`, or `/v1/chat/completions` with `chat`). Per request we record, as genai-perf and
AIPerf do:

    TTFT = time from sending to the first streamed response that carries text
    ITL  = (end-to-end time − TTFT) / (tokens − 1)   (per-token latency after the first)

Tokens are the generated ids (Triton) or the server's `usage.completion_tokens` (OpenAI); τ is
reported only when the server reports draft figures (trtspec does, in its `trtspec` field), pooled
over the level's requests: Σ tokens / Σ target forwards (the server's `target_forwards`; from a
server that sends only draft figures, tokens − accepted: a forward emits its accepted drafts + 1).

and per concurrency level the mean TTFT and ITL, the per-user decode speed 1 / ITL, and the
total tokens/s of all clients over the wall time of the level. Greedy, or sampled with prompt i
seeded `seed + i` (`bench.sampled.request_params`; the server verifies by its own coupling).
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

from trtspec.bench.sampled import describe, request_params
from trtspec.prompts import load_prompts
from trtspec.spec.sampling import SamplingParams
from trtspec.triton.client import Completion, GenerateParams, generate


def _itl(c: Completion) -> float | None:
    if c.num_tokens < 2 or c.first_response_s is None:
        return None
    return (c.total_s - c.first_response_s) / (c.num_tokens - 1)


def _params(max_tokens: int, sampling: SamplingParams, index: int) -> GenerateParams:
    """Prompt `index`'s request: streamed; greedy as the server's default, or sampled and seeded."""
    return GenerateParams.of(request_params(sampling, index, sampling.coupling), max_tokens, stream=True)


def run_remote(url: str, model: str, tasks: list[str], prompts_per_task: int, max_tokens: int,
               concurrency: list[int], chat: bool = False, api_key: str | None = None,
               sampling: SamplingParams | None = None) -> dict:
    sampling = sampling or SamplingParams()
    prompts = [p for t in tasks for p in load_prompts(t)[:prompts_per_task]]
    levels: dict[str, dict] = {}
    # closed on the way out of an error too, so the error starts a line of its own
    with tqdm(total=len(prompts) * len(concurrency), desc=f"bench {url}", unit="request") as bar:

        def client(share: list[tuple[int, str]]) -> list[Completion]:
            done = []
            for i, prompt in share:
                params = _params(max_tokens, sampling, i)
                done.append(generate(url, model, prompt, params, chat=chat, api_key=api_key))
                bar.update(1)
            return done

        for r in concurrency:
            shares = [list(enumerate(prompts))[i::r] for i in range(r)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(r) as pool:
                completions = [c for share in pool.map(client, shares) for c in share]
            wall = time.perf_counter() - t0
            levels[str(r)] = _level_row(completions, wall)
    return {"url": url, "model": model, "endpoint": "chat" if chat else "completions",
            "max_tokens": max_tokens, "prompts": len(prompts), "decoding": describe(sampling),
            "levels": levels}


def pooled_tau(completions: list[Completion]) -> float | None:
    """Σ tokens / Σ target forwards over the requests whose server reported draft figures, as the
    in-process bench pools τ (a request that drafted nothing counts at τ = 1); None when none did."""
    reported = [c for c in completions if c.target_forwards is not None]
    forwards = sum(c.target_forwards for c in reported)
    return sum(c.num_tokens for c in reported) / forwards if forwards > 0 else None


def _level_row(completions: list[Completion], wall: float) -> dict:
    itls = [x for x in map(_itl, completions) if x]
    tokens = sum(c.num_tokens for c in completions)
    tau = pooled_tau(completions)
    return {
        "ttft_ms": round(1e3 * statistics.fmean(c.first_response_s for c in completions), 2),
        "itl_ms": round(1e3 * statistics.fmean(itls), 3) if itls else None,
        "per_user_tokens_per_s": round(1 / statistics.fmean(itls), 2) if itls else 0.0,
        "total_tokens_per_s": round(tokens / wall, 2),
        "tau": None if tau is None else round(tau, 3),
        "tokens": tokens,
        "wall_s": round(wall, 3),
    }


def remote_table(remote: dict) -> str:
    lines = ["| R | TTFT (ms) | ITL (ms) | tokens/s per user | total tokens/s | τ |",
             "|---|---|---|---|---|---|"]
    for r, row in remote["levels"].items():
        itl = "–" if row["itl_ms"] is None else f"{row['itl_ms']:.2f}"
        tau = "–" if row["tau"] is None else f"{row['tau']:.2f}"
        lines.append(f"| {r} | {row['ttft_ms']:.1f} | {itl} | {row['per_user_tokens_per_s']:.1f} | "
                     f"{row['total_tokens_per_s']:.1f} | {tau} |")
    return "\n".join(lines)
