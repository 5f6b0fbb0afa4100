"""What one generation measured: τ, acceptance by position, timings."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from trtspec.spec.logprobs import TokenLogprobs


@dataclass(slots=True)
class GenerationResult:
    prompt_len: int
    num_draft_tokens: int  # k the drafter was configured with
    # prompt tokens whose K/V a previous request left in its slot (prefix reuse), not prefilled again
    cached_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)  # generated ids only
    num_target_calls: int = 0  # prefill included
    num_drafted: int = 0
    num_accepted: int = 0
    num_predicted: int = 0  # drafts taken from the request's prediction (predicted outputs)
    num_prediction_accepted: int = 0  # of them, those accepted
    # drafts copied from the request's own tokens (prompt lookup; counted in num_drafted too)
    num_looked_up: int = 0
    num_lookup_accepted: int = 0  # of them, those accepted (counted in num_accepted too)
    num_pooled: int = 0  # of the copies, those from other requests' tokens (lookup.pool_tokens)
    num_pool_accepted: int = 0  # of them, those accepted
    accept_counts: list[int] = field(default_factory=list)  # accepted drafts per cycle
    drafted_counts: list[int] = field(default_factory=list)  # drafts offered per cycle
    prefill_s: float = 0.0
    draft_s: float = 0.0
    total_s: float = 0.0
    logprobs: TokenLogprobs | None = None  # of token_ids, when the request asked for them
    prompt_logprobs: TokenLogprobs | None = None  # of the prompt's tokens after its first, when asked
    seed: int | None = None  # a sampled request's seed, drawn when it gave none; None when greedy
    # "stop": an end or stop id, or its on_tokens ended it (a stop word); "length": max_new_tokens
    finish_reason: Literal["stop", "length"] | None = None
    # why the request could not go on (`SpeculativeDecoder._dead_end`); token_ids: those before
    error: str | None = None

    def record_cycle(self, num_drafted: int, num_accepted: int) -> None:
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        self.drafted_counts.append(num_drafted)
        self.accept_counts.append(num_accepted)

    @property
    def tau(self) -> float:
        """Tokens emitted per target forward, bonus included (the prefill emits one)."""
        return len(self.token_ids) / max(1, self.num_target_calls)

    @property
    def decode_s(self) -> float:
        return self.total_s - self.prefill_s

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, over the time after prefill."""
        return (len(self.token_ids) - 1) / self.decode_s if self.decode_s > 0 else 0.0

    def acceptance_by_position(self) -> list[float]:
        """P(draft i accepted | offered), i = 1..k, over this request's cycles: the suffix-decay
        curve; 0 where it never offered draft i."""
        cycles = zip(self.drafted_counts, self.accept_counts, strict=True)
        return [r or 0.0 for r in acceptance_by_position(cycles, self.num_draft_tokens)]

    def to_dict(self) -> dict:
        return {
            "token_ids": self.token_ids,
            "num_generated": len(self.token_ids),
            "tau": round(self.tau, 4),
            "cached_tokens": self.cached_tokens,
            "num_target_calls": self.num_target_calls,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "acceptance_by_position": [round(r, 4) for r in self.acceptance_by_position()],
            "prefill_s": round(self.prefill_s, 6),
            "draft_s": round(self.draft_s, 6),
            "decode_s": round(self.decode_s, 6),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "finish_reason": self.finish_reason,
            **({} if self.seed is None else {"seed": self.seed}),
            **({"num_looked_up": self.num_looked_up, "num_lookup_accepted": self.num_lookup_accepted}
               if self.num_looked_up else {}),
            **({"num_pooled": self.num_pooled, "num_pool_accepted": self.num_pool_accepted}
               if self.num_pooled else {}),
        }


def acceptance_by_position(cycles: Iterable[tuple[int, int]], k: int) -> list[float | None]:
    """P(draft j accepted | offered), j = 1..k, from (drafted, accepted) pairs, one per draft–verify
    cycle (of one request, or pooled over many as `trtspec bench` does); None where no cycle
    offered draft j."""
    pairs = list(cycles)
    rates = []
    for j in range(1, k + 1):
        offered = sum(1 for drafted, _ in pairs if drafted >= j)
        passed = sum(1 for drafted, accepted in pairs if drafted >= j and accepted >= j)
        rates.append(passed / offered if offered else None)
    return rates
