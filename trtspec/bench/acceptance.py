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


def write_acceptance(drafter_dir: Path, rates: list[float], cycles: int, measured_with: str) -> Path:
    """Write `acceptance.json` (the format `spec.cost.load_acceptance` reads) into drafter_dir."""
    path = Path(drafter_dir) / ACCEPTANCE_FILE
    body = {
        "acceptance_by_position": [round(r, 4) for r in rates],
        "cycles": cycles,
        "measured_with": measured_with,
    }
    path.write_text(json.dumps(body, indent=1) + "\n")
    return path
