"""Memory planner: weights per GPU after TP/PP/EP sharding, drafter, KV cache, what fits.

The model (per GPU, worst pipeline stage):
- weights = ceil(L / pp) layers, each with attention, dense MLP and shared experts split over TP and
  routed experts split over TP as well (EP x MoE-TP = TP in TensorRT-LLM's Mapping, so EP moves
  experts between GPUs without changing the bytes per GPU); embedding and LM head vocab-parallel
  over TP, both on the stage when pp = 1, the larger otherwise.
- drafter = its layers sharded over TP like the target (the draft model is built with the target's
  mapping), counted on the worst stage.
- KV per token = per full-attention layer 2 x kv_heads_per_gpu x head_dim x bytes, with
  kv_heads_per_gpu = max(1, kv_heads / tp) (heads replicate when TP exceeds them); sliding-window
  layers cost a fixed window per sequence instead. DeepSeek-V4 layers keep a 128-token window plus
  one shared K=V row per `ratio` tokens (and an fp8 indexer row on ratio-4 layers); in an fp8 cache
  that row keeps its RoPE dims in bf16 and carries block scales (584 B, not head_dim = 512). Drafters add
  their own context cache per token (DFlash caches projected context K/V in every layer).
- KV budget = free_gpu_memory_fraction x (GPU memory - weights - drafter - runtime reserve), as
  TensorRT-LLM sizes its KV pool from the memory left after loading.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from trtspec.errors import ConfigError
from trtspec.plan.deployment import DeploymentConfig
from trtspec.plan.gpus import get_gpu
from trtspec.plan.models import CSA_RATIO, Architecture, get_drafter, get_target

GIB = 1024**3


class PlanError(ConfigError):
    """A deployment that cannot work: bad parallelism for the model, or not enough memory."""


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    gpu: str
    gpu_memory_bytes: int
    world_size: int
    weights_per_gpu_bytes: int
    drafter_per_gpu_bytes: int
    reserve_bytes: int
    kv_budget_bytes: int  # may be negative when weights alone do not fit
    kv_per_token_bytes: int  # target + drafter, per GPU
    kv_per_sequence_fixed_bytes: int  # sliding windows, per GPU
    max_seq_len: int
    max_batch_size: int
    max_tokens_in_kv: int  # tokens of context the KV pool holds with no fixed costs
    max_batch_at_max_seq_len: int
    max_context_at_max_batch: int

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def weights_fit(self) -> bool:
        return self.kv_budget_bytes > 0


def _kv_bytes(deployment: DeploymentConfig) -> int:
    # "auto" keeps the checkpoint's activation dtype: bf16 for every model in the table.
    return 1 if deployment.kv_cache_dtype == "fp8" else 2


def check_parallelism(deployment: DeploymentConfig, target: Architecture, where: str) -> None:
    """Refuse sizes TensorRT-LLM cannot shard this model with, naming the numbers."""
    tp, pp, ep = (
        deployment.tensor_parallel_size,
        deployment.pipeline_parallel_size,
        deployment.moe_expert_parallel_size,
    )
    if deployment.world_size != deployment.total_gpus:
        raise PlanError(
            f"{where}: tensor_parallel_size x pipeline_parallel_size = {tp} x {pp} = {deployment.world_size} "
            f"but nodes x gpus_per_node = {deployment.nodes} x {deployment.gpus_per_node} = "
            f"{deployment.total_gpus}"
        )
    if target.heads % tp:
        raise PlanError(
            f"{where}: tensor_parallel_size {tp} does not divide {target.name}'s "
            f"{target.heads} attention heads"
        )
    if target.kv_heads >= tp and target.kv_heads % tp:
        raise PlanError(
            f"{where}: tensor_parallel_size {tp} does not divide {target.name}'s {target.kv_heads} KV heads"
        )
    if target.kv_heads < tp and tp % target.kv_heads:
        raise PlanError(
            f"{where}: {target.name}'s {target.kv_heads} KV heads cannot be replicated evenly "
            f"over tensor_parallel_size {tp}"
        )
    if pp > target.num_layers:
        raise PlanError(
            f"{where}: pipeline_parallel_size {pp} exceeds {target.name}'s {target.num_layers} layers"
        )
    if ep > 1:
        if not target.num_experts:
            raise PlanError(f"{where}: moe_expert_parallel_size {ep} but {target.name} has no experts")
        if tp % ep:
            raise PlanError(
                f"{where}: moe_expert_parallel_size {ep} must divide tensor_parallel_size {tp} "
                "(TensorRT-LLM splits the TP group into EP x MoE-TP)"
            )
        if target.num_experts % ep:
            raise PlanError(
                f"{where}: moe_expert_parallel_size {ep} does not divide {target.name}'s "
                f"{target.num_experts} experts"
            )


def _layer_bytes_per_gpu(arch: Architecture, tp: int) -> float:
    dense = (arch.attention_params() + arch.dense_mlp_params() + arch.shared_params()) * arch.weight_bytes
    experts = arch.expert_params() * arch.expert_weight_bytes
    return (dense + experts) / tp


def _kv_per_token_and_fixed(arch: Architecture, layers: int, tp: int, kv_bytes: int) -> tuple[float, int]:
    """(bytes per context token, fixed bytes per sequence) for `layers` layers of arch on one GPU."""
    kv_heads = max(1, arch.kv_heads // tp)
    row = 2 * kv_heads * arch.head_dim * kv_bytes  # K and V of one token in one layer
    if arch.is_dsv4:
        ratios = arch.compress_ratios[:layers]
        shared_row = arch.latent_row_bytes(kv_bytes)  # one K=V row, shared by the single KV head
        index_row = arch.index_row_bytes  # CSA layers only
        per_token = sum((shared_row + (index_row if r == CSA_RATIO else 0)) / r for r in ratios if r)
        return per_token, len(ratios) * arch.sliding_window * shared_row
    sliding = min(arch.sliding_layers, layers)
    return (layers - sliding) * row, sliding * arch.sliding_window * row


def plan_memory(deployment: DeploymentConfig, where: str = "deployment") -> MemoryPlan:
    """Plan one replica of `deployment`; raises PlanError for impossible parallelism."""
    gpu = get_gpu(deployment.gpu)
    target = get_target(deployment.model_id)
    drafter = get_drafter(deployment.drafter_id) if deployment.drafter_id else None
    check_parallelism(deployment, target, where)
    tp, pp = deployment.tensor_parallel_size, deployment.pipeline_parallel_size

    stage_layers = math.ceil(target.num_layers / pp)
    embed = target.vocab * target.hidden * target.embedding_weight_bytes / tp
    embeds = embed * (1 if target.tie_embeddings else 2) if pp == 1 else embed
    weights = math.ceil(stage_layers * _layer_bytes_per_gpu(target, tp) + embeds)
    drafter_bytes = 0
    if drafter is not None:
        drafter_bytes = math.ceil(
            drafter.num_layers * _layer_bytes_per_gpu(drafter, tp)
            + drafter.extra_params * drafter.weight_bytes / tp
            + drafter.embedding_params() * drafter.embedding_weight_bytes / tp
        )

    kv_bytes = _kv_bytes(deployment)
    per_token, fixed = _kv_per_token_and_fixed(target, stage_layers, tp, kv_bytes)
    if drafter is not None:
        d_token, d_fixed = _kv_per_token_and_fixed(drafter, drafter.num_layers, tp, kv_bytes)
        per_token, fixed = per_token + d_token, fixed + d_fixed
    per_token = math.ceil(per_token)

    reserve = int(deployment.runtime_reserve_gib * GIB)
    free = gpu.memory_bytes - weights - drafter_bytes - reserve
    budget = math.floor(deployment.free_gpu_memory_fraction * free) if free > 0 else free
    usable = max(budget, 0)
    seq, batch = deployment.max_seq_len, deployment.max_batch_size
    return MemoryPlan(
        gpu=gpu.name,
        gpu_memory_bytes=gpu.memory_bytes,
        world_size=deployment.world_size,
        weights_per_gpu_bytes=weights,
        drafter_per_gpu_bytes=drafter_bytes,
        reserve_bytes=reserve,
        kv_budget_bytes=budget,
        kv_per_token_bytes=per_token,
        kv_per_sequence_fixed_bytes=fixed,
        max_seq_len=seq,
        max_batch_size=batch,
        max_tokens_in_kv=usable // per_token,
        max_batch_at_max_seq_len=usable // (seq * per_token + fixed),
        max_context_at_max_batch=max(0, (usable // batch - fixed) // per_token),
    )


def check_fits(plan: MemoryPlan, min_concurrency: int, where: str) -> None:
    """Refuse a plan whose weights, or `min_concurrency` full-length requests, do not fit: by how much."""
    if not plan.weights_fit:
        short = -plan.kv_budget_bytes
        need = plan.weights_per_gpu_bytes + plan.drafter_per_gpu_bytes + plan.reserve_bytes
        raise PlanError(
            f"{where}: weights do not fit on {plan.gpu}: {need / GIB:.1f} GiB per GPU needed (weights "
            f"{plan.weights_per_gpu_bytes / GIB:.1f} + drafter {plan.drafter_per_gpu_bytes / GIB:.1f} "
            "+ reserve "
            f"{plan.reserve_bytes / GIB:.1f}), {plan.gpu_memory_bytes / GIB:.1f} GiB available: short by "
            f"{short / GIB:.1f} GiB; use more GPUs (tensor/pipeline parallel) or a larger GPU"
        )
    need = min_concurrency * (plan.max_seq_len * plan.kv_per_token_bytes + plan.kv_per_sequence_fixed_bytes)
    if need > plan.kv_budget_bytes:
        raise PlanError(
            f"{where}: KV cache too small on {plan.gpu}: {min_concurrency} request(s) of max_seq_len "
            f"{plan.max_seq_len} need {need / GIB:.2f} GiB per GPU, the KV budget is "
            f"{plan.kv_budget_bytes / GIB:.2f} GiB: short by {(need - plan.kv_budget_bytes) / GIB:.2f} GiB"
        )


def format_plan(plan: MemoryPlan, deployment: DeploymentConfig) -> str:
    """Human-readable plan for `trtspec inspect`."""
    target = get_target(deployment.model_id)
    lines = [
        f"target    {target.name} ({target.source})",
        f"drafter   {deployment.drafter_id or '-'}",
        f"hardware  {deployment.nodes} node(s) x {deployment.gpus_per_node} {plan.gpu} "
        f"({get_gpu(plan.gpu).memory_gb:.0f} GB data sheet, {plan.gpu_memory_bytes / GIB:.1f} GiB each "
        "planned)",
        f"parallel  TP {deployment.tensor_parallel_size} x PP {deployment.pipeline_parallel_size}"
        f" (EP {deployment.moe_expert_parallel_size} inside TP) = {plan.world_size} GPUs",
        f"weights   {plan.weights_per_gpu_bytes / GIB:8.2f} GiB per GPU (worst pipeline stage)",
        f"drafter   {plan.drafter_per_gpu_bytes / GIB:8.2f} GiB per GPU",
        f"reserve   {plan.reserve_bytes / GIB:8.2f} GiB per GPU (runtime, activations, CUDA graphs)",
        _kv_budget(plan, deployment),
        f"KV/token  {plan.kv_per_token_bytes:,} B per GPU (+ {plan.kv_per_sequence_fixed_bytes:,} B per "
        "request for sliding windows)",
        f"fits      {plan.max_tokens_in_kv:,} tokens in KV (all requests together)",
        f"          KV room for {plan.max_batch_at_max_seq_len:,} requests of max_seq_len "
        f"{plan.max_seq_len:,} tokens (max_batch_size {plan.max_batch_size} run at once)",
        f"          {_at_max_batch(plan)}",
    ]
    return "\n".join(lines)


def _kv_budget(plan: MemoryPlan, deployment: DeploymentConfig) -> str:
    """The KV budget line: what is left for the cache, or by how much nothing is."""
    if not plan.weights_fit:
        return (f"KV budget     none: weights, drafter and reserve exceed the GPU by "
                f"{-plan.kv_budget_bytes / GIB:.2f} GiB")
    return (f"KV budget {plan.kv_budget_bytes / GIB:8.2f} GiB per GPU "
            f"({deployment.free_gpu_memory_fraction:.0%} of what is left, dtype {deployment.kv_cache_dtype})")


def _at_max_batch(plan: MemoryPlan) -> str:
    """What a full batch of max_seq_len requests needs vs what the KV cache holds per request."""
    room, seq, batch = plan.max_context_at_max_batch, plan.max_seq_len, plan.max_batch_size
    if room >= seq:
        return (f"max_batch_size {batch} requests of max_seq_len {seq:,} tokens: fit (KV room for "
                f"{room:,} each)")
    return f"max_batch_size {batch} requests: {room:,} tokens each fit, below max_seq_len {seq:,}"
