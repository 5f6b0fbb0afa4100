"""Slot buffers and packed attention: every segment's queries see exactly their own slot's keys
(causally, or over the whole segment), whatever else shares the forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

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
