"""Decode steps replayed as CUDA graphs (the gpt-fast / TensorRT-LLM pattern): the target's
verify step (chains and draft trees), a draft model's and EAGLE-3's chain and tree steps, and
DFlash/DSpark's block forward and context projection (the accepted tokens' taps into its K/V).

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
    trees    whether a row holds tree nodes (`kv_slots.TreeSpan`, trees of at most TREE_WINDOW
             nodes). Then the mask is built from per-token inputs that say, for chains and
             nodes alike, which context a token sees and which of its tree's nodes are its
             ancestors (one 64-bit word a token), and each node rotates by its depth
             (`StaticLayout`): the tree's shape is data, so one graph serves every tree.

So a graph is keyed by (B, n, K, trees), and at most MAX_GRAPHS are kept, holding at most
OUTPUT_BUDGET bytes of outputs (the least recently replayed goes first). Each keeps its own output
buffers, for a target the logits of B·n tokens: Qwen3-8B's vocabulary in bfloat16 at B = 8, n = 32
is 78 MB a graph, so 48 graphs could hold 3.7 GB (15 GB at B = 32); the budget bounds what the
deployment's memory check (`trtspec.memory`) must set aside for them. Before a replay
the step's inputs (tokens; EAGLE-3 also feeds a hidden state per token) and positions are gathered
into the graph's input buffers; after it the real tokens' outputs (logits, hidden states) are
gathered out of its output buffers (copies: the next replay overwrites them). Everything else runs
eagerly, as the packed forward: a chain or tree segment longer than MAX_TOKENS (a prefill, a large
tree's verification), a tree of more than TREE_WINDOW nodes, or a slot fed twice.

Graphs are captured on first use, not at start-up as vLLM and TensorRT-LLM do: their attention
kernels read each row's length from device memory, so a graph is keyed by batch size alone,
while here the context bucket K is part of the shape (SDPA over a static slice of the slot
buffers), and a start-up capture of every (B, n, K) would pass MAX_GRAPHS. The first step of each
shape pays its capture (WARMUP eager runs, then the capture).

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
from trtspec.models.kv_slots import AttentionGroup, Segment, tree_depths

log = logging.getLogger(__name__)

MAX_TOKENS = 32  # the longest chain a graph step feeds per row: longer ones are prefills
TREE_WINDOW = 64  # the most nodes a tree of a graph step may hold, one bit each in a 64-bit word
TOKEN_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, MAX_TOKENS)  # n of a causal step's graphs
MAX_GRAPHS = 48  # graphs kept per model
OUTPUT_BUDGET = 2 << 30  # bytes of output buffers a model's graphs keep (a working set of 2 context
# buckets at 32 slots and every token bucket up to 16 fits: 1 GB at Qwen3-8B's vocabulary)
MIN_CONTEXT = 256  # the smallest context bucket K
WARMUP = 2  # eager runs on a side stream before a capture (allocator and lazy-init settle)

Outputs = tuple[torch.Tensor | None, ...]  # each [B·n, ...] (or None), one row per padded token
Shape = tuple[int, int, int, bool]  # (B, n, K, trees): what a graph is keyed by


def _tree_rows(segments: list[Segment], positions: list[int], n: int) -> list[list[int]]:
    """rope_positions, prefix, tree_start and ancestors (`StaticLayout`) of each padded token of a step
    with trees; `positions` its storage indices. A chain token (and a padded one) is causal."""
    rope, prefix = list(positions), [p + 1 for p in positions]
    tree_start, ancestors = [0] * len(positions), [0] * len(positions)
    for s in segments:
        if s.tree is None:
            continue
        words: list[int] = []  # per node: itself and its ancestors, one bit each
        for i, p in enumerate(s.tree.parents):
            words.append((1 << i) | (words[p] if p >= 0 else 0))
        depths, first, base = tree_depths(s.tree.parents), s.start - s.tree.start, s.slot * n
        for i in range(s.length):
            word = words[first + i]
            rope[base + i] = s.tree.start + depths[first + i]
            prefix[base + i] = tree_start[base + i] = s.tree.start
            ancestors[base + i] = word - (1 << 64) if word >> 63 else word  # as a signed 64-bit int
    return [rope, prefix, tree_start, ancestors]


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

    slots, positions, rope_positions [B·n]; mask [B, 1, n, K] (rebuilt inside the step, so a
    replay rebuilds it too): from `positions` for chains; for a step with trees (`trees`) from
    per-token inputs that describe chains and tree nodes alike:

        prefix [B·n]      keys < prefix are seen (a chain token: its position + 1; a tree node:
                          its tree's start, the context before the tree)
        tree_start [B·n]  the storage index of the token's tree's node 0
        ancestors [B·n]   a 64-bit word, bit j set when the tree's node j (at tree_start + j) is the
                          token itself or an ancestor of it (a chain token: 0)

    and `rope_positions` its own buffer (a node rotates by its tree start + depth). All of them are
    rows of one buffer, `per_token` [5, B·n] (chains: [1, B·n], the positions), filled by one copy."""

    def __init__(self, rows: int, tokens: int, kv_len: int, device: torch.device, causal: bool = True,
                 trees: bool = False):
        self.shape, self.causal, self.has_trees = (rows, tokens, kv_len), causal, trees
        self.num_tokens = rows * tokens
        flat = torch.arange(self.num_tokens, device=device)
        self.slots = flat // tokens  # [B·n]
        self.per_token = torch.zeros(5 if trees else 1, self.num_tokens, dtype=torch.long, device=device)
        self.positions = self.per_token[0]  # [B·n]
        self.rope_positions = self.per_token[1] if trees else self.positions  # [B·n]
        if trees:
            self.prefix, self.tree_start, self.ancestors = self.per_token[2:]  # [B·n] each
        self._keys = torch.arange(kv_len, device=device)  # [K]
        self._visible = torch.zeros(rows, tokens, kv_len, dtype=torch.bool, device=device)  # [B, n, K]
        self.groups = [AttentionGroup(slice(0, rows), flat.view(rows, tokens), flat, self._visible[:, None],
                                      kv_len)]

    def rebuild_mask(self) -> None:
        """The mask from the current per-token inputs, in place: a chain query sees the slot up to
        its own position (causal) or up to its row's last one; a tree node its context and its
        ancestors (see the class doc)."""
        rows, tokens, kv_len = self.shape
        if self.has_trees:
            keys = self._keys[None, :]  # [1, K]
            visible = self._visible.view(self.num_tokens, kv_len)  # [B·n, K]
            torch.lt(keys, self.prefix[:, None], out=visible)
            rel = keys - self.tree_start[:, None]  # [B·n, K]: node index of each key in the token's tree
            bit = (self.ancestors[:, None] >> rel.clamp(0, TREE_WINDOW - 1)) & 1  # [B·n, K]
            visible |= bit.bool() & (rel >= 0) & (rel < TREE_WINDOW)
            return
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
                 num_slots: int, capacity: int, capture: bool, causal: bool = True, attends: bool = True):
        """`causal`: chains (n bucketed) rather than DFlash blocks (whole rows see each other);
        `attends`: False for a step that only writes K/V (DFlash's context projection): no
        context bucket then, K is 1."""
        self.step, self.device, self.causal, self.attends = step, torch.device(device), causal, attends
        self.num_slots, self.capacity, self.capture = num_slots, capacity, capture
        self.graphs: dict[Shape, _Graph] = {}
        self.pool = None  # the memory pool every captured graph shares
        self.num_steps = 0  # steps run padded (replays on CUDA)
        self.failed: str | None = None  # why capturing failed (then every step runs eagerly)

    def plan(self, segments: list[Segment]) -> Shape | None:
        """(B, n, K, trees) for a step of `segments` (each within the capacity), or None when the
        step must run eagerly."""
        if self.failed is not None or not segments:
            return None
        fed = [s.slot for s in segments]
        n = max(s.length for s in segments)
        trees = [s for s in segments if s.tree is not None]
        if len(set(fed)) != len(fed) or n > MAX_TOKENS or (trees and not self.causal):
            return None
        for s in trees:  # a tree past TREE_WINDOW, or a segment outside its tree (StepLayout says why)
            first = s.start - s.tree.start
            if len(s.tree.parents) > TREE_WINDOW or first < 0 or first + s.length > len(s.tree.parents):
                return None
        if self.causal:  # a DFlash block's queries see its whole row: no padding past its block
            n = next(b for b in TOKEN_BUCKETS if b >= n)
        end = max(s.start + s.length for s in segments)  # what the real tokens must see
        rows = _bucket(max(fed) + 1, 1, self.num_slots)
        kv_len = _bucket(end, MIN_CONTEXT, self.capacity) if self.attends else 1
        return rows, n, kv_len, bool(trees)

    def run(self, segments: list[Segment], *inputs: torch.Tensor) -> tuple[Outputs, torch.Tensor] | None:
        """`forward` at the step's `plan`, or None when the step must run eagerly."""
        shape = self.plan(segments)
        return None if shape is None else self.forward(shape, segments, *inputs)

    def forward(self, shape: Shape, segments: list[Segment], *inputs: torch.Tensor,
                ) -> tuple[Outputs, torch.Tensor]:
        """Run the padded step.  inputs: each [T, ...], packed as `segments` (the token ids first).
        -> the step's outputs (static buffers on CUDA: read them before the next step) and
        index [T]: the padded row of each packed token."""
        rows, n, kv_len, trees = shape
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
        new = g is None  # only a new graph adds outputs: the kept ones are checked against the budget then
        if new:
            g = _Graph(StaticLayout(rows, n, kv_len, self.device, self.causal, trees),
                       [x.new_zeros(rows * n, *x.shape[1:]) for x in inputs])
        self.graphs[shape] = g
        # gathered on the device, no wait for the host: the inputs never leave it
        source = torch.tensor(source, device=self.device)
        for x, buffer in zip(inputs, g.inputs, strict=True):
            torch.index_select(x, 0, source, out=buffer)
        per_token = [positions] + (_tree_rows(segments, positions, n) if trees else [])
        g.layout.per_token.copy_(torch.tensor(per_token))
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
        if new:
            self._evict()
        self.num_steps += 1
        return g.outputs, torch.tensor(index, dtype=torch.long, device=self.device)

    @property
    def output_bytes(self) -> int:
        """Bytes of the output buffers the kept graphs hold."""
        return sum(x.nbytes for g in self.graphs.values() for x in g.outputs or () if x is not None)

    def _evict(self) -> None:
        """Drop the least recently replayed graphs past MAX_GRAPHS or OUTPUT_BUDGET bytes of
        outputs, never the one just run (its buffers return to the shared pool)."""
        while len(self.graphs) > 1 and (len(self.graphs) > MAX_GRAPHS or self.output_bytes > OUTPUT_BUDGET):
            del self.graphs[next(iter(self.graphs))]

    def _run(self, g: _Graph) -> Outputs:
        """The padded forward: every kernel a replay runs (a step that attends to nothing reads no mask)."""
        if self.attends:
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
