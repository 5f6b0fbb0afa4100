"""K/V caches preallocated per request slot, and attention of packed queries over them.

Every model of the serving loop (the target, DFlash/DSpark context, EAGLE-3's midlayer, a draft
model) keeps its keys and values in per-layer buffers

    keys, values   [num_slots, kv_heads, capacity, head_dim]

where slot s holds one request and position i of that request sits at index i. Writing is an
indexed store; a rewind is a length change (the loop's bookkeeping, nothing is moved); a finished
request frees its slot for the next one. Nothing grows by concatenation.

One forward packs the new tokens of many requests into one row (no padding for the linear layers:
their cost follows the token count). Each request's tokens form a *segment* (slot, start, length):
positions start..start+length−1. Attention is the only ragged part: segments are grouped by length
(prefill segments apart from short verify segments) and each group runs as one padded attention

    q [G, heads, L, d]   over   keys[slots, :, :K]   with mask [G, 1, L, K]

`keys[slots]` is a view when the group's slots are contiguous and a copy of every row's K/V
otherwise, which costs more than the attention itself at short queries. So a group with a few
holes in its slot range takes the shorter segments of those slots in (padded to its length) or,
for an idle slot, a dummy row whose output is dropped (`_fill_slot_gaps`): a step where some
requests draft and the others decode plainly stays a view.

causal (query at position i sees positions ≤ i of its slot) or, for DFlash's block, over the whole
segment (a query sees every position < start + length). On a GPU the same contract is what a
paged/varlen attention kernel serves without the padding.

A segment may hold the nodes of a token tree (`TreeSpan`, draft trees: `trtspec.spec.tree`). Then
where a token is stored and where it sits in the sequence differ: node i is written at storage
index `span.start + i` but rotated at RoPE position `span.start + depth(i)`, and it sees the slot's
context [0, span.start) plus its ancestors and itself only. `StepLayout.positions` are storage
indices, `StepLayout.rope_positions` the positions a model rotates by (the same tensor when no
segment is a tree, so a chain pays nothing). After verification `SlotKV.keep` moves the accepted
path's K/V into place: a path node at depth j already carries RoPE position start + j, so moved to
storage start + j it is exactly what feeding the accepted tokens alone would have written.

`SlotKVCache` adapts the buffers to transformers' `Cache` interface and `slot_attention` is
registered as the attention implementation "trtspec_slots", so a Hugging Face model runs its own
layers over this layout; without a `StepLayout` the implementation is plain SDPA, so the same
model still works for everything else.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTN_IMPLEMENTATION = "trtspec_slots"


@dataclass(slots=True, frozen=True)
class TreeSpan:
    """Tree nodes stored from `start` on: node i at storage index start + i. parents[i] < i is the
    node it extends, −1 for a root (a node whose only ancestor is the slot's context [0, start)).
    The span may begin in an earlier forward (EAGLE-3 and draft models forward a tree depth by depth):
    a segment then holds its last `length` nodes."""

    start: int
    parents: tuple[int, ...]


def tree_depths(parents) -> list[int]:
    """depth(i) = 0 for a root, depth(parent) + 1 otherwise (parents[i] < i)."""
    depths: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"tree node {i} has parent {p}; parents must come first (-1 = a root)")
        depths.append(0 if p < 0 else depths[p] + 1)
    return depths


def ancestor_mask(parents) -> torch.Tensor:
    """[n, n] bool: row i is True at i and at each of its ancestors."""
    n = len(parents)
    anc = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
    return anc


@dataclass(slots=True, frozen=True)
class Segment:
    slot: int
    start: int  # storage index of the segment's first token in its slot
    length: int
    tree: TreeSpan | None = None  # None: a sequence (position = storage index)


@dataclass(slots=True)
class AttentionGroup:
    slots: torch.Tensor | slice  # [G] slot indices, or a slice when they are contiguous
    gather: torch.Tensor  # [G, L] packed index of each padded query (padding repeats a real one)
    valid: torch.Tensor  # [n] flat indices (into G·L) of the real queries, in packed order
    mask: torch.Tensor  # [G, 1, L, K] True = attend
    kv_len: int  # K


@dataclass(slots=True, frozen=True)
class _Dummy:
    """A row of an attention group for a slot with no segment in it: keeps the group's slots a range."""

    slot: int


# copying one row's K/V for a group over scattered slots costs about as much attention as this many
# padded query rows. Measured on the tiny target's forward at R = 8 (2-core CPU, 2026-12-05, medians
# of 15-25, each shape at 4, 16 and "always fill"), ms at 256 / 1,024 cached tokens a slot:
# 9-token rows in alternate slots 10.7 / 24.3 gathered (4), 9.8 / 18.8 at 16; three 9-token rows in
# slots 0, 3, 6 9.8 / 22.6 and 9.0 / 18.1; 17-token rows alternating 13.3 / 27.5 and 12.9 / 23.6;
# two 64-token rows in slots 0 and 7 17.8 / 30.0 and 17.3 / 29.7, which filling always (6 × 64
# padded rows) makes 24.8 / 52.3. Prompt lookup's and adaptive drafting's rows are such scattered
# slots; end to end at R = 8 (short contexts) 1-3 % more tokens/s (was 4, from a 7 × 3-token case)
GATHERED_ROW_COST = 16


def _fill_slot_gaps(groups: list[list[int]], segments: list[Segment]) -> list[list[int | _Dummy]]:
    """Each group's rows in slot order, its holes filled where that keeps its slots a contiguous
    range for fewer padded query rows (holes × the group's length) than GATHERED_ROW_COST per real
    row: a slot whose segment sits in a later (shorter) group moves in, padded to the group's
    length; a slot with no segment gets a dummy row. Slots that appear twice keep the groups as
    they are."""
    slot_of = [s.slot for s in segments]
    if len(set(slot_of)) != len(slot_of):
        return groups
    where = {slot_of[i]: gi for gi, g in enumerate(groups) for i in g}
    index = {s: i for i, s in enumerate(slot_of)}
    out: list[list[int | _Dummy]] = [list(g) for g in groups]
    for gi, rows in enumerate(out):
        slots = sorted(slot_of[i] for i in rows)
        if not slots:
            continue
        holes = [s for s in range(slots[0], slots[-1] + 1) if where.get(s) != gi]
        width = max(segments[i].length for i in rows)
        fill = holes and len(holes) * width <= GATHERED_ROW_COST * len(rows) and \
            all(where.get(s, len(out)) > gi for s in holes)
        for s in holes if fill else []:
            if s in where:  # its segment, shorter, leaves its own group for this one
                out[where[s]].remove(index[s])
                where[s] = gi
                rows.append(index[s])
            else:
                rows.append(_Dummy(s))
        rows.sort(key=lambda i: i.slot if isinstance(i, _Dummy) else slot_of[i])
    return [g for g in out if g]


def _group_segments(order: list[int], lengths: list[int]) -> list[list[int]]:
    """Split segment indices (sorted by length, longest first) where padding would pass 2×."""
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[groups[-1][0]] <= 2 * max(1, lengths[i]):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class StepLayout:
    """Where the packed tokens of one forward sit in the slot buffers, and how their attention is
    grouped. Built once per forward, read by every layer.

    slots [T], positions [T]: the slot and storage index each packed token is written to;
    rope_positions [T]: its position in its sequence (differs from `positions` for tree nodes).
    """

    def __init__(self, segments: list[Segment], device: torch.device | str = "cpu", causal: bool = True):
        self.segments = segments
        self.causal = causal
        lengths = [s.length for s in segments]
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        self.num_tokens = offsets[-1]
        slots, positions, rope = [], [], []
        for s in segments:
            slots += [s.slot] * s.length
            positions += range(s.start, s.start + s.length)
            if s.tree is not None:
                first = s.start - s.tree.start
                if first < 0 or first + s.length > len(s.tree.parents):
                    raise ValueError(f"segment of slot {s.slot} at {s.start}+{s.length} lies outside its "
                                     f"tree of {len(s.tree.parents)} nodes from {s.tree.start}")
                rope += [s.tree.start + d for d in tree_depths(s.tree.parents)[first : first + s.length]]
            else:
                rope += range(s.start, s.start + s.length)
        self.slots = torch.tensor(slots, dtype=torch.long, device=device)  # [T]
        self.positions = torch.tensor(positions, dtype=torch.long, device=device)  # [T]
        self.has_trees = any(s.tree is not None for s in segments)
        self.rope_positions = torch.tensor(rope, dtype=torch.long, device=device) if self.has_trees \
            else self.positions  # [T]
        self._offsets, self._device = offsets, device

    @functools.cached_property
    def groups(self) -> list[AttentionGroup]:
        """Attention groups (built on first use: a layout that only writes needs none)."""
        lengths = [s.length for s in self.segments]
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        rows = _fill_slot_gaps(_group_segments(order, lengths), self.segments)
        return [self._group(g, self._device) for g in rows]

    def _group(self, rows: list[int | _Dummy], device) -> AttentionGroup:
        """One padded attention over `rows`: segment indices, or dummy rows (slots without one)."""
        segs = [Segment(r.slot, 0, 1) if isinstance(r, _Dummy) else self.segments[r] for r in rows]
        width = max(s.length for s in segs)
        kv_len = max(s.start + s.length for s in segs)
        gather, valid, query_pos, key_limit = [], [], [], []
        for g, (row, s) in enumerate(zip(rows, segs, strict=True)):
            off = 0 if isinstance(row, _Dummy) else self._offsets[row]  # a dummy: any query, dropped
            gather += [off + min(i, s.length - 1) for i in range(width)]
            if not isinstance(row, _Dummy):
                valid += [g * width + i for i in range(s.length)]
            query_pos.append([s.start + min(i, s.length - 1) for i in range(width)])
            key_limit.append(s.start + s.length)
        keys = torch.arange(kv_len, device=device)
        if self.causal:  # position i sees positions <= i
            mask = keys[None, None, :] <= torch.tensor(query_pos, device=device)[:, :, None]
        else:  # every query of the segment sees the whole segment and what precedes it
            mask = (keys[None, :] < torch.tensor(key_limit, device=device)[:, None])[:, None, :]
            mask = mask.expand(len(segs), width, kv_len)
        if any(s.tree is not None for s in segs):
            mask = mask.clone()
            for g, s in enumerate(segs):
                if s.tree is not None:
                    mask[g] = _tree_rows(s, width, kv_len).to(device)
        slot_ids = [s.slot for s in segs]
        contiguous = slot_ids == list(range(slot_ids[0], slot_ids[0] + len(slot_ids)))
        slots = slice(slot_ids[0], slot_ids[0] + len(slot_ids)) if contiguous else \
            torch.tensor(slot_ids, dtype=torch.long, device=device)
        gather = torch.tensor(gather, dtype=torch.long, device=device).view(len(segs), width)
        valid = torch.tensor(valid, dtype=torch.long, device=device)
        return AttentionGroup(slots, gather, valid, mask[:, None], kv_len)


def _tree_rows(s: Segment, width: int, kv_len: int) -> torch.Tensor:
    """[width, kv_len] mask rows of a tree segment's queries (padding repeats the last node): the
    slot's context before the tree, then the node's ancestors and itself."""
    span = s.tree
    first = s.start - span.start
    anc = ancestor_mask(span.parents)[first : first + s.length]  # [length, n]
    rows = torch.zeros(s.length, kv_len, dtype=torch.bool)
    rows[:, : span.start] = True
    rows[:, span.start : span.start + anc.shape[1]] = anc[:, : kv_len - span.start]
    return rows[[min(i, s.length - 1) for i in range(width)]]


class SlotKV:
    """One layer's keys and values for every slot: [num_slots, kv_heads, capacity, head_dim] each."""

    def __init__(self, num_slots: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (num_slots, kv_heads, capacity, head_dim)
        # zeros, not empty: a query never attends to a position before it is written, but a padded
        # group's masked keys still enter attention with weight 0, and 0 · NaN garbage is NaN
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, layout: StepLayout, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys, values [T, kv_heads, d] of the packed tokens, stored at their slot and position."""
        self.keys[layout.slots, :, layout.positions] = keys.to(self.keys.dtype)
        self.values[layout.slots, :, layout.positions] = values.to(self.values.dtype)

    def keep(self, slots: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move kept tree nodes into place: storage src[m] -> dst[m] of slot slots[m], all [M]
        (dst[m] <= src[m]; the gather copies first, so overlapping moves are safe)."""
        self.keys[slots, :, dst] = self.keys[slots, :, src]
        self.values[slots, :, dst] = self.values[slots, :, src]

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy a slot's first `length` positions to another slot."""
        self.keys[dst, :, :length] = self.keys[src, :, :length]
        self.values[dst, :, :length] = self.values[src, :, :length]


def slot_attention(query: torch.Tensor, kv: SlotKV, layout: StepLayout,
                   scale: float | None = None, window: int | None = None) -> torch.Tensor:
    """Attention of the packed queries over their slots.  query [T, heads, d] -> [T, heads, d]

    `window`: a sliding-window layer's (transformers' rule: a query at position p sees keys at
    p − window < position <= p). Keys are banded by storage index, which is their position except
    for tree nodes: a node's ancestors stay in its window while the tree is shallower than the
    window (`SpeculativeDecoder` refuses deeper trees)."""
    out = query.new_empty(query.shape)
    for g in layout.groups:
        q = query[g.gather].transpose(1, 2)  # [G, h, L, d]
        k = kv.keys[g.slots, :, : g.kv_len]  # [G, kvh, K, d]
        v = kv.values[g.slots, :, : g.kv_len]
        mask = g.mask  # [G, 1, L, K]
        if window is not None:
            keys = torch.arange(g.kv_len, device=query.device)  # [K]
            oldest = layout.rope_positions[g.gather] - window  # [G, L]: keys past it are in the window
            mask = mask & (keys > oldest[..., None])[:, None]
        o = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=scale,
                                           enable_gqa=k.shape[1] != q.shape[1])  # [G, h, L, d]
        flat = o.transpose(1, 2).reshape(-1, o.shape[1], o.shape[3])  # [G·L, h, d]
        out[g.gather.flatten()[g.valid]] = flat[g.valid]
    return out


@dataclass(slots=True)
class SlotView:
    """One layer's slot buffers as a drafter layer sees them in a forward: the new tokens' K/V are
    written at their positions, then every query attends over its slot (`layout.causal` decides
    whether it sees later tokens of its own segment). DFlash writes its block right after each
    request's context, scratch that the next absorbed context overwrites, so block K/V never
    persist; EAGLE-3's chain steps do the same after the committed slots."""

    kv: SlotKV
    layout: StepLayout  # the b·s new tokens in row-major order

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [b, h, s, d]; k, v [b, kvh, s, d] (RoPE applied) -> [b, h, s, d]"""
        b, h, s, d = q.shape
        packed = [t.transpose(1, 2).reshape(b * s, -1, d) for t in (q, k, v)]  # [b·s, heads, d]
        self.kv.write(self.layout, packed[1], packed[2])
        out = slot_attention(packed[0], self.kv, self.layout)
        return out.view(b, s, h, d).transpose(1, 2)


# -- a Hugging Face model over slot buffers ----------------------------------------------------

class SlotKVCache:
    """transformers' cache protocol over `SlotKV` buffers: `update` stores the step's keys and
    values and hands the layer its `SlotKV`, which `hf_slot_attention` reads through the layout."""

    is_compileable = False

    def __init__(self, layers: list[SlotKV]):
        self.layers = layers
        self.layout: StepLayout | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key_states, value_states [1, kv_heads, T, d] of the packed tokens."""
        kv = self.layers[layer_idx]
        kv.write(self.layout, key_states[0].transpose(0, 1), value_states[0].transpose(0, 1))
        return kv, kv

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


def hf_slot_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      trtspec_layout: StepLayout | None = None, sliding_window: int | None = None, **kwargs):
    """The "trtspec_slots" attention implementation: packed queries over `SlotKV` when the model
    is called with a `trtspec_layout`, transformers' SDPA otherwise. `sliding_window`: what a
    sliding-window layer of the model passes (None for full attention)."""
    if trtspec_layout is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, sliding_window=sliding_window, **kwargs)
    out = slot_attention(query[0].transpose(0, 1), key, trtspec_layout, scaling, sliding_window)  # [T, h, d]
    return out[None], None  # [1, T, h, d], as transformers' attention functions return


