"""DFlash and DSpark as `Drafter`s over the exported graphs (engine flavour).

Same state and steps as `trtspec.models.dflash_drafter.DFlashDrafter`: the taps the target
committed are projected by the context graph and appended to the cached context K/V; each
proposal is ONE block-graph forward over `[anchor, MASK × (B−1)]` at positions start..start+B−1.
DSpark then walks its heads graph slot by slot (x_k feeds the Markov head of slot k+1), as
`trtspec.models.dspark_drafter.DSparkDrafter` does with the torch heads.
"""

from __future__ import annotations

import numpy as np
import torch

from trtspec.engine.session import GraphSession
from trtspec.models.dflash_drafter import propose_block
from trtspec.models.drafter import Drafter
from trtspec.models.dspark import ChooseToken, DraftBlock
from trtspec.models.dspark_drafter import MarkovProposer


class EngineDFlashDrafter(Drafter):
    method = "dflash"

    def __init__(self, context: GraphSession, block: GraphSession, tap_layer_ids: tuple[int, ...],
                 block_size: int, mask_token_id: int, num_layers: int, num_draft_tokens: int):
        self.context, self.block = context, block
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.block_size, self.mask_token_id, self.num_layers = block_size, mask_token_id, num_layers
        self.num_draft_tokens = num_draft_tokens
        self.ctx_kv: list[np.ndarray] = []  # k0, v0, k1, v1, ... each [1, kvh, ctx_len, d]
        self.ctx_len = 0
        self.pending: torch.Tensor | None = None  # [1, n, n_taps·H]

    def begin(self, prompt, hidden):
        self.ctx_kv, self.ctx_len, self.pending = [], 0, hidden

    def commit(self, num_accepted, hidden):
        self.pending = hidden

    def _absorb_pending(self) -> None:
        if self.pending is None or self.pending.shape[1] == 0:
            return
        n = self.pending.shape[1]
        out = self.context.run({
            "hidden_taps": np.ascontiguousarray(self.pending.numpy()),  # in the target graph's precision
            "position_ids": np.arange(self.ctx_len, self.ctx_len + n, dtype=np.int64)[None],
        })
        new = [out[f"ctx_{kind}_{i}"] for i in range(self.num_layers) for kind in ("key", "value")]
        self.ctx_kv = [np.concatenate([old, nw], axis=2) for old, nw in zip(self.ctx_kv, new, strict=True)] \
            if self.ctx_kv else new
        self.ctx_len += n
        self.pending = None

    def run_block(self, committed: list[int]) -> dict[str, np.ndarray]:
        """The block graph's outputs for the block anchored at committed[-1]."""
        self._absorb_pending()
        start = len(committed) - 1
        if start != self.ctx_len:
            raise RuntimeError(f"DFlash context holds {self.ctx_len} positions, anchor is at {start}")
        block = np.full((1, self.block_size), self.mask_token_id, dtype=np.int64)
        block[0, 0] = committed[-1]
        feeds = {"block_ids": block,
                 "position_ids": np.arange(start, start + self.block_size, dtype=np.int64)[None],
                 "ctx_lens": np.array([self.ctx_len], dtype=np.int32)}
        for i in range(self.num_layers):
            feeds[f"ctx_key_{i}"], feeds[f"ctx_value_{i}"] = self.ctx_kv[2 * i], self.ctx_kv[2 * i + 1]
        return self.block.run(feeds)

    def draft_logits(self, committed: list[int], k: int) -> torch.Tensor:
        """Logits of draft slots 1..k of the block anchored at committed[-1].  -> [1, k, V]"""
        return torch.from_numpy(self.run_block(committed)["logits"][:, 1 : 1 + k])  # of [1, B, V]

    def propose(self, committed, k, sampling, generator):
        return propose_block(self.draft_logits(committed, k), sampling, generator)


class EngineDSparkDrafter(MarkovProposer, EngineDFlashDrafter):
    method = "dspark"

    def __init__(self, context: GraphSession, block: GraphSession, heads: GraphSession,
                 tap_layer_ids: tuple[int, ...], block_size: int, mask_token_id: int, num_layers: int,
                 num_draft_tokens: int, sts_temperatures: torch.Tensor | None):
        super().__init__(context, block, tap_layer_ids, block_size, mask_token_id, num_layers,
                         num_draft_tokens)
        self.heads = heads
        self.sts_temperatures = sts_temperatures  # [γ] or None

    def draft_block(self, committed: list[int], k: int, choose: ChooseToken) -> DraftBlock:
        """Slot 0 of the block already predicts x_1 (the anchor is the first prediction position)."""
        out = self.run_block(committed)
        hidden, base = out["hidden"][:, :k], out["base_logits"][:, :k]  # [1, k, H], [1, k, V]
        prev = torch.tensor([committed[-1]])
        tokens, logits, conf = [], [], []
        for j in range(k):
            step = self.heads.run({"base_logits": base[:, j : j + 1], "hidden": hidden[:, j : j + 1],
                                   "prev_tokens": prev.numpy()[:, None]})
            logits.append(torch.from_numpy(step["logits"][:, 0]))  # [1, V]
            if "confidence_logits" in step:
                conf.append(torch.from_numpy(step["confidence_logits"]))  # [1, 1]
            prev = choose(j, logits[-1])
            tokens.append(prev)
        return DraftBlock(tokens=torch.stack(tokens, 1), logits=torch.stack(logits, 1),
                          confidence_logits=torch.cat(conf, 1) if conf else None)
