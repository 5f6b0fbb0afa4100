"""`trtspec bench --url`: the same prompts against a running server, as its users see it.

R client threads each stream their share of the prompts one request after another over gRPC
(`ModelStreamInfer`), HTTP (`/generate_stream`) or an OpenAI-compatible API (`openai://`: SSE of
`/v1/completions`, or `/v1/chat/completions` with `chat`). `warmup` requests go first, one at a
time, and are not counted (the tasks' prompts past those measured). A server that remembers what it
answered (`limits.prefix_reuse`, `lookup.pool_tokens`) serves each level after the first prompts it
has seen: `salt_per_level` sends each level with a cache_salt of its own (trtspec's and vLLM's
servers keep such caches per salt), else restart it per level. Each request leaves one record
(`request_record`), kept in the results so every figure can be recomputed from them; its figures
are AIPerf's:

    TTFT    = time from sending to the first response that carries a token (text or ids)
    latency = time from sending to the end of the stream
    ITL     = (latency − TTFT) / (tokens − 1), for requests of at least 2 tokens

and how the tokens came: `responses` (those that carried tokens) and `longest_gap_s`, the longest
wait between two of them (how long a reader saw nothing new; a server sending a response every
few steps, `limits.stream_interval`, keeps ITL and lengthens it).

A request with no token has no TTFT; a request that fails (the server refused it, its stream broke)
has no figures: it is counted under `errors` and left out of everything else. Tokens are the
generated ids (Triton) or the server's `usage.completion_tokens` (OpenAI).

Per concurrency level (`level_row`): the mean and p50/p90/p99 of TTFT, ITL and latency (numpy's
default linear interpolation, as AIPerf and vLLM's benchmark_serving compute them); tokens/s per
user = 1 / the mean ITL. AIPerf's "output token throughput per user" is instead the mean over
requests of each one's 1 / ITL, which a single request whose tokens arrive in one burst can
dominate: on a loaded 2-core machine one request of 64 tokens whose first text came at 388 ms and
the other 63 tokens 6 ms later (ITL 0.1 ms) made that mean 1,480 tokens/s where 1 / mean ITL gave
233. Total tokens/s = Σ tokens / the wall time of the level, first send to last response (AIPerf's
output token throughput). τ only when the server reports draft figures (trtspec does),
pooled over the level's requests: Σ tokens / Σ target forwards (the server's `target_forwards`,
the prefill's included; from a server that sends only draft figures, tokens − accepted). Greedy, or
sampled with prompt i seeded `seed + i` (`bench.sampled.request_params`; the server verifies by its
own coupling).
"""

from __future__ import annotations

import dataclasses
import secrets
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from tqdm import tqdm

from trtspec.bench.sampled import describe, request_params
from trtspec.prompts import load_prompts
from trtspec.spec.sampling import SamplingParams
from trtspec.triton.client import ClientError, Completion, GenerateParams, generate

PERCENTILES = (50, 90, 99)
WARMUP_PROMPT = "def warm_up(self):\n"  # when every prompt of the tasks is measured


def _params(max_tokens: int, sampling: SamplingParams, index: int, salt: str = "") -> GenerateParams:
    """Prompt `index`'s request: streamed; greedy as the server's default, or sampled and seeded;
    sent with cache_salt `salt` ("": none)."""
    params = GenerateParams.of(request_params(sampling, index, sampling.coupling), max_tokens, stream=True)
    return dataclasses.replace(params, cache_salt=salt)


def request_record(index: int, c: Completion | None = None, error: str | None = None) -> dict:
    """One request's figures in seconds, unrounded: `tokens`, `ttft_s` (None without a token),
    `latency_s`, `itl_s` (None under 2 tokens), `target_forwards` (None when the server reports no
    draft figures); or, for a failed request, only its `error`."""
    if c is None:
        return {"prompt": index, "error": error}
    ttft = c.first_response_s if c.num_tokens > 0 else None
    itl = (c.total_s - ttft) / (c.num_tokens - 1) if ttft is not None and c.num_tokens >= 2 else None
    return {"prompt": index, "tokens": c.num_tokens, "ttft_s": ttft, "latency_s": c.total_s, "itl_s": itl,
            "target_forwards": c.target_forwards, "cached_tokens": c.cached_tokens,
            "responses": c.token_responses, "longest_gap_s": c.longest_gap_s}


def warmup_prompts(tasks: list[str], prompts_per_task: int) -> list[str]:
    """Prompts to warm a server up with, none of those measured: a server remembering what it
    answered (prefix reuse, a lookup pool) then holds none of them. The tasks' prompts past those
    measured, or WARMUP_PROMPT."""
    measured = {p for t in tasks for p in load_prompts(t)[:prompts_per_task]}
    spare = [p for t in tasks for p in load_prompts(t)[prompts_per_task:] if p not in measured]
    return spare or [WARMUP_PROMPT]


