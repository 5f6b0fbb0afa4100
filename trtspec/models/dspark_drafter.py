"""DSpark as a `Drafter`: one backbone forward per step for every running request, then the
Markov head left to right, all rows together.

Context handling is DFlash's (`DFlashDrafter`: projected context K/V in slot buffers, pending taps
absorbed in one packed pass before each proposal). What differs: the block is
`[anchor, MASK × (γ−1)]` and slot 0 already predicts x_1 (γ drafts per forward); drafts are
picked left to right through the Markov head, each row after its own sampling parameters; each
proposal carries the confidences c_1..c_k, divided by the stored STS temperatures when the
checkpoint has an `sts.json`.

A tree (`propose_tree`) uses the same one backbone forward; each expanded node's children are
re-scored by the Markov head on that node's token (the RNN head continuing the state of that node's
own path), and their scores are path survivals: the node's confidence c (given its parent token)
times q(x) / max q (`trtspec.spec.tree`).
"""

from __future__ import annotations

import logging

import torch

from trtspec.errors import CheckpointError
from trtspec.models.cuda_graphs import graphs_wanted
from trtspec.models.dflash_drafter import DFlashDrafter
from trtspec.models.drafter import Drafter, DraftRow, Proposal, draft_positions, register_drafter
from trtspec.models.dspark import ChooseToken, DraftBlock, DSparkDraftModel, load_dspark
from trtspec.models.target import DTYPES
from trtspec.spec.grammar import choose_drafts
from trtspec.spec.sts import confidences, load_sts
from trtspec.spec.tree import grow_tree, log_scores

log = logging.getLogger(__name__)


class MarkovProposer(Drafter):
    """DSpark's proposal step over any `draft_block` (torch here, exported graphs in the engine
    flavour): each draft is picked from its Markov-corrected logits, argmax or sampled after its
    request's temperature/top-k/top-p; confidences are σ(z / T_STS)."""

    sts_temperatures: torch.Tensor | None = None  # [γ]

    def tree_heads(self, rows: list[DraftRow], depth: int):
        """(Markov logits, confidence logits | None) of slot d for given previous tokens: a function
        (d, prev [R, F], state [R, F, r] | None) -> ([R, F, V], [R, F] | None, state after slot d),
        after one backbone forward for all rows; state None at d = 0 is the head's initial one."""
        raise NotImplementedError

    def propose_tree(self, rows, tree):
        depth = self.tree_depth(tree)
        heads = self.tree_heads(rows, depth)
        params = [row.sampling for row in rows]
        # the RNN head's state after each node of the last expanded frontier [R, F, r] (a node's
        # children continue its path's state); None for the memoryless heads
        states: list = [None]

        def survival_scores(d: int, prev: torch.Tensor, parent: torch.Tensor | None = None) -> torch.Tensor:
            """Children of the frontier `prev` [R, F] at slot d; parent [R, F]: each node's index in
            the frontier expanded before (−1: the root)."""
            state = states[0]
            if state is not None and parent is not None:
                at = parent.clamp(min=0).to(state.device)[..., None].expand(-1, -1, state.shape[-1])
                state = state.gather(1, at)  # [R, F, r]
            logits, conf, states[0] = heads(d, prev, state)
            logq = log_scores(logits, params, draft_positions(rows, d))  # [R, F, V]
            if conf is None:
                return logq
            temps = None if self.sts_temperatures is None else self.sts_temperatures[d : d + 1]
            log_c = torch.log(confidences(conf[..., None], temps))  # [R, F, 1]
            return (log_c + logq - logq.amax(-1, keepdim=True)).clamp_max(0.0)

        anchors = torch.tensor([[row.committed[-1]] for row in rows], device=self.device)
        first = survival_scores(0, anchors)[:, 0]
        return grow_tree(first, survival_scores, tree.topk, tree.nodes, depth, [row.grammar for row in rows])

    def draft_block(self, rows: list[DraftRow], k: int, choose: ChooseToken) -> DraftBlock:
        raise NotImplementedError

    def propose(self, rows, k):
        qs: list[torch.Tensor] = []

        def choose(j: int, logits: torch.Tensor) -> torch.Tensor:
            tokens, q = choose_drafts(logits, rows, j)
            if q is not None:
                qs.append(q)
            return tokens

        drafted = self.draft_block(rows, k, choose)
        conf = None
        if drafted.confidence_logits is not None:
            conf = confidences(drafted.confidence_logits, self.sts_temperatures)  # [R, k]
        return Proposal(tokens=drafted.tokens, q_probs=torch.stack(qs, 1) if qs else None, confidence=conf)


class DSparkDrafter(MarkovProposer, DFlashDrafter):
    method = "dspark"

    def __init__(self, model: DSparkDraftModel, num_draft_tokens: int | None = None,
                 sts_temperatures: torch.Tensor | None = None, cuda_graphs: bool = False):
        super().__init__(model, model.embed_tokens, model.lm_head, cuda_graphs=cuda_graphs)
        self.num_draft_tokens = num_draft_tokens or model.spec.block_size
        # DeepSpec's DFlash recipe writes the same architecture with enable_confidence_head false
        self.has_confidence = model.confidence_head is not None
        self.sts_temperatures = sts_temperatures  # [γ] or None

    @property
    def max_tree_depth(self) -> int:
        return self.block_size

    @torch.inference_mode()
    def tree_heads(self, rows, depth):
        hidden = self.backbone_hidden(rows, depth)  # [R, D, H]
        base = self.model.lm_head(hidden)  # [R, D, V]

        def heads(d: int, prev: torch.Tensor, state):
            h = hidden[:, d, None].expand(-1, prev.shape[1], -1)  # [R, F, H]
            if state is None:
                state = self.model.markov_state(prev.shape, hidden)
            logits, state = self.model.markov_logits(base[:, d, None], prev, h, state)
            return logits, self.model.confidence_logits(h, prev), state
        return heads

    def backbone_hidden(self, rows: list[DraftRow], k: int) -> torch.Tensor:
        """h_1..h_k of every row's block.  -> [R, k, H]"""
        return self.block_hidden(rows)[:, :k]

    @torch.inference_mode()
    def draft_block(self, rows: list[DraftRow], k: int, choose: ChooseToken) -> DraftBlock:
        """Draft k tokens per row with `choose` picking each from its Markov-corrected logits."""
        hidden = self.backbone_hidden(rows, k)
        anchors = torch.tensor([row.committed[-1] for row in rows], device=self.device)
        return self.model.decode_block(hidden, anchors, choose)


@register_drafter("dspark")
def _build(config, target) -> DSparkDrafter:
    path = config.resolved_path
    model = load_dspark(path, target.config, DTYPES[config.dtype]).to(target.device)
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
    sts = load_sts(path, model.spec.block_size)
    graphs = graphs_wanted(config.cuda_graphs, target.device)
    return DSparkDrafter(model, k, None if sts is None else sts.to(target.device), graphs)
