"""ONNX export of the target p: KV cache in and out, and the hidden-state taps a drafter reads.

    inputs   input_ids [b, s] int64, position_ids [b, s] int64 (RoPE positions),
             attention_mask [b, s, past+s] bool (True = query i attends to cache slot j),
             past_key_{i} / past_value_{i} [b, kvh, past, d] for every layer i
    outputs  logits [b, s, V] float32, present_key_{i} / present_value_{i} [b, kvh, past+s, d],
             and, when taps are asked for, hidden_taps [b, s, n_taps·H]: the outputs of layers
             `tap_layer_ids` concatenated (HF's hidden_states[i + 1]; the last layer's is the
             final-normed state, as transformers returns it)
K/V and taps are in the graph's precision (float32 or float16); logits are float32.

The mask is an input so that one graph serves a packed ragged batch of requests sharing one cache
(`trtspec.engine.target.EngineTarget`: a slot is visible to a query iff it belongs to the query's
request and its position is <= the query's). Rewinding and compacting the cache is slicing the
present tensors, which the adapter does between calls.
"""

from __future__ import annotations

import onnx
import torch
from transformers import PretrainedConfig, PreTrainedModel

from trtspec.errors import CheckpointError
from trtspec.export.graph import BOOL, FLOAT, INT64, GraphBuilder
from trtspec.export.layers import apply_rope, heads, linear, merge_heads, rms_norm, rope_tables, silu_mlp
from trtspec.models.target import STATIC_ROPE_TYPES, rope_type_of, sliding_window_of

EXPORTABLE_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")


def check_exportable(config: PretrainedConfig, where: str = "config.json") -> None:
    """Refuse what the exporter does not write, naming the config field and what it supports."""
    model_type = getattr(config, "model_type", None)
    if model_type not in EXPORTABLE_MODEL_TYPES:
        raise CheckpointError(f"{where}: model_type {model_type!r} cannot be exported to ONNX; "
                              f"supported: {', '.join(EXPORTABLE_MODEL_TYPES)}")
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{where}: hidden_act {act!r} cannot be exported; the exporter writes "
                              "silu MLPs")
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        raise CheckpointError(f"{where}: layer_types has sliding-window layers; the exporter writes full "
                              "attention only")
    if sliding_window_of(config):
        raise CheckpointError(f"{where}: sliding_window is set; the exporter writes full attention only")
    rope_type = rope_type_of(config)
    if rope_type not in STATIC_ROPE_TYPES:
        raise CheckpointError(f"{where}: rope_parameters.rope_type {rope_type!r} cannot be exported; "
                              f"supported: {', '.join(STATIC_ROPE_TYPES)}")


def kv_shape(config: PretrainedConfig, length: str) -> list:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return ["batch", config.num_key_value_heads, length, head_dim]


