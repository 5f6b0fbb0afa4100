"""A drafter's acceptance by position, measured by `trtspec bench` and stored beside its weights.

Both curves here pool draft–verify cycles (verify steps) over every request, as τ does (Σ tokens /
Σ target forwards) and as vLLM's spec-decode metrics do (mean acceptance length 1 + Σ accepted /
Σ drafts, per-position counts over all drafts): a request weighs by the steps it took, so these
describe the steps a deployment runs, not the average request. A cycle that offered fewer than j
drafts (a scheduler cut, the end of a request's budget) says nothing about position j and is left
out of position j's figure.

- `acceptance_by_position` (`trtspec.spec.metrics`, pooled here over every request's cycles):
  P(draft j accepted | offered) = (cycles that accepted j drafts or more)
  / (cycles that offered draft j), the survival curve `trtspec bench` reports and plots per task.
  Until 2026-12 bench averaged each request's own curve, a position the request never offered
  counting as 0.
- `conditional_acceptance`: c_j = P(draft j accepted | drafts 1..j-1 were) = (cycles that accepted
  j or more) / (cycles that offered draft j and accepted the j-1 before it), what the cost model
  (`trtspec.spec.cost`) wants: a_j = c_1 ⋯ c_j is then the survival of draft j.
A per-request view is each request's own τ (`generate`, `results.json` of `bench --url`, the
server's `trtspec_tau` histogram).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from trtspec.files import write_text
from trtspec.spec.cost import ACCEPTANCE_FILE


def conditional_acceptance(cycles: Iterable[tuple[int, int]], k: int) -> list[float]:
    """c_1..c_k from (drafted, accepted) pairs, one per draft–verify cycle; 0 where never reached."""
    pairs = list(cycles)
    rates = []
    for j in range(1, k + 1):
        reached = sum(1 for drafted, accepted in pairs if drafted >= j and accepted >= j - 1)
        passed = sum(1 for drafted, accepted in pairs if drafted >= j and accepted >= j)
        rates.append(passed / reached if reached else 0.0)
    return rates


def stored_cycles(drafter_dir: Path) -> int:
    """Cycles behind the `acceptance.json` stored beside a drafter: 0 when there is none (or it
    names no count, as a hand-written one)."""
    path = Path(drafter_dir) / ACCEPTANCE_FILE
    try:
        return int(json.loads(path.read_text(encoding="utf-8")).get("cycles", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def replace_refusal(drafter_dir: Path, cycles: int) -> str | None:
    """Why a measurement of `cycles` draft–verify cycles must not replace the stored one (a smaller
    sample would overwrite a better estimate silently), or None when it may."""
    stored = stored_cycles(drafter_dir)
    if cycles >= stored:
        return None
    return (f"{Path(drafter_dir) / ACCEPTANCE_FILE} not replaced: it was measured over {stored} cycles, "
            f"this run over {cycles}; measure more (--prompts, --max-tokens, --tasks) or delete the "
            "file to replace it")


def write_acceptance(drafter_dir: Path, rates: list[float], cycles: int, measured_with: str) -> Path:
    """Write `acceptance.json` (the format `spec.cost.load_acceptance` reads) into drafter_dir."""
    path = Path(drafter_dir) / ACCEPTANCE_FILE
    body = {
        "acceptance_by_position": [round(r, 4) for r in rates],
        "cycles": cycles,
        "measured_with": measured_with,
    }
    write_text(path, json.dumps(body, indent=1) + "\n")
    return path