def run_remote(url: str, model: str, tasks: list[str], prompts_per_task: int, max_tokens: int,
               concurrency: list[int], chat: bool = False, api_key: str | None = None,
               sampling: SamplingParams | None = None, warmup: int = 0,
               salt_per_level: bool = False) -> dict:
    """`salt_per_level`: each level's requests (and the warm-up's) carry a cache_salt of their own
    (trtspec's and vLLM's servers): what a server cached of earlier levels' prompts (prefix reuse, a
    lookup pool) is not reused, as if it were restarted per level."""
    sampling = sampling or SamplingParams()
    run = secrets.token_hex(4)  # a new run never meets an earlier run's salts either

    def salt(level: str) -> str:
        return f"trtspec-bench-{run}-{level}" if salt_per_level else ""

    prompts = [p for t in tasks for p in load_prompts(t)[:prompts_per_task]]
    levels: dict[str, dict] = {}

    def send(i: int, prompt: str, level: str) -> dict:
        try:
            params = _params(max_tokens, sampling, i, salt(level))
            return request_record(i, generate(url, model, prompt, params, chat=chat, api_key=api_key))
        except ClientError as exc:
            return request_record(i, error=str(exc))

    spare = warmup_prompts(tasks, prompts_per_task)
    for w in range(warmup):  # the server's first requests pay its start-up; a failure here ends the run
        generate(url, model, spare[w % len(spare)], _params(max_tokens, sampling, w, salt("warmup")),
                 chat=chat, api_key=api_key)
    # closed on the way out of an error too, so the error starts a line of its own
    with tqdm(total=len(prompts) * len(concurrency), desc=f"bench {url}", unit="request") as bar:

        def client(share: list[tuple[int, str]], level: str) -> list[dict]:
            done = []
            for i, prompt in share:
                done.append(send(i, prompt, level))
                bar.update(1)
            return done

        for r in concurrency:
            shares = [list(enumerate(prompts))[i::r] for i in range(r)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(r) as pool:
                records = sorted((x for share in pool.map(client, shares, [str(r)] * r) for x in share),
                                 key=lambda x: x["prompt"])
            wall = time.perf_counter() - t0
            failed = [x for x in records if x.get("error")]
            if len(failed) == len(records):
                raise ClientError(f"every request at concurrency {r} failed: {failed[0]['error']}")
            levels[str(r)] = {**level_row(records, wall), "requests": records}
    return {"url": url, "model": model, "endpoint": "chat" if chat else "completions",
            "max_tokens": max_tokens, "prompts": len(prompts), "warmup": warmup,
            "salt_per_level": salt_per_level, "decoding": describe(sampling), "levels": levels}


def pooled_tau(records: list[dict]) -> float | None:
    """Σ tokens / Σ target forwards over the requests whose server reported draft figures, as the
    in-process bench pools τ (a request that drafted nothing counts at τ = 1); None when none did."""
    reported = [x for x in records if x.get("target_forwards") is not None]
    forwards = sum(x["target_forwards"] for x in reported)
    return sum(x["tokens"] for x in reported) / forwards if forwards > 0 else None


def _spread(values: list[float], digits: int) -> dict:
    """Mean and percentiles in ms; None each when there are no values."""
    ms = 1e3 * np.asarray(values, dtype=np.float64)  # [n]
    out = {"mean": round(float(ms.mean()), digits) if len(values) else None}
    for p in PERCENTILES:
        out[f"p{p}"] = round(float(np.percentile(ms, p)), digits) if len(values) else None
    return out


def level_row(records: list[dict], wall: float) -> dict:
    """One concurrency level's figures from its requests' records (`request_record`)."""
    ok = [x for x in records if not x.get("error")]
    errors = [x["error"] for x in records if x.get("error")]
    ttfts = [x["ttft_s"] for x in ok if x["ttft_s"] is not None]
    itls = [x["itl_s"] for x in ok if x["itl_s"] is not None]
    mean_itl = statistics.fmean(itls) if itls else None
    tokens = sum(x["tokens"] for x in ok)
    ttft, itl, latency = _spread(ttfts, 2), _spread(itls, 3), _spread([x["latency_s"] for x in ok], 2)
    gap = _spread([x["longest_gap_s"] for x in ok if x.get("longest_gap_s") is not None], 2)
    responses = sum(x.get("responses") or 0 for x in ok)
    tau = pooled_tau(ok)
    return {
        "ttft_ms": ttft.pop("mean"),
        "itl_ms": itl.pop("mean"),
        "latency_ms": latency.pop("mean"),
        "ttft_ms_percentiles": ttft,
        "itl_ms_percentiles": itl,
        "latency_ms_percentiles": latency,
        "longest_gap_ms": gap.pop("mean"),
        "longest_gap_ms_percentiles": gap,
        # tokens over the responses that carried them: 1 / step at τ 1 streaming every step
        "tokens_per_response": round(tokens / responses, 2) if responses else None,
        "per_user_tokens_per_s": round(1 / mean_itl, 2) if mean_itl else 0.0,
        "total_tokens_per_s": round(tokens / wall, 2),
        "tau": None if tau is None else round(tau, 3),
        "tokens": tokens,
        "completed": len(ok),
        "errors": len(errors),
        **({"first_error": errors[0]} if errors else {}),
        "wall_s": round(wall, 6),  # fine enough that total tokens/s recomputes from it
    }


def remote_table(remote: dict) -> str:
    lines = ["| R | TTFT (ms) | TTFT p99 | ITL (ms) | ITL p99 | tokens/s per user | total tokens/s | τ "
             "| tokens / response | longest gap p99 (ms) | errors |", "|---" * 11 + "|"]

    def cell(value: float | None, digits: int) -> str:
        return "–" if value is None else f"{value:.{digits}f}"

    for r, row in remote["levels"].items():
        lines.append(f"| {r} | {cell(row['ttft_ms'], 1)} | {cell(row['ttft_ms_percentiles']['p99'], 1)} | "
                     f"{cell(row['itl_ms'], 2)} | {cell(row['itl_ms_percentiles']['p99'], 2)} | "
                     f"{row['per_user_tokens_per_s']:.1f} | {row['total_tokens_per_s']:.1f} | "
                     f"{cell(row['tau'], 2)} | {cell(row.get('tokens_per_response'), 2)} | "
                     f"{cell(row.get('longest_gap_ms_percentiles', {}).get('p99'), 1)} | {row['errors']} |")
    errors = [f"R = {r}: {row['errors']} failed, the first: {row['first_error']}"
              for r, row in remote["levels"].items() if row["errors"]]
    return "\n".join(lines + ([""] + errors if errors else []))
