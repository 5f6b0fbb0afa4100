"""The cost model behind adaptive speculation: expected tokens per step over seconds per step.

A step of the serving loop drafts k tokens for each of R running requests, then verifies them in
one target forward. With a_j the probability that draft j of a request survives (is accepted
together with every draft before it), that request emits in expectation

    E_k = 1 + a_1 + … + a_k        (the recovered/bonus token is always emitted)

and the step costs T(R, k) = T_draft(R, k) + T_target(R·(k + 1) tokens) + T_loop(R) seconds (k = 0:
no drafting, plain decoding; T_loop is the loop's own verification and bookkeeping, 0.3 ms or
about 6 % of a plain step at R = 8 on the 2-core CPU, shared by all the tokens a step emits). A
request that drafts again after steps without drafting also makes the drafter catch up first (absorb
what those steps cached: EAGLE-3 up to 32 positions at 25 µs each at R = 8, a probe's whole batch
6 ms against a 5 ms plain step), and that time is added for each such request, spread over the
steps it is then expected to draft (at most 8, `SpeculativeDecoder._catch_up_seconds`): paid once,
it lets the request draft on, and charged whole to one step it would keep a batch plain. A
step that also feeds P prompt tokens of new requests (chunked prefill) adds what they cost beside
the R·(k + 1) (`SPSTable.step_seconds`). The best draft length for the batch maximises
Σ_r E_k(r) / T(R, k).
Only acceptance history and confidences enter, never the current drafts' verdict, so the choice
cannot bias the output (`spec.schedule` explains why that matters).

Where the numbers come from: `a_j` from a drafter's measured acceptance by position (the
conditional rates P(draft j accepted | drafts < j were), multiplied up), from a request's own
running counts, or from DSpark's confidences; T from `trtspec profile` on the serving machine
(`MeasuredCost`) or, for a GPU deployment planned on a CPU machine, from a roofline in
`trtspec.plan`. Both implement `StepCost`.

Draft trees (`trtspec.spec.tree`) are sized by the same table. A tree of N nodes costs a target
forward over N + 1 tokens per request; where that forward is memory-bound (a GPU up to tens of
tokens) extra nodes are nearly free, on a CPU they are not. `tree_budget` gives the largest N whose
verification costs at most (1 + slack) × a chain's of the same drafter — what `trtspec profile`
prints and `drafter.tree.nodes` should be set to. In adaptive mode `tree_rows` then admits, per
step, the requests whose expected gain (from their acceptance history) pays for their tree.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from trtspec.errors import ConfigError

if TYPE_CHECKING:
    from trtspec.spec.schedule import SPSTable

ACCEPTANCE_FILE = "acceptance.json"  # stored beside a drafter's weights
# step prices a MeasuredCost keeps, the least recently read going first. A plan reads one price per
# (k, admitted rows) at the step's batch and context (120 at R = 8, k = 15), and the context moves as
# requests grow, so every price kept grew the memo for good: 0.87 M prices (133 MB) after 20,000 plans
# at R <= 8 and 32k positions, with no end. 4,096 hold the plans of many steps (0.7 MB)
COST_MEMO = 4096


class StepCost(Protocol):
    def seconds(self, batch: int, draft_len: int) -> float:
        """Wall time of one step for `batch` requests each verifying `draft_len` drafts (0 = none)."""
        ...


def survival(conditional: Sequence[float]) -> list[float]:
    """a_j = ∏_{i≤j} c_i from conditional acceptance rates c_1..c_k."""
    out, running = [], 1.0
    for c in conditional:
        running *= min(1.0, max(0.0, float(c)))
        out.append(running)
    return out


def expected_tokens(surv: Sequence[float], k: int) -> float:
    """Tokens one request emits in expectation when it verifies its first k drafts."""
    return 1.0 + float(sum(surv[:k]))


def best_draft_len(cost: StepCost, survivals: Sequence[Sequence[float]], k_max: int,
                   min_gain: float = 0.0) -> tuple[int, float]:
    """The k in 0..k_max that maximises expected tokens per second of a step for these requests
    (one survival curve each), and that rate. Drafting (k > 0) must beat plain decoding by the
    factor 1 + `min_gain`: a margin for the estimates' error where the two are close. Ties go to
    the shorter draft."""
    batch = len(survivals)
    if batch == 0:
        return 0, 0.0
    plain = batch / cost.seconds(batch, 0)
    best_k, best_rate = 0, plain
    tokens = float(batch)  # Σ_rows expected_tokens(s, k), grown one position at a time
    for k in range(1, k_max + 1):
        tokens += sum(s[k - 1] for s in survivals if len(s) >= k)
        rate = tokens / cost.seconds(batch, k)
        if rate > best_rate and rate >= (1.0 + min_gain) * plain:
            best_k, best_rate = k, rate
    return best_k, best_rate


def admit_rows(cost: MeasuredCost, survivals: Sequence[Sequence[float]], k_max: int,
               min_gain: float = 0.0, context: int | None = None,
               catch_up: Sequence[float] | None = None, prompt: int = 0,
               copies: bool = False) -> tuple[int, list[int]]:
    """The draft length k and the requests that draft it (indices into `survivals`), the others
    decoding plainly in the same target forward: for each k the requests are ranked by their
    expected gain a_1 + … + a_k and the best prefix of that ranking is taken, the (k, prefix)
    with the most expected tokens per second winning. A request's survival curve may be shorter
    than k (its remaining budget): it then drafts that many. Drafting must beat plain decoding by
    the factor 1 + `min_gain`; ties go to fewer requests and shorter drafts. ([] when none pays.)
    `context`: the cached tokens the step's attention reads per request (`SPSTable.step_seconds`).
    `catch_up`: seconds each request's catch-up adds to a step it drafts in (`SPSTable.catch_up_time`:
    what its drafter must absorb first after steps without drafting); requests are then ranked by
    their gain less the tokens plain decoding would emit in that time.
    `prompt`: new requests' prompt tokens the step's forward feeds too (chunked prefill): they make
    the step dearer whatever k is, so drafting pays more easily (`SPSTable.step_seconds`).
    `copies`: the drafts are copied, not drafted (prompt lookup, `spec.lookup`): no drafter time;
    a request with an empty curve has none to send and is never admitted."""
    batch = len(survivals)
    if batch == 0:
        return 0, []
    plain = batch / cost.step(batch, 0, 0, 0, context, prompt)
    extra = list(catch_up) if catch_up is not None else [0.0] * batch
    best_k, best_rows, best_rate = 0, [], plain * (1.0 + min_gain)
    gains = [0.0] * batch
    for k in range(1, k_max + 1):
        for r, s in enumerate(survivals):
            if len(s) >= k:
                gains[r] += s[k - 1]
        net = [g - plain * e for g, e in zip(gains, extra, strict=True)]  # tokens less the catch-up's
        order = sorted((r for r in range(batch) if survivals[r]), key=lambda r: -net[r])
        tokens, verified, paid = float(batch), 0, 0.0
        for n, r in enumerate(order, start=1):
            tokens += gains[r]
            verified += min(k, len(survivals[r]))
            paid += extra[r]
            rate = tokens / (cost.step(batch, 0 if copies else n, k, verified, context, prompt) + paid)
            if rate > best_rate:
                best_k, best_rows, best_rate = k, order[:n], rate
    return best_k, sorted(best_rows)


def load_acceptance(drafter_dir: Path) -> list[float] | None:
    """The conditional acceptance by position stored beside a drafter (`acceptance.json`,
    {"acceptance_by_position": [c_1, …, c_k], "measured_with": "<command>"}), or None."""
    path = Path(drafter_dir) / ACCEPTANCE_FILE
    if not path.is_file():
        return None
    try:
        given = json.loads(path.read_text(encoding="utf-8"))["acceptance_by_position"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: expected {{\"acceptance_by_position\": [floats]}} ({exc})") from None
    if not isinstance(given, list):  # float() over a string's characters read "10" as [1.0, 0.0]
        raise ConfigError(f"{path}: acceptance_by_position must be a list of rates in [0, 1], got {given!r}")
    # numbers only (float() read the string "0.5" and true as rates); NaN is outside [0, 1] too
    bad = [r for r in given if isinstance(r, bool) or not isinstance(r, int | float) or not 0 <= r <= 1]
    if bad or not given:
        raise ConfigError(f"{path}: acceptance_by_position must be rates in [0, 1], one or more"
                          + (f", got {bad[0]!r}" if bad else ""))
    return [float(r) for r in given]


class MeasuredCost:
    """Step time from a `trtspec profile` table measured on the serving machine: the drafter's
    time at (batch, draft length), one target forward over batch·(k + 1) tokens, and the loop's
    own time at that batch."""

    def __init__(self, table: SPSTable, memo: int = COST_MEMO):
        self.table = table
        self.memo = memo  # prices kept (the table is fixed: a price, once read, holds)
        self._seconds: OrderedDict[tuple, float] = OrderedDict()

    def seconds(self, batch: int, draft_len: int) -> float:
        return self.step(batch, batch if draft_len else 0, draft_len, batch * draft_len)

    def step(self, batch: int, drafting: int, draft_len: int, drafts: int,
             context: int | None = None, prompt: int = 0) -> float:
        """Seconds of a step of `batch` requests of which `drafting` draft `draft_len` tokens and
        send `drafts` of them in all to the target (the rest feed their last token alone), each
        request's attention reading `context` cached tokens (None: the table's own context), and
        the forward feeding `prompt` tokens of new requests' prompts beside them."""
        key = (batch, drafting, draft_len, drafts, context, prompt)
        seconds = self._seconds.get(key)
        if seconds is not None:
            self._seconds.move_to_end(key)
            return seconds
        verify = self.table.step_seconds(batch, batch + drafts, context, prompt)
        draft = self.table.draft_time(drafting, draft_len) if drafting and draft_len else 0.0
        seconds = self._seconds[key] = verify + draft + self.table.loop_time(batch)
        if len(self._seconds) > self.memo:
            self._seconds.popitem(last=False)
        return seconds


