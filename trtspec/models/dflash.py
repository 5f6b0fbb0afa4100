"""DFlash drafter network (z-lab, arXiv 2602.06036), in z-lab's published checkpoint layout.

- No embedding or LM head of its own: the target's `embed_tokens` and `lm_head` are used, frozen.
- Context feature: `hidden_norm(fc(concat(hidden_states[id + 1] for id in target_layer_ids)))`.
- KV injection: in EVERY layer, keys/values = projections of [context feature ; block hidden];
  k-norm and RoPE on both parts; queries come only from the block; no `input_layernorm` on the
  context (`hidden_norm` is its only norm). The projected context K/V are cached across cycles.
- Block `[last verified token, MASK × (B−1)]` at positions start..start+B−1, attention
  bidirectional in the block and full over the context; output slot j predicts the token at
  position start + j (no shift), so one forward yields B − 1 drafts.

State-dict names (no `model.` prefix): `fc`, `hidden_norm`, `layers.{i}.{input_layernorm,
self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm, mlp.{gate,up,down}_proj}`,
`norm` — as z-lab's `DFlashDraftModel` and SpecForge write them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding

from trtspec.errors import CheckpointError
from trtspec.models.checkpoint import (
    cast_keeping_rope,
    check_weights_fit,
    int_field,
    int_list_field,
    load_weights,
    object_field,
    read_checkpoint,
    weight_shapes,
    write_checkpoint,
)
from trtspec.models.kv_slots import SlotView
from trtspec.models.target import check_config_values

ContextKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: k, v [b, kv_heads, c, head_dim]


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps: spread evenly from layer 1 to L−3 (36 layers, 5 → [1, 9, 17, 25, 33])."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, heads, s, d]; cos/sin: [b, s, d]."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


class DFlashAttention(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        d, h, kvh = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.num_heads, self.num_kv_heads = d, h, kvh
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, h * d, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kvh * d, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kvh * d, bias=bias)
        self.o_proj = nn.Linear(h * d, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)

    def project_kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of x [b, s, H] at the positions of cos/sin: k-normed and rotated."""
        b, s, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v  # [b, kvh, s, d] each

    def forward(self, x, cos, sin, ctx: LayerContext, mask=None) -> torch.Tensor:
        """x [b, B, H] (normed block); ctx: (ctx_k, ctx_v) [b, kvh, c, d] with mask [b|1, 1, B, c+B]
        or None, or a `SlotView` (the context already in slot buffers, no mask)."""
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, self.num_heads, self.head_dim)).transpose(1, 2)
        q = apply_rope(q, cos, sin)  # [b, h, B, d]
        k_blk, v_blk = self.project_kv(x, cos, sin)
        if isinstance(ctx, SlotView):
            out = ctx.attend(q, k_blk, v_blk)  # [b, h, B, d]
        else:
            k = torch.cat([ctx[0], k_blk], dim=2)  # [b, kvh, c+B, d]
            v = torch.cat([ctx[1], v_blk], dim=2)
            out = kv_injection_attention(q, k, v, mask)  # [b, h, B, d]
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


LayerContext = tuple[torch.Tensor, torch.Tensor] | SlotView


def kv_injection_attention(q, k, v, mask=None) -> torch.Tensor:
    """Torch reference of the `kv_injection_attention` plugin: non-causal GQA attention of the
    block queries over [context K/V ; block K/V], RoPE already applied.
    q: [b, h, B, d]; k, v: [b, kvh, c+B, d]; mask: boolean (True = attend) or None -> [b, h, B, d]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)

    def forward(self, h, cos, sin, ctx: LayerContext, mask=None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


@dataclass(slots=True)
class DFlashSpec:
    """The DFlash fields of a checkpoint's config.json."""

    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: int

    @classmethod
    def from_config_dict(cls, raw: dict, where: str) -> DFlashSpec:
        dflash = object_field(raw, "dflash_config", where)
        num_target_layers = int_field(raw, "num_target_layers", where, "DFlash")
        mask_token_id = int_field(dflash, "mask_token_id", where, "DFlash", "dflash_config.")
        if "target_layer_ids" in dflash:
            layer_ids = int_list_field(dflash, "target_layer_ids", where, "DFlash", "dflash_config.")
        else:  # z-lab's default spread over the drafter's depth
            layer_ids = build_target_layer_ids(num_target_layers,
                                               int_field(raw, "num_hidden_layers", where, "DFlash"))
        return cls(dflash_block_size(raw, where), mask_token_id, layer_ids, num_target_layers)


def dflash_block_size(raw: dict, where: str) -> int:
    """Top-level `block_size` (z-lab, TensorRT-LLM) or `dflash_config.block_size` (SpecForge), 16
    when neither is given; a CheckpointError when both are given and differ, since readers that
    prefer different places would draft blocks of different sizes."""
    dflash = object_field(raw, "dflash_config", where)
    if "block_size" not in dflash:
        return int_field(raw, "block_size", where, "DFlash", default=16)
    nested = int_field(dflash, "block_size", where, "DFlash", "dflash_config.")
    if "block_size" in raw and raw["block_size"] != nested:
        raise CheckpointError(
            f"{where}: block_size {raw['block_size']!r} and dflash_config.block_size {nested} differ; "
            "TensorRT-LLM reads the first, SpecForge writes the second: keep one"
        )
    return nested


