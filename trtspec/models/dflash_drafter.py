"""DFlash as a `Drafter`: one drafter forward per step drafts a block for every running request.

State per slot: the projected context K/V of every position the target has cached for that
request (`ctx_len[slot]` of them, in per-layer slot buffers) plus the taps the target produced
since the last proposal that are not yet projected (`pending`). A proposal

1. projects the pending taps of every row in ONE packed pass and writes them after each row's
   context, so each anchor (the last committed token) sits at position `ctx_len[slot]`;
2. runs ONE block forward over `[anchor, MASK × (B−1)]` for all rows, each row's block at
   positions ctx_len..ctx_len+B−1, attending to its own context and its whole block.

A tree (`propose_tree`) comes from the same one block forward: slot d's marginal scores every
depth-d node, whatever its parent, and EAGLE-2's expansion ranks paths by their product.
"""

from __future__ import annotations

import torch

from trtspec.errors import CheckpointError
from trtspec.models.cuda_graphs import MAX_TOKENS, GraphedSteps, StaticLayout, graphs_wanted
from trtspec.models.dflash import DFlashDraftModel, load_dflash
from trtspec.models.drafter import DraftRow, Proposal, TapsDrafter, draft_positions, register_drafter
from trtspec.models.kv_slots import Segment, SlotKV, SlotView, StepLayout, slot_bytes_per_position
from trtspec.models.target import DTYPES
from trtspec.spec.grammar import choose_drafts
from trtspec.spec.sampling import choose_tokens
from trtspec.spec.tree import DraftTree, grow_tree, log_scores

# a block drafter projects a slot's pending taps once they stand for this many positions, drafting
# or not: a request decoding plainly (adaptive speculation at a large batch) would otherwise hold
# the taps of its whole prompt and output, 40 KB a position on an 8B target with 5 taps in bf16
ABSORB_AT = 256


class BlockDrafter(TapsDrafter):
    """A drafter whose ONE block pass gives logits for every draft slot (DFlash, and DSpark's
    backbone; torch and engine): chains and trees both come from those per-slot logits."""

    block_size: int  # the anchor and block_size - 1 draft slots

    def _absorb_pending(self, slots: list[int]) -> None:
        """Project every pending tap of these slots in one pass and append it to their context."""
        raise NotImplementedError

    def tidy(self) -> None:
        """Project the piles of ABSORB_AT positions or more, all in one pass: the context they
        stand for must be projected before the slot drafts anyway, so this moves that work earlier
        (a new prompt's: to the step that prefilled it) and bounds the taps a slot holds."""
        piled = [slot for slot, n in self.pending.positions.items() if n >= ABSORB_AT]
        if piled:
            self._absorb_pending(piled)

    def release(self, slot, tokens=None):
        self.release_many([(slot, tokens)])

    def release_many(self, releases):
        """Kept for a next prompt: the pending taps are projected first, every kept slot's in ONE
        pass (over at most ABSORB_AT positions each), so the context covers every position the
        target holds. Dropped, a request that decoded plainly (adaptive speculation at a large
        batch) would leave its whole answer for the target to prefill again at the next turn."""
        kept = [slot for slot, tokens in releases if tokens is not None and self.pending.positions.get(slot)]
        if kept:
            self._absorb_pending(kept)
        for slot, tokens in releases:
            super().release(slot, tokens)

    def anchor_starts(self, rows: list[DraftRow]) -> list[int]:
        """Each row's anchor position, which must be where its absorbed context ends."""
        starts = []
        for row in rows:
            start = len(row.committed) - 1
            if start != self.ctx_len[row.slot]:
                raise RuntimeError(f"{self.method} context of slot {row.slot} holds "
                                   f"{self.ctx_len[row.slot]} positions, anchor is at {start}")
            starts.append(start)
        return starts

    def draft_logits(self, rows: list[DraftRow], k: int) -> torch.Tensor:
        """Logits of draft slots 1..k of every row's block.  -> [R, k, V]"""
        raise NotImplementedError

    @property
    def max_tree_depth(self) -> int:
        return self.block_size - 1

    def propose(self, rows, k):
        return propose_block(self.draft_logits(rows, k), rows)

    def propose_tree(self, rows, tree):
        depth = self.tree_depth(tree)
        return marginal_tree(self.draft_logits(rows, depth), rows, tree, depth)


