"""A drafter's acceptance by position, measured by `trtspec bench` and stored beside its weights.

The cost model (`trtspec.spec.cost`) wants the conditional rates c_j = P(draft j accepted | drafts
1..j-1 were): a_j = c_1 ⋯ c_j is then the survival of draft j. Pooling cycles over every prompt
gives c_j as (cycles that accepted j drafts or more) / (cycles that offered draft j and accepted
the j-1 before it); a cycle that offered fewer than j drafts (a scheduler cut, the end of a request)
says nothing about position j and is left out. `GenerationResult.acceptance_by_position` is the
other quantity, P(draft j accepted | offered) = survival, averaged per request.
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
        return int(json.loads(path.read_text()).get("cycles", 0))
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
