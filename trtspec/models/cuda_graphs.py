"""Decode steps replayed as CUDA graphs (the gpt-fast / TensorRT-LLM pattern): the target's
verify step, a draft model's and EAGLE-3's chain steps, and DFlash/DSpark's block forward.

A decode step feeds each running request a short chain ([last] or [last, x_1..x_k]; a DFlash
block: [anchor, MASK × (B−1)]) and launches the same few hundred kernels every time; on a GPU at
batch 1 launching them costs about as much as running them. A CUDA graph replays captured kernels
on fixed addresses, so a step is padded to a static shape, one graph per shape, captured on first
use:

    rows     slots 0..B-1, B the batch bucket (a power of two past the highest slot fed, at most
             the slot count). A slot of that range with nothing to feed feeds a dummy chain into
             the scratch tail of its buffers: the MAX_TOKENS positions past the capacity, which
             the model allocates for this and no request ever holds.
    tokens   n per row: the step's longest chain rounded up to a TOKEN_BUCKETS size (causal steps;
             a DFlash block is always its block size). A shorter chain is padded with its last token
             at the positions after it: written past the request's length (into the scratch tail
             at most), where nothing reads them before a later step writes the real ones.
    context  attention over the first K positions of each slot, K a power of two (at least
             MIN_CONTEXT) past the longest row, at most the capacity, under a mask the graph
             builds from the positions: causal (a query at position p sees positions <= p of its
             slot) or, for a DFlash block, each query sees its whole row and what precedes it.

So a graph is keyed by (B, n, K), and at most MAX_GRAPHS are kept (the least recently replayed
goes first: each holds its output buffers, the logits of B·n tokens for a target). Before a replay
the step's inputs (tokens; EAGLE-3 also feeds a hidden state per token) and positions are gathered
into the graph's input buffers; after it the real tokens' outputs (logits, hidden states) are
gathered out of its output buffers (copies: the next replay overwrites them). Everything else runs
eagerly, as the packed forward: a step with a token tree, a chain longer than MAX_TOKENS (a
prefill) or a slot fed twice.

The padded step is plain torch, so on the CPU it runs eagerly (`capture=False`), which is how the
tests prove it equals the packed forward, and, under `CaptureAudit` (`graph_audit`), that a
capture would accept it and its replays run what the capture recorded; on CUDA `gpu_check` proves
the replay decodes what the eager loop decodes. A capture that fails logs why and leaves the model
eager for good.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trtspec.models.graph_audit import current_audit
from trtspec.models.kv_slots import AttentionGroup, Segment

log = logging.getLogger(__name__)

MAX_TOKENS = 32  # the longest chain a graph step feeds per row: longer ones are prefills
TOKEN_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, MAX_TOKENS)  # n of a causal step's graphs
MAX_GRAPHS = 48  # graphs kept per model
MIN_CONTEXT = 256  # the smallest context bucket K
WARMUP = 2  # eager runs on a side stream before a capture (allocator and lazy-init settle)

Outputs = tuple[torch.Tensor | None, ...]  # each [B·n, ...] (or None), one row per padded token


def graphs_wanted(enabled: bool, device: torch.device) -> bool:
    """Whether a model pads its decode steps: its config's `cuda_graphs` on a CUDA device (on the
    CPU the padded steps would only cost; the tests build the models with it on directly)."""
    return enabled and torch.device(device).type == "cuda"


def _bucket(n: int, low: int, high: int) -> int:
    """The smallest power of two >= max(n, low), capped at `high` (which need not be one)."""
    b = low
    while b < n:
        b *= 2
    return min(b, high)


class StaticLayout:
    """A `StepLayout` of static shape: B rows of n tokens, row r in slot r, attention over K
    positions as one group. Its tensors are buffers a graph reads at fixed addresses.

    slots, positions, rope_positions [B·n]; mask [B, 1, n, K] (rebuilt from `positions` inside the
    step, so a replay rebuilds it too)."""

    has_trees = False

    def __init__(self, rows: int, tokens: int, kv_len: int, device: torch.device, causal: bool = True):
        self.shape, self.causal = (rows, tokens, kv_len), causal
        self.num_tokens = rows * tokens
        flat = torch.arange(self.num_tokens, device=device)
        self.slots = flat // tokens  # [B·n]
        self.positions = torch.zeros(self.num_tokens, dtype=torch.long, device=device)  # [B·n]
        self.rope_positions = self.positions
        self._keys = torch.arange(kv_len, device=device)  # [K]
        self._visible = torch.zeros(rows, tokens, kv_len, dtype=torch.bool, device=device)  # [B, n, K]
        self.groups = [AttentionGroup(slice(0, rows), flat.view(rows, tokens), flat, self._visible[:, None],
                                      kv_len)]

    def rebuild_mask(self) -> None:
        """The mask from the current positions, in place: a query sees the slots up to its own
        position (causal) or up to its row's last one."""
        rows, tokens, _ = self.shape
        seen = self.positions.view(rows, tokens, 1)  # [B, n, 1]
        if not self.causal:
            seen = seen[:, -1:].expand(rows, tokens, 1)  # each row's last position
        torch.le(self._keys[None, None, :], seen, out=self._visible)


@dataclass
class _Graph:
    layout: StaticLayout
    inputs: list[torch.Tensor]  # each [B·n, ...]: the step's per-token inputs, padded
    outputs: Outputs | None = None
    graph: torch.cuda.CUDAGraph | None = None


