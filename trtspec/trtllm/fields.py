"""The one place that holds TensorRT-LLM's names: every key trtspec writes into a TensorRT-LLM file.

Read from NVIDIA/TensorRT-LLM (PyTorch backend, LLM API), not guessed:

- `tensorrt_llm/llmapi/llm_args.py` @ 0004396720054fd8e205cbf616f21f0b57c6b412:
  `BaseLlmArgs` / `TorchLlmArgs` (top-level LLM-API arguments), `KvCacheConfig`,
  `DecodingBaseConfig` and its subclasses `DFlashDecodingConfig` (decoding_type "DFlash"),
  `DSparkDecodingConfig` ("DSpark"), `Eagle3DecodingConfig` ("Eagle3"),
  `DraftTargetDecodingConfig` ("Draft_Target"). `speculative_model` also accepts the alias
  `speculative_model_dir`; we write the canonical name.
- `triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml` @ 0ebb1536ac12bbe27201185de960df3ab00bcecc
  and `.../1/model.py` @ 044a90d209e380c95e23e8ae42f3583fa05ada78: model.yaml holds LLM-API
  arguments at the top level plus a `triton_config` mapping (`max_batch_size`, `decoupled`,
  optional `cancellation_check_period_ms`) that `model.py` strips before calling `LLM(**args)`.
- `triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt` @ 0a71057313ec0626527e164a8fc0205c5822e2f5:
  tensor names and types of the llmapi Triton model (`max_batch_size` and `decoupled` must NOT be
  in config.pbtxt: `auto_complete_config` sets them from model.yaml).
- Drafter config.json keys that TensorRT-LLM reads: `modeling_dflash.py`
  @ 009d8fa431bd3de92245aab80f8b57dc70da1ac4 (`dflash_config.mask_token_id`,
  `dflash_config.target_layer_ids`, top-level `block_size`, `model_type` for the backbone) and the
  DSpark branch of `TorchLlmArgs.validate_speculative_config` (`dspark_target_layer_ids`,
  `dspark_noise_token_id`, `dspark_block_size`, `dspark_markov_rank`, also nested
  `dspark_config` / `dflash_config` or plain keys).

- Prompt lookup (`lookup:`, no drafter): `NGramDecodingConfig` (decoding_type "NGram", PyTorch
  backend only) of a 2026 llm_args.py (the version beside `DFlashDecodingConfig` and
  `SADecodingConfig`): `max_draft_len` (> 0), `max_matching_ngram_size` (PositiveInt, default 2:
  the longest run of last tokens matched; TensorRT-LLM matches down to one token), `is_keep_all`,
  `is_use_oldest` (True: the oldest match), `is_public_pool` (True: one pool of n-grams for all
  requests: trtspec writes it from lookup.pool_tokens > 0; no field bounds its size). trtspec
  writes the newest match, as its own lookup copies.
- Prompt lookup beside an EAGLE-3 drafter: `Eagle3DecodingConfig.sa_config` (status beta), an
  `SAEnhancerConfig` (`tensorrt_llm/llmapi/llm_args.py` @ 0004396720054fd8e205cbf616f21f0b57c6b412,
  and the LLM-API reference pages of 1.3.0rc27 / 1.4.0rc4; llm_args.py @ fcd3f316, cited here before,
  is an older version with neither class nor `sa_config`): `threshold` (PositiveInt, default 4:
  the suffix match length from which the suffix automaton's copies override the neural drafts;
  trtspec writes lookup.min_match) and `enable_global_pool` (bool, default False: each request
  searches all active requests' automata; trtspec writes lookup.pool_tokens > 0). MTP and PARD take
  it too; DFlash, DSpark and Draft_Target configs have no `sa_config`, so lookup beside them is
  refused. The standalone `SADecodingConfig` (decoding_type "SA": `max_matching_ngram_size` -1 =
  longest match, `enable_global_pool`, `global_pool_size` in request slots, completed requests kept
  until the pool is full) is not written: lookup alone stays NGram.
- Speculation under load, `DecodingBaseConfig` in the same llm_args.py: `draft_len_schedule`
  (dict[int, int]; keys ≥ 1 are upper batch-size thresholds, values ≥ 0 draft lengths; the
  smallest key must map to max_draft_len and no length may exceed it; batches above the largest
  key do not speculate), `acceptance_rate_window_size` (NonNegativeInt, 0 = off) and
  `acceptance_rate_threshold` (float in [0, 1]: speculation is disabled permanently once the rolling
  accepted/drafted rate over the window drops below it), `max_concurrency` (PositiveInt; mutually
  exclusive with draft_len_schedule, which it is translated into). Older releases named the
  acceptance pair `acceptance_window` / `acceptance_length_threshold`.
- Which decoding types vary their draft length at run time:
  `SpeculativeDecodingMode.support_dynamic_draft_len()` in
  `tensorrt_llm/_torch/speculative/interface.py` @ 00b6d5a25c30b4382d24fbdf52956d601b3ffd24 (Eagle3
  one-model, DFlash, DraftTarget one-model, PARD, MTP one-model, SA; not DSpark, whose
  block_size must equal max_draft_len). trtspec writes draft_len_schedule only for those.
  Later TensorRT-LLM (`min_runtime_draft_len`) floors a scheduled 0 at 1 for one-engine modes other
  than Eagle3 / MTP-Eagle; at the commits above a 0 turns speculation off.

- Chunked prefill, same llm_args.py: `BaseLlmArgs.enable_chunked_prefill` (bool, default False);
  the prompt tokens a step takes are what its running requests leave of `max_num_tokens` (the
  default chunk is 8192, TensorRT-LLM PR #6386). Together with speculative decoding it is not
  verified here (no TensorRT-LLM on this machine).
- CUDA graphs, same llm_args.py: `TorchLlmArgs.cuda_graph_config` (default `CudaGraphConfig()`,
  i.e. on, for decode-only batches; None turns them off), whose decode config
  (`DecodeCudaGraphConfig` / `BaseCudaGraphConfig`) takes `batch_sizes`, `max_batch_size`
  (NonNegativeInt; 0 = 128 when no batch_sizes are given) and `enable_padding` (round a batch up
  to the next captured size, "usually a net win for performance"); the sizes are generated up to
  max_batch_size and the draft_len_schedule keys are merged into them.
- Streaming granularity, same llm_args.py (offset ~257,900): `TorchLlmArgs.stream_interval`
  (PositiveInt, default 1, "The iteration interval to create responses under the streaming mode");
  `PyExecutor._handle_responses` in `tensorrt_llm/_torch/pyexecutor/py_executor.py` at the same
  commit emits a request's response when `py_decoding_iter == 1 or is_finished or
  py_decoding_iter % stream_interval == 0`, the rule trtspec's served model follows
  (`limits.stream_interval`); written only when not 1.

Not written because not confirmed or not wanted: `enable_confidence_head` /
`confidence_threshold` (absent from `DSparkDecodingConfig` on purpose, see its NOTE), and
`moe_tensor_parallel_size` (TensorRT-LLM derives it as tp / ep when left unset).

Re-checked 2026-12-03 against the same commits (the newest llm_args.py the public index stores;
the whole repository, 2.5 GB, could not be fetched): every name and value above as written, and
- `backend` is deprecated in `TorchLlmArgs` (`Literal["pytorch"]`, the default) but still accepted;
  TensorRT-LLM's own model.yaml writes it, so model.yaml keeps it and trtllm-serve.yaml omits it.
- `DecodingBaseConfig.use_rejection_sampling` (prototype, default False: non-greedy batches are
  verified by exact match against the target's sampled token, lossless but accepting less than
  p/q rejection sampling; True needs FlashInfer >= 0.6.4 on the nodes) is left at its default.
- Newer releases, from the LLM-API reference pages of TensorRT-LLM 1.4.0rc1 / 1.4.0rc4
  (nvidia.github.io/TensorRT-LLM/1.4.0rc4/llm-api/reference/{TorchLlmArgs,DFlashDecodingConfig,
  DSparkDecodingConfig}.html): every name trtspec writes is still there, spelled the same. They add
  DSpark confidence scheduling (`enable_confidence_scheduling`, default False;
  `confidence_cost_table_path`, `confidence_calibration_path`, `confidence_min_predicted_gain`
  0.04, `enable_fused_confidence_scheduler`), i.e. TensorRT-LLM's own verify-length planner over
  a step-cost table that `tensorrt_llm._torch.speculative.dspark_sps_profiler` measures on the
  serving GPUs. Not written: the table cannot be made without those GPUs, and the release that
  has the fields is a release candidate. DSpark's `attention_backend` default becomes "AUTO" and
  DFlash's gains "FA4"; trtspec writes neither.
- DSpark Markov head types (checked 2026-12-03): `DSparkDecodingConfig.markov_head_type` is
  `Literal['vanilla', 'gated', 'rnn'] | None` in the LLM-API reference of 1.3.0rc27, 1.4.0rc1,
  1.4.0rc4 and latest. The heads are `tensorrt_llm/_torch/models/dspark/heads.py` @ 06ec703b
  (`VanillaMarkov`, `GatedMarkovHead` with `gate_proj`, `RNNHead` with `joint_proj`, ported from
  DeepSpec under DeepSpec's names; `build_markov_head` raises on any other type). Who reads the
  type: `modeling_dspark.py` (DeepSeek-V4) the speculative_config's `markov_head_type`, else the
  checkpoint's `dspark_markov_head_type`; `modeling_dspark_qwen3.py` @ 40289c86 (standalone DeepSpec
  Qwen3 drafters) the draft config's plain `markov_head_type`; the DFlash-path DSpark reader in
  `modeling_dflash.py` (the version the index stores) `dflash_config.markov_head_type`, and it
  accepts "vanilla" only ("gated/rnn heads need per-step hidden features"). `convert.py` writes a
  gated / RNN type under all three spellings, so no reader builds a vanilla head in its place; the
  speculative_config field is left unset (the checkpoint's type is what was trained).
- Readers of a standalone (Qwen3-style) DSpark drafter's config.json, i.e. what
  `convert.py` must write (checked 2026-12-03; tests/test_trtllm_readers.py restates each):
  * `modeling_dspark_qwen3.py` @ 40289c86d092d0a94681210d676eb34a94237e68
    (`Qwen3DSparkDraftModel`, DeepSpec's `Qwen3DSparkModel` checkpoints): plain top-level names
    only. `target_layer_ids` (asserted non-empty), `block_size` (default 7), `mask_token_id`
    (the speculative_config's first, else plain, else `vocab_size`), `markov_rank` (default 0;
    the Markov head asserts > 0), `markov_head_type` (default "vanilla"),
    `enable_confidence_head` / `confidence_head_with_markov` (default False; the weights then
    load with strict=True, embed_tokens / lm_head skipped).
  * `GQADSparkForCausalLM` in `modeling_dspark.py` @ 008b54fe0ce45214810a9e78853900f0f468de66 (the
    newest stored; its `_build_dspark_draft` sends every non-embedded GQA drafter there, MLA ones
    to `MLADSparkForCausalLM`), over `DFlashForCausalLM` (`modeling_dflash.py` @ 009d8fa4 above):
    `dflash_config.mask_token_id` (else plain, else `vocab_size`), `dflash_config.target_layer_ids`,
    top-level `block_size`; `markov_rank`, `markov_head_type`, `use_confidence_head` /
    `enable_confidence_head`, `shift_label`, `causal` through `resolve_dspark_head_config`
    (`dspark_config.<k>`, `dflash_config.<k>`, `dspark_<k>`, `<k>`). Vanilla heads only.
  * `TorchLlmArgs.validate_speculative_config` (llm_args.py above): the `dspark_*` names below.
  Which TensorRT-LLM the pinned image (tritonserver 26.07-trtllm) carries, and so which of the two
  drafter classes it builds, is not in the stored sources; `convert.py` writes the union, so
  either loads the same drafter. Until 2026-12-03 it wrote only `dspark_*` + `dflash_config`,
  which the Qwen3 reader cannot load (no plain `target_layer_ids`).
- DSpark embedded in the target (DeepSeek-V4 `mtp.*`): `speculative_model` may be the target
  itself; an explicit `target_layer_ids` that differs from the checkpoint's
  `dspark_target_layer_ids` is refused at start-up. The values written for
  DeepSeek-V4-Flash-DSpark (block 5, noise token 128799, layers [40, 41, 42], Markov rank 256)
  are the `dspark_*` keys every public copy of its config.json found shows.
"""

