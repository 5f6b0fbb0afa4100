"""Classic draft model (`method: draft_model`): a small causal LM proposing k tokens one by one.

It shares the target's tokenizer and keeps its own KV cache over the committed tokens; before
each proposal the cache is rewound to the longest prefix it shares with the committed tokens
(the drafts it fed that the target rejected are dropped). Draft cost grows O(k).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from trtspec.errors import CheckpointError
from trtspec.models.drafter import Drafter, Proposal, register_drafter
from trtspec.models.target import load_causal_lm
from trtspec.spec.sampling import probs_from_logits, sample


class DraftModelDrafter(Drafter):
    method = "draft_model"

    def __init__(self, model, num_draft_tokens: int):
        self.model = model
        self.num_draft_tokens = num_draft_tokens
        self.cache = DynamicCache()
        self.cached_ids: list[int] = []

    def begin(self, prompt, hidden):
        self.cache = DynamicCache()
        self.cached_ids = []

    def _sync(self, committed: list[int]) -> None:
        common = 0
        limit = min(len(self.cached_ids), len(committed) - 1)  # always feed at least one token
        while common < limit and self.cached_ids[common] == committed[common]:
            common += 1
        if common < len(self.cached_ids):
            self.cache.crop(-(len(self.cached_ids) - common))
            del self.cached_ids[common:]

    @torch.inference_mode()
    def _next_logits(self, ids: list[int]) -> torch.Tensor:
        out = self.model(
            input_ids=torch.tensor([ids]), cache=self.cache, use_cache=True, logits_to_keep=1
        )
        self.cached_ids.extend(ids)
        return out.logits[:, -1]  # [1, V]

    def propose(self, committed, k, sampling, generator):
        self._sync(committed)
        pending = committed[len(self.cached_ids) :]
        tokens, q_rows = [], []
        for i in range(k):
            logits = self._next_logits(pending if i == 0 else [tokens[-1]])
            if sampling.greedy:
                tokens.append(int(logits.argmax(-1)))
            else:
                q = probs_from_logits(logits, sampling)  # [1, V]
                q_rows.append(q)
                tokens.append(int(sample(q, generator)))
        q_probs = torch.stack(q_rows, dim=1) if q_rows else None  # [1, k, V]
        return Proposal(tokens=torch.tensor([tokens], dtype=torch.long), q_probs=q_probs)


@register_drafter("draft_model")
def _build(config, target) -> DraftModelDrafter:
    model = load_causal_lm(config.resolved_path, dtype=config.dtype)
    if model.config.vocab_size != target.vocab_size:
        raise CheckpointError(
            f"drafter {config.resolved_path}: vocab_size {model.config.vocab_size} does not match "
            f"the target's vocab_size {target.vocab_size}; a draft model must share the tokenizer"
        )
    return DraftModelDrafter(model, config.num_draft_tokens or 5)
