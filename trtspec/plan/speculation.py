"""Speculation under load, planned per batch size: TensorRT-LLM's `draft_len_schedule` and the
acceptance-rate cut-off, from the roofline step cost and the drafter's acceptance by position.

For each batch size b of the deployment (1..max_batch_size) `spec.cost.best_draft_len` picks the
draft length k that maximises expected tokens per second, Σ E_k / T(b, k), with T the roofline of
`trtspec.plan.roofline` (the same cost model the adaptive serving core uses with measured T).
TensorRT-LLM's rules shape the result (llm_args.DecodingBaseConfig, see trtspec/trtllm/fields.py):
the schedule maps batch-size thresholds to draft lengths, `{4: 4, 8: 2}` meaning b ≤ 4 drafts 4,
4 < b ≤ 8 drafts 2 and larger batches do not speculate; its smallest key must map to
max_draft_len; every length lies in 0..max_draft_len. trtspec also keeps lengths non-increasing in
b, so a growing batch never drafts more: k(1) = max_draft_len, then each b takes the best length no
longer than k(b − 1).

`acceptance_rate_threshold`: TensorRT-LLM turns speculation off for good once the rolling rate
accepted/drafted over `acceptance_rate_window_size` iterations drops below it. It is set where
speculation stops paying even at batch 1 (where it pays most): the acceptance rate of a drafter
whose conditional acceptance c is the same at every position and whose k(1) drafts break even with
plain decoding, 1 + c + … + c^k = T(1, k) / T(1, 0).

Acceptance by position, first found of: `deployment.acceptance_by_position`; `acceptance.json`
beside the drafter's weights (`trtspec bench --write-acceptance`); the method's default below, a
constant conditional rate solved from a published mean τ at a published draft length.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.config import BuildConfig
from trtspec.errors import ConfigError
from trtspec.plan.roofline import RooflineCost
from trtspec.spec.cost import ACCEPTANCE_FILE, best_draft_len, expected_tokens, load_acceptance, survival

# method -> (mean τ, draft length it was measured at, where it was published)
DEFAULT_TAU = {
    "dflash": (6.49, 15, "DFlash paper (arXiv 2602.06036): Qwen3-8B, block 16, temperature 0, 4-task mean"),
    "dspark": (3.72, 7, "DSpark (deepseek-ai/DeepSpec): Qwen3-8B, block 7, temperature 1, MT-Bench"),
    "eagle3": (2.96, 16, "DFlash paper's EAGLE-3 (16) baseline: Qwen3-8B, temperature 0, 4-task mean"),
}


def constant_rate(tau: float, k: int) -> float:
    """The conditional rate c, the same at every position, with 1 + c + … + c^k = tau."""
    if not 1 <= tau <= k + 1:
        raise ConfigError(f"mean τ {tau} is impossible with {k} drafts (1 ≤ τ ≤ {k + 1})")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(survival([mid] * k), k) < tau else (lo, mid)
    return (lo + hi) / 2


def drafter_acceptance(config: BuildConfig, k: int) -> tuple[list[float], str]:
    """Conditional acceptance c_1..c_k of the config's drafter and where it came from."""
    dep, drafter = config.deployment, config.drafter
    rates, source = None, ""
    if dep is not None and dep.acceptance_by_position is not None:
        rates, source = dep.acceptance_by_position, "deployment.acceptance_by_position"
    elif drafter.resolved_path.is_dir() and (drafter.resolved_path / ACCEPTANCE_FILE).is_file():
        rates, source = load_acceptance(drafter.resolved_path), str(drafter.resolved_path / ACCEPTANCE_FILE)
    if rates is not None:
        if len(rates) < k:
            raise ConfigError(f"{source}: {len(rates)} positions measured, drafter.num_draft_tokens is {k}; "
                              f"measure at least {k} (trtspec bench --write-acceptance)")
        return [float(r) for r in rates[:k]], source
    if drafter.method not in DEFAULT_TAU:
        raise ConfigError(f"config {config.name!r}: no acceptance for drafter method {drafter.method!r}: set "
                          "deployment.acceptance_by_position or put acceptance.json beside the drafter "
                          "(trtspec bench --write-acceptance)")
    tau, at_k, cite = DEFAULT_TAU[drafter.method]
    c = constant_rate(tau, at_k)
    return [c] * k, f"default c = {c:.3f} per position from τ {tau} at k = {at_k} ({cite})"


@dataclass(frozen=True, slots=True)
class SpeculationPlan:
    max_draft_len: int
    acceptance: list[float]  # conditional c_1..c_k
    acceptance_source: str
    draft_len: list[int]  # schedule's length at batch b = index + 1
    best_len: list[int]  # unconstrained best length at each batch
    tokens_per_s: dict[str, list[float]]  # "schedule" / "always" / "never", per batch b = index + 1
    acceptance_rate_threshold: float
    acceptance_rate_window_size: int

    @property
    def draft_len_schedule(self) -> dict[int, int]:
        """TensorRT-LLM's form: the last batch size of each run of equal lengths -> that length."""
        schedule: dict[int, int] = {}
        for b, k in enumerate(self.draft_len, start=1):
            if b == len(self.draft_len) or self.draft_len[b] != k:
                schedule[b] = k
        return schedule

    def rate(self, which: str, batch: int) -> float:
        return self.tokens_per_s[which][batch - 1]