from __future__ import annotations

from trtspec.errors import ConfigError

TRTLLM_REPO = "NVIDIA/TensorRT-LLM"
LLM_ARGS_PATH = "tensorrt_llm/llmapi/llm_args.py"
LLM_ARGS_COMMIT = "0004396720054fd8e205cbf616f21f0b57c6b412"

# BaseLlmArgs / TorchLlmArgs fields trtspec may emit.
LLM_ARGS_FIELDS = frozenset(
    {
        "model",
        "backend",
        "dtype",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "moe_expert_parallel_size",
        "gpus_per_node",
        "max_batch_size",
        "max_seq_len",
        "max_num_tokens",
        "enable_chunked_prefill",
        "stream_interval",
        "kv_cache_config",
        "cuda_graph_config",
        "speculative_config",
        "trust_remote_code",
    }
)
# KvCacheConfig fields trtspec may emit.
KV_CACHE_FIELDS = frozenset({"free_gpu_memory_fraction", "enable_block_reuse", "max_tokens", "dtype"})
# CudaGraphConfig (decode) fields trtspec may emit.
CUDA_GRAPH_FIELDS = frozenset({"batch_sizes", "max_batch_size", "enable_padding"})
# KvCacheConfig.dtype values accepted by its validator (besides torch dtype names).
KV_CACHE_DTYPES = ("auto", "fp8")

