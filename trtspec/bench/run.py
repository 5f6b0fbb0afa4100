"""Side-by-side decoding benchmark: every method on the same prompts, repetitions interleaved.

Methods: `none` (the target alone through trtspec's loop), each configured drafter, each
drafter with a draft tree (`NAME+tree`: the config's `drafter.tree`, or one sized for this machine,
`resolve_trees`), and — for reference — `transformers` `generate` alone and with assisted
generation (the `draft_model` drafter as `assistant_model`). Speedups are ratios of wall time
measured in this run on identical prompts and token budgets, after one untimed run of the first
prompt by every method. Greedy, or sampled with seeded prompts
(`trtspec.bench.sampled`); a method whose tokens must equal its reference's (greedy: `none`'s;
Gumbel-coupled: `none+gumbel`'s) and differ is flagged, never silently averaged.
"""

from __future__ import annotations

import copy
import os
import platform
import statistics
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from trtspec.bench.acceptance import conditional_acceptance
from trtspec.bench.sampled import (
    COUPLED_SUFFIX,
    check_fields,
    check_key,
    describe,
    method_couplings,
    reference_of,
    request_params,
)
from trtspec.config import BuildConfig, ScheduleConfig, TreeConfig
from trtspec.errors import ConfigError
from trtspec.models.dflash_drafter import DFlashDrafter
from trtspec.pipeline import Pipeline, load_pipeline
from trtspec.prompts import load_prompts
from trtspec.provenance import source_revision
from trtspec.spec.cost import tree_budget
from trtspec.spec.metrics import GenerationResult, acceptance_by_position
from trtspec.spec.near_ties import MISMATCH, NEAR_TIE, GreedyJudge
from trtspec.spec.sampling import SamplingParams

TREE_TOPK = 8  # children per expanded node of the trees `--tree auto` sizes


@dataclass
class MethodStats:
    seconds: float = 0.0
    tokens: int = 0
    target_calls: int = 0
    draft_s: float = 0.0
    mismatches: int = 0  # texts that differ from the reference's (`reference_of`), where there is one
    near_ties: int = 0  # texts that part from the reference's at near-ties only (`near_ties`)
    checked: str | None = None  # the check's field prefix (`check_key`); None: texts not compared
    draft_len: int = 0  # k the drafter was configured with (0: it never drafted)
    cycles: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per cycle, all requests
    prompt_seconds: dict[int, float] = field(default_factory=dict)  # prompt index -> seconds, repeats summed

    def add(self, prompt: int, seconds: float, tokens: int, target_calls: int = 0,
            draft_s: float = 0.0) -> None:
        self.prompt_seconds[prompt] = self.prompt_seconds.get(prompt, 0.0) + seconds
        self.seconds += seconds
        self.tokens += tokens
        self.target_calls += target_calls
        self.draft_s += draft_s

    def record(self, prompt: int, result: GenerationResult) -> None:
        """One request (of prompt `prompt`) decoded through trtspec's loop: its time, tokens and cycles."""
        self.add(prompt, result.total_s, len(result.token_ids), result.num_target_calls, result.draft_s)
        if result.num_draft_tokens:
            self.draft_len = max(self.draft_len, result.num_draft_tokens)
            self.cycles += zip(result.drafted_counts, result.accept_counts, strict=True)

    def summary(self, baseline: MethodStats | None) -> dict:
        out = {
            "tokens": self.tokens,
            "seconds": round(self.seconds, 6),  # fine enough that speedups recompute from it
            "tokens_per_s": round(self.tokens / self.seconds, 2) if self.seconds else 0.0,
            # in prompt order, paired across methods: what the pooled speedups' intervals resample
            "prompt_seconds": [round(s, 6) for _, s in sorted(self.prompt_seconds.items())],
        }
        out.update(check_fields(self.checked, self.mismatches, self.near_ties))
        if self.target_calls:
            out["tau"] = round(self.tokens / self.target_calls, 3)
            out["draft_share"] = round(self.draft_s / self.seconds, 3)
        if baseline is not None and self.seconds:
            out["speedup"] = round(baseline.seconds / self.seconds, 3)
        if self.draft_len:  # pooled over the cycles of every request, as τ is (bench.acceptance)
            out["acceptance_by_position"] = [None if r is None else round(r, 3)
                                             for r in acceptance_by_position(self.cycles, self.draft_len)]
        return out


