"""Throughput against interactivity: R concurrent requests per method, side by side.

For each concurrency R the held-out prompts are served in groups of R by `BatchDecoder` (one
packed target forward per cycle for the whole group). Every method serves the same groups, one
after the other within a group, so drift hits all alike. A method is `none`, a drafter with the
full block verified, or — for drafters with a confidence head — the prefix scheduler or a fixed
survival threshold. Per group we record wall time and each request's decode speed:

    per-user tokens/s = a request's tokens after the first / its time after prefill (mean over users)
    total tokens/s    = all tokens of the groups / their wall time

`recommend` then answers the decision-guide question from these numbers: at a per-user speed
of at least S tokens/s and at most R concurrent users, which method serves the most tokens/s.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from trtspec.config import BuildConfig, ScheduleConfig
from trtspec.pipeline import Pipeline, load_pipeline
from trtspec.prompts import load_prompts
from trtspec.spec.batch import BatchDecoder, Request
from trtspec.spec.schedule import SPSTable

THRESHOLDS = (0.3, 0.5, 0.7)


@dataclass
class _Point:
    wall_s: float = 0.0
    tokens: int = 0
    user_tps: list[float] = field(default_factory=list)
    cycles: int = 0
    mismatches: int = 0
    offered: int = 0
    admitted: int = 0

    def summary(self) -> dict:
        return {
            "total_tokens_per_s": round(self.tokens / self.wall_s, 2) if self.wall_s else 0.0,
            "per_user_tokens_per_s": round(statistics.fmean(self.user_tps), 2) if self.user_tps else 0.0,
            "tokens_per_cycle": round(self.tokens / self.cycles, 3) if self.cycles else 0.0,
            "admitted_share": round(self.admitted / self.offered, 3) if self.offered else None,
            "greedy_mismatches": self.mismatches,
            "tokens": self.tokens,
            "wall_s": round(self.wall_s, 3),
        }


def _decoders(pipelines: dict[str, Pipeline], sps: SPSTable | None) -> dict[str, BatchDecoder]:
    """One decoder per method; confidence drafters also get the scheduler and thresholds."""
    out = {}
    for name, p in pipelines.items():
        target, verifier = p.packed_target(), p.decoder.verifier
        drafter = None if name == "none" else p.drafter
        out[name] = BatchDecoder(target, drafter, p.tokenizer.eos_id, verifier=verifier)
        if p.drafter.method == "dspark" and sps is not None:
            out[f"{name}+scheduler"] = BatchDecoder(target, drafter, p.tokenizer.eos_id,
                                                    ScheduleConfig(mode="scheduler"), sps, verifier)
            for th in THRESHOLDS:
                out[f"{name}+threshold{th}"] = BatchDecoder(target, drafter, p.tokenizer.eos_id,
                                                            ScheduleConfig(mode="threshold", threshold=th),
                                                            sps, verifier)
    return out


def run_concurrency(configs: dict[str, BuildConfig], tasks: list[str], prompts_per_task: int,
                    max_tokens: int, concurrency: list[int], sps: SPSTable | None = None) -> dict:
    """`configs`: method name -> config (all the same target). Returns results['concurrency']."""
    first = next(iter(configs.values()))
    pipelines = {"none": load_pipeline(first, use_drafter=False)}
    pipelines.update({name: load_pipeline(cfg) for name, cfg in configs.items()})
    decoders = _decoders(pipelines, sps)
    tok = pipelines["none"].tokenizer
    prompts = [tok.encode(p) for t in tasks for p in load_prompts(t)[:prompts_per_task]]
    points = {m: {r: _Point() for r in concurrency} for m in decoders}
    groups = [(r, prompts[i : i + r]) for r in concurrency for i in range(0, len(prompts), r)]
    for r, group in tqdm(groups, desc="concurrency", unit="group"):
        expected = None
        for name, decoder in decoders.items():
            t0 = time.perf_counter()
            results = decoder.generate([Request(ids, max_tokens) for ids in group])
            pt = points[name][r]
            pt.wall_s += time.perf_counter() - t0
            pt.tokens += sum(len(res.token_ids) for res in results)
            pt.user_tps += [res.decode_tokens_per_s for res in results]
            pt.cycles += decoder.num_cycles
            pt.offered += decoder.offered_drafts
            pt.admitted += decoder.admitted_drafts
            tokens = [res.token_ids for res in results]
            if expected is None:
                expected = tokens
            elif tokens != expected:
                pt.mismatches += sum(a != b for a, b in zip(tokens, expected, strict=True))
    return {
        "max_tokens": max_tokens,
        "prompts": len(prompts),
        "sps_table": None if sps is None else sps.model_dump(),
        "methods": {m: {str(r): pt.summary() for r, pt in by_r.items()} for m, by_r in points.items()},
    }


def recommend(concurrency_results: dict, min_user_tps: float, max_users: int | None = None) -> dict | None:
    """The measured (method, R) with the most total tokens/s among those at ≥ `min_user_tps` per user."""
    best = None
    for method, by_r in concurrency_results["methods"].items():
        for r, row in by_r.items():
            if max_users is not None and int(r) > max_users:
                continue
            if row["per_user_tokens_per_s"] < min_user_tps:
                continue
            if best is None or row["total_tokens_per_s"] > best["total_tokens_per_s"]:
                best = {"method": method, "concurrency": int(r), **row}
    return best


def recommendation_text(concurrency_results: dict, min_user_tps: float, max_users: int | None) -> str:
    best = recommend(concurrency_results, min_user_tps, max_users)
    users = f" and at most {max_users} concurrent users" if max_users else ""
    if best is None:
        return (f"No measured setting reaches {min_user_tps:.0f} tokens/s per user{users}; "
                "lower the per-user target or measure lower concurrency.")
    return (f"For at least {min_user_tps:.0f} tokens/s per user{users}: **{best['method']}** at "
            f"concurrency {best['concurrency']} serves {best['total_tokens_per_s']:.0f} tokens/s in total "
            f"({best['per_user_tokens_per_s']:.0f} per user), the most of every measured setting.")