# trtspec method -> DecodingBaseConfig subclass discriminator (`decoding_type` Literal).
DECODING_TYPE = {"dflash": "DFlash", "dspark": "DSpark", "eagle3": "Eagle3", "draft_model": "Draft_Target"}
_BASE_SPEC_FIELDS = frozenset(
    {
        "decoding_type",
        "max_draft_len",
        "speculative_model",
        "draft_len_schedule",
        "acceptance_rate_window_size",
        "acceptance_rate_threshold",
    }
)
# Kept for the record, never written: mutually exclusive with draft_len_schedule.
MAX_CONCURRENCY_FIELD = "max_concurrency"
# decoding types whose SpeculativeDecodingMode.support_dynamic_draft_len() is true (interface.py above)
DYNAMIC_DRAFT_LEN_TYPES = frozenset({"DFlash", "Eagle3", "Draft_Target"})
# Per decoding_type: the fields of that config class trtspec may emit.
SPEC_FIELDS = {
    "DFlash": _BASE_SPEC_FIELDS | {"mask_token_id", "target_layer_ids", "attention_backend"},
    "DSpark": _BASE_SPEC_FIELDS
    | {
        "mask_token_id",
        "target_layer_ids",
        "block_size",
        "markov_rank",
        "markov_head_type",
        "attention_backend",
    },
    "Eagle3": _BASE_SPEC_FIELDS | {"eagle3_layers_to_capture", "sa_config"},
    "Draft_Target": _BASE_SPEC_FIELDS,
    "NGram": frozenset({"decoding_type", "max_draft_len", "max_matching_ngram_size", "is_keep_all",
                        "is_use_oldest", "is_public_pool"}),
}
NGRAM_TYPE = "NGram"  # prompt lookup alone (`lookup:` without a drafter)
SA_ENHANCER_FIELDS = frozenset({"threshold", "enable_global_pool"})  # speculative_config.sa_config

