"""DSpark as a `Drafter`: one backbone forward per block, then the Markov head left to right.

Context handling is DFlash's (`DFlashDrafter`: projected context K/V cached across cycles, taps
of the last cycle absorbed before each proposal). What differs: the block is
`[anchor, MASK × (γ−1)]` and slot 0 already predicts x_1 (γ drafts per forward); drafts are
picked left to right through the Markov head; each proposal carries the confidences c_1..c_k,
divided by the stored STS temperatures when the checkpoint has an `sts.json`.
"""

from __future__ import annotations

import logging

import torch

from trtspec.errors import CheckpointError
from trtspec.models.dflash_drafter import DFlashDrafter
from trtspec.models.drafter import Drafter, Proposal, register_drafter
from trtspec.models.dspark import ChooseToken, DraftBlock, DSparkDraftModel, load_dspark
from trtspec.spec.sampling import SamplingParams, probs_from_logits, sample
from trtspec.spec.sts import confidences, load_sts

log = logging.getLogger(__name__)


class MarkovProposer(Drafter):
    """DSpark's proposal step over any `draft_block` (torch here, exported graphs in the engine
    flavour): each draft is picked from its Markov-corrected logits, argmax or sampled after the
    request's temperature/top-k/top-p; confidences are σ(z / T_STS)."""

    sts_temperatures: torch.Tensor | None = None  # [γ]

    def draft_block(self, committed: list[int], k: int, choose: ChooseToken) -> DraftBlock:
        raise NotImplementedError

    def propose(self, committed, k, sampling: SamplingParams, generator):
        if sampling.greedy:
            drafted = self.draft_block(committed, k, lambda _, logits: logits.argmax(-1))
            q = None
        else:
            qs = []

            def choose(_: int, logits: torch.Tensor) -> torch.Tensor:
                qs.append(probs_from_logits(logits, sampling))  # [1, V] q_k after temperature/top-k/top-p
                return sample(qs[-1], generator)

            drafted = self.draft_block(committed, k, choose)
            q = torch.stack(qs, 1)  # [1, k, V]
        conf = None
        if drafted.confidence_logits is not None:
            conf = confidences(drafted.confidence_logits, self.sts_temperatures)  # [1, k]
        return Proposal(tokens=drafted.tokens, q_probs=q, confidence=conf)


class DSparkDrafter(MarkovProposer, DFlashDrafter):
    method = "dspark"

    def __init__(self, model: DSparkDraftModel, num_draft_tokens: int | None = None,
                 sts_temperatures: torch.Tensor | None = None):
        super().__init__(model, model.embed_tokens, model.lm_head)
        self.num_draft_tokens = num_draft_tokens or model.spec.block_size
        self.sts_temperatures = sts_temperatures  # [γ] or None

    @torch.inference_mode()
    def backbone_hidden(self, committed: list[int], k: int) -> torch.Tensor:
        """h_1..h_k of the block anchored at committed[-1].  -> [1, k, H]"""
        self._absorb_pending()
        start = len(committed) - 1
        if start != self.ctx_len:
            raise RuntimeError(f"DSpark context holds {self.ctx_len} positions, anchor is at {start}")
        block = torch.full((1, self.block_size), self.model.spec.mask_token_id, dtype=torch.long)
        block[0, 0] = committed[-1]
        positions = torch.arange(start, start + self.block_size)[None]  # [1, γ]
        hidden = self.model(self.embed_tokens(block), positions, self.ctx_kv)  # [1, γ, H]
        return hidden[:, :k]

    @torch.inference_mode()
    def draft_block(self, committed: list[int], k: int, choose: ChooseToken) -> DraftBlock:
        """Draft k tokens with `choose` picking each from its Markov-corrected logits."""
        hidden = self.backbone_hidden(committed, k)
        return self.model.decode_block(hidden, torch.tensor([committed[-1]]), choose)


@register_drafter("dspark")
def _build(config, target) -> DSparkDrafter:
    path = config.resolved_path
    model = load_dspark(path, target.config)
    k = config.num_draft_tokens
    if k is not None and k > model.spec.block_size:
        raise CheckpointError(
            f"drafter.num_draft_tokens is {k} but the DSpark block size {model.spec.block_size} "
            f"yields at most {model.spec.block_size} drafts"
        )
    hf = target.model
    for name, mine, theirs in (("embed_tokens", model.embed_tokens, hf.get_input_embeddings()),
                               ("lm_head", model.lm_head, hf.get_output_embeddings())):
        if not torch.equal(mine.weight.to(theirs.weight.dtype), theirs.weight):
            # still lossless (verification uses the target), but the drafter was distilled
            # from another target and will be accepted less often
            log.warning("%s: %s differs from the target's; retrain the drafter on this target", path, name)
    return DSparkDrafter(model, k, load_sts(path, model.spec.block_size))