DEFAULT_CONDITIONAL = 0.7  # P(draft j accepted | drafts < j were) before anything is measured


class AcceptanceTracker:
    """Conditional acceptance by draft position, c_j = P(draft j accepted | drafts < j were), from
    counts of what was verified: after a step that verified L drafts and accepted a, positions
    1..min(a + 1, L) were tested and 1..a passed (later positions were never tested).

    `prior` (a population tracker, or fixed rates) stands in for positions with few counts; with
    `decay` < 1 old counts fade at each observation, so a request's estimate follows the phase it
    is in (a run of boilerplate, then free text) rather than its whole history. A request that
    stopped drafting learns again from the loop's probes (`SpeculativeDecoder._probe`)."""

    def __init__(self, num_positions: int, prior: AcceptanceTracker | Sequence[float] | None = None,
                 prior_weight: float = 4.0, decay: float = 1.0):
        self.tested = [0.0] * num_positions
        self.passed = [0.0] * num_positions
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self.version = 0  # observations so far: a tracker that leans on this one re-reads it after each
        self._rates: list[float] | None = None  # conditional(j) for every j, while _seen still holds
        self._seen: tuple[int, int] = (-1, -1)  # (own version, prior's version) _rates were made at

    def _prior(self, j: int) -> float:
        if isinstance(self.prior, AcceptanceTracker):
            return self.prior.rates()[j]
        if self.prior is not None and j < len(self.prior):
            return float(self.prior[j])
        return DEFAULT_CONDITIONAL

    def rates(self) -> list[float]:
        """conditional(j) for every position (kept until this tracker or its prior tracker observes
        again: a population tracker is read by every request of every step)."""
        seen = (self.version, self.prior.version if isinstance(self.prior, AcceptanceTracker) else 0)
        if seen != self._seen:
            self._rates, self._seen = [self.conditional(j) for j in range(len(self.tested))], seen
        return self._rates

    def conditional(self, j: int) -> float:
        """Estimated c_{j+1} (0-based j)."""
        w = self.prior_weight
        return (self.passed[j] + w * self._prior(j)) / (self.tested[j] + w)

    def survival(self, k: int) -> list[float]:
        return survival(self.rates()[:k])

    def observe(self, verified: int, accepted: int) -> None:
        self.version += 1
        if self.decay < 1.0:
            self.tested = [t * self.decay for t in self.tested]
            self.passed = [p * self.decay for p in self.passed]
        for j in range(min(accepted + 1, verified)):
            self.tested[j] += 1.0
            self.passed[j] += float(j < accepted)