def _hf_generate(pipeline: Pipeline, ids: list[int], max_tokens: int, sampling: SamplingParams,
                 assistant=None) -> list[int]:
    model = pipeline.target.model
    ends = list(pipeline.end_ids)
    prompt = torch.tensor([ids])
    how: dict = {"do_sample": False}
    if not sampling.greedy:  # top_k=0 said outright: transformers' own default would keep 50
        how = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
               "top_k": sampling.top_k}
        torch.manual_seed(sampling.seed or 0)
    # one unpadded prompt: say so, rather than let transformers guess a mask from pad == eos
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), **how,
                         max_new_tokens=max_tokens, eos_token_id=ends or None,
                         pad_token_id=ends[0] if ends else None,
                         assistant_model=assistant)
    return out[0, len(ids) :].tolist()


def _drafting_state(drafter, context_len: int, capacity: int, num_draft_tokens: int | None = None):
    """A copy of `drafter` with one request of `context_len` random-tap positions in slot 0, its
    context absorbed; -> (drafter, rows)."""
    from trtspec.models.drafter import DraftRow
    from trtspec.spec.sampling import SamplingParams

    drafter = copy.copy(drafter)
    drafter.num_draft_tokens = num_draft_tokens or drafter.num_draft_tokens
    drafter.allocate(1, capacity)
    width = drafter.model.fc.in_features
    hidden = torch.randn(context_len, width, device=drafter.device)
    committed = list(range(context_len + 1))
    drafter.begin(0, committed[:-1], hidden)
    rows = [DraftRow(0, committed, SamplingParams(), torch.Generator(device=drafter.device))]
    drafter.propose(rows, 1)  # absorbs the context once
    return drafter, rows


def time_dflash_block(drafter: DFlashDrafter, context_len: int, block_sizes: list[int],
                      reps: int = 30) -> dict[int, float]:
    """Median seconds of one drafter forward per block size, same drafter and context."""
    drafter, rows = _drafting_state(drafter, context_len, context_len + max(block_sizes) + 1)
    times: dict[int, list[float]] = {b: [] for b in block_sizes}
    for _ in range(reps):
        for b in block_sizes:  # interleaved so drift hits every size alike
            drafter.block_size = b
            t = time.perf_counter()
            drafter.draft_logits(rows, b - 1)
            times[b].append(time.perf_counter() - t)
    return {b: statistics.median(v) for b, v in times.items()}


def time_eagle3_chain(drafter, context_len: int, ks: list[int], reps: int = 30) -> dict[int, float]:
    """Median seconds of one EAGLE-3 proposal of k tokens (context already absorbed)."""
    drafter, rows = _drafting_state(drafter, context_len, context_len + 1,
                                    max(drafter.num_draft_tokens, max(ks)))
    times: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(reps):
        for k in ks:
            t = time.perf_counter()
            drafter.propose(rows, k)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def resolve_trees(pipelines: dict[str, Pipeline], tree: str | TreeConfig | None) -> dict[str, dict]:
    """The tree each drafter's `NAME+tree` method uses: its config's `drafter.tree`; else, with
    `tree` "auto", N = `tree_budget` of the machine's cost table (verifying the tree costs at most
    10 % more than the chain) and K = TREE_TOPK; with a TreeConfig that one. Without a config tree
    and with `tree` None there is no tree method. One tree per drafter method and coupling (the
    first config of each)."""
    out: dict[str, dict] = {}
    methods = set()
    for name, p in pipelines.items():
        if name == "none" or not p.drafter.num_draft_tokens:
            continue
        config_tree = p.config.drafter.tree
        kind = (p.drafter.method, name.endswith(COUPLED_SUFFIX))
        if config_tree is not None:
            out[name] = {"tree": config_tree, "sized_by": "the config's drafter.tree"}
        elif tree is not None and kind not in methods:
            if tree == "auto":
                nodes = tree_budget(p.cost_table, p.drafter.num_draft_tokens)
                out[name] = {"tree": TreeConfig(nodes=nodes, topk=TREE_TOPK),
                             "sized_by": "tree_budget of this machine's cost table (+10 % verify time)"}
            else:
                out[name] = {"tree": tree, "sized_by": "--tree"}
        methods.add(kind)
    return out


def _target_key(cfg: BuildConfig) -> tuple:
    """What makes two configs' targets the same loaded model."""
    return cfg.target.resolved_path.resolve(), cfg.target.dtype, cfg.target.device, cfg.flavour