class DFlashDrafter(BlockDrafter):
    method = "dflash"

    def __init__(self, model: DFlashDraftModel, embed_tokens: torch.nn.Module, lm_head: torch.nn.Module,
                 num_draft_tokens: int | None = None, cuda_graphs: bool = False):
        """`cuda_graphs`: block forwards and context projections padded to static shapes
        (`trtspec.models.cuda_graphs`), replayed as CUDA graphs on a CUDA device and eagerly
        elsewhere."""
        self.model = model
        self.embed_tokens, self.lm_head = embed_tokens, lm_head  # the target's, frozen
        self.tap_layer_ids = tuple(model.spec.target_layer_ids)
        self.block_size = model.spec.block_size
        self.num_draft_tokens = num_draft_tokens or self.block_size - 1
        self.device, self.dtype = model.fc.weight.device, model.fc.weight.dtype
        self.ctx: list[SlotKV] = []
        self.cuda_graphs = cuda_graphs
        self.graphed: GraphedSteps | None = None  # block forwards
        self.projections: GraphedSteps | None = None  # context projections

    @property
    def kv_bytes_per_position(self) -> int:
        return slot_bytes_per_position(self.model.config, self.dtype, num_layers=len(self.model.layers))

    def allocate(self, num_slots, capacity):
        super().allocate(num_slots, capacity)
        cfg = self.model.config
        room = capacity + self.block_size  # a block is written after the longest context
        scratch = MAX_TOKENS if self.cuda_graphs else 0  # the padded steps' dummy rows write there
        self.ctx = [SlotKV(num_slots, cfg.num_key_value_heads, room + scratch, cfg.head_dim,
                           self.dtype, self.device) for _ in self.model.layers]
        capture = self.device.type == "cuda"
        self.graphed = None if not self.cuda_graphs else \
            GraphedSteps(self._block, self.device, num_slots, room, capture, causal=False)
        self.projections = None if not self.cuda_graphs else \
            GraphedSteps(self._project, self.device, num_slots, room, capture, attends=False)

    @torch.inference_mode()
    def _absorb_pending(self, slots: list[int]) -> None:
        """Project every pending tap of these slots in one pass and append it to their context."""
        segments, taps = [], []
        for slot in slots:
            new = self.pending.take(slot)
            if new is not None:
                segments.append(Segment(slot, self.ctx_len[slot], len(new)))
                taps.append(new)
        if not segments:
            return
        x = torch.cat(taps).to(self.device, self.dtype)  # [N, n_taps·H]
        padded = self.projections.run(segments, x) if self.projections is not None else None
        if padded is None:  # a prefill's taps (or no graphs): packed
            self._project(StepLayout(segments, self.device), x)
        for s in segments:
            self.ctx_len[s.slot] += s.length

    def _project(self, layout: StepLayout | StaticLayout, taps: torch.Tensor) -> tuple[()]:
        """The context K/V of every layer from `taps` [T, n_taps·H], written where `layout` places
        them (packed, or padded for a graph). -> no outputs"""
        for kv, (k, v) in zip(self.ctx, self.model.project_context(taps[None], layout.positions[None]),
                              strict=True):
            kv.write(layout, k[0].transpose(0, 1), v[0].transpose(0, 1))  # [T, kvh, d]
        return ()

    @torch.inference_mode()
    def block_hidden(self, rows: list[DraftRow]) -> torch.Tensor:
        """Final-normed hidden states of every row's block.  -> [R, B, H]"""
        slots = [row.slot for row in rows]
        self._absorb_pending(slots)
        starts = self.anchor_starts(rows)
        b = self.block_size
        mask_id = self.model.spec.mask_token_id
        block = torch.full((len(rows), b), mask_id, dtype=torch.long, device=self.device)  # [R, B]
        block[:, 0] = torch.tensor([row.committed[-1] for row in rows], device=self.device)
        segments = [Segment(s, start, b) for s, start in zip(slots, starts, strict=True)]
        self.num_forwards += 1
        padded = self.graphed.run(segments, block.flatten()) if self.graphed is not None else None
        if padded is not None:  # out of the graph's buffers by packed index
            (hidden,), index = padded
            return hidden[index].view(len(rows), b, -1)
        layout = StepLayout(segments, self.device, causal=False)
        return self._block(layout, block.flatten())[0].view(len(rows), b, -1)

    def _block(self, layout: StepLayout | StaticLayout, input_ids: torch.Tensor) -> tuple[torch.Tensor]:
        """Block forwards of whole blocks over the slot buffers as `layout` places them (packed, or
        padded for a graph).  input_ids [rows·B] -> (hidden [rows·B, H],)"""
        b = self.block_size
        embeds = self.embed_tokens(input_ids.view(-1, b)).to(self.dtype)  # [rows, B, H]
        hidden = self.model(embeds, layout.positions.view(-1, b), [SlotView(kv, layout) for kv in self.ctx])
        return (hidden.reshape(-1, hidden.shape[-1]),)

    def draft_logits(self, rows: list[DraftRow], k: int) -> torch.Tensor:
        """Logits of draft slots 1..k of every row's block.  -> [R, k, V]"""
        hidden = self.block_hidden(rows)[:, 1 : 1 + k]
        with torch.inference_mode():
            return self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()