class GainCalibration:
    """Accepted drafts over what the acceptance estimates expected, over recent drafting steps.

    The per-position estimates are biased where it matters: the requests admitted to draft are
    those whose estimate is highest (the winner's curse), and positions a request has rarely
    reached lean on the drafter's pooled rates, high at late positions because only easy runs get
    there. Measured on DFlash at R = 8 on chat, the admitted rows accepted about 70 % of what was
    expected, and drafting lost to plain decoding. Scaling the expected gains by this running ratio
    corrects that from the verdicts of past steps only (never the current drafts': lossless)."""

    def __init__(self, decay: float = 0.98, prior_weight: float = 4.0):
        self.decay, self.prior_weight = decay, prior_weight
        self.expected = self.accepted = 0.0

    def observe(self, expected: float, accepted: float) -> None:
        """One drafting step: Σ over its rows of the expected and the accepted drafts."""
        self.expected = self.decay * self.expected + expected
        self.accepted = self.decay * self.accepted + accepted

    @property
    def factor(self) -> float:
        return (self.accepted + self.prior_weight) / (self.expected + self.prior_weight)

    def scale(self, surv: Sequence[float]) -> list[float]:
        """A survival curve with its gains scaled by `factor` (each a_j kept ≤ 1)."""
        f = self.factor
        return [min(1.0, a * f) for a in surv]


