"""EAGLE-3 as a `Drafter`: a chain of k autoregressive midlayer steps over its own KV cache.

State per sequence: the midlayer K/V of every drafter slot whose target feature is known
(`ctx_len` slots; slot j pairs the feature of position j with token j + 1) and the taps the
target produced in the last cycle that are not yet absorbed (`pending`). A proposal

1. absorbs the pending taps with the now-known next tokens (one causal pass; the cache grows),
   its last output h predicting x_1;
2. runs k − 1 chain steps, each feeding back h and the token just drafted at the next position;
   the chain's K/V live only during the proposal, since the next cycle replaces the drafts'
   fed-back features by the target's own.

Draft cost therefore grows O(k), unlike DFlash's one pass per block.
"""

from __future__ import annotations

import torch

from trtspec.models.drafter import Drafter, Proposal, register_drafter
from trtspec.models.eagle3 import KV, Eagle3DraftModel, causal_mask, load_eagle3
from trtspec.models.target import DTYPES
from trtspec.spec.sampling import probs_from_logits, sample

DEFAULT_NUM_DRAFT_TOKENS = 7


class Eagle3Drafter(Drafter):
    method = "eagle3"

    def __init__(self, model: Eagle3DraftModel, num_draft_tokens: int | None = None):
        self.model = model
        self.tap_layer_ids = tuple(model.spec.aux_layer_ids or ())
        self.num_draft_tokens = num_draft_tokens or DEFAULT_NUM_DRAFT_TOKENS
        self.past: KV | None = None
        self.ctx_len = 0
        self.pending: torch.Tensor | None = None  # [1, n, 3·target_hidden]
        self.last_h: torch.Tensor | None = None  # [1, 1, H] output of slot ctx_len − 1

    def begin(self, prompt, hidden):
        self.past, self.ctx_len, self.pending, self.last_h = None, 0, hidden, None

    def commit(self, num_accepted, hidden):
        if hidden is None:
            return
        self.pending = hidden if self.pending is None else torch.cat([self.pending, hidden], 1)

    def _absorb_pending(self, committed: list[int]) -> torch.Tensor:
        """Cache the slots of the pending taps; return h of the last slot.  -> [1, 1, H]"""
        n = len(committed) - 1  # the target has cached committed[:n]
        if self.pending is not None and self.pending.shape[1]:
            new = self.pending.shape[1]
            if self.ctx_len + new != n:
                raise RuntimeError(f"EAGLE-3 holds {self.ctx_len} + {new} pending slots, target caches {n}")
            tokens = torch.tensor([committed[self.ctx_len + 1 : n + 1]])  # [1, new]
            positions = torch.arange(self.ctx_len, n)[None]  # [1, new]
            mask = causal_mask(self.ctx_len, new) if new > 1 else None
            h, (k, v) = self.model(tokens, self.model.fuse(self.pending), positions, self.past, mask)
            self.past = (k, v) if self.past is None else (
                torch.cat([self.past[0], k], 2), torch.cat([self.past[1], v], 2))
            self.ctx_len, self.pending, self.last_h = n, None, h[:, -1:]
        if self.last_h is None or self.ctx_len != n:
            raise RuntimeError(f"EAGLE-3 context holds {self.ctx_len} slots, the target caches {n}")
        return self.last_h

    @torch.inference_mode()
    def draft_chain(self, committed: list[int], k: int, choose) -> list[torch.Tensor]:
        """Run the chain; `choose(logits [1, 1, V]) -> token [1, 1]` picks each draft.
        Returns the target-vocabulary logits of steps 1..k, each [1, 1, V]."""
        h = self._absorb_pending(committed)
        past, position = self.past, self.ctx_len - 1
        logits = []
        for i in range(k):
            logits.append(self.model.to_target_logits(self.model.draft_logits(h)).float())
            if i + 1 == k:
                break
            token = choose(logits[-1])  # [1, 1]
            position += 1
            h, (nk, nv) = self.model(token, h, torch.tensor([[position]]), past)
            past = (torch.cat([past[0], nk], 2), torch.cat([past[1], nv], 2))
        return logits

    def propose(self, committed, k, sampling, generator):
        chosen: list[torch.Tensor] = []
        q_rows: list[torch.Tensor] = []

        def choose(logits):
            if sampling.greedy:
                token = logits.argmax(-1)
            else:
                q_rows.append(probs_from_logits(logits, sampling))  # [1, 1, V]
                token = sample(q_rows[-1], generator)
            chosen.append(token)
            return token

        logits = self.draft_chain(committed, k, choose)
        choose(logits[-1])  # the last step's draft
        tokens = torch.cat(chosen, dim=1)  # [1, k]
        return Proposal(tokens=tokens, q_probs=None if sampling.greedy else torch.cat(q_rows, 1))


@register_drafter("eagle3")
def _build(config, target) -> Eagle3Drafter:
    hf = target.model
    model = load_eagle3(config.resolved_path, target.config, hf.get_input_embeddings(), DTYPES[config.dtype])
    return Eagle3Drafter(model, config.num_draft_tokens)