class DFlashDraftModel(nn.Module):
    """The drafter layers. `forward` takes embedded block tokens and returns normed hidden states."""

    def __init__(self, config: Qwen3Config, spec: DFlashSpec):
        super().__init__()
        self.config, self.spec = config, spec
        n_taps, hidden = len(spec.target_layer_ids), config.hidden_size
        self.fc = nn.Linear(n_taps * hidden, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)

    def rope(self, positions: torch.Tensor, like: torch.Tensor):
        """cos, sin [b, s, d] for positions [b, s]."""
        return self.rotary_emb(like, positions)

    def project_context(self, taps: torch.Tensor, positions: torch.Tensor) -> ContextKV:
        """Per-layer K/V of new context. taps: [b, c, n_taps*H] raw target hidden states."""
        ctx = self.hidden_norm(self.fc(taps))  # [b, c, H]
        cos, sin = self.rope(positions, ctx)
        return [layer.self_attn.project_kv(ctx, cos, sin) for layer in self.layers]

    def forward(self, block_embeds, positions, ctx_kv: list[LayerContext], mask=None) -> torch.Tensor:
        """block_embeds [b, B, H] at positions [b, B] over each layer's context -> hidden [b, B, H]."""
        cos, sin = self.rope(positions, block_embeds)
        h = block_embeds
        for layer, ctx in zip(self.layers, ctx_kv, strict=True):
            h = layer(h, cos, sin, ctx, mask)
        return self.norm(h)


# -- checkpoint layout ------------------------------------------------------------------------

def dflash_config_dict(config: Qwen3Config, spec: DFlashSpec) -> dict:
    raw = config.to_dict()
    for key in ("trtspec_special_tokens", "transformers_version", "output_hidden_states"):
        raw.pop(key, None)
    raw.update(
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        block_size=spec.block_size,
        num_target_layers=spec.num_target_layers,
        dflash_config={"mask_token_id": spec.mask_token_id, "target_layer_ids": spec.target_layer_ids},
    )
    return raw


def save_dflash(model: DFlashDraftModel, out_dir: Path) -> None:
    write_checkpoint(model, dflash_config_dict(model.config, model.spec), out_dir)


def check_block_drafter_fits(spec: DFlashSpec, config: Qwen3Config, target_config, where: str,
                             prefix: str = "", same_vocab: bool = False) -> None:
    """Refuse a DFlash-style drafter (DFlash, DSpark) that does not fit its target, naming the
    field and both values. `prefix`: where the spec's fields sit in config.json (DFlash:
    "dflash_config."); `same_vocab`: the drafter has its own vocabulary, which must be the target's."""
    checks = [("hidden_size", config.hidden_size, target_config.hidden_size)]
    if same_vocab:
        checks.append(("vocab_size", config.vocab_size, target_config.vocab_size))
    checks.append(("num_target_layers", spec.num_target_layers, target_config.num_hidden_layers))
    for field, mine, theirs in checks:
        if mine != theirs:
            raise CheckpointError(f"{where}: {field} is {mine} but the target has {theirs}")
    bad = [i for i in spec.target_layer_ids if not 0 <= i < target_config.num_hidden_layers]
    if bad:
        raise CheckpointError(
            f"{where}: {prefix}target_layer_ids {spec.target_layer_ids} has {bad} out of range "
            f"for a target with {target_config.num_hidden_layers} layers"
        )
    if not 0 <= spec.mask_token_id < target_config.vocab_size:
        raise CheckpointError(
            f"{where}: {prefix}mask_token_id {spec.mask_token_id} is outside the target's "
            f"vocabulary of {target_config.vocab_size}"
        )
    # a block longer than the target's context never fits it (2**70 was a TypeError traceback as
    # the cost profile allocated it, 5,000 on a 4,096-position target a run that did not end)
    positions = getattr(target_config, "max_position_embeddings", None)
    if isinstance(positions, int) and spec.block_size > positions:
        raise CheckpointError(f"{where}: block_size {spec.block_size} is more than the target's "
                              f"max_position_embeddings {positions}")


def check_fits_target(spec: DFlashSpec, config: Qwen3Config, target_config, where: str) -> None:
    """Refuse a DFlash drafter that does not fit its target, naming the field and both values."""
    check_block_drafter_fits(spec, config, target_config, where, prefix="dflash_config.")
    if spec.block_size < 2:
        raise CheckpointError(f"{where}: block_size is {spec.block_size}; DFlash needs at least 2")


def load_dflash(path: Path, target_config=None, dtype=torch.float32) -> DFlashDraftModel:
    """Load a DFlash checkpoint (z-lab layout); with `target_config`, refuse one that does not fit."""
    config_file, raw, weights = read_checkpoint(path, "a DFlash")
    spec = DFlashSpec.from_config_dict(raw, str(config_file))
    dflash_keys = ("dflash_config", "block_size", "num_target_layers")
    qwen_fields = {k: v for k, v in raw.items() if k not in dflash_keys}
    config = Qwen3Config(**qwen_fields)
    check_config_values(config_file, config)  # a NaN rms_norm_eps or rope_theta drafted NaN
    if target_config is not None:
        check_fits_target(spec, config, target_config, str(config_file))
    check_weights_fit(lambda: DFlashDraftModel(config, spec),
                      weight_shapes(weights, lambda k: k.removeprefix("model.")), path)
    model = DFlashDraftModel(config, spec)
    state = {k.removeprefix("model."): v for k, v in load_weights(weights).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the DFlash layout "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return cast_keeping_rope(model, dtype).eval()
