"""How many draft tokens of each request to verify: DSpark's hardware-aware prefix scheduler.

A drafter with a confidence head gives, for request r and draft slot j, c_{r,j} = P(x_{r,j} is
accepted | x_{r,<j} were). The survival a_{r,j} = ∏_{i≤j} c_{r,i} is then the expected
contribution of slot j to the tokens the cycle emits, and verifying B tokens in one target
forward runs at SPS(B) steps per second (measured by `trtspec profile`). Algorithm 1 of the
DSpark paper:

    sort every (r, j) by a_{r,j}, largest first
    start from B = R (each request feeds its last token) and τ* = R (each emits ≥ 1 token)
    admit the next (r, j) while Θ = τ* · SPS(B) improves (B += 1, τ* += a_{r,j});
    STOP at the first non-improvement.

The early stop is what keeps verification lossless. Whether slot j is verified may depend on the
drafts before it (a_{r,j} reads x_{r,<j}) but never on x_{r,j} itself. A scheduler that instead
takes the best Θ over every cut (`mode="argmax"`, kept only to demonstrate the point) looks at
a_{r,j+1}, which reads x_{r,j}: then whether x_{r,j} is checked depends on its own value and the
output is biased (tests/test_schedule.py measures it).

Because a_{r,j} never grows with j and ties keep slot order, every admitted set is a prefix of
each request's block, so a schedule is just one length per request.

The step also pays for drafting: with the drafter's time T_d of this step (measured by
`trtspec profile` with the SPS table), Θ = τ* / (T_d + 1/SPS(B)) — the tokens per second of the
whole step. T_d = 0 gives the paper's Θ = τ* · SPS(B).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, Field, ValidationError

from trtspec.errors import ConfigError
from trtspec.files import write_text
from trtspec.strict import first_mistake

Mode = Literal["scheduler", "threshold", "full", "argmax"]  # (adaptive picks k first: spec.cost)


class SPSTable(BaseModel):
    """Target steps per second at each verify batch size B (tokens in one forward), and the
    drafter's seconds per step by batch and draft length: the cost model of a serving machine."""

    batch_tokens: list[int] = Field(description="B values measured, ascending")
    steps_per_s: list[float] = Field(description="target forwards per second at each B")
    machine: str = Field("", description="where it was measured")
    draft_batches: list[int] = Field(default_factory=list,
                                     description="requests R the drafter's time was measured at, ascending")
    draft_lens: list[int] = Field(default_factory=list, description="draft lengths k measured, ascending")
    draft_seconds: list[list[float]] = Field(
        default_factory=list, description="drafter seconds per step: one row per R, one column per k")
    drafter: str = Field("", description="the drafter the draft times belong to")
    draft_catch_up: int = Field(
        0, description="positions per request each timed proposal absorbed before drafting (one step's "
                       "accepted tokens; draft_seconds include them)")
    catch_up_seconds: list[float] = Field(
        default_factory=list,
        description="drafter seconds per further pending position of one request, at each draft_batches R: "
                    "the catch-up of a proposal after steps without drafting (empty: not measured)")
    verify_rows: list[int] = Field(
        default_factory=list,
        description="requests R the target's step time was measured at by shape, ascending")
    verify_tokens_per_row: list[int] = Field(
        default_factory=list, description="new tokens per request t measured at each R, ascending")
    verify_steps_per_s: list[list[float]] = Field(
        default_factory=list, description="target forwards per second over R requests × t tokens each: "
                                          "one row per R, one column per t")
    verify_context: int = Field(0, description="cached tokens per request of the R × t grid (0: unknown)")
    short_context: int = Field(0, description="cached tokens per request of the second, short-context grid")
    short_steps_per_s: list[list[float]] = Field(
        default_factory=list, description="the R × t grid again at short_context (same shape; empty: "
                                          "step time does not follow the requests' context)")
    loop_rows: list[int] = Field(default_factory=list,
                                 description="running requests R the serving loop's own time was measured at")
    loop_seconds: list[float] = Field(
        default_factory=list, description="seconds per serving-loop step outside the target forward and the "
                                          "drafter (verification, bookkeeping, Python) at each R")

    def sps(self, b: int) -> float:
        """SPS(B), linear between measured points, flat-extrapolated by cost beyond the last."""
        xs, ys = self.batch_tokens, self.steps_per_s
        if b <= xs[0]:
            return ys[0]
        if b >= xs[-1]:  # time per step grows linearly past the table
            return ys[-1] * xs[-1] / b
        i = bisect.bisect_right(xs, b)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (b - x0) / (x1 - x0)

    def step_seconds(self, rows: int, tokens: int, context: int | None = None, prompt: int = 0) -> float:
        """Seconds of one target forward over `tokens` new tokens from `rows` requests. The shape
        matters (2 requests × 16 tokens cost less than 8 × 4: attention reads each request's
        context), so where the R × t grid was measured it is read at t = tokens / rows; past its
        last R, the time grows as 1 / SPS(B) does. Without a grid: 1 / SPS(tokens).

        `context`: the cached tokens the step's attention reads per request. With the short grid
        measured, the time is linear in it between (and beyond) the two grids' contexts, never
        below the short grid's; without, or None, the grid's own context.

        `prompt`: new requests' prompt tokens fed in the same forward (chunked prefill), priced as
        what they add to a forward of `tokens` along SPS(B): 1/SPS(tokens + prompt) − 1/SPS(tokens)
        (nearly free where the forward is memory-bound, linear where compute-bound)."""
        if prompt > 0:
            extra = 1.0 / self.sps(tokens + prompt) - 1.0 / self.sps(tokens)
            return self.step_seconds(rows, tokens, context) + max(0.0, extra)
        if not self.verify_steps_per_s or rows < 1:
            return 1.0 / self.sps(tokens)
        seconds = self._grid_seconds(self.verify_steps_per_s, rows, tokens)
        if context is None or not self.short_steps_per_s or self.verify_context <= self.short_context:
            return seconds
        short = self._grid_seconds(self.short_steps_per_s, rows, tokens)
        share = (max(context, self.short_context) - self.short_context) / \
            (self.verify_context - self.short_context)
        return short + max(0.0, seconds - short) * share

    def _grid_seconds(self, grid: list[list[float]], rows: int, tokens: int) -> float:
        t = tokens / rows

        def seconds_at(r: int) -> float:  # grid row r's step time at t tokens per request
            return _interpolate_by(self.verify_tokens_per_row, lambda j: 1.0 / grid[r][j], t)

        last = self.verify_rows[-1]
        if rows > last:
            return seconds_at(len(grid) - 1) * self.sps(round(last * t)) / self.sps(tokens)
        return _interpolate_by(self.verify_rows, seconds_at, rows)

    def loop_time(self, batch: int) -> float:
        """Seconds a step of `batch` running requests spends outside the two forwards (linear between
        measured points, growing linearly with R past the last one); 0 when not measured."""
        if not self.loop_seconds or batch <= 0:
            return 0.0
        return _interpolate(self.loop_rows, self.loop_seconds, batch)

    def draft_time(self, batch: int, k: int) -> float:
        """Seconds the drafter needs for `batch` requests and k drafts each (linear between measured
        points, growing linearly with R past the last one); 0 when no draft times were measured."""
        if not self.draft_seconds or k <= 0:
            return 0.0

        def seconds_at(j: int) -> float:  # draft length j's time at this batch
            return _interpolate_by(self.draft_batches, lambda r: self.draft_seconds[r][j], batch)

        return _interpolate_by(self.draft_lens, seconds_at, k)

    def catch_up_time(self, batch: int, positions: int) -> float:
        """Seconds a proposal among `batch` requests spends absorbing one request's `positions`
        pending positions beyond the `draft_catch_up` that `draft_time` includes (per position as
        measured at the nearest R, flat past the last); 0 when not measured."""
        extra = positions - self.draft_catch_up
        if not self.catch_up_seconds or extra <= 0:
            return 0.0
        batch = min(batch, self.draft_batches[-1])
        return extra * _interpolate(self.draft_batches, self.catch_up_seconds, batch)

    def save(self, path: Path) -> None:
        write_text(path, self.model_dump_json(indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> SPSTable:
        try:  # strict: the string "100" or true is no rate
            table = cls.model_validate(json.loads(path.read_text(encoding="utf-8")), strict=True)
        except ValidationError as exc:  # its text ran over several lines
            raise ConfigError(f"{path}: not an SPS table written by `trtspec profile` "
                              f"({first_mistake(exc)})") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not an SPS table written by `trtspec profile` ({exc})") from None
        # a NaN, 0 or negative rate (or time) was taken, and priced every step wrong
        rates = {"steps_per_s": table.steps_per_s, "verify_steps_per_s": sum(table.verify_steps_per_s, []),
                 "short_steps_per_s": sum(table.short_steps_per_s, [])}
        seconds = {"draft_seconds": sum(table.draft_seconds, []), "catch_up_seconds": table.catch_up_seconds,
                   "loop_seconds": table.loop_seconds}
        for name, values in rates.items():
            bad = [v for v in values if not 0 < v < math.inf]
            if bad:
                raise ConfigError(f"{path}: {name} must be steps per second > 0, got {bad[0]}")
        for name, values in seconds.items():
            bad = [v for v in values if not 0 <= v < math.inf]
            if bad:
                raise ConfigError(f"{path}: {name} must be seconds >= 0, got {bad[0]}")
        if len(table.batch_tokens) != len(table.steps_per_s) or not table.batch_tokens:
            raise ConfigError(f"{path}: batch_tokens and steps_per_s must be non-empty and equal in length")
        grid = table.verify_steps_per_s
        columns = len(table.verify_tokens_per_row)
        if len(grid) != len(table.verify_rows) or any(len(r) != columns for r in grid):
            raise ConfigError(f"{path}: verify_steps_per_s must have one row per verify_rows entry and one "
                              "column per verify_tokens_per_row entry")
        if table.short_steps_per_s and [len(r) for r in table.short_steps_per_s] != [len(r) for r in grid]:
            raise ConfigError(f"{path}: short_steps_per_s must have the shape of verify_steps_per_s")
        if table.catch_up_seconds and len(table.catch_up_seconds) != len(table.draft_batches):
            raise ConfigError(f"{path}: catch_up_seconds must have one entry per draft_batches entry")
        if len(table.loop_rows) != len(table.loop_seconds):
            raise ConfigError(f"{path}: loop_rows and loop_seconds must be equal in length")
        return table


def _interpolate(xs: list[int], ys: list[float], x: float) -> float:
    """ys at x: linear between points, flat below the first, proportional to x past the last."""
    return _interpolate_by(xs, ys.__getitem__, x)


def _interpolate_by(xs: list[int], y: Callable[[int], float], x: float) -> float:
    """`_interpolate` with the i-th point's value y(i), read only for the one or two points x falls
    at or between (a plan prices ~120 steps, each reading the R × t grids: reading every row there
    made pricing most of adaptive's planning time)."""
    if x <= xs[0]:
        return y(0)
    if x >= xs[-1]:
        return y(len(xs) - 1) * x / xs[-1]
    i = bisect.bisect_right(xs, x)
    below, above = y(i - 1), y(i)
    return below + (above - below) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])