# model.yaml of the llmapi Triton model: everything but this key goes to `LLM(**args)`.
TRITON_CONFIG_KEY = "triton_config"
TRITON_CONFIG_FIELDS = frozenset({"max_batch_size", "decoupled", "cancellation_check_period_ms"})

# config.pbtxt tensors of the llmapi model, all of TensorRT-LLM's own file (config.pbtxt @ 0a71057 above):
# a request carrying an optional input the model does not declare is refused by Triton ("unexpected
# inference input"), and a response tensor it does not declare is dropped. (name, TYPE_*, dims, optional)
LLMAPI_INPUTS = (
    ("text_input", "TYPE_STRING", (-1,), False),
    ("image_url", "TYPE_STRING", (-1,), True),
    ("streaming", "TYPE_BOOL", (1,), True),
    ("sampling_param_best_of", "TYPE_INT32", (1,), True),
    ("sampling_param_temperature", "TYPE_FP32", (1,), True),
    ("sampling_param_top_k", "TYPE_INT32", (1,), True),
    ("sampling_param_top_p", "TYPE_FP32", (1,), True),
    ("sampling_param_frequency_penalty", "TYPE_FP32", (1,), True),
    ("sampling_param_presence_penalty", "TYPE_FP32", (1,), True),
    ("sampling_param_max_tokens", "TYPE_INT32", (1,), True),
    ("sampling_param_stop", "TYPE_STRING", (-1,), True),
    ("sampling_param_seed", "TYPE_UINT64", (1,), True),
    ("sampling_param_exclude_input_from_output", "TYPE_BOOL", (1,), True),
    ("sampling_param_return_perf_metrics", "TYPE_BOOL", (1,), True),
    ("return_finish_reason", "TYPE_BOOL", (1,), True),
    ("return_stop_reason", "TYPE_BOOL", (1,), True),
    ("return_cumulative_logprob", "TYPE_BOOL", (1,), True),
    ("stop", "TYPE_BOOL", (1,), True),
    ("lora_id", "TYPE_UINT64", (1,), True),
    ("lora_name", "TYPE_STRING", (1,), True),
    ("lora_path", "TYPE_STRING", (1,), True),
    ("lora_ckpt_source", "TYPE_STRING", (1,), True),
)
# kv_cache_* / *_time_ns / acceptance come back only with sampling_param_return_perf_metrics
LLMAPI_OUTPUTS = (
    ("text_output", "TYPE_STRING", (-1,)),
    ("finish_reason", "TYPE_STRING", (-1,)),
    ("stop_reason", "TYPE_STRING", (-1,)),
    ("cumulative_logprob", "TYPE_FP32", (-1,)),
    ("kv_cache_reused_block", "TYPE_INT32", (-1,)),
    ("kv_cache_missed_block", "TYPE_INT32", (-1,)),
    ("kv_cache_alloc_new_blocks", "TYPE_INT32", (-1,)),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", (-1,)),
    ("kv_cache_hit_rate", "TYPE_FP32", (-1,)),
    ("arrival_time_ns", "TYPE_INT64", (1,)),
    ("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    ("first_token_time_ns", "TYPE_INT64", (1,)),
    ("last_token_time_ns", "TYPE_INT64", (1,)),
    ("acceptance_rate", "TYPE_FP32", (1,)),
    ("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    ("total_draft_tokens", "TYPE_INT32", (1,)),
)

# Drafter config.json keys TensorRT-LLM reads.
DFLASH_DRAFT_KEYS = frozenset({"dflash_config", "block_size", "model_type", "architectures"})
DFLASH_CONFIG_KEYS = frozenset({"mask_token_id", "target_layer_ids", "use_swa", "swa_window_size"})
# Plain key -> top-level dspark_* key (llm_args). convert.py writes both spellings.
DSPARK_DRAFT_KEYS = {
    "target_layer_ids": "dspark_target_layer_ids",
    "mask_token_id": "dspark_noise_token_id",
    "block_size": "dspark_block_size",
    "markov_rank": "dspark_markov_rank",
    "markov_head_type": "dspark_markov_head_type",
}


def check_names(mapping: dict, allowed: frozenset, where: str) -> None:
    """Refuse a key TensorRT-LLM does not have: a typo here would only fail on the GPU node."""
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: {unknown} not in the TensorRT-LLM names kept in trtspec/trtllm/fields.py"
        )


def check_llm_args(args: dict, where: str) -> None:
    """Check every key of LLM-API args (nested kv_cache_config / cuda_graph_config /
    speculative_config included)."""
    check_names(args, LLM_ARGS_FIELDS, where)
    if "kv_cache_config" in args:
        check_names(args["kv_cache_config"], KV_CACHE_FIELDS, f"{where}: kv_cache_config")
    if args.get("cuda_graph_config") is not None:
        check_names(args["cuda_graph_config"], CUDA_GRAPH_FIELDS, f"{where}: cuda_graph_config")
    spec = args.get("speculative_config")
    if spec is not None:
        kind = spec.get("decoding_type")
        if kind not in SPEC_FIELDS:
            raise ConfigError(
                f"{where}: speculative_config.decoding_type {kind!r} is not one of {sorted(SPEC_FIELDS)}"
            )
        check_names(spec, SPEC_FIELDS[kind], f"{where}: speculative_config ({kind})")
        if "sa_config" in spec:
            check_names(spec["sa_config"], SA_ENHANCER_FIELDS, f"{where}: speculative_config.sa_config")
        if "draft_len_schedule" in spec:
            check_draft_len_schedule(spec["draft_len_schedule"], spec.get("max_draft_len"), where)


def check_draft_len_schedule(schedule: dict, max_draft_len: int | None, where: str) -> None:
    """DecodingBaseConfig.validate_draft_len_schedule_and_sort's rules, plus non-increasing lengths."""
    if not schedule:
        raise ConfigError(f"{where}: draft_len_schedule is empty")
    keys = sorted(schedule)
    for b in keys:
        if not isinstance(b, int) or b < 1:
            raise ConfigError(f"{where}: draft_len_schedule batch size {b!r} must be an integer >= 1")
        k = schedule[b]
        if not isinstance(k, int) or k < 0 or (max_draft_len is not None and k > max_draft_len):
            raise ConfigError(f"{where}: draft_len_schedule[{b}] = {k!r} must lie in 0..max_draft_len "
                              f"({max_draft_len})")
    if max_draft_len is not None and schedule[keys[0]] != max_draft_len:
        raise ConfigError(f"{where}: draft_len_schedule[{keys[0]}] = {schedule[keys[0]]} must equal "
                          f"max_draft_len {max_draft_len} (the smallest key)")
    lengths = [schedule[b] for b in keys]
    if any(a < b for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ConfigError(f"{where}: draft_len_schedule {schedule} drafts more at a larger batch")