def _attention(g: GraphBuilder, x: str, attn, config, cos: str, sin: str, past: tuple[str, str],
               allowed: str, name: str) -> tuple[str, str, str]:
    """GQA self-attention over [past ; new] where `allowed` [b, 1, 1, s, T] is True.
    Returns (output [b, s, H], present k, v)."""
    h, kvh = config.num_attention_heads, config.num_key_value_heads
    d = kv_shape(config, "")[3]
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)  # Qwen3 only
    q = heads(g, linear(g, x, attn.q_proj, f"{name}.q_proj"), h, d, q_norm, f"{name}.q_norm")
    k = heads(g, linear(g, x, attn.k_proj, f"{name}.k_proj"), kvh, d, k_norm, f"{name}.k_norm")
    v = heads(g, linear(g, x, attn.v_proj, f"{name}.v_proj"), kvh, d, None, "")
    q, k = apply_rope(g, q, cos, sin), apply_rope(g, k, cos, sin)
    present_k = g.op("Concat", past[0], k, axis=2)  # [b, kvh, T, d]
    present_v = g.op("Concat", past[1], v, axis=2)
    # the G = h / kvh query heads sharing a kv head are consecutive: [b, kvh, G, s, d]
    q5 = g.op("Reshape", q, g.const([0, kvh, h // kvh, -1, d]))
    k5 = g.op("Unsqueeze", present_k, g.const([2]))  # [b, kvh, 1, T, d]
    v5 = g.op("Unsqueeze", present_v, g.const([2]))
    scores = g.op("MatMul", q5, g.op("Transpose", k5, perm=[0, 1, 2, 4, 3]))  # [b, kvh, G, s, T]
    scores = g.op("Mul", g.to_float32(scores), g.const([float(attn.scaling)], "float32"))
    scores = g.op("Where", allowed, scores, g.const([float("-inf")], "float32"))
    weights = g.from_float32(g.op("Softmax", scores, axis=-1))
    out = g.op("MatMul", weights, v5)  # [b, kvh, G, s, d]
    out = g.op("Reshape", out, g.const([0, h, -1, d]))  # [b, h, s, d]
    return linear(g, merge_heads(g, out), attn.o_proj, f"{name}.o_proj"), present_k, present_v


def export_target(model: PreTrainedModel, tap_layer_ids: tuple[int, ...] = (),
                  precision: str = "float32") -> onnx.ModelProto:
    """The ONNX graph of a Qwen3/Qwen2/Llama/Mistral causal LM with KV cache and taps."""
    config = model.config
    check_exportable(config)
    num_layers = config.num_hidden_layers
    bad = [i for i in tap_layer_ids if not 0 <= i < num_layers]
    if bad:
        raise CheckpointError(f"tap layers {bad} are out of range for a target with {num_layers} layers")
    base = model.model
    g = GraphBuilder("trtspec_target", precision)
    fp = g.float_type
    input_ids = g.input("input_ids", INT64, ["batch", "seq"])
    position_ids = g.input("position_ids", INT64, ["batch", "seq"])
    mask = g.input("attention_mask", BOOL, ["batch", "seq", "total"])
    pasts = [(g.input(f"past_key_{i}", fp, kv_shape(config, "past")),
              g.input(f"past_value_{i}", fp, kv_shape(config, "past"))) for i in range(num_layers)]

    with torch.no_grad():
        hidden = g.op("Gather", g.weight(base.embed_tokens.weight, "embed_tokens.weight"), input_ids, axis=0)
        cos, sin = rope_tables(g, position_ids, base.rotary_emb, "rotary_emb")
        allowed = g.op("Unsqueeze", mask, g.const([1, 2]))  # [b, 1, 1, s, T]
        layer_out = []
        for i, layer in enumerate(base.layers):
            name = f"layers.{i}"
            attn_in = rms_norm(g, hidden, layer.input_layernorm, f"{name}.input_layernorm")
            attn_out, pk, pv = _attention(g, attn_in, layer.self_attn, config, cos, sin, pasts[i],
                                          allowed, f"{name}.self_attn")
            hidden = g.op("Add", hidden, attn_out)
            mlp_in = rms_norm(g, hidden, layer.post_attention_layernorm, f"{name}.post_attention_layernorm")
            hidden = g.op("Add", hidden, silu_mlp(g, mlp_in, layer.mlp, f"{name}.mlp"))
            layer_out.append(hidden)
            g.output(pk, f"present_key_{i}", fp, kv_shape(config, "total"))
            g.output(pv, f"present_value_{i}", fp, kv_shape(config, "total"))
        normed = rms_norm(g, hidden, base.norm, "norm")
        logits = linear(g, normed, model.get_output_embeddings(), "lm_head")
        g.output(g.to_float32(logits), "logits", FLOAT, ["batch", "seq", config.vocab_size])
        if tap_layer_ids:
            taps = [normed if i == num_layers - 1 else layer_out[i] for i in tap_layer_ids]
            tapped = g.op("Concat", *taps, axis=-1) if len(taps) > 1 else taps[0]
            g.output(tapped, "hidden_taps", fp, ["batch", "seq", len(taps) * config.hidden_size])
    doc = (f"trtspec target ({config.model_type}, {num_layers} layers, {precision}), "
           f"taps {list(tap_layer_ids)}")
    return g.model(doc)
