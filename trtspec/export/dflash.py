"""ONNX export of a DFlash drafter (`trtspec.models.dflash`) as two graphs, attention as a plugin.

context graph (run once per cycle on the positions the target just committed):
    inputs   hidden_taps [b, c, n_taps·H] (the target's taps), position_ids [b, c] int64
    outputs  ctx_key_{l} / ctx_value_{l} [b, kvh, c, d] per drafter layer: k-normed, rotated
block graph (one forward per proposal; owns copies of the target's embed_tokens and lm_head):
    inputs   block_ids [b, B] int64 ([anchor, MASK × (B−1)]), position_ids [b, B] int64,
             ctx_key_{l} / ctx_value_{l} [b, kvh, c, d] (all cached context), ctx_lens [b] int32
    outputs  logits [b, B, V] (slot j predicts the token at position start + j)

Each drafter layer's attention is one `trtspec::kv_injection_attention` node over the cached
context K/V and the block's own K/V, so TensorRT runs the plugin kernel and never concatenates
the context again. Hidden states and K/V are in the graph's precision (float32 or float16);
logits are float32.
"""

from __future__ import annotations

import onnx
import torch

from trtspec.export.graph import FLOAT, INT32, INT64, PLUGIN_DOMAIN, GraphBuilder
from trtspec.export.layers import apply_rope, heads, linear, merge_heads, rms_norm, rope_tables, silu_mlp
from trtspec.export.plugins import kv_injection_attention
from trtspec.models.dflash import DFlashDraftModel


def _kv_shape(model: DFlashDraftModel, length: str) -> list:
    return ["batch", model.config.num_key_value_heads, length, model.config.head_dim]


def _project_kv(g: GraphBuilder, x: str, attn, cos: str, sin: str, name: str) -> tuple[str, str]:
    """DFlashAttention.project_kv: K/V [b, kvh, s, d] of x [b, s, H], k-normed and rotated."""
    kvh, d = attn.num_kv_heads, attn.head_dim
    k = heads(g, linear(g, x, attn.k_proj, f"{name}.k_proj"), kvh, d, attn.k_norm, f"{name}.k_norm")
    v = heads(g, linear(g, x, attn.v_proj, f"{name}.v_proj"), kvh, d, None, "")
    return apply_rope(g, k, cos, sin), v


def export_dflash_context(model: DFlashDraftModel, precision: str = "float32") -> onnx.ModelProto:
    """DFlashDraftModel.project_context as a graph."""
    n_in = model.fc.in_features
    g = GraphBuilder("trtspec_dflash_context", precision)
    taps = g.input("hidden_taps", g.float_type, ["batch", "ctx", n_in])
    position_ids = g.input("position_ids", INT64, ["batch", "ctx"])
    with torch.no_grad():
        ctx = rms_norm(g, linear(g, taps, model.fc, "fc"), model.hidden_norm, "hidden_norm")  # [b, c, H]
        cos, sin = rope_tables(g, position_ids, model.rotary_emb, "rotary_emb")
        for i, layer in enumerate(model.layers):
            k, v = _project_kv(g, ctx, layer.self_attn, cos, sin, f"layers.{i}.self_attn")
            g.output(k, f"ctx_key_{i}", g.float_type, _kv_shape(model, "ctx"))
            g.output(v, f"ctx_value_{i}", g.float_type, _kv_shape(model, "ctx"))
    return g.model(f"trtspec DFlash context projection ({len(model.layers)} layers)")


def block_hidden(g: GraphBuilder, model: DFlashDraftModel, embed_tokens: torch.nn.Embedding) -> str:
    """DFlashDraftModel.forward over the graph inputs block_ids, position_ids, ctx K/V and ctx_lens
    (declared here) -> final-normed hidden [b, B, H]."""
    block_ids = g.input("block_ids", INT64, ["batch", "block"])
    position_ids = g.input("position_ids", INT64, ["batch", "block"])
    ctx_kv = [(g.input(f"ctx_key_{i}", g.float_type, _kv_shape(model, "ctx")),
               g.input(f"ctx_value_{i}", g.float_type, _kv_shape(model, "ctx")))
              for i in range(len(model.layers))]
    ctx_lens = g.input("ctx_lens", INT32, ["batch"])
    with torch.no_grad():
        h = g.op("Gather", g.weight(embed_tokens.weight, "embed_tokens.weight"), block_ids, axis=0)
        cos, sin = rope_tables(g, position_ids, model.rotary_emb, "rotary_emb")
        for i, (layer, (ctx_k, ctx_v)) in enumerate(zip(model.layers, ctx_kv, strict=True)):
            name, attn = f"layers.{i}", layer.self_attn
            x = rms_norm(g, h, layer.input_layernorm, f"{name}.input_layernorm")
            q = heads(g, linear(g, x, attn.q_proj, f"{name}.self_attn.q_proj"), attn.num_heads,
                      attn.head_dim, attn.q_norm, f"{name}.self_attn.q_norm")
            q = apply_rope(g, q, cos, sin)  # [b, h, B, d]
            blk_k, blk_v = _project_kv(g, x, attn, cos, sin, f"{name}.self_attn")
            out = kv_injection_attention(g, q, ctx_k, ctx_v, blk_k, blk_v, ctx_lens)  # [b, h, B, d]
            h = g.op("Add", h, linear(g, merge_heads(g, out), attn.o_proj, f"{name}.self_attn.o_proj"))
            mlp_in = rms_norm(g, h, layer.post_attention_layernorm, f"{name}.post_attention_layernorm")
            h = g.op("Add", h, silu_mlp(g, mlp_in, layer.mlp, f"{name}.mlp"))
        return rms_norm(g, h, model.norm, "norm")


def export_dflash_block(model: DFlashDraftModel, embed_tokens: torch.nn.Embedding,
                        lm_head: torch.nn.Linear, precision: str = "float32") -> onnx.ModelProto:
    """DFlashDraftModel.forward with the target's embedding and LM head around it."""
    g = GraphBuilder("trtspec_dflash_block", precision)
    hidden = block_hidden(g, model, embed_tokens)  # [b, B, H]
    with torch.no_grad():
        logits = linear(g, hidden, lm_head, "lm_head")
        g.output(g.to_float32(logits), "logits", FLOAT, ["batch", "block", lm_head.out_features])
    return g.model(f"trtspec DFlash block ({len(model.layers)} layers, block {model.spec.block_size})",
                   {PLUGIN_DOMAIN: 1})
