"""EAGLE-3 as a `Drafter`: a chain of k autoregressive midlayer steps, each batched over requests.

State per slot: the midlayer K/V of every drafter slot whose target feature is known
(`ctx_len[slot]` of them; drafter slot j pairs the feature of position j with token j + 1), the
output h of the last of them, and the taps the target produced since the last proposal
(`pending`). A proposal, for all rows together,

1. absorbs every row's pending taps with the now-known next tokens in ONE packed causal pass,
   whose last output per row predicts x_1 (a row with more than CATCH_UP_WINDOW pending, after
   plain steps or a long prompt, restarts its context from the newest ones: a bounded catch-up);
2. runs k − 1 chain steps, each ONE forward over all rows feeding back h and the token just
   drafted at the next position. The chain's K/V are written after the committed slots and
   overwritten by the next absorption, since the next cycle replaces the drafts' fed-back features
   by the target's own.

Draft cost therefore grows O(k) forwards, unlike DFlash's one pass per block.

A tree (`propose_tree`) is EAGLE-2's dynamic tree, as EAGLE-3 is published: after the same
absorption, each depth is ONE forward over every row's frontier (its K best nodes), written after
the committed slots in tree attention (each node sees the context and its ancestors); each node
feeds back its parent's h, as a chain step feeds back the previous one.
"""

from __future__ import annotations

import torch

from trtspec.models.cuda_graphs import MAX_TOKENS, GraphedSteps, StaticLayout, graphs_wanted
from trtspec.models.drafter import DraftRow, Proposal, TapsDrafter, draft_positions, register_drafter
from trtspec.models.eagle3 import Eagle3DraftModel, load_eagle3
from trtspec.models.kv_slots import (
    Segment,
    SlotKV,
    SlotView,
    StepLayout,
    TreeSpan,
    head_dim_of,
    slot_bytes_per_position,
)
from trtspec.models.target import DTYPES
from trtspec.spec.grammar import choose_drafts
from trtspec.spec.tree import grow_tree, log_scores

DEFAULT_NUM_DRAFT_TOKENS = 7
# a proposal absorbs at most this many of a row's newest pending positions; a row with more (plain
# steps piled them up, or a long prompt) restarts its context from them. RoPE sees only distances,
# so the kept positions are stored from drafter slot 0 on and attend exactly as they would at their
# own positions; the older ones are no longer seen. Drafts only: the verifier keeps the output exact.
CATCH_UP_WINDOW = 32