def survival(confidence: torch.Tensor) -> torch.Tensor:
    """a_{r,j} = ∏_{i≤j} c_{r,i}.  confidence [R, k] -> [R, k]"""
    return confidence.cumprod(-1)


def _ranked(surv: list[torch.Tensor]) -> list[tuple[float, int, int]]:
    """Every (a, r, j) with j 1-based, largest a first; ties keep request then slot order."""
    items = [(float(a), r, j + 1) for r, row in enumerate(surv) for j, a in enumerate(row.tolist())]
    return sorted(items, key=lambda t: -t[0])  # stable: equal a keep (r, j) order


def schedule_lengths(surv: list[torch.Tensor], sps: SPSTable, mode: Mode = "scheduler",
                     threshold: float = 0.5, draft_seconds: float = 0.0, plain_rows: int = 0,
                     context: int | None = None, prompt: int = 0) -> list[int]:
    """Draft tokens to verify per request.  surv: per request [k_r] survival, non-increasing;
    draft_seconds: what this step costs besides its target forward (drafting, the loop's own
    time), part of the step time Θ divides by;
    plain_rows: requests in the same target forward that drafted nothing (one token each);
    context: the cached tokens the forward's attention reads per request;
    prompt: new requests' prompt tokens fed in the same forward (`SPSTable.step_seconds`)."""
    num_requests = len(surv)
    if mode == "full":
        return [len(a) for a in surv]
    if mode == "threshold":
        return [int((a >= threshold).long().cumprod(-1).sum()) for a in surv]
    rows = num_requests + plain_rows

    def step_rate(tokens: float, batch: int) -> float:  # Θ: tokens per second of the step
        return tokens / (draft_seconds + sps.step_seconds(rows, batch, context, prompt))

    lengths = [0] * num_requests
    b, tau = rows, float(rows)
    best = step_rate(tau, b)
    cuts: list[tuple[float, list[int]]] = [(best, list(lengths))]
    for a, r, j in _ranked(surv):
        theta = step_rate(tau + a, b + 1)
        if mode == "scheduler" and theta <= best:
            break  # the early stop: never look past the first non-improvement
        b, tau = b + 1, tau + a
        lengths[r] = j
        if mode == "argmax":
            cuts.append((theta, list(lengths)))
        best = max(best, theta)
    if mode == "argmax":
        return max(cuts, key=lambda c: c[0])[1]
    return lengths
