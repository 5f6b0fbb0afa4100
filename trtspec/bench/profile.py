"""`trtspec profile`: the serving machine's cost model — target steps per second at each verify batch
size B, and the drafter's seconds per step at each batch size R and draft length k.

Adaptive speculation and DSpark's prefix scheduler trade expected accepted tokens against the cost
of drafting and verifying them, so they need both curves. We measure them the way serving runs
them: `requests` sequences of `context` tokens in their slots, B new tokens spread over them
(round robin) in one packed forward, then rewound, so every repetition sees the same cache. The
step's shape matters as much as its size (R requests × t tokens each: each request's attention
reads its own context), so the target is also timed on the grid R ∈ DRAFT_BATCHES × t ≤ k + 1,
which is what adaptive speculation reads (`SPSTable.step_seconds`). Attention reads each request's
context, so the grid is timed twice: at `context` cached tokens and at a quarter of it (on more
slots, prefilled shorter), and a step is priced at its requests' context between the two (serving
contexts are mostly shorter than the profile's: the bench's chat prompts hold 34–62 tokens).

The drafter proposes for R of those requests at once, each time after a commit of one accepted
draft and its anchor (ACCEPTED_PER_STEP), as in serving: a drafter absorbs the taps or tokens the
last step accepted inside its proposal (EAGLE-3's catch-up pass, a draft model's feed), and a
proposal from an unchanged state would leave that out (EAGLE-3 at k = 1 then looks free).
Requests take turns so the contexts grow evenly (by a few dozen tokens over a profile).

A proposal after steps without drafting first absorbs everything they piled up (its catch-up:
EAGLE-3 up to its window of 32 positions per request, a draft model every missing token), which
can cost more than the drafting itself. So the drafter is also timed on requests of its own after
a commit of CATCH_UP_POSITIONS positions each against one of ACCEPTED_PER_STEP + 1, at each R:
`catch_up_seconds` is the difference per further position and request, which adaptive speculation
adds to a step for every request it would make draft again.

On a shared machine a burst of other work slows whatever cell is being timed, and a median of a
few repetitions can keep it (a bench run whose cost table was timed beside a test run read 16.5 ms
for 4 requests × 4 tokens each, against 7.7 and 9.2 ms for 3 and 5 tokens). Interference only ever
adds time, and more work never takes less, so each measured curve is replaced by its monotone
lower envelope (`monotone_envelope`): a cell costs at most what any cell with as many or more
requests, tokens or drafts cost. Slower drifts of the machine's speed (it runs 1.5-2x slower for
minutes at a time) scale every cell of a repetition alike, so each cell is the median of its ratio
to the plain step timed in the same repetition, times the plain step's median (`_paired_medians`).

Last, the serving loop's own time per step at each R (`loop_seconds`): R requests decoded plainly
through `SpeculativeDecoder`, minus the time inside the target's forward. Verification, emission and
bookkeeping cost 0.2–0.3 ms a step on a 2-core CPU (about 6 % of a plain step at R = 8); a cost
model without them prices drafting steps, which share that time among more tokens, a little too
high against plain ones.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import platform
import statistics
import time

import torch
from tqdm import tqdm

from trtspec.models.drafter import Drafter, DraftRow, NoDrafter
from trtspec.models.target import Chunk
from trtspec.spec.sampling import SamplingParams
from trtspec.spec.schedule import SPSTable

log = logging.getLogger(__name__)

DEFAULT_BATCHES = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]
DRAFT_BATCHES = [1, 2, 4, 8, 16, 32]
TOKENS_PER_ROW = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]  # t of the target's R × t grid, up to k + 1
ACCEPTED_PER_STEP = 1  # drafts accepted in the step before each timed proposal
SHORT_CONTEXT_DIVISOR = 4  # the second R × t grid is timed at context / 4 cached tokens
CATCH_UP_POSITIONS = 32  # positions per request a timed catch-up absorbs (EAGLE-3's window)
CATCH_UP_REPS = 5  # repetitions of the catch-up timing (each grows its requests' context)
CATCH_UP_PROMPT = 16  # cached tokens of the catch-up requests before their first proposal


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def draft_lens_to_measure(drafter: Drafter) -> list[int]:
    """A block drafter costs the same at every k (one pass), a chain drafter one pass per draft."""
    k_max = drafter.num_draft_tokens
    if drafter.method in ("dflash", "dspark"):
        return [k_max]
    return sorted({1, max(1, k_max // 2), k_max})


def profile_cost(target, drafter: Drafter | None = None, batch_tokens: list[int] | None = None,
                 requests: int = 8, context: int = 256, reps: int = 15, seed: int = 0,
                 max_batch: int = 8, progress: bool = True, verify_len: int = 0) -> SPSTable:
    """Median step times, B values (and R values) interleaved across repetitions. `verify_len`:
    drafts per request the target's R × t grid must cover besides the drafter's (prompt lookup's,
    `trtspec.spec.lookup`, with or without a drafter)."""
    batch_tokens = sorted(batch_tokens or DEFAULT_BATCHES)
    drafter = drafter or NoDrafter()
    draft_batches = [r for r in DRAFT_BATCHES if r <= max(1, min(max_batch, requests))]
    lens = draft_lens_to_measure(drafter) if drafter.num_draft_tokens else []
    k_max = max(drafter.num_draft_tokens, verify_len)
    verifies = bool(lens) or verify_len > 0
    per_row = sorted({t for t in TOKENS_PER_ROW if t <= k_max + 1} | {k_max + 1}) if verifies else []
    slots = max(requests, max(draft_batches))
    short = max(1, context // SHORT_CONTEXT_DIVISOR)  # slots + r: the grid's rows at this context
    target, drafter = copy.copy(target), copy.copy(drafter)
    capacity = context + max(batch_tokens + [k_max + 1]) + k_max + 2
    # each timed proposal commits ACCEPTED_PER_STEP + 1 tokens to its rows; requests take turns
    growth = reps * len(lens) * sum(draft_batches) * (ACCEPTED_PER_STEP + 1) // slots + 2 * k_max + 8
    target.allocate(slots + (max(draft_batches) if per_row else 0), capacity)
    # the catch-up requests take slots after the others and turns among themselves
    catch_rows = max(draft_batches) if lens else 0
    catch_reps = min(reps, CATCH_UP_REPS)
    catch_growth = (catch_reps * sum(draft_batches) * (CATCH_UP_POSITIONS + ACCEPTED_PER_STEP + 1)
                    // max(1, catch_rows) + 2 * (CATCH_UP_POSITIONS + k_max) + CATCH_UP_PROMPT)
    drafter.allocate(slots + catch_rows, max(capacity + growth, catch_growth))
    device = target.device
    gen = torch.Generator().manual_seed(seed)
    vocab = min(256, target.config.vocab_size)
    prompts = [torch.randint(0, vocab, (context,), generator=gen).tolist() for _ in range(slots)]
    out = target.forward([Chunk(r, torch.tensor(p, device=device)) for r, p in enumerate(prompts)],
                         logits_at=torch.zeros(1, dtype=torch.long, device=device))
    if per_row:  # the short-context rows
        target.forward([Chunk(slots + r, torch.randint(0, vocab, (short,), generator=gen).to(device))
                        for r in range(max(draft_batches))],
                       logits_at=torch.zeros(1, dtype=torch.long, device=device))
    for r, p in enumerate(prompts):
        taps = None if out.hidden is None else out.hidden[r * context : (r + 1) * context - 1]
        drafter.begin(r, p[:-1], taps)
        target.rewind(r, 1)  # the anchor is fed again by each verify chunk
    greedy = SamplingParams()
    rows = [DraftRow(r, p, greedy, torch.Generator(device=device)) for r, p in enumerate(prompts)]

    def taps_of(n: int) -> torch.Tensor | None:
        """Taps of n positions, for drafters fed by the target (any taps time the same; repeated
        when the prompts hold fewer)."""
        return None if out.hidden is None else out.hidden[torch.arange(n, device=out.hidden.device)
                                                          % out.hidden.shape[0]]

    def forward(sizes: list[int], first_slot: int = 0) -> float:
        chunks = [Chunk(first_slot + r, torch.randint(0, vocab, (n,), generator=gen).to(device))
                  for r, n in enumerate(sizes) if n]
        seconds = _timed(lambda: target.forward(chunks), device)
        for c in chunks:
            target.rewind(c.slot, len(c.input_ids))
        return seconds

    turns = {"rows": 0, "catch": 0}

    def draft(r: int, k: int, positions: int = ACCEPTED_PER_STEP + 1, among: list[DraftRow] = rows) -> float:
        """Commit `positions` new positions (one step's accepted tokens, or a catch-up) to r of the
        requests `among` (taking turns), then time their proposal."""
        turn = "rows" if among is rows else "catch"
        batch = [among[(turns[turn] + i) % len(among)] for i in range(r)]
        turns[turn] = (turns[turn] + r) % len(among)

        def step() -> None:
            for row in batch:
                row.committed.extend(torch.randint(0, vocab, (positions,), generator=gen).tolist())
                drafter.commit(row.slot, positions - 1, taps_of(positions))
            drafter.propose(batch, k)

        return _timed(step, device)

    times: dict[int, list[float]] = {b: [] for b in batch_tokens}
    grid: dict[tuple[int, int], list[float]] = {(r, t): [] for r in draft_batches for t in per_row}
    short_grid: dict[tuple[int, int], list[float]] = {key: [] for key in grid}
    draft_times: dict[tuple[int, int], list[float]] = {(r, k): [] for r in draft_batches for k in lens}
    if lens:  # the first proposal absorbs the prompts' context; time only the steady state
        drafter.propose(rows, max(lens))
    for _ in tqdm(range(reps), desc="profile", unit="rep", disable=not progress):
        for b in batch_tokens:
            times[b].append(forward([b // requests + (r < b % requests) for r in range(requests)]))
        for r, t in grid:
            grid[(r, t)].append(forward([t] * r))
            short_grid[(r, t)].append(forward([t] * r, first_slot=slots))
        for r, k in draft_times:
            draft_times[(r, k)].append(draft(r, k))
    catch_up = []
    if lens:  # the catch-up requests: absorb their prompts first, then time as the others
        catch = [DraftRow(slots + r, torch.randint(0, vocab, (CATCH_UP_PROMPT + 1,), generator=gen).tolist(),
                          greedy, torch.Generator(device=device)) for r in range(catch_rows)]
        for row in catch:
            drafter.begin(row.slot, row.committed[:-1], taps_of(CATCH_UP_PROMPT))
        drafter.propose(catch, lens[0])
        timed = {(r, n): [] for r in draft_batches for n in (ACCEPTED_PER_STEP + 1, CATCH_UP_POSITIONS)}
        for _ in range(catch_reps):
            for r, n in timed:
                timed[(r, n)].append(draft(r, lens[0], n, catch))
        extra = CATCH_UP_POSITIONS - ACCEPTED_PER_STEP - 1
        catch_up = [round(max(0.0, statistics.median(timed[(r, CATCH_UP_POSITIONS)])
                                   - statistics.median(timed[(r, ACCEPTED_PER_STEP + 1)])) / (r * extra), 9)
                    for r in draft_batches]
    loop_rows = sorted(set(draft_batches) | {1})
    loop = loop_seconds(target, loop_rows, context, steps=max(8, reps), seed=seed)
    machine = (f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__} "
               f"({torch.get_num_threads()} threads) on {device}, {requests} requests × {context} "
               "cached tokens")
    step_times = _paired_medians({(0, b): times[b] for b in batch_tokens}, [0], batch_tokens,
                                 {0: times[batch_tokens[0]]})[0]
    verify_s = short_s = draft_s = []
    if per_row:  # each anchored on the plain step (1 token a row) at its R, timed in the same rep
        plain = {r: grid[(r, 1)] for r in draft_batches}
        verify_s = _paired_medians(grid, draft_batches, per_row, plain)
        short_plain = {r: short_grid[(r, 1)] for r in draft_batches}
        short_s = _paired_medians(short_grid, draft_batches, per_row, short_plain)
        draft_s = _paired_medians(draft_times, draft_batches, lens, plain)
    return SPSTable(
        batch_tokens=batch_tokens,
        steps_per_s=[round(1.0 / t, 3) for t in step_times],
        machine=machine,
        draft_batches=draft_batches if lens else [],
        draft_lens=lens,
        draft_seconds=[[round(t, 6) for t in row] for row in draft_s],
        drafter=drafter.method,
        draft_catch_up=ACCEPTED_PER_STEP + 1 if lens else 0,
        catch_up_seconds=catch_up,
        verify_rows=draft_batches if per_row else [],
        verify_tokens_per_row=per_row,
        verify_steps_per_s=[[round(1.0 / t, 3) for t in row] for row in verify_s],
        verify_context=context if per_row else 0,
        short_context=short if per_row else 0,
        short_steps_per_s=[[round(1.0 / t, 3) for t in row] for row in short_s],
        loop_rows=loop_rows,
        loop_seconds=loop,
    )


def monotone_envelope(seconds: list[list[float]]) -> list[list[float]]:
    """seconds[i][j] of a grid whose work grows with i and with j: each cell becomes the least of
    itself and every cell at or beyond it in both (interference only adds time; more work never
    takes less), which removes a slow outlier and keeps every cell measured or a larger one."""
    out = [list(row) for row in seconds]
    for i in reversed(range(len(out))):
        for j in reversed(range(len(out[i]))):
            if j + 1 < len(out[i]):
                out[i][j] = min(out[i][j], out[i][j + 1])
            if i + 1 < len(out):
                out[i][j] = min(out[i][j], out[i + 1][j])
    return out


def _paired_medians(cells: dict, rows: list, cols: list, anchor: dict) -> list[list[float]]:
    """Each (row, col) cell's time as the median, over repetitions, of its ratio to the row's
    anchor timed in the same repetition (a plain step), times the anchor's median; the grid made
    monotone (`monotone_envelope`). Every cell of a repetition is timed within a second or two,
    so a drift of the machine's speed between repetitions scales them together and cancels in
    the ratio: the ratios adaptive speculation decides on (a drafting step against a plain one)
    keep only each timing's own jitter. cells[(row, col)], anchor[row]: one timing per repetition."""
    def cell(r, c) -> float:
        ratios = [x / a for x, a in zip(cells[(r, c)], anchor[r], strict=True)]
        return statistics.median(ratios) * statistics.median(anchor[r])
    return monotone_envelope([[cell(r, c) for c in cols] for r in rows])


def loop_seconds(target, batches: list[int], context: int, steps: int, seed: int = 0) -> list[float]:
    """Median seconds per step of the serving loop outside the target forward, for R = each of
    `batches` requests decoding plainly (`steps` steps after their prefill)."""
    from trtspec.bench.loop_overhead import timed_calls
    from trtspec.spec.decoder import Request, SpeculativeDecoder

    decoder = SpeculativeDecoder(target, None, end_ids=(), max_slots=max(batches),
                                 capacity=context + steps + 2)
    device = decoder.target.device
    inside: list[float] = []  # seconds of each target forward of the current step
    decoder.target.forward = timed_calls(decoder.target.forward, inside, device)
    gen = torch.Generator().manual_seed(seed)
    vocab = min(256, target.config.vocab_size)
    out = []
    for r in batches:
        decoder.reset()
        for _ in range(r):
            decoder.add(Request(torch.randint(0, vocab, (context,), generator=gen).tolist(), steps + 1))
        decoder.step()  # the prefill
        outside = []
        for _ in range(steps):
            inside.clear()
            seconds = _timed(decoder.step, device)
            outside.append(seconds - sum(inside))
        out.append(round(statistics.median(outside), 6))
    return out


def cost_key(parts: dict) -> str:
    """Cache key of a measured cost table: what was measured, on which machine and threads."""
    parts = {**parts, "host": platform.node(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
             "torch": torch.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]
