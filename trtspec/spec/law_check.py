"""A goodness-of-fit test of sampled tokens against their exact law, calibrated by simulation.

`trtspec verify` draws n seeded requests and compares the law of each of the first few generated
tokens with the target's exact one (walked over its top-k tree). Per position the statistic is the
total-variation distance TV between the empirical law of the n draws and the exact law; its
p-value is the chance that n draws from the exact law itself give a TV at least as large, counted
over `SIMULATIONS` multinomial samples of n from that law (seeded, so a verdict repeats):

    p = (1 + #{simulated TV ≥ observed TV}) / (1 + SIMULATIONS)

which is a valid p-value for any number of simulations (the observed TV is one more draw of the
same statistic when the law is right). A token the exact law gives probability 0 cannot come from
it: its position's p-value is 0. The positions are tested together at `alpha` by Bonferroni (each
at alpha / positions), so a correct deployment fails with probability at most alpha in all.

This replaces a distribution-free bound (Bretagnolle–Huber–Carol, TV ≤ sqrt((K ln 2 + ln 1/δ) / 2n)),
which holds for every law of support K and is therefore loose for the one at hand: at n = 400 it let
a third token's TV reach 0.18, and slips of the acceptance rule that move the law by 0.05–0.1 passed
(docs/EVAL.md, "How strong `trtspec verify`'s sampling test is").
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

SIMULATIONS = 20_000  # resolution 5e-5 of each p-value, under alpha / positions at the default alpha
SIMULATION_SEED = 0


@dataclass(slots=True)
class PositionCheck:
    """One generated position: n draws against its exact law."""

    draws: int
    support: int  # outcomes (tokens, or texts) of positive exact probability
    tv: float  # total variation between the draws' empirical law and the exact one
    p_value: float  # P(TV ≥ observed | the exact law); 0 when a draw has exact probability 0
    outside: int  # draws of outcomes the exact law never emits


def total_variation(counts: dict[Hashable, int], law: dict[Hashable, float]) -> float:
    n = max(1, sum(counts.values()))
    return 0.5 * sum(abs(counts.get(t, 0) / n - law.get(t, 0.0)) for t in set(counts) | set(law))


def check_position(counts: dict[Hashable, int], law: dict[Hashable, float], simulations: int = SIMULATIONS,
                  seed: int = SIMULATION_SEED) -> PositionCheck:
    """The draws `counts` (outcome -> times drawn: a token id, or a whole text) of one position
    against its exact `law`."""
    n = sum(counts.values())
    tokens = [t for t, p in law.items() if p > 0]
    outside = sum(c for t, c in counts.items() if law.get(t, 0.0) <= 0)
    # the law as the simulations draw from it: a walked law's float products sum to 1 ± 1e-7, which
    # alone gave a one-token law's exact draws a TV above every simulated one (p at its floor)
    total = sum(law[t] for t in tokens)
    tv = total_variation(counts, {t: law[t] / total for t in tokens})
    if outside:
        return PositionCheck(n, len(tokens), tv, 0.0, outside)
    if n == 0:
        return PositionCheck(0, len(tokens), 0.0, 1.0, 0)
    probs = np.array([law[t] for t in tokens], dtype=np.float64)  # [K]
    probs /= probs.sum()
    sims = np.random.default_rng(seed).multinomial(n, probs, size=simulations)  # [S, K]
    sim_tv = 0.5 * np.abs(sims / n - probs).sum(-1)  # [S]
    # ties: the same counts give the same TV up to summation order, so compare with a margin
    exceed = int((sim_tv >= tv - 1e-12).sum())
    return PositionCheck(n, len(tokens), tv, (1 + exceed) / (1 + simulations), 0)


@dataclass(slots=True)
class LawCheck:
    """The first len(positions) generated tokens' laws, tested together at `alpha`."""

    positions: list[PositionCheck]
    alpha: float

    @property
    def level(self) -> float:
        """Each position's threshold: alpha shared equally (Bonferroni)."""
        return self.alpha / max(1, len(self.positions))

    def failed(self, pos: int) -> bool:
        return self.positions[pos].p_value <= self.level

    @property
    def passed(self) -> bool:
        return not any(self.failed(i) for i in range(len(self.positions)))


def check_law(counts: list[dict[Hashable, int]], laws: list[dict[Hashable, float]], alpha: float,
             simulations: int = SIMULATIONS, seed: int = SIMULATION_SEED) -> LawCheck:
    """Each position's draws `counts[i]` against its exact law `laws[i]`."""
    return LawCheck([check_position(c, law, simulations, seed + i)
                    for i, (c, law) in enumerate(zip(counts, laws, strict=True))], alpha)
