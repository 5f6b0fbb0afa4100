"""Roofline step cost of a speculative deployment on its GPUs: a `spec.cost.StepCost` for planning.

A forward pass on one GPU takes max(bytes read / bandwidth, FLOPs / peak) plus its tensor-parallel
collectives. Per step of `batch` requests each verifying k drafts (T = batch·(k+1) tokens):

- target: its weights (1/TP of them, the worst pipeline stage times PP), every request's KV cache
  once (DeepSeek-V4's CSA layers: the indexer's rows and the top `index_topk` rows they pick), the
  routed experts the T tokens activate (E·(1 − (1 − top_k/E)^T) of E, uniform routing),
  and 2 FLOPs per active parameter per token plus attention over the context;
- drafter: DFlash/DSpark draft the whole block in ONE forward of batch·(k+1) tokens (and read the
  target's LM head for k positions); EAGLE-3 and draft models run k chained forwards of `batch`
  tokens each, so their cost grows with k;
- collectives: two all-reduces per layer when TP > 1, a fixed latency plus the activations over
  NVLink (inter-node latency when the replica spans nodes).

That is why speculation stops paying as the batch grows: at batch 1 the target forward is bound by
reading the weights, so verifying k extra tokens is almost free; at large batches it is bound by
compute and every rejected draft costs real FLOPs (MoE targets earlier: more tokens wake more
experts). The constants below are assumptions, not measurements: `trtspec profile` measures the
real curve on a serving machine (`spec.cost.MeasuredCost`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtspec.plan.deployment import DeploymentConfig
from trtspec.plan.gpus import GPU, get_gpu
from trtspec.plan.memory import _kv_per_token_and_fixed
from trtspec.plan.models import CSA_RATIO, Architecture, get_drafter, get_target

MEMORY_EFFICIENCY = 0.8  # share of peak HBM bandwidth decode kernels reach
COMPUTE_EFFICIENCY = 0.6  # share of peak tensor-core FLOP/s GEMMs of these shapes reach
ALLREDUCE_LATENCY_S = 8e-6  # one NVLink all-reduce of a small message, inside a node
INTER_NODE_LATENCY_S = 25e-6  # the same across nodes (InfiniBand / RoCE)
INTER_NODE_GB_S = 50.0  # per GPU between nodes (one 400 Gb/s NIC per GPU)
ACTIVATION_BYTES = 2  # BF16 activations in the all-reduces
PARALLEL_DRAFTERS = frozenset({"dflash", "dspark"})  # one forward per block; the others chain k forwards


@dataclass(frozen=True, slots=True)
class _Model:
    """One forward of a model on one GPU: bytes independent of the tokens, and per-token costs."""

    dense_bytes: float  # attention, dense MLP, shared experts, extra (fc, heads) weights
    expert_bytes: float  # every routed expert this GPU holds
    head_bytes: float  # the LM head the forward reads
    num_experts: int
    experts_per_token: int
    dense_flops: float  # per token: 2 x active dense parameters
    expert_flops: float  # per token: 2 x active expert parameters
    head_flops: float  # per token that needs logits
    attn_flops_ctx: float  # per query token and context token (full-attention layers)
    attn_flops_fixed: float  # per query token (sliding windows)
    attn_flops_selected: float  # per query token and row selected (DeepSeek-V4 CSA: top-k rows)
    kv_bytes_ctx: float  # read per request and context token
    kv_bytes_fixed: float  # read per request
    kv_bytes_selected: float  # read per request and row selected
    index_topk: int  # rows a CSA layer selects, at most (0: none)
    dense_precision: float  # bytes per parameter: picks the tensor-core rate
    expert_precision: float
    layers: int
    hidden: int


def _model(arch: Architecture, layers: int, tp: int, kv_bytes: int, head: Architecture | None) -> _Model:
    dense_params = arch.attention_params() + arch.dense_mlp_params() + arch.shared_params()
    expert_one = 3 * arch.hidden * arch.expert_intermediate
    head_params = head.vocab * head.hidden if head is not None else 0
    attn = 4 * arch.heads * arch.head_dim  # QK^T and PV, per query and key
    kv_ctx, kv_fixed = _kv_per_token_and_fixed(arch, layers, tp, kv_bytes)
    attn_selected = kv_selected = 0.0
    if arch.is_dsv4:
        # Every layer attends its window. HCA (ratio 128) layers attend every compressed row. CSA
        # (ratio 4) layers score every compressed row with the indexer (its fp8 K rows are what they
        # read of it) and attend only the top index_topk rows: min(context / 4, index_topk) of them.
        ratios, csa = arch.compress_ratios[:layers], arch.csa_layers(layers)
        row = arch.latent_row_bytes(kv_bytes)
        hca = sum(1 / r for r in ratios if r and r != CSA_RATIO)
        attn_ctx = attn * hca + 2 * arch.index_heads * arch.index_head_dim * csa / CSA_RATIO
        attn_fixed = attn * len(ratios) * arch.sliding_window
        attn_selected = attn * csa
        kv_ctx = row * hca + arch.index_row_bytes * csa / CSA_RATIO
        kv_selected = row * csa
    else:
        sliding = min(arch.sliding_layers, layers)
        attn_ctx, attn_fixed = attn * (layers - sliding), attn * sliding * arch.sliding_window
    return _Model(
        dense_bytes=(layers * dense_params + arch.extra_params) * arch.weight_bytes / tp,
        expert_bytes=layers * arch.num_experts * expert_one * arch.expert_weight_bytes / tp,
        head_bytes=head_params * (head.embedding_weight_bytes if head is not None else 0) / tp,
        num_experts=arch.num_experts,
        experts_per_token=arch.experts_per_token,
        dense_flops=2 * (layers * dense_params + arch.extra_params) / tp,
        expert_flops=2 * layers * arch.experts_per_token * expert_one / tp,
        head_flops=2 * head_params / tp,
        attn_flops_ctx=attn_ctx / tp,
        attn_flops_fixed=attn_fixed / tp,
        attn_flops_selected=attn_selected / tp,
        kv_bytes_ctx=kv_ctx,
        kv_bytes_fixed=kv_fixed,
        kv_bytes_selected=kv_selected,
        index_topk=arch.index_topk,
        dense_precision=arch.weight_bytes,
        expert_precision=arch.expert_weight_bytes,
        layers=layers,
        hidden=arch.hidden,
    )


class RooflineCost:
    """`StepCost` of a planned deployment: seconds of one draft–verify step, from the GPU table."""

    def __init__(self, deployment: DeploymentConfig, method: str | None):
        self.deployment = deployment
        self.gpu: GPU = get_gpu(deployment.gpu)
        self.method = method
        tp, pp = deployment.tensor_parallel_size, deployment.pipeline_parallel_size
        kv_bytes = 1 if deployment.kv_cache_dtype == "fp8" else 2
        target = get_target(deployment.model_id)
        self.stages = pp
        self.target = _model(target, math.ceil(target.num_layers / pp), tp, kv_bytes, target)
        self.drafter = None
        if method is not None and deployment.drafter_id is not None:
            drafter = get_drafter(deployment.drafter_id)
            # DFlash/DSpark share the target's LM head; EAGLE-3's own head is in its extra_params
            head = target if method in PARALLEL_DRAFTERS else None
            self.drafter = _model(drafter, drafter.num_layers, tp, kv_bytes, head)
        self.context = deployment.context_len

    # -- one forward ----------------------------------------------------------------------
    def _forward(self, m: _Model, batch: int, tokens: int, head_tokens: int) -> float:
        """Seconds of one forward over `tokens` tokens of `batch` requests, `head_tokens` of which
        need logits."""
        gpu, dep = self.gpu, self.deployment
        woken = 1 - (1 - m.experts_per_token / m.num_experts) ** tokens if m.num_experts else 0.0
        selected = min(self.context / CSA_RATIO, m.index_topk)
        kv = batch * (self.context * m.kv_bytes_ctx + m.kv_bytes_fixed + selected * m.kv_bytes_selected)
        bytes_read = m.dense_bytes + woken * m.expert_bytes + m.head_bytes + kv
        memory_s = bytes_read / (gpu.hbm_tb_s * 1e12 * MEMORY_EFFICIENCY)
        bf16 = gpu.peak_flops(2)
        attention = tokens * (self.context * m.attn_flops_ctx + m.attn_flops_fixed
                              + selected * m.attn_flops_selected)
        compute_s = (tokens * m.dense_flops / gpu.peak_flops(m.dense_precision)
                     + tokens * m.expert_flops / gpu.peak_flops(m.expert_precision)
                     + (head_tokens * m.head_flops + attention) / bf16) / COMPUTE_EFFICIENCY
        seconds = max(memory_s, compute_s)
        tp = dep.tensor_parallel_size
        if tp > 1:
            message = tokens * m.hidden * ACTIVATION_BYTES
            if dep.nodes > 1:
                latency, bandwidth = INTER_NODE_LATENCY_S, INTER_NODE_GB_S * 1e9
            else:  # NVLink figures count both directions
                latency, bandwidth = ALLREDUCE_LATENCY_S, gpu.nvlink_gb_s * 1e9 / 2
            seconds += 2 * m.layers * (latency + 2 * (tp - 1) / tp * message / bandwidth)
        return seconds

    # -- StepCost ---------------------------------------------------------------------------
    def target_seconds(self, batch: int, draft_len: int) -> float:
        tokens = batch * (draft_len + 1)
        return self.stages * self._forward(self.target, batch, tokens, tokens)

    def draft_seconds(self, batch: int, draft_len: int) -> float:
        if draft_len == 0 or self.drafter is None:
            return 0.0
        if self.method in PARALLEL_DRAFTERS:
            return self._forward(self.drafter, batch, batch * (draft_len + 1), batch * draft_len)
        return draft_len * self._forward(self.drafter, batch, batch, batch)

    def seconds(self, batch: int, draft_len: int) -> float:
        return self.draft_seconds(batch, draft_len) + self.target_seconds(batch, draft_len)