def load_methods(configs: dict[str, BuildConfig]) -> dict[str, Pipeline]:
    """`none` (the first config's target alone) and a pipeline per method of `configs`; configs of
    one target (`check_same_target`, as `bench` requires) share its loaded weights, flavour torch,
    each pipeline keeping its own slots and taps."""
    first = next(iter(configs.values()))
    pipelines = {"none": load_pipeline(first, use_drafter=False)}
    models = {_target_key(first): pipelines["none"].target.model} if first.flavour == "torch" else {}
    for name, cfg in configs.items():
        pipelines[name] = load_pipeline(cfg, model=models.get(_target_key(cfg)))
        if cfg.flavour == "torch":
            models.setdefault(_target_key(cfg), pipelines[name].target.model)
    return pipelines


def check_same_target(configs: dict[str, BuildConfig]) -> None:
    """Refuse configs whose targets differ (checkpoint, dtype, device or flavour): every method
    is measured against one target alone, so a drafter over another target would be timed and
    judged against the wrong model."""
    first_name, first = next(iter(configs.items()))
    for name, cfg in configs.items():
        if _target_key(cfg) != _target_key(first):
            raise ConfigError(
                f"config {cfg.name!r} ({name}) has target {cfg.target.resolved_path} ({cfg.target.dtype}, "
                f"{cfg.target.device}, flavour {cfg.flavour}) but config {first.name!r} ({first_name}) has "
                f"{first.target.resolved_path} ({first.target.dtype}, {first.target.device}, flavour "
                f"{first.flavour}): bench compares drafters of one target, give configs that share it")


