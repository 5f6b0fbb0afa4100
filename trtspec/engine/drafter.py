"""DFlash and DSpark as `Drafter`s over the exported graphs (engine flavour).

Same state and steps as `trtspec.models.dflash_drafter.DFlashDrafter`: the taps the target
committed are projected by the context graph (ONE run over every row's pending taps, packed, each
at its own positions) and written into per-slot context arrays [num_slots, kvh, capacity, d];
each proposal is ONE block-graph run over `[anchor, MASK × (B−1)]` for every row, with the rows'
contexts gathered to [R, kvh, C, d] and `ctx_lens` [R] telling the `kv_injection_attention`
plugin how much of each is real. DSpark then walks its heads graph slot by slot for all rows
(x_k feeds the Markov head of slot k+1; an RNN head's state s_k goes in and out with it), as
`DSparkDrafter` does with the torch heads.

Trees come from the same one block-graph run (`propose_tree`, `trtspec.spec.tree`): DFlash's per-slot
marginals; DSpark's heads graph re-run on each expanded node's token ([R, F] rows at once).
"""

from __future__ import annotations

import numpy as np
import torch

from trtspec.engine.session import GraphSession
from trtspec.models.dflash_drafter import BlockDrafter
from trtspec.models.drafter import DraftRow
from trtspec.models.dspark import ChooseToken, DraftBlock
from trtspec.models.dspark_drafter import MarkovProposer


class EngineDFlashDrafter(BlockDrafter):
    method = "dflash"
    device = torch.device("cpu")

    def __init__(self, context: GraphSession, block: GraphSession, tap_layer_ids: tuple[int, ...],
                 block_size: int, mask_token_id: int, num_layers: int, num_draft_tokens: int):
        self.context, self.block = context, block
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.block_size, self.mask_token_id, self.num_layers = block_size, mask_token_id, num_layers
        self.num_draft_tokens = num_draft_tokens
        self.ctx_kv: list[np.ndarray] = []  # k0, v0, k1, v1, ... each [num_slots, kvh, capacity, d]
        self._capacity = self._num_slots = 0

    def allocate(self, num_slots, capacity):
        super().allocate(num_slots, capacity)
        self.ctx_kv, self._capacity, self._num_slots = [], capacity, num_slots  # shaped on first output

    def _absorb_pending(self, slots: list[int]) -> None:
        taken = [(slot, self.pending.take(slot)) for slot in slots]
        taken = [(slot, taps) for slot, taps in taken if taps is not None]
        if not taken:
            return
        positions = np.concatenate([np.arange(self.ctx_len[s], self.ctx_len[s] + len(t)) for s, t in taken])
        out = self.context.run({
            "hidden_taps": np.ascontiguousarray(torch.cat([t for _, t in taken]).numpy())[None],
            "position_ids": positions.astype(np.int64)[None],  # [1, N]
        })
        new = [out[f"ctx_{kind}_{i}"][0] for i in range(self.num_layers) for kind in ("key", "value")]
        if not self.ctx_kv:  # [kvh, N, d] -> buffers in the graph's precision
            kvh, _, d = new[0].shape
            # zeros: padded rows' masked keys enter the plugin with weight 0, and 0 · NaN is NaN
            self.ctx_kv = [np.zeros((self._num_slots, kvh, self._capacity, d), dtype=new[0].dtype)
                           for _ in new]
        slots = np.concatenate([np.full(len(t), s) for s, t in taken])
        for buf, part in zip(self.ctx_kv, new, strict=True):
            buf[slots, :, positions] = part.transpose(1, 0, 2)  # [N, kvh, d]
        for s, t in taken:
            self.ctx_len[s] += len(t)

    def run_block(self, rows: list[DraftRow]) -> dict[str, np.ndarray]:
        """The block graph's outputs for every row's block anchored at its last committed token."""
        slots = [row.slot for row in rows]
        self._absorb_pending(slots)
        starts = np.array(self.anchor_starts(rows), dtype=np.int64)
        block = np.full((len(rows), self.block_size), self.mask_token_id, dtype=np.int64)
        block[:, 0] = [row.committed[-1] for row in rows]
        width = max(1, int(starts.max()))
        feeds = {"block_ids": block,
                 "position_ids": starts[:, None] + np.arange(self.block_size, dtype=np.int64)[None],
                 "ctx_lens": starts.astype(np.int32)}
        for i in range(self.num_layers):
            feeds[f"ctx_key_{i}"] = self.ctx_kv[2 * i][slots, :, :width]  # [R, kvh, C, d]
            feeds[f"ctx_value_{i}"] = self.ctx_kv[2 * i + 1][slots, :, :width]
        self.num_forwards += 1
        return self.block.run(feeds)

    def draft_logits(self, rows: list[DraftRow], k: int) -> torch.Tensor:
        """Logits of draft slots 1..k of every row's block.  -> [R, k, V]"""
        return torch.from_numpy(self.run_block(rows)["logits"][:, 1 : 1 + k])  # of [R, B, V]


