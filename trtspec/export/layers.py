"""Transformer blocks written as ONNX nodes, shared by the target and drafter exporters.

Each helper mirrors one Hugging Face / trtspec torch module (named in its docstring), so in
float32 onnxruntime reproduces the torch flavour's logits to float rounding. In float16 graphs
they keep what Hugging Face keeps in float32: RMSNorm statistics, RoPE tables (cast at the end)
and the attention softmax. Layouts: hidden
`[b, s, H]`, heads `[b, heads, s, d]`, RoPE tables `[b, 1, s, d]`.
"""

from __future__ import annotations

import torch

from trtspec.export.graph import FLOAT, GraphBuilder


def linear(g: GraphBuilder, x: str, module: torch.nn.Linear, name: str) -> str:
    """nn.Linear: x @ W^T (+ b)."""
    y = g.op("MatMul", x, g.weight(module.weight.t(), f"{name}.weight_t"))
    if module.bias is not None:
        y = g.op("Add", y, g.weight(module.bias, f"{name}.bias"))
    return y


def rms_norm(g: GraphBuilder, x: str, module: torch.nn.Module, name: str) -> str:
    """Qwen3RMSNorm / LlamaRMSNorm over the last axis: w * x / sqrt(mean(x²) + eps), the
    statistics in float32."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
    x32 = g.to_float32(x)
    mean = g.op("ReduceMean", g.op("Mul", x32, x32), g.const([-1]), keepdims=1)
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", mean, g.const([eps], "float32"))))
    return g.op("Mul", g.weight(module.weight, f"{name}.weight"), g.from_float32(g.op("Mul", x32, inv)))


def silu_mlp(g: GraphBuilder, x: str, mlp: torch.nn.Module, name: str) -> str:
    """Qwen3MLP / LlamaMLP: down(silu(gate(x)) * up(x))."""
    gate = linear(g, x, mlp.gate_proj, f"{name}.gate_proj")
    act = g.op("Mul", gate, g.op("Sigmoid", gate))
    return linear(g, g.op("Mul", act, linear(g, x, mlp.up_proj, f"{name}.up_proj")), mlp.down_proj,
                  f"{name}.down_proj")


def rope_tables(g: GraphBuilder, position_ids: str, rotary: torch.nn.Module, prefix: str) -> tuple[str, str]:
    """cos, sin [b, 1, s, d] of position_ids [b, s], as the HF rotary embedding computes them."""
    inv_freq = g.weight(rotary.inv_freq, f"{prefix}.inv_freq", full_precision=True)  # [d/2]
    pos = g.op("Unsqueeze", g.op("Cast", position_ids, to=FLOAT), g.const([-1]))  # [b, s, 1]
    freqs = g.op("Mul", pos, inv_freq)  # [b, s, d/2]
    emb = g.op("Concat", freqs, freqs, axis=-1)  # [b, s, d]
    cos, sin = g.op("Cos", emb), g.op("Sin", emb)
    scaling = float(getattr(rotary, "attention_scaling", 1.0))
    if scaling != 1.0:
        factor = g.const([scaling], "float32")
        cos, sin = g.op("Mul", cos, factor), g.op("Mul", sin, factor)
    axis = g.const([1])
    return g.op("Unsqueeze", g.from_float32(cos), axis), g.op("Unsqueeze", g.from_float32(sin), axis)


def apply_rope(g: GraphBuilder, x: str, cos: str, sin: str) -> str:
    """x [b, heads, s, d] rotated: x·cos + rotate_half(x)·sin."""
    x1, x2 = g.op("Split", x, axis=-1, num_outputs=2, n_out=2)
    rotated = g.op("Concat", g.op("Neg", x2), x1, axis=-1)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", rotated, sin))


def heads(g: GraphBuilder, x: str, num_heads: int, head_dim: int, norm: torch.nn.Module | None,
          name: str) -> str:
    """[b, s, heads·d] -> [b, heads, s, d], with the per-head RMSNorm (Qwen3 q/k_norm) if any."""
    y = g.op("Reshape", x, g.const([0, 0, num_heads, head_dim]))
    if norm is not None:
        y = rms_norm(g, y, norm, name)
    return g.op("Transpose", y, perm=[0, 2, 1, 3])


def merge_heads(g: GraphBuilder, x: str) -> str:
    """[b, heads, s, d] -> [b, s, heads·d]."""
    return g.op("Reshape", g.op("Transpose", x, perm=[0, 2, 1, 3]), g.const([0, 0, -1]))