def run_bench(configs: dict[str, BuildConfig], tasks: list[str], prompts_per_task: int,
              max_tokens: int, repeats: int = 1, hf_reference: bool = True,
              tree: str | TreeConfig | None = None, sampling: SamplingParams | None = None,
              pipelines: dict[str, Pipeline] | None = None) -> dict:
    """`configs` maps a method name to a config whose drafter it uses; all share one target, and at
    a temperature each samples with its config's coupling (`bench.sampled.with_couplings` names
    them). `tree`: "auto", a TreeConfig or None (`resolve_trees`). `sampling`: greedy by default.
    `pipelines`: `load_methods(configs)` when the caller has them already."""
    torch.manual_seed(0)
    sampling = sampling or SamplingParams()
    first = next(iter(configs.values()))
    couplings = method_couplings(configs, sampling)
    pipelines = pipelines or load_methods(configs)
    trees = resolve_trees(pipelines, tree)
    assistant = None
    if hf_reference:
        drafts = [p for p in pipelines.values() if p.drafter.method == "draft_model"]
        assistant = drafts[0].drafter.lm.model if drafts else None
    # whole blocks: this table measures each drafter itself (adaptive serving is compared in
    # the concurrency section)
    full = ScheduleConfig(mode="full")
    decoders = {name: pipelines[name if name in pipelines else "none"].decoder_for(1, full, tree=None)
                for name in couplings}
    for name, spec in trees.items():
        decoders[f"{name}+tree"] = pipelines[name].decoder_for(1, full, tree=spec["tree"])
        couplings[f"{name}+tree"] = couplings[name]
    methods = list(decoders)
    if hf_reference:
        methods += ["hf_generate"] + (["hf_assisted"] if assistant else [])
    references = {m: reference_of(sampling, couplings.get(m)) for m in methods}
    stats = {t: {m: MethodStats(checked=check_key(sampling) if references[m] else None)
                 for m in methods} for t in tasks}
    prompts = [(t, p) for t in tasks for p in load_prompts(t)[:prompts_per_task]]
    work = list(enumerate(prompts)) * repeats  # prompt i samples with seed + i in every repetition
    ref = pipelines["none"]
    judge = GreedyJudge(first.target, ref.target)

    def hf(name: str, ids: list[int], params: SamplingParams) -> list[int]:
        return _hf_generate(ref, ids, max_tokens, params, assistant if name == "hf_assisted" else None)

    # one untimed run of the first prompt per method: a method's first call pays one-time costs
    # (allocations, kernel selection; on a GPU the CUDA graph captures) that would be charged to it
    warm_ids = ref.tokenizer.encode(prompts[0][1])
    for name in methods:
        params = request_params(sampling, 0, couplings.get(name, "rejection"))
        if name.startswith("hf_"):
            hf(name, warm_ids, params)
        else:
            decoders[name].generate(warm_ids, max_tokens, params)
    for index, (task, prompt) in tqdm(work, desc="bench", unit="prompt"):
        ids = ref.tokenizer.encode(prompt)
        texts: dict[str, list[int]] = {}
        for name in methods:
            params = request_params(sampling, index, couplings.get(name, "rejection"))
            t0 = time.perf_counter()
            if name.startswith("hf_"):
                tokens = hf(name, ids, params)
                stats[task][name].add(index, time.perf_counter() - t0, len(tokens))
            else:
                result = decoders[name].generate(ids, max_tokens, params)
                tokens = result.token_ids
                stats[task][name].record(index, result)
            texts[name] = tokens
            st = stats[task][name]
            if st.checked:
                verdict = judge(ids, tokens, texts[references[name]], params)
                st.mismatches += verdict == MISMATCH
                st.near_ties += verdict == NEAR_TIE

    machine = f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__} " \
              f"({torch.get_num_threads()} threads)"
    results: dict = {"max_tokens": max_tokens, "prompts_per_task": prompts_per_task, "repeats": repeats,
                     "machine": machine, "revision": source_revision(),
                     # what bench's options set (no penalties: it decodes the target's plain law)
                     "sampling": sampling.model_dump(include={"temperature", "top_p", "top_k", "seed"}),
                     "decoding": describe(sampling), "tasks": {},
                     "trees": {f"{name}+tree": {**spec["tree"].model_dump(), "sized_by": spec["sized_by"]}
                               for name, spec in trees.items()}}
    for task in tasks:
        base = stats[task]["none"]
        hf_base = stats[task].get("hf_generate")
        rows = {}
        for name in methods:
            baseline = hf_base if name == "hf_assisted" else base
            rows[name] = stats[task][name].summary(baseline)
        results["tasks"][task] = rows
    for name, p in pipelines.items():
        k = p.drafter.num_draft_tokens if name != "none" else 0
        cycles = [c for task in tasks for c in stats[task][name].cycles]
        if k and cycles:  # pooled over every task: what a deployment's traffic mixes
            results.setdefault("acceptance", {})[name] = {
                "conditional": [round(c, 4) for c in conditional_acceptance(cycles, k)],
                "cycles": len(cycles),
            }
    for name, p in pipelines.items():
        if p.drafter.method == "eagle3":
            results.setdefault("eagle3_chain_time_s", {})[name] = {
                str(k): round(s, 6) for k, s in time_eagle3_chain(p.drafter, 256, [3, 7, 15]).items()
            }
        if isinstance(p.drafter, DFlashDrafter) and p.drafter.method == "dflash":
            results.setdefault("dflash_block_time_s", {})[name] = {
                str(b): round(s, 6) for b, s in time_dflash_block(p.drafter, 256, [4, 8, 16]).items()
            }
    return results


def check_cell(row: dict) -> str:
    """A row's mismatches against its reference (greedy, or Gumbel-coupled), with its partings at
    near-ties (bf16/fp16) when there are any; "–" where texts cannot be compared (rejection
    sampling, transformers' sampled columns)."""
    key = next((k for k in ("greedy", "sampled") if f"{k}_mismatches" in row), None)
    if key is None:
        return "–"
    ties = row.get(f"{key}_near_ties", 0)
    return f"{row[f'{key}_mismatches']}" + (f" (+{ties} at near-ties)" if ties else "")


def check_header(results: dict) -> str:
    """The column of `check_cell`."""
    sampled = results.get("sampling", {}).get("temperature", 0.0) > 0
    return "texts ≠ the target alone's (coupled)" if sampled else "greedy mismatches"


def markdown_table(results: dict) -> str:
    lines = [f"| task | method | τ | tokens/s | speedup | {check_header(results)} |",
             "|---|---|---|---|---|---|"]
    for task, rows in results["tasks"].items():
        for name, r in rows.items():
            tau = f"{r['tau']:.2f}" if "tau" in r else "–"
            speedup = f"{r['speedup']:.2f}×" if "speedup" in r else "–"
            lines.append(f"| {task} | {name} | {tau} | {r['tokens_per_s']:.1f} | {speedup} | "
                         f"{check_cell(r)} |")
    return "\n".join(lines)
