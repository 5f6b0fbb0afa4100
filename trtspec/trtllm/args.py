"""LLM-API arguments for TensorRT-LLM's PyTorch backend, from a trtspec build config.

The same mapping feeds `trtllm-serve --config` and the llmapi Triton model's model.yaml; every
key is checked against trtspec/trtllm/fields.py before it is written.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from trtspec.config import BuildConfig
from trtspec.errors import ConfigError
from trtspec.plan.models import get_drafter
from trtspec.trtllm.fields import DECODING_TYPE, DYNAMIC_DRAFT_LEN_TYPES, NGRAM_TYPE, check_llm_args

# Draft tokens per cycle when the config leaves num_draft_tokens unset (DESIGN §1.2: B − 1).
_DEFAULT_DRAFT_LEN = {"dflash": 15, "dspark": 7, "eagle3": 5, "draft_model": 5}
# DFlash/DSpark checkpoint facts of the drafters in trtspec/plan/models.py, written explicitly so
# TensorRT-LLM does not fall back to vocab_size for a missing mask id.
_DRAFT_FIELDS = {
    "z-lab/Qwen3-8B-DFlash-b16": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "deepseek-ai/DeepSeek-V4-Flash-DSpark": {
        "mask_token_id": 128799,
        "target_layer_ids": [40, 41, 42],
        "block_size": 5,
        "markov_rank": 256,
    },
}


def deploy_path(config: BuildConfig, path: str) -> str:
    """Where a checkpoint lives on the serving nodes: its last path component under weights_dir."""
    if path.startswith(("/", "builtin:")):
        raise ConfigError(
            f"{path!r}: a trtllm deployment names checkpoints by a relative path resolved "
            "under deployment.weights_dir on the serving nodes"
        )
    return str(PurePosixPath(config.deployment.weights_dir) / PurePosixPath(path).name)


def draft_len_of(config: BuildConfig) -> int:
    """max_draft_len: the config's num_draft_tokens, else the method's default."""
    return config.drafter.num_draft_tokens or _DEFAULT_DRAFT_LEN[config.drafter.method]


def _speculative_config(config: BuildConfig) -> dict | None:
    drafter = config.drafter
    if drafter is None:
        return None if config.lookup is None else _ngram_config(config)
    kind = DECODING_TYPE[drafter.method]
    draft_len = draft_len_of(config)
    spec: dict = {"decoding_type": kind, "max_draft_len": draft_len}
    drafter_id = config.deployment.drafter_id
    known = _DRAFT_FIELDS.get(drafter_id or "", {})
    if drafter.method == "dspark" and known.get("block_size", draft_len) != draft_len:
        # TorchLlmArgs.validate_speculative_config: "DSpark block_size must equal max_draft_len".
        raise ConfigError(
            f"drafter.num_draft_tokens {draft_len} must equal {drafter_id}'s DSpark block size "
            f"{known['block_size']} (TensorRT-LLM requires block_size == max_draft_len)"
        )
    spec["speculative_model"] = deploy_path(config, drafter.path)
    if drafter.method in ("dflash", "dspark"):
        for key in ("mask_token_id", "target_layer_ids"):
            if key in known:
                spec[key] = known[key]
    if drafter.method == "dspark":
        spec["block_size"] = draft_len
        if "markov_rank" in known:
            spec["markov_rank"] = known["markov_rank"]
    if config.lookup is not None:  # BuildConfig allows it beside EAGLE-3 only
        spec["sa_config"] = _sa_enhancer(config, draft_len)
    if drafter_id is not None:
        get_drafter(drafter_id)  # unknown drafter ids fail here, not on the GPU node
    if drafter_id is not None and drafter.schedule.mode == "adaptive":  # full: every draft, always
        from trtspec.plan.speculation import plan_speculation

        plan = plan_speculation(config)
        if kind in DYNAMIC_DRAFT_LEN_TYPES:
            spec["draft_len_schedule"] = plan.draft_len_schedule
        spec["acceptance_rate_window_size"] = plan.acceptance_rate_window_size
        spec["acceptance_rate_threshold"] = plan.acceptance_rate_threshold
    return spec


def _ngram_config(config: BuildConfig) -> dict:
    """Prompt lookup alone as TensorRT-LLM's NGram drafter: the newest match, runs of up to
    lookup.max_match tokens, each request's own n-grams (a private pool) or, with lookup.pool_tokens,
    one pool for all requests (TensorRT-LLM's has no size: trtspec's bound does not carry over).
    BuildConfig refuses a lookup.min_match above 1, which TensorRT-LLM has no field for."""
    lookup = config.lookup
    return {"decoding_type": NGRAM_TYPE, "max_draft_len": lookup.num_draft_tokens,
            "max_matching_ngram_size": lookup.max_match, "is_keep_all": True, "is_use_oldest": False,
            "is_public_pool": lookup.pool_tokens > 0}


def _sa_enhancer(config: BuildConfig, draft_len: int) -> dict:
    """Prompt lookup beside EAGLE-3 as TensorRT-LLM's suffix-automaton enhancer (`SAEnhancerConfig`):
    a request's copies replace the drafter's drafts where its tokens repeat at least `threshold`
    (lookup.min_match) of its last ones, searching all active requests' tokens too with
    lookup.pool_tokens. Its copies fill the drafter's max_draft_len, so lookup.num_draft_tokens must
    equal it; it matches the longest suffix (lookup.max_match does not carry over)."""
    lookup = config.lookup
    if lookup.num_draft_tokens != draft_len:
        raise ConfigError(f"lookup.num_draft_tokens {lookup.num_draft_tokens} must equal the drafter's "
                          f"max_draft_len {draft_len} for flavour trtllm: TensorRT-LLM's suffix automaton "
                          "copies as many tokens as the drafter drafts")
    return {"threshold": lookup.min_match, "enable_global_pool": lookup.pool_tokens > 0}


def llm_args(config: BuildConfig, *, for_triton: bool) -> dict:
    """LLM-API arguments; `for_triton` adds `model` and `backend` as model.yaml carries them."""
    if config.deployment is None:
        raise ConfigError(f"config {config.name!r}: flavour trtllm needs a `deployment:` section")
    dep = config.deployment
    config.limits.check_positions(dep.max_seq_len, "deployment.max_seq_len")
    args: dict = {}
    if for_triton:
        args["model"] = deploy_path(config, config.target.path)
        args["backend"] = "pytorch"
    args["tensor_parallel_size"] = dep.tensor_parallel_size
    args["pipeline_parallel_size"] = dep.pipeline_parallel_size
    if dep.moe_expert_parallel_size > 1:
        args["moe_expert_parallel_size"] = dep.moe_expert_parallel_size
    if dep.nodes > 1:
        args["gpus_per_node"] = dep.gpus_per_node
    args["max_batch_size"] = dep.max_batch_size
    args["max_seq_len"] = dep.max_seq_len
    args["max_num_tokens"] = dep.max_num_tokens
    if config.limits.prefill_chunk:
        # off by default in TensorRT-LLM, where a prompt longer than max_num_tokens is refused. Its
        # chunks are what a step's running requests leave of max_num_tokens: prefill_chunk's own
        # number (512, chosen on a CPU) is trtspec's loop's, and a GPU keeps TensorRT-LLM's budget
        args["enable_chunked_prefill"] = True
    if config.limits.stream_interval != 1:  # a response every interval-th step, as trtspec's model
        args["stream_interval"] = config.limits.stream_interval
    args["kv_cache_config"] = {
        "free_gpu_memory_fraction": dep.free_gpu_memory_fraction,
        # one switch, set on either side (BuildConfig refuses the two set apart)
        "enable_block_reuse": dep.enable_block_reuse and config.limits.prefix_reuse,
        "dtype": dep.kv_cache_dtype,
    }
    # decode batches replayed as CUDA graphs up to the deployment's batch size, each padded up to
    # the next captured size (TensorRT-LLM's own default stops at 128, unpadded); target.cuda_graphs
    # false turns them off, as in the torch flavour
    args["cuda_graph_config"] = {"enable_padding": True, "max_batch_size": dep.max_batch_size} \
        if config.target.cuda_graphs else None
    spec = _speculative_config(config)
    if spec is not None:
        args["speculative_config"] = spec
    check_llm_args(args, f"config {config.name!r}")
    return args
