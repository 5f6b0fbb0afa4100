"""Slot buffers and packed attention: every segment's queries see exactly their own slot's keys
(causally, or over the whole segment), whatever else shares the forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trtspec import memory
from trtspec.errors import ConfigError
from trtspec.models.kv_slots import Segment, SlotKV, StepLayout, slot_attention

HEADS, KV_HEADS, D = 4, 2, 8


def _reference(q, keys, values, start, causal):
    """One segment alone: q [s, h, d] over keys/values [kvh, start + s, d]."""
    s = q.shape[0]
    k_pos = torch.arange(start + s)
    q_pos = start + torch.arange(s)
    mask = (k_pos[None] <= q_pos[:, None]) if causal else torch.ones(s, start + s, dtype=torch.bool)
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys[None], values[None], attn_mask=mask,
                                         enable_gqa=True)
    return out[0].transpose(0, 1)


@pytest.mark.parametrize("causal", [True, False])
def test_packed_segments_equal_each_segment_alone(causal):
    gen = torch.Generator().manual_seed(0)
    kv = SlotKV(5, KV_HEADS, 64, D, torch.float32, "cpu")
    # slots 3, 0, 4 hold 20, 7 and 31 earlier positions; slot 1 is idle
    history = {3: 20, 0: 7, 4: 31}
    for slot, n in history.items():
        kv.keys[slot, :, :n] = torch.randn(KV_HEADS, n, D, generator=gen)
        kv.values[slot, :, :n] = torch.randn(KV_HEADS, n, D, generator=gen)
    segments = [Segment(3, 20, 1), Segment(0, 7, 16), Segment(4, 31, 5)]  # ragged: padding inside a group
    layout = StepLayout(segments, causal=causal)
    t = layout.num_tokens
    new_k, new_v = torch.randn(t, KV_HEADS, D, generator=gen), torch.randn(t, KV_HEADS, D, generator=gen)
    kv.write(layout, new_k, new_v)
    q = torch.randn(t, HEADS, D, generator=gen)
    out = slot_attention(q, kv, layout)
    start = 0
    for seg in segments:
        end = start + seg.length
        n = seg.start + seg.length
        keys, values = kv.keys[seg.slot, :, :n], kv.values[seg.slot, :, :n]
        ref = _reference(q[start:end], keys, values, seg.start, causal)
        torch.testing.assert_close(out[start:end], ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kv.keys[seg.slot, :, seg.start : n].transpose(0, 1), new_k[start:end])
        start = end
    assert layout.positions.tolist()[:2] == [20, 7] and layout.slots.tolist()[:2] == [3, 0]


def test_groups_keep_padding_bounded():
    """A long prefill does not pad the short verify segments to its length."""
    layout = StepLayout([Segment(0, 0, 300), Segment(1, 40, 16), Segment(2, 50, 16), Segment(3, 9, 12)])
    widths = sorted(g.gather.shape[1] for g in layout.groups)
    assert widths == [16, 300]


@pytest.mark.parametrize("causal", [True, False])
def test_mixed_step_attends_over_slot_views_and_stays_exact(causal):
    """Some requests draft (3 tokens), others feed one, one slot is idle: the drafting group takes
    the plain slot in its range and a dummy row for the idle one, so it reads its slots' K/V as a
    view (no gathered copy), and every segment still sees exactly its own slot."""
    gen = torch.Generator().manual_seed(7)
    kv = SlotKV(8, KV_HEADS, 64, D, torch.float32, "cpu")
    segments = [Segment(5, 11, 3), Segment(0, 9, 3), Segment(3, 30, 1), Segment(1, 4, 3),
                Segment(2, 17, 3), Segment(7, 2, 1)]  # slot 4 and 6 idle; 3 and 7 plain
    for seg in segments:
        kv.keys[seg.slot, :, : seg.start] = torch.randn(KV_HEADS, seg.start, D, generator=gen)
        kv.values[seg.slot, :, : seg.start] = torch.randn(KV_HEADS, seg.start, D, generator=gen)
    layout = StepLayout(segments, causal=causal)
    assert [isinstance(g.slots, slice) for g in layout.groups] == [True, True]
    t = layout.num_tokens
    kv.write(layout, torch.randn(t, KV_HEADS, D, generator=gen), torch.randn(t, KV_HEADS, D, generator=gen))
    q = torch.randn(t, HEADS, D, generator=gen)
    out = slot_attention(q, kv, layout)
    start = 0
    for seg in segments:
        end, n = start + seg.length, seg.start + seg.length
        keys, values = kv.keys[seg.slot, :, :n], kv.values[seg.slot, :, :n]
        ref = _reference(q[start:end], keys, values, seg.start, causal)
        torch.testing.assert_close(out[start:end], ref, atol=1e-5, rtol=1e-5)
        start = end


def test_sparse_wide_groups_keep_their_gather():
    """Filling holes of a long group would pad more query rows than a gathered copy costs: two
    64-token segments at the ends of 8 slots (6 × 64 padded rows measured 1.4-1.8x slower)."""
    layout = StepLayout([Segment(0, 5, 64)] + [Segment(s, 5, 1) for s in range(1, 7)] + [Segment(7, 5, 64)])
    assert sorted(g.gather.shape[1] for g in layout.groups) == [1, 64]
    assert not isinstance(next(g for g in layout.groups if g.gather.shape[1] == 64).slots, slice)


def test_alternating_verify_segments_are_filled_into_one_view():
    """17-token segments in alternate slots (drafting rows beside plain ones) take the plain rows in,
    padded: one attention over a contiguous slot range, no gathered copy (measured faster)."""
    layout = StepLayout([Segment(0, 5, 17), Segment(1, 5, 1), Segment(2, 5, 17), Segment(3, 5, 1),
                         Segment(4, 5, 17)])
    assert [g.gather.shape[1] for g in layout.groups] == [17]
    assert isinstance(layout.groups[0].slots, slice)


def test_a_tree_segment_rotates_by_depth_and_sees_only_its_ancestors():
    """A draft tree stored from index 10 of slot 1 (node i at 10 + i) beside a chain in slot 0:
    node i is rotated at 10 + depth(i) and attends to the slot's context [0, 10), its ancestors and
    itself only; a later forward's segment may hold the tree's last nodes, never lie outside it."""
    from trtspec.models.kv_slots import TreeSpan, tree_depths

    gen = torch.Generator().manual_seed(3)
    parents = (-1, 0, 0, 1, -1, 4, 3)  # two roots; node 3's parent is node 1, node 6's node 3
    assert tree_depths(parents) == [0, 1, 1, 2, 0, 1, 3]
    for bad in ((0,), (-1, 1), (-1, -2)):  # a parent must come before its node, -1 for a root
        with pytest.raises(ValueError, match="parents must come first"):
            tree_depths(bad)
    kv = SlotKV(2, KV_HEADS, 32, D, torch.float32, "cpu")
    for slot, n in ((0, 6), (1, 10)):
        kv.keys[slot, :, :n] = torch.randn(KV_HEADS, n, D, generator=gen)
        kv.values[slot, :, :n] = torch.randn(KV_HEADS, n, D, generator=gen)
    layout = StepLayout([Segment(0, 6, 2), Segment(1, 10, len(parents), TreeSpan(10, parents))])
    assert layout.positions.tolist() == [6, 7, *range(10, 17)]
    assert layout.rope_positions.tolist() == [6, 7, 10, 11, 11, 12, 10, 11, 13]
    t = layout.num_tokens
    kv.write(layout, torch.randn(t, KV_HEADS, D, generator=gen), torch.randn(t, KV_HEADS, D, generator=gen))
    q = torch.randn(t, HEADS, D, generator=gen)
    out = slot_attention(q, kv, layout)
    chain = _reference(q[:2], kv.keys[0, :, :8], kv.values[0, :, :8], 6, causal=True)
    torch.testing.assert_close(out[:2], chain, atol=1e-5, rtol=1e-5)
    for i in range(len(parents)):
        seen, node = [], i
        while node >= 0:  # the node and its ancestors, at their storage indices
            seen.insert(0, 10 + node)
            node = parents[node]
        idx = torch.tensor([*range(10), *seen])
        ref = F.scaled_dot_product_attention(q[2 + i][None, :, None], kv.keys[1, :, idx][None],
                                             kv.values[1, :, idx][None], enable_gqa=True)[0, :, 0]
        torch.testing.assert_close(out[2 + i], ref, atol=1e-5, rtol=1e-5)
    # the tree fed in two forwards: the second holds nodes 4..6 only, rotated by their depths
    later = StepLayout([Segment(1, 14, 3, TreeSpan(10, parents))])
    assert later.positions.tolist() == [14, 15, 16] and later.rope_positions.tolist() == [10, 11, 13]
    with pytest.raises(ValueError, match="lies outside its tree"):
        StepLayout([Segment(1, 15, 3, TreeSpan(10, parents))])  # nodes 5..7 of a 7-node tree
    with pytest.raises(ValueError, match="lies outside its tree"):
        StepLayout([Segment(1, 9, 2, TreeSpan(10, parents))])  # starts before its tree


def test_a_drafter_layer_s_view_and_the_hf_cache_write_and_attend_over_their_slots():
    """`SlotView.attend` (a drafter layer: q, k, v [b, heads, s, d], row r its request's s new tokens)
    stores k, v at each row's positions and attends over the row's slot; `SlotKVCache.update`
    (transformers' [1, kv_heads, T, d] of the packed tokens) stores them likewise."""
    from trtspec.models.kv_slots import SlotKVCache, SlotView

    gen = torch.Generator().manual_seed(4)
    b, s, starts = 2, 3, (5, 9)
    kv = SlotKV(2, KV_HEADS, 16, D, torch.float32, "cpu")
    for slot, n in enumerate(starts):
        kv.keys[slot, :, :n] = torch.randn(KV_HEADS, n, D, generator=gen)
        kv.values[slot, :, :n] = torch.randn(KV_HEADS, n, D, generator=gen)
    layout = StepLayout([Segment(r, starts[r], s) for r in range(b)])
    q = torch.randn(b, HEADS, s, D, generator=gen)
    k, v = torch.randn(b, KV_HEADS, s, D, generator=gen), torch.randn(b, KV_HEADS, s, D, generator=gen)
    out = SlotView(kv, layout).attend(q, k, v)  # [b, h, s, d]
    for r, start in enumerate(starts):
        torch.testing.assert_close(kv.keys[r, :, start : start + s], k[r])
        torch.testing.assert_close(kv.values[r, :, start : start + s], v[r])
        seen = slice(0, start + s)
        ref = _reference(q[r].transpose(0, 1), kv.keys[r, :, seen], kv.values[r, :, seen], start,
                         causal=True)  # [s, h, d]
        torch.testing.assert_close(out[r], ref.transpose(0, 1), atol=1e-5, rtol=1e-5)
    cache = SlotKVCache([SlotKV(2, KV_HEADS, 16, D, torch.float32, "cpu")])
    cache.layout = layout
    new_k = torch.randn(1, KV_HEADS, b * s, D, generator=gen)
    new_v = torch.randn(1, KV_HEADS, b * s, D, generator=gen)
    got, _ = cache.update(new_k, new_v, 0)
    assert got is cache.layers[0]
    for r, start in enumerate(starts):
        torch.testing.assert_close(got.keys[r, :, start : start + s], new_k[0, :, r * s : (r + 1) * s])
        torch.testing.assert_close(got.values[r, :, start : start + s], new_v[0, :, r * s : (r + 1) * s])


def test_slot_bytes_per_position_is_what_the_buffers_hold():
    """The memory check's K/V bytes per position of a Hugging Face config are what its slot buffers
    take per slot and position, for every layer or the ones asked for."""
    from types import SimpleNamespace

    from trtspec.models.kv_slots import hf_slot_buffers, slot_bytes_per_position

    config = SimpleNamespace(num_hidden_layers=3, num_key_value_heads=2, num_attention_heads=4,
                             hidden_size=32, head_dim=None)  # head_dim from hidden_size / heads: 8
    for dtype in (torch.float32, torch.bfloat16):
        held = sum(t.numel() * t.element_size() for kv in hf_slot_buffers(config, 2, 5, dtype, "cpu")
                   for t in (kv.keys, kv.values))
        assert slot_bytes_per_position(config, dtype) == held // (2 * 5)
        assert slot_bytes_per_position(config, dtype, num_layers=1) == held // (2 * 5 * 3)


def test_slot_buffers_that_fit_exactly_pass_and_a_refusal_says_what_fits(monkeypatch):
    """2 slots of 1,000 positions at 1,000 bytes a position, and 100,000 bytes of graph outputs:
    2,100,000 bytes. Free exactly that, they pass; a byte less, they are refused, and what fits is
    (free - graph outputs) // (slots * bytes a position) positions a slot."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(memory, "free_bytes", lambda device: 2_100_000)
    memory.check_slot_buffers(1_000, cpu, 2, 1_000, None, graph_bytes=100_000)
    monkeypatch.setattr(memory, "free_bytes", lambda device: 2_000_000)
    memory.check_slot_buffers(1_000, cpu, 2, 1_000, None)  # no graph outputs: no byte set aside
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1_000_000)
    with pytest.raises(ConfigError) as refused:
        memory.check_slot_buffers(1_000, cpu, 2, 1_000, 900, graph_bytes=100_000)
    said = str(refused.value)  # (1,000,000 - 100,000) // (2 * 1,000) = 450
    assert "for 2 requests (limits.max_concurrency) of 1,000 positions each (limits.max_input_tokens" in said
    assert "so that it + limits.max_tokens <= 450 or lower limits.max_concurrency" in said
    monkeypatch.setattr(memory, "free_bytes", lambda device: 50_000)  # less than the graph outputs
    with pytest.raises(ConfigError, match=r"<= 0 or lower"):
        memory.check_slot_buffers(1_000, cpu, 2, 1_000, 900, graph_bytes=100_000)


def test_free_memory_on_the_cpu_is_the_least_of_available_and_the_cgroups_room(tmp_path, monkeypatch):
    """/proc/meminfo's MemAvailable, bounded by a cgroup v2 limit less what the cgroup uses; no
    limit ("max"): MemAvailable alone."""
    meminfo, limit, used = tmp_path / "meminfo", tmp_path / "memory.max", tmp_path / "memory.current"
    meminfo.write_text("MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n")
    monkeypatch.setattr(memory, "MEMINFO", meminfo)
    monkeypatch.setattr(memory, "CGROUP_V2_MEMORY", (limit, used))
    limit.write_text("3000000000\n")
    used.write_text("1000000000\n")
    assert memory.free_bytes(torch.device("cpu")) == 2_000_000_000  # the cgroup's room, the lesser
    limit.write_text("12000000000\n")
    assert memory.free_bytes(torch.device("cpu")) == 8_000_000 * 1024  # MemAvailable, the lesser
    limit.write_text("max\n")
    assert memory.free_bytes(torch.device("cpu")) == 8_000_000 * 1024