def tree_draft_seconds(table: SPSTable, rows: int, depth: int, per_depth_forward: bool, topk: int) -> float:
    """Drafting time of `rows` trees: a block drafter's one forward (its time at (rows, depth)); a
    chain drafter forwards rows·K frontier nodes per depth, timed as a chain over rows·K requests."""
    return table.draft_time(rows * topk if per_depth_forward else rows, depth)


def tree_rows(table: SPSTable, expected: Sequence[float], batch: int, nodes: int, depth: int,
              per_depth_forward: bool, topk: int, min_gain: float = 0.0, context: int | None = None,
              catch_up: Sequence[float] | None = None, prompt: int = 0) -> list[int]:
    """Which requests draft a tree this step (indices into `expected`, each request's expected tokens
    from a tree step), out of `batch` running ones: the most promising first, the prefix that
    maximises the step's tokens per second (none at all unless it beats plain decoding by
    `min_gain`, as `admit_rows` asks of chains). `context`, `catch_up` and `prompt` as `admit_rows` takes
    them: the target forward priced at the requests' context, each request's catch-up paid by
    the step it drafts in, and requests ranked by their gain less what plain decoding would emit
    in that time."""
    loop = table.loop_time(batch)
    plain = batch / (table.step_seconds(batch, batch, context, prompt) + loop)
    extra = list(catch_up) if catch_up is not None else [0.0] * len(expected)
    order = sorted(range(len(expected)), key=lambda j: -(expected[j] - plain * extra[j]))
    best_n, best_rate = 0, plain * (1.0 + min_gain)
    tokens, paid = float(batch), 0.0
    for n, j in enumerate(order, start=1):
        tokens += expected[j] - 1.0
        paid += extra[j]
        seconds = tree_draft_seconds(table, n, depth, per_depth_forward, topk) + \
            table.step_seconds(batch, batch + n * nodes, context, prompt) + loop + paid
        if tokens / seconds > best_rate:
            best_n, best_rate = n, tokens / seconds
    return sorted(order[:best_n])


def tree_budget(table: SPSTable, chain_len: int, slack: float = 0.1, most: int = 256) -> int:
    """The most tree nodes N whose target forward (N + 1 tokens) costs at most (1 + slack) × the
    chain's (chain_len + 1 tokens) on this machine; at least chain_len."""
    limit = (1.0 + slack) / table.sps(chain_len + 1)
    best = chain_len
    for n in range(chain_len, most + 1):
        if 1.0 / table.sps(n + 1) <= limit:
            best = n
    return best
