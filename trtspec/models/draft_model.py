"""Classic draft model (`method: draft_model`): a small causal LM proposing k tokens one by one.

It shares the target's tokenizer and keeps its own per-slot K/V (the same slot buffers and packed
forward as the target, `TargetModel`). Before each proposal every row's cache is rewound to the
longest prefix it shares with the committed tokens (the drafts it fed that the target rejected
are dropped); then ONE packed forward feeds every row's missing committed tokens and gives x_1,
and each further draft position is ONE forward over all rows. Draft cost grows O(k).

A tree (`propose_tree`) expands the K best children per step (EAGLE-2's dynamic tree): each depth
is ONE forward over every row's frontier, written after the committed tokens in tree attention.
At the next proposal the nodes on the committed path keep their K/V, moved into place
(`TargetModel.keep_paths`): a node's K/V depend only on its root path, which the target accepted.
"""

from __future__ import annotations

import copy

import torch

from trtspec.errors import CheckpointError
from trtspec.models.cuda_graphs import graphs_wanted
from trtspec.models.drafter import (
    Drafter,
    DraftRow,
    Proposal,
    common_prefix,
    draft_positions,
    register_drafter,
)
from trtspec.models.target import Chunk, PathKeep, TargetModel, chunk_offsets, load_causal_lm
from trtspec.spec.grammar import choose_drafts
from trtspec.spec.tree import grow_tree, log_scores