def use_slot_attention(model) -> None:
    """Let a Hugging Face model run over slot buffers (and keep SDPA for ordinary calls)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, hf_slot_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, sdpa_mask)
    if model.config._attn_implementation != ATTN_IMPLEMENTATION:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)


def head_dim_of(config) -> int:
    """A Hugging Face config's attention head width (`head_dim`, else hidden_size / heads)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def slot_bytes_per_position(config, dtype: torch.dtype, num_layers: int | None = None) -> int:
    """K and V of one position in every decoder layer (or `num_layers`) of a Hugging Face config."""
    layers = config.num_hidden_layers if num_layers is None else num_layers
    return 2 * layers * config.num_key_value_heads * head_dim_of(config) * dtype.itemsize


def hf_slot_buffers(config, num_slots: int, capacity: int, dtype: torch.dtype,
                    device: torch.device | str) -> list[SlotKV]:
    """One `SlotKV` per decoder layer of a Hugging Face causal LM config."""
    return [SlotKV(num_slots, config.num_key_value_heads, capacity, head_dim_of(config), dtype, device)
            for _ in range(config.num_hidden_layers)]


@torch.inference_mode()
def hf_forward(model, cache: SlotKVCache, layout: StepLayout, input_ids: torch.Tensor,
               logits_at: torch.Tensor | None):
    """One forward of a Hugging Face causal LM over packed tokens.  input_ids [T]; logits_at [n]
    packed indices whose logits to compute (None = all).  -> model output (logits [1, n, V])."""
    cache.layout = layout
    return model(
        input_ids=input_ids[None],  # [1, T]
        position_ids=layout.rope_positions[None],
        attention_mask=_NO_MASK,  # a 4D mask is taken as given: transformers builds none
        **{cache_argument(type(model)): cache},
        use_cache=True,
        logits_to_keep=0 if logits_at is None else logits_at,
        trtspec_layout=layout,  # reaches every attention call
    )


_NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)  # never read: the layout says who sees what


@functools.cache
def cache_argument(model_class: type) -> str:
    """The name a model's forward takes its KV cache under: `cache` from transformers 5.24 on,
    `past_key_values` before (which silently ignores an unknown `cache=` and runs cache-less)."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"
