"""The `trtspec` plugin nodes as the exporters write them (DESIGN §2, plugins/README.md).

A node reaches a TensorRT plugin when its op is the plugin name and it carries the namespace:
the attribute `plugin_namespace="trtspec"` (every TensorRT 10.x/11.x) and the node domain
`trtspec` (from TensorRT 10.10). `aot=1` selects the plugin's ahead-of-time PTX implementation,
so the engine runs without Python. onnxruntime gets a CPU implementation of each op as an ONNX
function attached at session load (`trtspec.engine.cpu_plugins`); the files on disk hold none.
"""

from __future__ import annotations

from trtspec.export.graph import PLUGIN_DOMAIN, GraphBuilder

KV_INJECTION_ATTENTION = "kv_injection_attention"
CONFIDENCE_VERIFY_GREEDY = "confidence_verify_greedy"
CONFIDENCE_VERIFY_SAMPLING = "confidence_verify_sampling"
CONFIDENCE_VERIFY_TREE_GREEDY = "confidence_verify_tree_greedy"
CONFIDENCE_VERIFY_TREE_SAMPLING = "confidence_verify_tree_sampling"
PLUGIN_OPS = (KV_INJECTION_ATTENTION, CONFIDENCE_VERIFY_GREEDY, CONFIDENCE_VERIFY_SAMPLING,
              CONFIDENCE_VERIFY_TREE_GREEDY, CONFIDENCE_VERIFY_TREE_SAMPLING)
PLUGIN_ATTRS = {"plugin_namespace": PLUGIN_DOMAIN, "aot": 1}


def kv_injection_attention(g: GraphBuilder, q: str, ctx_k: str, ctx_v: str, blk_k: str, blk_v: str,
                           ctx_lens: str) -> str:
    """q [b, h, B, d], ctx_k/ctx_v [b, kvh, c, d], blk_k/blk_v [b, kvh, B, d], ctx_lens [b] int32
    -> [b, h, B, d]: block queries over [context ; block], non-causal, GQA, RoPE applied."""
    return g.op(KV_INJECTION_ATTENTION, q, ctx_k, ctx_v, blk_k, blk_v, ctx_lens, domain=PLUGIN_DOMAIN,
                **PLUGIN_ATTRS)


def confidence_verify_greedy(g: GraphBuilder, draft_tokens: str, target_logits: str,
                             draft_lens: str) -> tuple[str, str]:
    """draft_tokens [b, k] int32, target_logits [b, k+1, V], draft_lens [b] int32
    -> num_accepted [b] int32, tokens [b, k+1] int32 (accepted, then recovered/bonus, then -1)."""
    out = g.op(CONFIDENCE_VERIFY_GREEDY, draft_tokens, target_logits, draft_lens, n_out=2,
               domain=PLUGIN_DOMAIN, **PLUGIN_ATTRS)
    return out[0], out[1]


def confidence_verify_sampling(g: GraphBuilder, draft_tokens: str, q_probs: str, p_probs: str,
                               draft_lens: str, uniforms: str, u_last: str) -> tuple[str, str]:
    """draft_tokens [b, k] int32, q_probs [b, k, V], p_probs [b, k+1, V] (processed), draft_lens [b]
    int32, uniforms [b, k] float32, u_last [b] float32 -> num_accepted [b] int32, tokens [b, k+1]
    int32: rejection sampling with the randomness given (plugins/confidence_verify/reference.py)."""
    out = g.op(CONFIDENCE_VERIFY_SAMPLING, draft_tokens, q_probs, p_probs, draft_lens, uniforms, u_last,
               n_out=2, domain=PLUGIN_DOMAIN, **PLUGIN_ATTRS)
    return out[0], out[1]


def confidence_verify_tree_greedy(g: GraphBuilder, draft_tokens: str, parents: str, draft_lens: str,
                                  target_logits: str) -> tuple[str, str, str]:
    """draft_tokens [b, n] int32 (node i + 1's token), parents [b, n] int32 (node i + 1's parent, 0 =
    the root), draft_lens [b] int32 (nodes per row), target_logits [b, n+1, V] at the root and every
    node -> num_accepted [b] int32, path [b, n] int32 (accepted nodes, then -1), tokens [b, n+1]
    int32 (accepted, then the bonus, then -1): the greedy rule of `trtspec.spec.tree_verify`."""
    out = g.op(CONFIDENCE_VERIFY_TREE_GREEDY, draft_tokens, parents, draft_lens, target_logits, n_out=3,
               domain=PLUGIN_DOMAIN, **PLUGIN_ATTRS)
    return out[0], out[1], out[2]


def confidence_verify_tree_sampling(g: GraphBuilder, draft_tokens: str, parents: str, draft_lens: str,
                                    p_probs: str, uniforms: str, u_last: str) -> tuple[str, str, str]:
    """As `confidence_verify_tree_greedy` with p_probs [b, n+1, V] (processed), uniforms [b, n] and
    u_last [b] float32: the rule for deterministic children of `trtspec.spec.tree_verify`."""
    out = g.op(CONFIDENCE_VERIFY_TREE_SAMPLING, draft_tokens, parents, draft_lens, p_probs, uniforms, u_last,
               n_out=3, domain=PLUGIN_DOMAIN, **PLUGIN_ATTRS)
    return out[0], out[1], out[2]
