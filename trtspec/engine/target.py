"""The target p over an exported graph, serving several requests at once (engine flavour).

`trtspec.models.target.TargetModel`'s interface (slots, one packed forward, rewinds as a count)
over the exported target graph. The graph takes its cache as `past_*` inputs [1, kvh, S, d] and
returns `present_*` with the new tokens appended, and an explicit `attention_mask` [1, T, S+T]:
so the requests share one sequence of cache slots, each remembering the request that owns it and
its position there, and the mask lets each query see only its own request's live slots, causally.
A slot freed by a rewind or a finished request is marked dead and skipped by the mask until it is
compacted away (dropped from the arrays) before a forward: once the dead are half the cache, or
sooner when keeping them would make the forward's keys (cache + new tokens) outnumber what the
slots can hold, num_slots × capacity, the bound a TensorRT engine's profile is built for.

This is the graph's contract; the per-slot preallocated layout of the torch flavour would need a
graph that scatters into fixed buffers (not exported yet).

A tree chunk (draft trees) needs no other graph: its nodes get RoPE positions start + depth as
`position_ids`, and the mask lets each see its request's context and its own ancestors.
`keep_paths` relabels the accepted path's cache positions (start + depth, which their keys were
rotated by) and marks the rest dead: nothing moves.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from trtspec.engine.session import GraphSession
from trtspec.models.kv_slots import ancestor_mask, tree_depths
from trtspec.models.target import Chunk, PathKeep, TargetOutput

DEAD = -1


class TargetGraph:
    """The exported target graph and its K/V between runs: `past_*` in, `present_*` out, kept as
    arrays [1, kvh, S, d] in the graph's precision and sliced to drop slots."""

    def __init__(self, session: GraphSession, config, tap_layer_ids: tuple[int, ...] = (),
                 precision: str = "float32"):
        self.session = session
        self.num_layers = config.num_hidden_layers
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.precision = precision  # of the graph's K/V and taps
        self._empty = np.zeros((1, config.num_key_value_heads, 0, head_dim), dtype=precision)
        if tap_layer_ids and "hidden_taps" not in session.output_names:
            raise ValueError(f"the target graph has no hidden_taps output, yet taps {tap_layer_ids} were "
                             "asked for; export it with the drafter")
        self.has_taps = bool(tap_layer_ids)
        self.clear()

    def clear(self) -> None:
        self.cache: list[np.ndarray] = [self._empty] * (2 * self.num_layers)  # k0, v0, k1, v1, ...

    def run(self, input_ids: np.ndarray, positions: np.ndarray,
            mask: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids, positions [1, s] int64; mask [1, s, S+s] bool (True = attend) -> logits
        [1, s, V] float32 and taps [1, s, n·H] (None without taps); the cache grows by s slots."""
        feeds = {"input_ids": input_ids, "position_ids": positions, "attention_mask": mask}
        for i in range(self.num_layers):
            feeds[f"past_key_{i}"], feeds[f"past_value_{i}"] = self.cache[2 * i], self.cache[2 * i + 1]
        out = self.session.run(feeds)
        self.cache = [out[f"present_{kind}_{i}"] for i in range(self.num_layers) for kind in ("key", "value")]
        hidden = torch.from_numpy(out["hidden_taps"]) if self.has_taps else None
        return torch.from_numpy(out["logits"]), hidden

    def keep(self, slots: slice | np.ndarray) -> None:
        """Keep only the cache slots `slots`: a prefix slice (a view, no copy) or ascending indices."""
        self.cache = [c[:, :, slots] for c in self.cache]


class EngineTarget:
    """Feed packed chunks of many requests in one graph run; rewind and release per slot."""

    device = torch.device("cpu")

    def __init__(self, session: GraphSession, config, tap_layer_ids: tuple[int, ...] = (),
                 precision: str = "float32"):
        self.graph = TargetGraph(session, config, tap_layer_ids, precision)
        self.config = config  # the checkpoint's HF config (the drafter checks it fits)
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.num_slots, self.capacity = 1, self.max_positions
        self.reset()

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 1 << 20)

    def allocate(self, num_slots: int, capacity: int) -> None:
        """The graph's cache grows with its inputs: only the capacity check is per slot. A copy
        that allocates gets a cache of its own (the session stays shared)."""
        self.graph = copy.copy(self.graph)
        self.num_slots, self.capacity = num_slots, capacity
        self.reset()

    def reset(self) -> None:
        self.owner = np.empty(0, dtype=np.int64)  # [S] slot of each cache position, DEAD if freed
        self.position = np.empty(0, dtype=np.int64)  # [S] position within its request
        self.lengths: dict[int, int] = {}
        self.num_forwards = 0
        self.graph.clear()

    def seq_len(self, slot: int) -> int:
        return self.lengths.get(slot, 0)

    def _compact(self, incoming: int) -> None:
        """Drop dead cache positions once they are at least half of the cache, or when the forward
        feeding `incoming` tokens would otherwise attend over more than num_slots × capacity keys
        (live positions and new tokens alone never do: each slot stays within its capacity)."""
        live = self.owner != DEAD
        dead = len(live) - int(live.sum())
        if dead and (2 * dead >= len(live) or len(live) + incoming > self.num_slots * self.capacity):
            keep = np.flatnonzero(live)
            self.graph.keep(keep)
            self.owner, self.position = self.owner[keep], self.position[keep]

    def forward(self, chunks: list[Chunk], logits_at: torch.Tensor | None = None) -> TargetOutput:
        """Feed every chunk after its slot's cached tokens in ONE graph run."""
        self._compact(sum(len(c.input_ids) for c in chunks))
        owner_q = np.concatenate([np.full(len(c.input_ids), c.slot) for c in chunks])  # [T]
        pos_q = np.concatenate([self.seq_len(c.slot) + np.arange(len(c.input_ids)) for c in chunks])
        if (pos_q >= self.capacity).any():
            raise ValueError(f"a slot would hold more than its capacity of {self.capacity} positions")
        owner_k, pos_k = np.concatenate([self.owner, owner_q]), np.concatenate([self.position, pos_q])
        visible = (owner_k[None, :] == owner_q[:, None]) & (pos_k[None, :] <= pos_q[:, None])  # [T, S+T]
        rope = pos_q.copy()  # [T]
        first = 0
        for c in chunks:
            n = len(c.input_ids)
            if c.parents is not None:
                self._tree_rows(c, first, rope, visible, owner_k, pos_k)
            first += n
        input_ids = torch.cat([c.input_ids for c in chunks]).to(torch.int64).numpy()
        logits, hidden = self.graph.run(input_ids[None], rope[None], visible[None])
        self.owner, self.position = owner_k, pos_k
        for c in chunks:
            self.lengths[c.slot] = self.seq_len(c.slot) + len(c.input_ids)
        self.num_forwards += 1
        logits = logits[0] if logits_at is None else logits[0, logits_at]
        return TargetOutput(logits=logits.float(), hidden=None if hidden is None else hidden[0])

    def _tree_rows(self, c: Chunk, first: int, rope: np.ndarray, visible: np.ndarray, owner_k: np.ndarray,
                   pos_k: np.ndarray) -> None:
        """A tree chunk's queries (packed from `first`): RoPE by depth, context + ancestors visible."""
        n, start = len(c.input_ids), self.seq_len(c.slot)
        tree_start = start if c.tree_start is None else c.tree_start
        nodes = np.arange(start - tree_start, start - tree_start + n)
        rows = slice(first, first + n)
        rope[rows] = tree_start + np.asarray(tree_depths(c.parents))[nodes]
        mine = np.flatnonzero((owner_k == c.slot) & (pos_k >= tree_start))
        anc = ancestor_mask(c.parents).numpy()
        visible[rows] &= (pos_k < tree_start)[None, :] | (owner_k != c.slot)[None, :]
        visible[rows, mine] = anc[nodes][:, pos_k[mine] - tree_start]

    def keep_paths(self, keeps: list[PathKeep]) -> None:
        """Keep each slot's accepted root path: its positions relabelled start..start+len−1."""
        for k in keeps:
            mine = (self.owner == k.slot) & (self.position >= k.start)
            new = np.full(len(self.owner), DEAD, dtype=np.int64)
            for j, p in enumerate(k.path):
                new[mine & (self.position == k.start + p)] = k.start + j
            self.owner[mine & (new == DEAD)] = DEAD
            self.position[mine] = np.where(new[mine] == DEAD, self.position[mine], new[mine])
            self.lengths[k.slot] = k.start + len(k.path)

    def rewind(self, slot: int, num_rejected: int) -> None:
        """Free the last `num_rejected` positions of a slot (its rejected drafts)."""
        length = self.seq_len(slot)
        if not 0 <= num_rejected <= length:
            raise ValueError(f"cannot rewind {num_rejected} positions of slot {slot} holding {length}")
        if num_rejected:
            self.owner[(self.owner == slot) & (self.position >= length - num_rejected)] = DEAD
            self.lengths[slot] = length - num_rejected

    # a released slot's positions are marked dead and compacted away by a later forward (they move
    # and vanish): nothing is held for a next request
    reuses_prefixes = False

    def reuse(self, slot: int, length: int) -> None:
        if length:
            raise ValueError(f"the engine flavour's target holds no prefix of slot {slot} to keep")

    def release(self, slot: int) -> None:
        """A finished request: free all its positions."""
        self.owner[self.owner == slot] = DEAD
        self.lengths.pop(slot, None)