def marginal_tree(logits: torch.Tensor, rows: list[DraftRow], tree, depth: int) -> DraftTree:
    """A tree from per-slot marginals logits [R, depth, V]: depth-d children are slot d's best."""
    at = draft_positions(rows, count=logits.shape[1])  # [R, D]
    scores = log_scores(logits, [row.sampling for row in rows], at)  # [R, D, V]
    guides = [row.grammar for row in rows]
    if any(g is not None for g in guides):  # each node's children masked after its path: full scores
        return grow_tree(scores[:, 0], lambda d, frontier, _: scores[:, d, None], tree.topk, tree.nodes,
                         depth, guides)
    best, tokens = scores.topk(min(tree.topk, scores.shape[-1]), -1)  # [R, D, K], once for every depth
    return grow_tree(scores[:, 0], lambda d, frontier, _: (best[:, d, None], tokens[:, d, None]), tree.topk,
                     tree.nodes, depth)


def propose_block(logits: torch.Tensor, rows: list[DraftRow]) -> Proposal:
    """Drafts from every row's block logits [R, k, V] (`choose_tokens`): argmax for greedy rows, the
    coupled draft at each slot's position for Gumbel-coupled rows; each slot of a sampling row
    drawn independently from its q under the row's own parameters."""
    tokens, q = choose_tokens(logits, [row.sampling for row in rows], [row.generator for row in rows],
                              [row.position(0) for row in rows])
    for r, row in enumerate(rows):  # a guided row: slot by slot, each under its guide after the drafts before
        if row.grammar is None:
            continue
        if row.sampling.greedy:  # each slot's masked argmax (its q, when kept: one-hot on it)
            drafts = row.grammar.greedy_block(logits[r], tokens[r].tolist())
            tokens[r] = torch.tensor(drafts, device=tokens.device)
            if q is not None:
                q[r] = torch.nn.functional.one_hot(tokens[r], q.shape[-1]).to(q.dtype)
            continue
        for j in range(logits.shape[1]):
            token, q_j = choose_drafts(logits[r : r + 1, j], [row], j)
            tokens[r, j], q[r, j] = token[0], q_j[0]
    return Proposal(tokens=tokens, q_probs=q)


@register_drafter("dflash")
def _build(config, target) -> DFlashDrafter:
    model = load_dflash(config.resolved_path, target.config, DTYPES[config.dtype]).to(target.device)
    k = config.num_draft_tokens
    if k is not None and k > model.spec.block_size - 1:
        raise CheckpointError(
            f"drafter.num_draft_tokens is {k} but the DFlash block size {model.spec.block_size} "
            f"yields at most {model.spec.block_size - 1} drafts"
        )
    hf = target.model
    graphs = graphs_wanted(config.cuda_graphs, target.device)
    return DFlashDrafter(model, hf.get_input_embeddings(), hf.get_output_embeddings(), k, graphs)
