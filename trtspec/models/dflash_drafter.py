"""DFlash as a `Drafter`: one drafter forward per block, context K/V cached across cycles.

State per sequence: the projected context K/V of every position the target has cached
(`ctx_len` of them) plus the taps the target produced in the last cycle that are not yet
projected (`pending`). Before each proposal the pending taps are projected and appended, so
the anchor (the last committed token) always sits at position `ctx_len`.
"""

from __future__ import annotations

import torch

from trtspec.errors import CheckpointError
from trtspec.models.dflash import ContextKV, DFlashDraftModel, load_dflash
from trtspec.models.drafter import Drafter, Proposal, register_drafter
from trtspec.spec.sampling import probs_from_logits, sample


class DFlashDrafter(Drafter):
    method = "dflash"

    def __init__(self, model: DFlashDraftModel, embed_tokens: torch.nn.Module, lm_head: torch.nn.Module,
                 num_draft_tokens: int | None = None):
        self.model = model
        self.embed_tokens, self.lm_head = embed_tokens, lm_head  # the target's, frozen
        self.tap_layer_ids = tuple(model.spec.target_layer_ids)
        self.block_size = model.spec.block_size
        self.num_draft_tokens = num_draft_tokens or self.block_size - 1
        self.ctx_kv: ContextKV = []
        self.ctx_len = 0
        self.pending: torch.Tensor | None = None  # [1, n, n_taps*H]

    def begin(self, prompt, hidden):
        self.ctx_kv, self.ctx_len, self.pending = [], 0, hidden

    def commit(self, num_accepted, hidden):
        self.pending = hidden

    def _absorb_pending(self) -> None:
        if self.pending is None or self.pending.shape[1] == 0:
            return
        n = self.pending.shape[1]
        positions = torch.arange(self.ctx_len, self.ctx_len + n)[None]  # [1, n]
        new = self.model.project_context(self.pending.to(self.model.fc.weight.dtype), positions)
        if self.ctx_kv:
            self.ctx_kv = [
                (torch.cat([k, nk], 2), torch.cat([v, nv], 2))
                for (k, v), (nk, nv) in zip(self.ctx_kv, new, strict=True)
            ]
        else:
            self.ctx_kv = new
        self.ctx_len += n
        self.pending = None

    @torch.inference_mode()
    def draft_logits(self, committed: list[int], k: int) -> torch.Tensor:
        """Logits of draft slots 1..k of the block anchored at committed[-1].  -> [1, k, V]"""
        self._absorb_pending()
        start = len(committed) - 1
        if start != self.ctx_len:
            raise RuntimeError(f"DFlash context holds {self.ctx_len} positions, anchor is at {start}")
        block = torch.full((1, self.block_size), self.model.spec.mask_token_id, dtype=torch.long)
        block[0, 0] = committed[-1]
        positions = torch.arange(start, start + self.block_size)[None]  # [1, B]
        embeds = self.embed_tokens(block).to(self.model.fc.weight.dtype)
        hidden = self.model(embeds, positions, self.ctx_kv)  # [1, B, H]
        return self.lm_head(hidden[:, 1 : 1 + k].to(self.lm_head.weight.dtype))

    def propose(self, committed, k, sampling, generator):
        return propose_block(self.draft_logits(committed, k), sampling, generator)


def propose_block(logits: torch.Tensor, sampling, generator) -> Proposal:
    """Drafts from one block's logits [1, k, V]: argmax, or each slot sampled independently."""
    if sampling.greedy:
        return Proposal(tokens=logits.argmax(-1), q_probs=None)
    q = probs_from_logits(logits, sampling)  # [1, k, V]
    return Proposal(tokens=sample(q, generator), q_probs=q)


@register_drafter("dflash")
def _build(config, target) -> DFlashDrafter:
    model = load_dflash(config.resolved_path, target.config)
    k = config.num_draft_tokens
    if k is not None and k > model.spec.block_size - 1:
        raise CheckpointError(
            f"drafter.num_draft_tokens is {k} but the DFlash block size {model.spec.block_size} "
            f"yields at most {model.spec.block_size - 1} drafts"
        )
    hf = target.model
    return DFlashDrafter(model, hf.get_input_embeddings(), hf.get_output_embeddings(), k)
