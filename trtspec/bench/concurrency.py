"""Throughput against interactivity: R concurrent requests per method, side by side.

For each concurrency R every method serves the held-out prompts as R closed-loop clients would:
R requests in flight in the serving loop (`SpeculativeDecoder`: one drafter pass, one packed target
forward and one verification per step for all of them), the next prompt joining as soon as one
finishes. A method is `none`, a drafter verifying whole blocks, the same drafter with adaptive
speculation (`+adaptive`: each step's draft length from the measured cost model, 0 when speculation
would not pay) and — for drafters with a confidence head — the prefix scheduler or a fixed survival
threshold over whole blocks. The methods take turns every TURN_STEPS steps, so a drift of the
machine's speed hits all alike; each counts only the time of its own steps (its clock). We record

    total tokens/s    = tokens emitted while all R slots were busy / that time (the steady state,
                        up to the step after which no prompt is left to fill a free slot)
    run tokens/s      = all tokens / the whole run, the final drain at fewer than R included
    per-user tokens/s = a request's tokens after the first / its time after its first token, on its
                        method's clock (mean over the requests of at least 2 tokens: AIPerf's
                        "output token throughput per user", 1 / ITL, averaged over requests)

The steady state is what a server under R concurrent clients runs. The drain is not: requests that
speculation speeds up unevenly finish at different steps, so a fixed group of R would spend its
end at a batch of one or two (DFlash at R = 8 on chat: 30 % of a group's time), which a server
fills with the next requests.

`recommend` then answers the decision-guide question from these numbers: at a per-user speed
of at least S tokens/s and at most R concurrent users, which method serves the most tokens/s.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from trtspec.bench.profile import profile_cost
from trtspec.bench.run import load_methods
from trtspec.bench.sampled import check_fields, check_key, method_couplings, reference_of, request_params
from trtspec.config import BuildConfig, ScheduleConfig
from trtspec.pipeline import Pipeline
from trtspec.prompts import load_prompts
from trtspec.spec.decoder import Emitted, Request, SpeculativeDecoder
from trtspec.spec.metrics import GenerationResult
from trtspec.spec.near_ties import MISMATCH, NEAR_TIE, GreedyJudge
from trtspec.spec.sampling import SamplingParams
from trtspec.spec.schedule import SPSTable

THRESHOLDS = (0.3, 0.5, 0.7)
TURN_STEPS = 16  # steps a method runs before the next takes its turn (tens of ms: caches stay warm)

# repetitions of each cost table's timings (`trtspec profile`'s default): with 5, single cells of
# one run's EAGLE-3 table were 8 % apart from the same cells of its EAGLE-3 k16 twin, enough to
# flip adaptive's choice at R = 8 between drafting one token a step and none
PROFILE_REPS = 15


@dataclass
class _Point:
    steady_s: float = 0.0
    steady_tokens: int = 0
    wall_s: float = 0.0
    tokens: int = 0
    user_tps: list[float] = field(default_factory=list)
    cycles: int = 0
    mismatches: int = 0  # texts that differ from the reference's (`reference_of`), where there is one
    near_ties: int = 0  # texts that part from the reference's at near-ties only (`near_ties`)
    checked: str | None = None  # the check's field prefix (`check_key`); None: texts not compared
    offered: int = 0
    admitted: int = 0
    draft_lens: dict[int, int] = field(default_factory=dict)

    def summary(self) -> dict:
        steps = sum(self.draft_lens.values())
        mean_k = sum(k * n for k, n in self.draft_lens.items()) / steps if steps else 0.0
        return {
            "total_tokens_per_s": round(self.steady_tokens / self.steady_s, 2) if self.steady_s else 0.0,
            "run_tokens_per_s": round(self.tokens / self.wall_s, 2) if self.wall_s else 0.0,
            "per_user_tokens_per_s": round(statistics.fmean(self.user_tps), 2) if self.user_tps else 0.0,
            "tokens_per_cycle": round(self.tokens / self.cycles, 3) if self.cycles else 0.0,
            "admitted_share": round(self.admitted / self.offered, 3) if self.offered else None,
            "mean_draft_len": round(mean_k, 2),
            **check_fields(self.checked, self.mismatches, self.near_ties),
            "tokens": self.tokens,
            "wall_s": round(self.wall_s, 3),
            "steady_tokens": self.steady_tokens,
            "steady_s": round(self.steady_s, 3),
        }


def _decoders(pipelines: dict[str, Pipeline], couplings: dict[str, str], slots: int,
              tables: dict[str, SPSTable]) -> dict[str, SpeculativeDecoder]:
    """One decoder per method (all with `slots` slots), each drafter's with its cost table; a
    drafter's schedule variants are added to `couplings` with the drafter's coupling."""
    out = {}
    for name in list(couplings):
        p = pipelines.get(name, pipelines["none"])  # none+gumbel: the target alone too
        # no prefix reuse: a measured request must prefill its whole prompt, whatever ran before it
        out[name] = p.decoder_for(slots, ScheduleConfig(mode="full"), prefix_reuse=False)
        if name not in tables:
            continue
        schedules = {"adaptive": ScheduleConfig(mode="adaptive")}
        if p.drafter.method == "dspark":
            schedules["scheduler"] = ScheduleConfig(mode="scheduler")
            schedules.update({f"threshold{th}": ScheduleConfig(mode="threshold", threshold=th)
                              for th in THRESHOLDS})
        for label, schedule in schedules.items():
            out[f"{name}+{label}"] = p.decoder_for(slots, schedule, cost_table=tables[name],
                                                   prefix_reuse=False)
            couplings[f"{name}+{label}"] = couplings[name]
    return out


def measure_cost(pipeline: Pipeline, config: BuildConfig, max_batch: int) -> SPSTable:
    """The cost table a drafter's adaptive and scheduler methods are priced with when none is given,
    measured on this machine up to `max_batch` requests (prompt lookup's drafts covered where
    `config` copies them)."""
    return profile_cost(pipeline.target, pipeline.drafter, reps=PROFILE_REPS, max_batch=max_batch,
                        verify_len=config.lookup.num_draft_tokens if config.lookup else 0)


def run_concurrency(configs: dict[str, BuildConfig], tasks: list[str], prompts_per_task: int,
                    max_tokens: int, concurrency: list[int], table: SPSTable | None = None,
                    sampling: SamplingParams | None = None, pipelines: dict[str, Pipeline] | None = None,
                    ) -> dict:
    """`configs`: method name -> config (all the same target; each samples with its config's
    coupling, `sampled.method_couplings`). Each drafter's cost model is `table` when given, else its
    config's `schedule.sps_table`, else measured in this run. `sampling`: greedy by default.
    `pipelines`: `run.load_methods(configs)` when the caller has them already.
    Returns results['concurrency']."""
    sampling = sampling or SamplingParams()
    couplings = method_couplings(configs, sampling)
    first = next(iter(configs.values()))
    pipelines = pipelines or load_methods(configs)
    tables: dict[str, SPSTable] = {}
    measured: dict = {}  # one profile per drafter (`--coupling both` runs each drafter twice)
    for name, cfg in configs.items():
        if table is not None or (cfg.drafter and cfg.drafter.resolved_sps_table is not None):
            tables[name] = table or pipelines[name].cost_table
            continue
        key = (cfg.drafter and cfg.drafter.model_dump_json(), cfg.lookup and cfg.lookup.num_draft_tokens)
        if key not in measured:
            measured[key] = measure_cost(pipelines[name], cfg, max(concurrency))
        tables[name] = measured[key]
    decoders = _decoders(pipelines, couplings, max(concurrency), tables)
    tok = pipelines["none"].tokenizer
    prompts = [tok.encode(p) for t in tasks for p in load_prompts(t)[:prompts_per_task]]
    judge = GreedyJudge(first.target, pipelines["none"].target)
    references = {m: reference_of(sampling, couplings[m]) for m in decoders}
    points = {m: {r: _Point(checked=check_key(sampling) if references[m] else None)
                  for r in concurrency} for m in decoders}
    bar = tqdm(total=len(concurrency) * len(decoders) * len(prompts), desc="concurrency", unit="request")
    for r in concurrency:
        runs = {}
        for name, decoder in decoders.items():
            requests = [Request(ids, max_tokens, request_params(sampling, i, couplings[name]))
                        for i, ids in enumerate(prompts)]
            runs[name] = StreamRun(decoder, requests, r)
        while not all(run.done for run in runs.values()):  # the methods take turns, TURN_STEPS each
            for run in runs.values():
                before = len(run.finished)
                run.advance(TURN_STEPS)
                bar.update(len(run.finished) - before)
        texts = {name: [res.token_ids for res in run.results] for name, run in runs.items()}
        for name, run in runs.items():
            decoder = run.decoder
            pt = points[name][r]
            pt.steady_s, pt.steady_tokens = run.steady
            pt.wall_s, pt.tokens = run.whole
            pt.user_tps += run.user_tps
            pt.cycles += decoder.num_cycles
            pt.offered += decoder.offered_drafts
            pt.admitted += decoder.admitted_drafts
            for k, n in decoder.draft_len_counts.items():
                pt.draft_lens[k] = pt.draft_lens.get(k, 0) + n
            if pt.checked:
                verdicts = [judge(ids, a, b, request.sampling) for ids, a, b, request in
                            zip(prompts, texts[name], texts[references[name]], run.requests, strict=True)]
                pt.mismatches += verdicts.count(MISMATCH)
                pt.near_ties += verdicts.count(NEAR_TIE)
    bar.close()
    return {
        "max_tokens": max_tokens,
        "prompts": len(prompts),
        "cost_tables": {name: t.model_dump() for name, t in tables.items()},
        "methods": {m: {str(r): pt.summary() for r, pt in by_r.items()} for m, by_r in points.items()},
    }


class StreamRun:
    """Serve `requests` in order with at most `r` in flight, each joining as a slot frees, a few
    steps at a time (`advance`), so that several methods can take turns on the machine. Keeps the
    seconds spent in its own steps and the tokens emitted: `steady` up to the step after which no
    request is left to fill a free slot (every slot busy until then; the whole run while that has
    not happened), `whole` for the run."""

    def __init__(self, decoder: SpeculativeDecoder, requests: list[Request], r: int):
        decoder.reset()
        self.decoder, self.r = decoder, r
        self.requests = requests
        self.waiting = list(enumerate(requests))
        self.index: dict[int, int] = {}  # decoder request id -> position in `requests`
        self.finished: dict[int, GenerationResult] = {}
        self.seconds, self.emitted = 0.0, 0
        self._steady: tuple[float, int] | None = None  # (seconds, tokens) once a slot stays free
        self.count = len(requests)
        self.first: dict[int, float] = {}  # request -> this run's clock after its first token
        self.user_tps: list[float] = []  # finished requests' tokens after the first / their time (≥ 2 tokens)
        self._started: list[int] = []  # requests whose first token came in the current step

    @property
    def done(self) -> bool:
        return not self.waiting and not self.decoder.num_running

    def _on_tokens(self, i: int):
        def emitted(step: Emitted) -> None:
            if i not in self.first:
                self._started.append(i)
            self.emitted += len(step.ids)

        return emitted

    def advance(self, steps: int) -> None:
        decoder = self.decoder
        for _ in range(steps):
            if self.done:
                return
            t0 = time.perf_counter()
            while self.waiting and decoder.num_running < self.r:
                i, request = self.waiting.pop(0)
                self.index[decoder.add(request, self._on_tokens(i))] = i
            finished = decoder.step()
            self.seconds += time.perf_counter() - t0
            for i in self._started:
                self.first[i] = self.seconds
            self._started.clear()
            for rid, result in finished.items():
                i = self.index[rid]
                self.finished[i] = result
                decode_s = self.seconds - self.first[i]
                if len(result.token_ids) >= 2 and decode_s > 0:  # one token has no speed after the first
                    self.user_tps.append((len(result.token_ids) - 1) / decode_s)
            if self._steady is None and not self.waiting and decoder.num_running < self.r:
                self._steady = self.whole

    @property
    def whole(self) -> tuple[float, int]:
        return self.seconds, self.emitted

    @property
    def steady(self) -> tuple[float, int]:
        return self._steady or self.whole

    @property
    def results(self) -> list[GenerationResult]:
        return [self.finished[i] for i in range(self.count)]


def serve_stream(decoder: SpeculativeDecoder, requests: list[Request], r: int
                 ) -> tuple[list[GenerationResult], tuple[float, int], tuple[float, int]]:
    """`StreamRun` alone to the end: the results in request order, and (seconds, tokens emitted) of
    the steady state and of the whole run."""
    run = StreamRun(decoder, requests, r)
    while not run.done:
        run.advance(TURN_STEPS)
    return run.results, run.steady, run.whole


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