class Eagle3Drafter(TapsDrafter):
    method = "eagle3"
    pending_window = CATCH_UP_WINDOW

    def __init__(self, model: Eagle3DraftModel, num_draft_tokens: int | None = None,
                 cuda_graphs: bool = False):
        """`cuda_graphs`: catch-ups and chain steps padded to static shapes
        (`trtspec.models.cuda_graphs`), replayed as CUDA graphs on a CUDA device, eager elsewhere."""
        self.model = model
        self.tap_layer_ids = tuple(model.spec.aux_layer_ids or ())
        self.num_draft_tokens = num_draft_tokens or DEFAULT_NUM_DRAFT_TOKENS
        self.device, self.dtype = model.fc.weight.device, model.fc.weight.dtype
        self.kv: SlotKV | None = None
        self.last_h: dict[int, torch.Tensor] = {}  # slot -> [H] output of drafter slot ctx_len − 1
        self.dropped: dict[int, int] = {}  # slot -> positions before drafter slot 0 (a restart's)
        self.cuda_graphs = cuda_graphs
        self.graphed: GraphedSteps | None = None

    @property
    def kv_bytes_per_position(self) -> int:
        return slot_bytes_per_position(self.model.config, self.dtype, num_layers=1)  # its one midlayer

    def allocate(self, num_slots, capacity):
        super().allocate(num_slots, capacity)
        cfg = self.model.config
        room = capacity + self.num_draft_tokens  # the chain's k − 1 steps follow the committed slots
        scratch = MAX_TOKENS if self.cuda_graphs else 0  # the padded steps' dummy rows write there
        self.kv = SlotKV(num_slots, cfg.num_key_value_heads, room + scratch, head_dim_of(cfg), self.dtype,
                         self.device)
        self.last_h, self.dropped = {}, {}
        self.graphed = None if not self.cuda_graphs else \
            GraphedSteps(self._step, self.device, num_slots, room, capture=self.device.type == "cuda")

    def begin(self, slot, prompt, hidden, reused=0):
        super().begin(slot, prompt, hidden, reused)
        # the first `reused` positions count as dropped: the first proposal restarts from the newest
        # CATCH_UP_WINDOW (`reusable` leaves more pending), as it does without reuse
        self.ctx_len[slot], self.dropped[slot] = 0, reused
        self.last_h.pop(slot, None)

    def reusable(self, slot, prompt):
        """Positions whose taps the first proposal would drop anyway: with more than CATCH_UP_WINDOW
        pending it restarts from the newest, so the state is the one a fresh prefill gives. Kept
        midlayer K/V are not reused: drafter slot i pairs the feature of position i with token
        i + 1 (valid only for i < common − 1), and a fresh request restarts from its prompt's last
        CATCH_UP_WINDOW positions, stored from drafter slot 0, where the kept ones do not sit."""
        return max(0, len(prompt) - CATCH_UP_WINDOW - 1)

    def release(self, slot, tokens=None):
        super().release(slot)  # keeps nothing (`reusable`)
        self.last_h.pop(slot, None)
        self.dropped.pop(slot, None)

    def catch_up(self, slot, committed):
        return min(super().catch_up(slot, committed), CATCH_UP_WINDOW)

    def _absorbed(self, slot: int) -> int:
        """Target positions this slot's drafter context stands for (dropped ones included)."""
        return self.dropped.get(slot, 0) + self.ctx_len[slot]

    def _absorb_pending(self, rows: list[DraftRow]) -> None:
        """Cache the drafter slots of every row's pending taps in one packed causal pass."""
        segments, tokens, taps = [], [], []
        for row in rows:
            pile = self.pending.positions.get(row.slot, 0)
            new = self.pending.take(row.slot)  # the pile's newest positions, CATCH_UP_WINDOW or more
            if new is None:
                continue
            first, n = self._absorbed(row.slot), len(row.committed) - 1  # the target caches committed[:n]
            if first + pile != n:
                raise RuntimeError(f"EAGLE-3 slot {row.slot} holds {first} + {pile} pending positions, "
                                   f"the target caches {n}")
            if pile > CATCH_UP_WINDOW:  # restart from the newest positions
                new, first = new[-CATCH_UP_WINDOW:], n - CATCH_UP_WINDOW
                self.dropped[row.slot], self.ctx_len[row.slot] = first, 0
                self.last_h.pop(row.slot, None)
            segments.append(Segment(row.slot, self.ctx_len[row.slot], len(new)))
            tokens += row.committed[first + 1 : n + 1]  # token j + 1 for the position j of a drafter slot
            taps.append(new)
        if not segments:
            return
        ids = torch.tensor(tokens, device=self.device)  # [N]
        h = self._forward(segments, ids, self.model.fuse(torch.cat(taps).to(self.device)[None])[0])  # [N, H]
        self.num_forwards += 1
        end = 0
        for s in segments:
            end += s.length
            self.ctx_len[s.slot] += s.length
            self.last_h[s.slot] = h[end - 1]

    def _forward(self, segments: list[Segment], ids: torch.Tensor, h_in: torch.Tensor) -> torch.Tensor:
        """The drafter layer over packed chains or tree nodes, padded when `cuda_graphs` lets it.
        ids [N], h_in [N, H] (fused taps, or the previous step's outputs)  -> [N, H]"""
        padded = self.graphed.run(segments, ids, h_in) if self.graphed is not None else None
        if padded is not None:  # out of the graph's buffers by packed index
            (h,), index = padded
            return h[index]
        return self._step(StepLayout(segments, self.device), ids, h_in)[0]

    def _step(self, layout: StepLayout | StaticLayout, ids: torch.Tensor, h_in: torch.Tensor) -> tuple:
        """The drafter layer over the slot buffers as `layout` places the tokens (packed, or padded
        for a graph).  ids [T], h_in [T, H] -> ([T, H],)"""
        h, _ = self.model(ids[None], h_in[None], layout.rope_positions[None], SlotView(self.kv, layout))
        return (h[0],)

    def _check_absorbed(self, rows: list[DraftRow]) -> None:
        for row in rows:
            absorbed = self._absorbed(row.slot)
            if absorbed != len(row.committed) - 1 or row.slot not in self.last_h:
                raise RuntimeError(f"EAGLE-3 slot {row.slot} stands for {absorbed} positions, "
                                   f"the target caches {len(row.committed) - 1}")

    @torch.inference_mode()
    def propose_tree(self, rows, tree):
        self._absorb_pending(rows)
        self._check_absorbed(rows)
        params = [row.sampling for row in rows]
        h0 = torch.stack([self.last_h[row.slot] for row in rows])  # [R, H]
        parents: list[list[int]] = [[] for _ in rows]  # per row: the tree of forwarded nodes
        state = {"h": h0[:, None], "first": 0}  # the last frontier's outputs [R, F, H]

        def scores(h: torch.Tensor, depth: int) -> torch.Tensor:  # h [R, H] or [R, F, H]
            at = draft_positions(rows, depth)  # [R, 1]
            return log_scores(self.model.to_target_logits(self.model.draft_logits(h)), params,
                              at if h.dim() == 3 else at[:, 0])

        def expand(d: int, frontier: torch.Tensor, from_prev: torch.Tensor) -> torch.Tensor:
            """Forward the depth-d frontier [R, F] (each on its parent's h) -> children scores."""
            r, f = frontier.shape
            h_in = state["h"].gather(1, from_prev.clamp_min(0)[..., None].expand(r, f, h0.shape[-1]))
            base, prev = len(parents[0]), state["first"]
            for row, up in zip(parents, from_prev.tolist(), strict=True):
                row += [-1 if d == 1 else prev + j for j in up]
            segments = [Segment(row.slot, self.ctx_len[row.slot] + base, f,
                                TreeSpan(self.ctx_len[row.slot], tuple(par)))
                        for row, par in zip(rows, parents, strict=True)]
            h = self._forward(segments, frontier.reshape(r * f), h_in.reshape(r * f, -1))  # [R·F, H]
            self.num_forwards += 1
            state["h"], state["first"] = h.view(r, f, -1), base
            return scores(state["h"], d)

        return grow_tree(scores(h0, 0), expand, tree.topk, tree.nodes, self.tree_depth(tree),
                         [row.grammar for row in rows])

    @torch.inference_mode()
    def draft_chain(self, rows: list[DraftRow], k: int, choose) -> list[torch.Tensor]:
        """Run the chain for every row; `choose(logits [R, V]) -> tokens [R]` picks each draft.
        Returns the target-vocabulary logits of steps 1..k, each [R, V]."""
        self._absorb_pending(rows)
        self._check_absorbed(rows)
        h = torch.stack([self.last_h[row.slot] for row in rows])  # [R, H]
        logits = []
        for i in range(k):
            logits.append(self.model.to_target_logits(self.model.draft_logits(h)).float())  # [R, V]
            if i + 1 == k:
                break
            token = choose(logits[-1])  # [R]
            # chain step i + 1 of each row sits at position ctx_len + i
            h = self._forward([Segment(row.slot, self.ctx_len[row.slot] + i, 1) for row in rows], token, h)
            self.num_forwards += 1
        return logits

    def propose(self, rows, k):
        chosen: list[torch.Tensor] = []
        q_rows: list[torch.Tensor] = []

        def choose(logits: torch.Tensor) -> torch.Tensor:
            depth = len(chosen)
            tokens, q = choose_drafts(logits, rows, depth)
            chosen.append(tokens)
            if q is not None:
                q_rows.append(q)
            return tokens

        logits = self.draft_chain(rows, k, choose)
        choose(logits[-1])  # the last step's draft
        return Proposal(tokens=torch.stack(chosen, 1), q_probs=torch.stack(q_rows, 1) if q_rows else None)


@register_drafter("eagle3")
def _build(config, target) -> Eagle3Drafter:
    hf = target.model
    model = load_eagle3(config.resolved_path, target.config, hf.get_input_embeddings(), DTYPES[config.dtype])
    graphs = graphs_wanted(config.cuda_graphs, target.device)
    return Eagle3Drafter(model.to(target.device), config.num_draft_tokens, graphs)
