"""Architecture numbers of the real models trtspec deploys, so a config plans without weights.

Each entry cites where its numbers come from. Parameter counts are derived from these numbers
(projections and MLPs; norms and biases are left out, < 0.01% of the total), and each target's
derived total is checked against its published parameter count in tests/test_planner.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trtspec.errors import ConfigError

# MXFP4 (OCP microscaling): 4-bit e2m1 element + one 8-bit e8m0 scale per 32 elements = 4.25 bits.
MXFP4_BYTES = (4 + 8 / 32) / 8
CSA_RATIO = 4  # DeepSeek-V4's compressed sparse attention layers; ratio 128 is HCA (dense), 0 window only


@dataclass(frozen=True, slots=True)
class Architecture:
    """One model (target or drafter) as far as memory is concerned. Widths are global (pre-TP)."""

    name: str
    source: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int = 0  # dense SwiGLU width; 0 when every layer is MoE
    tie_embeddings: bool = False
    has_embeddings: bool = True  # DFlash/DSpark drafters share the target's embed_tokens and lm_head
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_experts: int = 0
    weight_bytes: float = 2.0  # bytes per non-expert parameter
    embedding_bytes: float | None = None  # bytes per embedding / LM head parameter; None: weight_bytes
    expert_weight_bytes: float = 2.0
    attention_params_override: int | None = None  # per layer, for attention not shaped q/k/v/o
    extra_params: int = 0  # e.g. DFlash `fc`, EAGLE-3 `fc` + draft lm_head, DSpark Markov head
    sliding_layers: int = 0  # layers whose KV is a fixed window per sequence
    sliding_window: int = 0
    compress_ratios: tuple[int, ...] = field(default=())  # DeepSeek-V4: per layer, 0 = window only
    index_row_bytes: int = 0  # DeepSeek-V4 indexer K bytes per compressed row (ratio-4 layers)
    index_topk: int = 0  # DeepSeek-V4 CSA (ratio-4) layers: compressed rows each query attends
    index_heads: int = 0  # DeepSeek-V4 lightning indexer: heads scoring every compressed row
    index_head_dim: int = 0
    rope_dim: int = 0  # DeepSeek-V4: RoPE dims of the K=V row, kept bfloat16 in an fp8 cache
    fp8_row_scale_bytes: int = 0  # DeepSeek-V4: block scales of one fp8 K=V row

    # -- parameters (global) ---------------------------------------------------------------
    def attention_params(self) -> int:
        if self.attention_params_override is not None:
            return self.attention_params_override
        q_and_o = 2 * self.hidden * self.heads * self.head_dim
        k_and_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_and_o + k_and_v

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    def expert_params(self) -> int:
        """Routed experts of one layer (all of them)."""
        return self.num_experts * 3 * self.hidden * self.expert_intermediate

    def shared_params(self) -> int:
        """Shared experts and the router of one layer."""
        return (
            self.shared_experts * 3 * self.hidden * self.expert_intermediate + self.hidden * self.num_experts
        )

    @property
    def embedding_weight_bytes(self) -> float:
        return self.weight_bytes if self.embedding_bytes is None else self.embedding_bytes

    def embedding_params(self) -> int:
        if not self.has_embeddings:
            return 0
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    def total_params(self) -> int:
        per_layer = (
            self.attention_params() + self.dense_mlp_params() + self.expert_params() + self.shared_params()
        )
        return self.num_layers * per_layer + self.embedding_params() + self.extra_params

    # -- KV cache (global, i.e. before any TP split of KV heads) ---------------------------
    @property
    def is_dsv4(self) -> bool:
        return bool(self.compress_ratios)

    def csa_layers(self, layers: int) -> int:
        """DeepSeek-V4: how many of the first `layers` layers are CSA (compress ratio 4: an fp8
        indexer row per compressed row, and attention over the top `index_topk` rows only)."""
        return sum(1 for r in self.compress_ratios[:layers] if r == CSA_RATIO)

    def latent_row_bytes(self, kv_bytes: int) -> int:
        """DeepSeek-V4: bytes of one cached K=V row (shared by K and V and by the one KV head).

        bfloat16: head_dim x 2. fp8 (`kv_bytes` 1): the non-RoPE dims in fp8, the RoPE dims still in
        bfloat16 (DeepSeek-V4 report, section 2.3.4), plus the fp8 block scales.
        """
        if kv_bytes >= 2:
            return self.head_dim * kv_bytes
        return (self.head_dim - self.rope_dim) * kv_bytes + self.rope_dim * 2 + self.fp8_row_scale_bytes


def _dsv4_ratios(num_layers: int) -> tuple[int, ...]:
    # Layers 0 and 1 keep only the sliding window; from layer 2 even layers compress 4:1 (CSA,
    # with indexer), odd layers 128:1 (HCA) -- the schedule antirez/ds4 MODEL_CARD.md describes
    # for DeepSeek-V4-Flash.
    return tuple(0 if i < 2 else (4 if i % 2 == 0 else 128) for i in range(num_layers))


# DeepSeek-V4-Flash attention is not q/k/v/o-shaped (low-rank q, grouped low-rank o, indexer), so
# its per-layer count is derived from the published total: 284B - routed experts - shared experts
# - routers - embeddings, spread over 43 layers.
_DSV4_EXPERTS = 43 * 256 * 3 * 4096 * 2048
_DSV4_SHARED = 43 * (1 * 3 * 4096 * 2048 + 4096 * 256)
_DSV4_EMBED = 2 * 129280 * 4096
_DSV4_ATTN_PER_LAYER = (284_000_000_000 - _DSV4_EXPERTS - _DSV4_SHARED - _DSV4_EMBED) // 43

TARGETS: dict[str, Architecture] = {
    # Qwen/Qwen3-8B config.json: 36 layers, hidden 4096, 32 q / 8 kv heads, head_dim 128,
    # intermediate 12288, vocab 151936, tie_word_embeddings false, bfloat16 (model card: 8.2B
    # params, 36 layers, 32 Q / 8 KV heads; widths as in vllm-project/speculators DFlash test fixture).
    "Qwen/Qwen3-8B": Architecture(
        name="Qwen/Qwen3-8B",
        source="huggingface.co/Qwen/Qwen3-8B config.json",
        num_layers=36,
        hidden=4096,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        intermediate=12288,
    ),
    # meta-llama/Llama-3.1-8B-Instruct config.json: 32 layers, hidden 4096, 32 / 8 heads,
    # head_dim 128, intermediate 14336, vocab 128256, untied, bfloat16.
    "meta-llama/Llama-3.1-8B-Instruct": Architecture(
        name="meta-llama/Llama-3.1-8B-Instruct",
        source="huggingface.co/meta-llama/Llama-3.1-8B-Instruct config.json",
        num_layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=128256,
        intermediate=14336,
    ),
    # openai/gpt-oss-120b config.json: 36 layers, hidden 2880, 64 q / 8 kv heads, head_dim 64,
    # 128 local experts, 4 per token, intermediate 2880, vocab 201088, untied, sliding_window 128 on
    # every other layer (layer_types), experts MXFP4 and the rest bf16 (quantization_config
    # modules_to_not_convert: self_attn, router, embed_tokens, lm_head).
    "openai/gpt-oss-120b": Architecture(
        name="openai/gpt-oss-120b",
        source="huggingface.co/openai/gpt-oss-120b config.json",
        num_layers=36,
        hidden=2880,
        heads=64,
        kv_heads=8,
        head_dim=64,
        vocab=201088,
        num_experts=128,
        experts_per_token=4,
        expert_intermediate=2880,
        expert_weight_bytes=MXFP4_BYTES,
        sliding_layers=18,
        sliding_window=128,
    ),
    # deepseek-ai/DeepSeek-V4-Flash: 43 layers, hidden 4096, 64 heads, 1 KV head (MQA) of
    # head_dim 512, vocab 129280, 256 routed + 1 shared expert, top-6, moe_intermediate 2048,
    # sliding_window 128, index_n_heads 64, index_head_dim 128, index_topk 512, qk_rope_head_dim
    # 64, compress_ratios [0, 0, 4, 128, ..., 4, 128, 4] + one 0 for the MTP layer (44 entries).
    # The official config.json was not readable from here: these values are as mirrored in
    # third-party copies of it (a benchmark repo's snapshot of its config.json, vllm_musa
    # deepseek_v4_policy tests, a DS4 Rust port's V4F_CONFIG_JSON), which agree, and NVIDIA NeMo's
    # model page (43 layers, 256 + 1 experts, top-6). Weights: FP4 experts, FP8 elsewhere (model card:
    # "FP4 + FP8 mixed"). Indexer K row: 132 B in fp8 at index_head_dim 128 (TensorRT-LLM
    # DeepSeekSparseAttentionConfig.indexer_k_dtype description). Embedding and LM head stay bf16
    # (DeepSeek's V4-Flash inference reference: "lm_head in the checkpoint is stored in bf16"; the
    # embedding is built in the default bf16 dtype, not as an FP8 Linear). K=V row in an fp8 cache: the 448
    # non-RoPE dims in fp8, the qk_rope_head_dim 64 RoPE dims in bf16 (DeepSeek-V4 report 2.3.4:
    # "RoPE dimensions kept in BF16") and 7 ue8m0 scales (one per 64 fp8 dims) + 1 byte of padding:
    # 448 + 128 + 8 = 584 B, the entry SGLang's DeepSeek-V4 memory pool stores (not 512 B: pricing
    # every dim at one byte understates the fp8 cache by 12%).
    "deepseek-ai/DeepSeek-V4-Flash": Architecture(
        name="deepseek-ai/DeepSeek-V4-Flash",
        source="DeepSeek-V4-Flash config as mirrored in public test fixtures (see trtspec/plan/models.py)",
        num_layers=43,
        hidden=4096,
        heads=64,
        kv_heads=1,
        head_dim=512,
        vocab=129280,
        num_experts=256,
        experts_per_token=6,
        expert_intermediate=2048,
        shared_experts=1,
        weight_bytes=1.0,
        embedding_bytes=2.0,
        expert_weight_bytes=MXFP4_BYTES,
        attention_params_override=_DSV4_ATTN_PER_LAYER,
        sliding_window=128,
        compress_ratios=_dsv4_ratios(43),
        index_row_bytes=132,
        index_topk=512,
        index_heads=64,
        index_head_dim=128,
        rope_dim=64,
        fp8_row_scale_bytes=8,
    ),
}

# Published parameter counts the derived totals are checked against, at the precision published:
# Hugging Face's count of the safetensors (Qwen3-8B "8.19B params", Llama-3.1-8B-Instruct "8.03B
# params"), the gpt-oss model card (arXiv 2508.10925, table 1: 116.83B total) and DeepSeek's
# model card (DeepSeek-V4-Flash: 284B total, 13B activated).
PUBLISHED_PARAMS = {
    "Qwen/Qwen3-8B": 8.19e9,
    "meta-llama/Llama-3.1-8B-Instruct": 8.03e9,
    "openai/gpt-oss-120b": 116.83e9,
    "deepseek-ai/DeepSeek-V4-Flash": 284e9,
}
# The unit of the last published digit of each count (a count is checked to half of it).
PUBLISHED_PARAMS_UNIT = {
    "Qwen/Qwen3-8B": 0.01e9,
    "meta-llama/Llama-3.1-8B-Instruct": 0.01e9,
    "openai/gpt-oss-120b": 0.01e9,
    "deepseek-ai/DeepSeek-V4-Flash": 1e9,
}


def _dflash(name: str, source: str, target: Architecture, layers: int, intermediate: int,
            taps: int | None = None) -> Architecture:
    # No embeddings or LM head of its own; `fc: Linear(taps * H -> H)` over the target layers tapped
    # (len(target_layer_ids); as many as draft layers unless `taps` says otherwise).
    return Architecture(
        name=name,
        source=source,
        num_layers=layers,
        hidden=target.hidden,
        heads=target.heads,
        kv_heads=target.kv_heads,
        head_dim=target.head_dim,
        vocab=target.vocab,
        intermediate=intermediate,
        has_embeddings=False,
        extra_params=(layers if taps is None else taps) * target.hidden * target.hidden,
    )


_QWEN3 = TARGETS["Qwen/Qwen3-8B"]
_LLAMA = TARGETS["meta-llama/Llama-3.1-8B-Instruct"]
_GPTOSS = TARGETS["openai/gpt-oss-120b"]
_DSV4 = TARGETS["deepseek-ai/DeepSeek-V4-Flash"]

DRAFTERS: dict[str, Architecture] = {
    # z-lab/Qwen3-8B-DFlash-b16 config.json: 5 layers, Qwen3-8B widths, block_size 16,
    # dflash_config {mask_token_id 151669, target_layer_ids [1, 9, 17, 25, 33]} (as mirrored in
    # vllm-project/speculators tests/unit/convert/dflash).
    "z-lab/Qwen3-8B-DFlash-b16": _dflash(
        "z-lab/Qwen3-8B-DFlash-b16", "huggingface.co/z-lab/Qwen3-8B-DFlash-b16 config.json", _QWEN3, 5, 12288
    ),
    # z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat config.json: 5 layers, hidden 4096, 32 q / 8 kv
    # heads, intermediate 12288 (the Qwen3-8B drafter's, not Llama's 14336), block_size 10,
    # target_layer_ids [1, 8, 15, 22, 29]; one 1.95 GiB bf16 safetensors file = 1.05B params (as
    # tabulated from the Hugging Face configs and file listing in a public DFlash survey; the
    # config itself was not readable from here).
    "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat": _dflash(
        "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
        "huggingface.co/z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat config.json (as tabulated)",
        _LLAMA,
        5,
        12288,
    ),
    # z-lab/gpt-oss-120b-DFlash config.json: 8 layers at gpt-oss widths (hidden 2880, 64 q / 8 kv
    # heads of 64), intermediate 7680, block_size 10, target_layer_ids [1, 9, 17, 25, 33] (5 taps,
    # not 8); one 1.46 GiB bf16 safetensors file = 0.78B params (tabulated like the Llama drafter's).
    "z-lab/gpt-oss-120b-DFlash": _dflash(
        "z-lab/gpt-oss-120b-DFlash",
        "huggingface.co/z-lab/gpt-oss-120b-DFlash config.json (as tabulated)",
        _GPTOSS,
        8,
        7680,
        taps=5,
    ),
    # The trtspec recipe's own drafter for gpt-oss-120b (chosen before z-lab published theirs):
    # 5 dense layers at target widths, SwiGLU 3 x 2880.
    "trtspec/gpt-oss-120b-DFlash": _dflash(
        "trtspec/gpt-oss-120b-DFlash",
        "trtspec recipe choice: 5 dense layers, intermediate 8640",
        _GPTOSS,
        5,
        3 * 2880,
    ),
    # EAGLE-3 (arXiv 2503.01840): one decoder layer, fc 3H -> H, own lm_head over a reduced draft
    # vocabulary. ASSUMED sizes: target widths and a 32000-token draft vocabulary, as in the
    # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B layout; confirm against the Qwen3-8B checkpoint used.
    # Its q/k/v read the token embedding concatenated with the fused hidden state, 2H wide (EAGLE's
    # cnets.py; trtspec/models/eagle3.py builds them the same way); o maps back to H.
    "eagle3/Qwen3-8B": Architecture(
        name="eagle3/Qwen3-8B",
        source="ASSUMED: EAGLE-3 layout at Qwen3-8B widths, draft vocab 32000",
        num_layers=1,
        hidden=4096,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        intermediate=12288,
        has_embeddings=False,
        attention_params_override=2 * 4096 * (32 + 2 * 8) * 128 + 32 * 128 * 4096,
        extra_params=3 * 4096 * 4096 + 32000 * 4096,
    ),
    # deepseek-ai/DeepSeek-V4-Flash-DSpark: the embedded flavour (draft = the target's `mtp.*`
    # blocks, full DeepSeek-V4 decoder blocks). Block size 5 (`dspark_block_size` in public copies
    # of the checkpoint's config.json, and the k = 5 that vLLM deployments of it run; the sglang
    # DSpark hook test's 3 is a small fixture), markov_rank 256, target layers [40, 41, 42], noise
    # token 128799. Number of draft blocks
    # ASSUMED 3 (TensorRT-LLM modeling_dspark.py states n_mtp_layers = 3 for V4-Pro); the Markov
    # head adds vocab x 256 twice. Its KV is a rolling window (DSv4DSparkWorker), not per token:
    # DeepSeek-V4 blocks with compress ratio 0 (window only; the 0731 checkpoint's compress_ratios
    # end in 0s for the draft blocks), each window row one shared K=V row like the target's.
    "deepseek-ai/DeepSeek-V4-Flash-DSpark": Architecture(
        name="deepseek-ai/DeepSeek-V4-Flash-DSpark",
        source="ASSUMED 3 embedded mtp blocks of DeepSeek-V4-Flash shape; DSpark fields from sglang tests",
        num_layers=3,
        hidden=_DSV4.hidden,
        heads=_DSV4.heads,
        kv_heads=1,
        head_dim=512,
        vocab=_DSV4.vocab,
        num_experts=256,
        experts_per_token=6,
        expert_intermediate=2048,
        shared_experts=1,
        weight_bytes=1.0,
        expert_weight_bytes=MXFP4_BYTES,
        attention_params_override=_DSV4_ATTN_PER_LAYER,
        has_embeddings=False,
        extra_params=2 * _DSV4.vocab * 256 + 3 * _DSV4.hidden * _DSV4.hidden,
        sliding_window=128,
        compress_ratios=(0, 0, 0),
        rope_dim=_DSV4.rope_dim,
        fp8_row_scale_bytes=_DSV4.fp8_row_scale_bytes,
    ),
}


def get_target(model_id: str) -> Architecture:
    try:
        return TARGETS[model_id]
    except KeyError:
        raise ConfigError(f"unknown deployment.model_id {model_id!r}; known: {', '.join(TARGETS)}") from None


# the method each drafter of DRAFTERS drafts by (a config's drafter.method must agree)
DRAFTER_METHODS = {
    "z-lab/Qwen3-8B-DFlash-b16": "dflash",
    "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat": "dflash",
    "z-lab/gpt-oss-120b-DFlash": "dflash",
    "trtspec/gpt-oss-120b-DFlash": "dflash",
    "eagle3/Qwen3-8B": "eagle3",
    "deepseek-ai/DeepSeek-V4-Flash-DSpark": "dspark",
}


def get_drafter(drafter_id: str) -> Architecture:
    try:
        return DRAFTERS[drafter_id]
    except KeyError:
        raise ConfigError(
            f"unknown deployment.drafter_id {drafter_id!r}; known: {', '.join(DRAFTERS)}"
        ) from None