class EngineDSparkDrafter(MarkovProposer, EngineDFlashDrafter):
    method = "dspark"

    def __init__(self, context: GraphSession, block: GraphSession, heads: GraphSession,
                 tap_layer_ids: tuple[int, ...], block_size: int, mask_token_id: int, num_layers: int,
                 num_draft_tokens: int, sts_temperatures: torch.Tensor | None, has_confidence: bool = True,
                 markov_state_size: int = 0):
        super().__init__(context, block, tap_layer_ids, block_size, mask_token_id, num_layers,
                         num_draft_tokens)
        self.heads = heads
        self.markov_state_size = markov_state_size  # r of an RNN Markov head (its state), else 0
        self.sts_temperatures = sts_temperatures  # [γ] or None
        self.has_confidence = has_confidence  # the bundle's: the checkpoint had a confidence head

    def _run_heads(self, base: np.ndarray, hidden: np.ndarray, prev: np.ndarray, state: np.ndarray | None):
        """The heads graph on n slots per row.  base [R, n, V]; hidden [R, n, H]; prev [R, n] int64;
        state [R, n, r] | None (an RNN head's s_{k−1}; None: zeros)
        -> (logits [R, n, V], confidence logits [R, n] | None, state after the slot | None)"""
        feeds = {"base_logits": np.ascontiguousarray(base), "hidden": np.ascontiguousarray(hidden),
                 "prev_tokens": np.ascontiguousarray(prev, dtype=np.int64)}
        if self.markov_state_size:
            feeds["markov_state"] = np.ascontiguousarray(state) if state is not None else \
                np.zeros((*prev.shape, self.markov_state_size), dtype=hidden.dtype)
        step = self.heads.run(feeds)
        conf = step.get("confidence_logits")
        return (torch.from_numpy(step["logits"]), None if conf is None else torch.from_numpy(conf),
                step.get("markov_state_out"))

    def draft_block(self, rows: list[DraftRow], k: int, choose: ChooseToken) -> DraftBlock:
        """Slot 0 of the block already predicts x_1 (the anchor is the first prediction position)."""
        out = self.run_block(rows)
        hidden, base = out["hidden"][:, :k], out["base_logits"][:, :k]  # [R, k, H], [R, k, V]
        prev = torch.tensor([row.committed[-1] for row in rows])
        tokens, logits, conf, state = [], [], [], None
        for j in range(k):
            step, c, state = self._run_heads(base[:, j : j + 1], hidden[:, j : j + 1], prev.numpy()[:, None],
                                             state)
            logits.append(step[:, 0])  # [R, V]
            if c is not None:
                conf.append(c)  # [R, 1]
            prev = choose(j, logits[-1])
            tokens.append(prev)
        return DraftBlock(tokens=torch.stack(tokens, 1), logits=torch.stack(logits, 1),
                          confidence_logits=torch.cat(conf, 1) if conf else None)

    @property
    def max_tree_depth(self) -> int:
        return self.block_size

    def tree_heads(self, rows, depth):
        out = self.run_block(rows)
        hidden, base = out["hidden"][:, :depth], out["base_logits"][:, :depth]  # [R, D, H], [R, D, V]

        def heads(d: int, prev: torch.Tensor, state):
            f = prev.shape[1]
            logits, conf, state = self._run_heads(np.repeat(base[:, d : d + 1], f, 1),
                                                  np.repeat(hidden[:, d : d + 1], f, 1),
                                                  prev.to(torch.int64).cpu().numpy(),
                                                  None if state is None else np.asarray(state))
            return logits, conf, None if state is None else torch.from_numpy(state)
        return heads
