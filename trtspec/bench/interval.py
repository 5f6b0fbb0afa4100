"""How far a pooled speedup could move with other prompts of the same tasks: a paired bootstrap.

A speedup in the bench table is a ratio of sums, Σ_i t_none(i) / Σ_i t_m(i) over the prompts i, every
method timing each prompt back to back. Drawing each task's prompts again with replacement (one draw
for both methods, so each prompt keeps its pair of timings; within each task, so the mix of tasks
stays the run's) and recomputing the ratio many times gives its sampling distribution, and its 2.5
and 97.5 percentiles bound a 95 % interval (Efron's percentile bootstrap, stratified by task). The
interval holds what the prompts of a task differ in (how well each one drafts) and the timing noise
of each prompt's runs. Two runs on the same prompts differ by the noise alone (docs/bench/revisions.md
measures it), so their figures usually lie well inside each other's interval; a revision's figure
outside the other's interval is more than noise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LEVEL = 0.95
DRAWS = 4000
MIN_PROMPTS = 8  # fewer prompts, or a task with fewer than 2: a bootstrap says little; no interval


def ratio_interval(base: Sequence[float], other: Sequence[float], tasks: Sequence[str] | None = None,
                   level: float = LEVEL, draws: int = DRAWS, seed: int = 0) -> tuple[float, float]:
    """The `level` percentile-bootstrap interval of Σ base / Σ other, the prompts resampled in pairs
    within their task. base, other: seconds per prompt [n], index i the same prompt in both;
    tasks: each prompt's task [n] (None: one task)."""
    t_base, t_other = np.asarray(base, dtype=float), np.asarray(other, dtype=float)
    if t_base.ndim != 1 or t_base.shape != t_other.shape or not len(t_base):
        raise ValueError(f"paired timings needed, got {t_base.shape} and {t_other.shape}")
    labels = np.asarray(tasks if tasks is not None else [""] * len(t_base))
    if labels.shape != t_base.shape:
        raise ValueError(f"one task per prompt needed, got {labels.shape} for {t_base.shape}")
    rng = np.random.default_rng(seed)
    sum_base, sum_other = np.zeros(draws), np.zeros(draws)  # [draws] each
    for task in np.unique(labels):
        rows = np.flatnonzero(labels == task)
        picks = rows[rng.integers(0, len(rows), size=(draws, len(rows)))]  # [draws, n_task]
        sum_base += t_base[picks].sum(1)
        sum_other += t_other[picks].sum(1)
    low, high = np.quantile(sum_base / sum_other, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)