class GraphedSteps:
    """The padded decode steps of one model: `plan` says whether a step qualifies (and its shape),
    `forward` runs it (replayed on CUDA, eager on the CPU).

    `step(layout, *inputs)` is the model's forward over slot buffers laid out by `layout` (writing
    the fed tokens' K/V, attending through `layout.groups`), each input [B·n, ...] one row per
    padded token (the token ids first); it returns its outputs, one row per padded token too. The
    buffers hold `capacity` + MAX_TOKENS positions per slot, the last MAX_TOKENS scratch."""

    def __init__(self, step: Callable[..., Outputs], device: torch.device,
                 num_slots: int, capacity: int, capture: bool, causal: bool = True):
        self.step, self.device, self.causal = step, torch.device(device), causal
        self.num_slots, self.capacity, self.capture = num_slots, capacity, capture
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self.pool = None  # the memory pool every captured graph shares
        self.num_steps = 0  # steps run padded (replays on CUDA)
        self.failed: str | None = None  # why capturing failed (then every step runs eagerly)

    def plan(self, segments: list[Segment]) -> tuple[int, int, int] | None:
        """(B, n, K) for a step of `segments` (each within the capacity), or None when the step
        must run eagerly."""
        if self.failed is not None or not segments:
            return None
        fed = [s.slot for s in segments]
        n = max(s.length for s in segments)
        if len(set(fed)) != len(fed) or n > MAX_TOKENS or any(s.tree is not None for s in segments):
            return None
        if self.causal:  # a DFlash block's queries see its whole row: no padding past its block
            n = next(b for b in TOKEN_BUCKETS if b >= n)
        end = max(s.start + s.length for s in segments)  # what the real tokens must see
        return _bucket(max(fed) + 1, 1, self.num_slots), n, _bucket(end, MIN_CONTEXT, self.capacity)

    def run(self, segments: list[Segment], *inputs: torch.Tensor) -> tuple[Outputs, torch.Tensor] | None:
        """`forward` at the step's `plan`, or None when the step must run eagerly."""
        shape = self.plan(segments)
        return None if shape is None else self.forward(shape, segments, *inputs)

    def forward(self, shape: tuple[int, int, int], segments: list[Segment], *inputs: torch.Tensor,
                ) -> tuple[Outputs, torch.Tensor]:
        """Run the padded step.  inputs: each [T, ...], packed as `segments` (the token ids first).
        -> the step's outputs (static buffers on CUDA: read them before the next step) and
        index [T]: the padded row of each packed token."""
        rows, n, _ = shape
        # source (packed index) and position of each padded token; a slot with nothing to feed:
        # a dummy chain (any token) in its scratch tail
        source, positions, index = [0] * (rows * n), list(range(self.capacity, self.capacity + n)) * rows, []
        at = 0
        for s in segments:
            base = s.slot * n
            for i in range(n):
                source[base + i] = at + min(i, s.length - 1)  # padding repeats the last token
                positions[base + i] = s.start + i
            index += range(base, base + s.length)
            at += s.length
        g = self.graphs.pop(shape, None)  # back in last: the most recently used
        if g is None:
            if len(self.graphs) >= MAX_GRAPHS:
                del self.graphs[next(iter(self.graphs))]
            g = _Graph(StaticLayout(*shape, self.device, self.causal),
                       [x.new_zeros(rows * n, *x.shape[1:]) for x in inputs])
        self.graphs[shape] = g
        # gathered on the device, no wait for the host: the inputs never leave it
        source = torch.tensor(source, device=self.device)
        for x, buffer in zip(inputs, g.inputs, strict=True):
            torch.index_select(x, 0, source, out=buffer)
        g.layout.positions.copy_(torch.tensor(positions))
        audit = None if self.capture else current_audit()
        if audit is not None:  # on the CPU, run as a capture and its replays would (graph_audit)
            others = [h.outputs for h in self.graphs.values() if h is not g]
            g.outputs = audit.step(f"{self.step.__qualname__} {shape}", g, g.outputs, lambda: self._run(g),
                                   others)
        elif not self.capture:
            g.outputs = self._run(g)
        elif g.graph is None:
            self._capture(g)
        else:
            g.graph.replay()
        if self.failed is not None:  # the capture failed: this step eagerly, later ones packed
            g.outputs = self._run(g)
        self.num_steps += 1
        return g.outputs, torch.tensor(index, dtype=torch.long, device=self.device)

    def _run(self, g: _Graph) -> Outputs:
        """The padded forward: every kernel a replay runs."""
        g.layout.rebuild_mask()
        return self.step(g.layout, *g.inputs)

    def _capture(self, g: _Graph) -> None:
        """Capture the step on its first use (the inputs already hold this step's, so the warm-up
        runs write the very K/V the step writes); on failure, log it and stay eager."""
        try:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(WARMUP):
                    self._run(g)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                g.outputs = self._run(g)
            self.pool = graph.pool()
            g.graph = graph
            graph.replay()
        except Exception as exc:  # noqa: BLE001 - any capture failure means: decode eagerly
            self.failed = f"{type(exc).__name__}: {exc}"
            self.graphs.clear()
            log.warning("CUDA graph capture of a decode step failed (%s); decoding eagerly", self.failed)