def _rate(cost: RooflineCost, surv: list[float], batch: int, k: int) -> float:
    return batch * expected_tokens(surv, k) / cost.seconds(batch, k)


def _threshold(cost: RooflineCost, k: int) -> float:
    """Acceptance rate (accepted / drafted) at which k drafts at batch 1 break even with none."""
    if k == 0:
        return 0.0
    needed = cost.seconds(1, k) / cost.seconds(1, 0)  # tokens per step that pay for the step
    if needed >= k + 1:
        return 1.0
    c = constant_rate(max(needed, 1.0), k)
    return sum(survival([c] * k)) / k


def plan_speculation(config: BuildConfig) -> SpeculationPlan:
    """Draft length per batch size, predicted tokens/s, and TensorRT-LLM's acceptance cut-off."""
    dep, drafter = config.deployment, config.drafter
    if dep is None:
        raise ConfigError(f"config {config.name!r} has no `deployment:` section to plan speculation for")
    if drafter is None:
        raise ConfigError(f"config {config.name!r} has no drafter")
    from trtspec.trtllm.args import draft_len_of

    k_max = draft_len_of(config)
    rates, source = drafter_acceptance(config, k_max)
    surv = survival(rates)
    cost = RooflineCost(dep, drafter.method)
    chosen, best, curves = [], [], {"schedule": [], "always": [], "never": []}
    for b in range(1, dep.max_batch_size + 1):
        fits = max(0, min(k_max, dep.max_num_tokens // b - 1))  # b·(k+1) tokens in one forward
        k_best, _ = best_draft_len(cost, [surv] * b, fits)
        best.append(k_best)
        if b == 1:
            k = k_max  # TensorRT-LLM: the smallest key maps to max_draft_len
        else:
            k, _ = best_draft_len(cost, [surv] * b, min(fits, chosen[-1]))
        chosen.append(k)
        curves["schedule"].append(_rate(cost, surv, b, k))
        curves["always"].append(_rate(cost, surv, b, k_max if fits >= k_max else 0))
        curves["never"].append(_rate(cost, surv, b, 0))
    return SpeculationPlan(
        max_draft_len=k_max,
        acceptance=rates,
        acceptance_source=source,
        draft_len=chosen,
        best_len=best,
        tokens_per_s=curves,
        acceptance_rate_threshold=round(_threshold(cost, k_max), 4),
        acceptance_rate_window_size=dep.acceptance_rate_window_size,
    )


def plan_batches(max_batch_size: int) -> list[int]:
    """Batch sizes `trtspec inspect` prints: powers of two, then the largest."""
    out, b = [], 1
    while b < max_batch_size:
        out.append(b)
        b *= 2
    return out + [max_batch_size]


def format_speculation(plan: SpeculationPlan, max_batch_size: int, written: bool, full: bool = False) -> str:
    """Human-readable schedule and predicted tokens/s for `trtspec inspect`; `full`: drafter.schedule.mode
    full, which drafts max_draft_len at every batch size (neither the schedule nor the threshold is used)."""
    where = "written to speculative_config" if written else "not written (see trtspec/trtllm/fields.py)"
    if full:
        where = f"not used: drafter.schedule.mode full drafts k = {plan.max_draft_len} always"
    lines = [
        f"acceptance {', '.join(f'{c:.2f}' for c in plan.acceptance)} (conditional, by position)",
        f"           from {plan.acceptance_source}",
        f"draft_len_schedule {plan.draft_len_schedule} ({where})",
        f"acceptance_rate_threshold {plan.acceptance_rate_threshold} over "
        f"acceptance_rate_window_size {plan.acceptance_rate_window_size} iterations"
        + (" (not used: mode full)" if full else ""),
        "predicted tokens/s per replica (roofline, trtspec/plan/roofline.py):",
        f"{'batch':>7} {'k':>3} {'schedule':>11} {f'always k={plan.max_draft_len}':>12} {'never':>11} "
        f"{'vs never':>9}",
    ]
    for b in plan_batches(max_batch_size):
        sched, never = plan.rate("schedule", b), plan.rate("never", b)
        lines.append(f"{b:>7} {plan.draft_len[b - 1]:>3} {sched:>11,.0f} {plan.rate('always', b):>12,.0f} "
                     f"{never:>11,.0f} {sched / never:>8.2f}×")
    if full:
        lines.append(f"mode full runs the `always k={plan.max_draft_len}` column; the schedule column is "
                     "what drafter.schedule.mode adaptive would run")
    if plan.rate("always", 1) < plan.rate("never", 1):
        lines.append("warning: this drafter loses to plain decoding even at batch 1; drop it or improve it")
    elif plan.best_len[0] != plan.max_draft_len:
        lines.append(f"note: at batch 1 the cost model prefers k = {plan.best_len[0]}; TensorRT-LLM makes "
                     f"the schedule start at max_draft_len = {plan.max_draft_len} (drafter.num_draft_tokens)")
    return "\n".join(lines)