class DraftModelDrafter(Drafter):
    method = "draft_model"

    def __init__(self, model, num_draft_tokens: int, cuda_graphs: bool = False):
        self.lm = TargetModel(model, cuda_graphs=cuda_graphs)  # its chain steps: one token per row
        self.cuda_graphs = cuda_graphs
        self.num_draft_tokens = num_draft_tokens
        self.fed: dict[int, list[int]] = {}  # slot -> the token ids its cache holds
        self.fed_drafts: dict[int, torch.Tensor] = {}  # slot -> drafts fed in the last proposal
        self.fed_tree: dict[int, tuple[list[int], list[int]]] = {}  # slot -> (tokens, parents) fed as a tree

    @property
    def kv_bytes_per_position(self) -> int:
        return self.lm.kv_bytes_per_position

    def allocate(self, num_slots, capacity):
        # drafts are fed after the committed tokens, hence the extra room; a copy gets its own cache
        self.lm = copy.copy(self.lm)
        self.lm.allocate(num_slots, capacity + self.num_draft_tokens)
        self.fed, self.fed_drafts, self.fed_tree = {}, {}, {}
        self.held: dict[int, list[int]] = {}  # released slot -> the tokens its cache still holds

    def begin(self, slot, prompt, hidden, reused=0):
        # its own K/V of what it fed, however many positions the target kept: it catches up on
        # the rest from the tokens themselves (`_sync`)
        kept = common_prefix(self.held.pop(slot, ()), prompt)
        self.lm.reuse(slot, kept)
        self.fed[slot] = list(prompt[:kept])
        self.fed_drafts.pop(slot, None)
        self.fed_tree.pop(slot, None)

    def reusable(self, slot, prompt):
        """It needs no taps: any prefix the target keeps will do. What it keeps of its own (`begin`):
        its K/V at position i come from tokens 0..i, valid while those match."""
        return len(prompt)

    def release(self, slot, tokens=None):
        fed = self.fed.pop(slot, None)
        self.lm.release(slot)
        self.fed_drafts.pop(slot, None)  # fed after `fed`, never read again
        self.fed_tree.pop(slot, None)
        if tokens is None or not fed:
            self.held.pop(slot, None)
        else:
            self.held[slot] = fed

    def catch_up(self, slot, committed):
        # the committed tokens its cache lacks; last proposal's drafts count as held (most of them
        # are accepted when drafting pays), so one step's catch-up reads as about one token
        fed = len(self.fed.get(slot, ())) + len(self.fed_drafts.get(slot, ()))
        return max(1, committed - fed)

    def _keep_committed_path(self, row: DraftRow) -> None:
        """After a tree proposal: keep the fed nodes on the committed path, the rest is dropped."""
        tokens, parents = self.fed_tree.pop(row.slot)
        fed, committed = self.fed[row.slot], row.committed
        start, u, path = len(fed), -1, []
        for token in committed[start : len(committed) - 1]:  # the last one is fed again as the root
            u = next((i for i, (t, p) in enumerate(zip(tokens, parents, strict=True))
                      if p == u and t == token), None)
            if u is None:
                break
            path.append(u)
        self.lm.keep_paths([PathKeep(row.slot, start, path)])
        fed += committed[start : start + len(path)]

    def _sync(self, row: DraftRow) -> list[int]:
        """Rewind the row's cache to what it shares with the committed tokens; return the
        committed tokens still to feed (at least the last one)."""
        if row.slot in self.fed_tree:
            self._keep_committed_path(row)
        fed, committed = self.fed[row.slot], row.committed
        fed += self.fed_drafts.pop(row.slot, torch.zeros(0, dtype=torch.long)).tolist()
        common, limit = 0, min(len(fed), len(committed) - 1)
        while common < limit and fed[common] == committed[common]:
            common += 1
        self.lm.rewind(row.slot, len(fed) - common)
        del fed[common:]
        return committed[common:]

    @torch.inference_mode()
    def propose(self, rows, k):
        device = self.lm.device
        chunks = []
        for row in rows:
            missing = self._sync(row)
            self.fed[row.slot] += missing
            chunks.append(Chunk(row.slot, torch.tensor(missing, device=device)))
        tokens, q_rows = [], []
        for i in range(k):
            last = torch.tensor(chunk_offsets(chunks)[1:], device=device) - 1  # each row's last token
            logits = self.lm.forward(chunks, logits_at=last).logits  # [R, V]
            token, q = choose_drafts(logits, rows, i)
            tokens.append(token)
            if q is not None:
                q_rows.append(q)
            if i + 1 < k:
                chunks = [Chunk(row.slot, token[r : r + 1]) for r, row in enumerate(rows)]
        drafts = torch.stack(tokens, 1)  # [R, k]
        for r, row in enumerate(rows):  # x_1..x_{k−1} were fed; read back at the next sync
            self.fed_drafts[row.slot] = drafts[r, : k - 1]
        self.num_forwards = self.lm.num_forwards
        return Proposal(tokens=drafts, q_probs=torch.stack(q_rows, 1) if q_rows else None)

    @torch.inference_mode()
    def propose_tree(self, rows, tree):
        device = self.lm.device
        params = [row.sampling for row in rows]
        chunks = []
        for row in rows:
            missing = self._sync(row)
            self.fed[row.slot] += missing
            chunks.append(Chunk(row.slot, torch.tensor(missing, device=device)))
        last = torch.tensor(chunk_offsets(chunks)[1:], device=device) - 1
        first = log_scores(self.lm.forward(chunks, logits_at=last).logits, params,
                           draft_positions(rows)[:, 0])  # [R, V]
        starts = [len(self.fed[row.slot]) for row in rows]
        fed = {row.slot: ([], []) for row in rows}  # slot -> (tokens, parents) of the nodes fed
        state = {"first": 0}

        def expand(d: int, frontier: torch.Tensor, from_prev: torch.Tensor) -> torch.Tensor:
            r, f = frontier.shape
            prev = state["first"]
            state["first"] = len(fed[rows[0].slot][0])
            chunks = []
            for i, (row, start, up) in enumerate(zip(rows, starts, from_prev.tolist(), strict=True)):
                tokens, parents = fed[row.slot]
                tokens += frontier[i].tolist()
                parents += [-1 if d == 1 else prev + j for j in up]
                chunks.append(Chunk(row.slot, frontier[i], tuple(parents), start))
            return log_scores(self.lm.forward(chunks).logits.view(r, f, -1), params,
                              draft_positions(rows, d))  # [R, F, V]

        drafted = grow_tree(first, expand, tree.topk, tree.nodes, self.tree_depth(tree),
                            [row.grammar for row in rows])
        self.fed_tree.update(fed)
        self.num_forwards = self.lm.num_forwards
        return drafted


@register_drafter("draft_model")
def _build(config, target) -> DraftModelDrafter:
    model = load_causal_lm(config.resolved_path, dtype=config.dtype, device=str(target.device))
    if model.config.vocab_size != target.vocab_size:
        raise CheckpointError(
            f"drafter {config.resolved_path}: vocab_size {model.config.vocab_size} does not match "
            f"the target's vocab_size {target.vocab_size}; a draft model must share the tokenizer"
        )
    graphs = graphs_wanted(config.cuda_graphs, model.device)
    return DraftModelDrafter(model, config.num_draft_tokens or 5, graphs)
