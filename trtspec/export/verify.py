"""ONNX export of verification, one `trtspec` plugin node per graph.

greedy    `trtspec::confidence_verify_greedy`, the rule of `trtspec.spec.verify.verify_greedy`
    inputs   draft_tokens [b, k] int32, target_logits [b, k+1, V] float32, draft_lens [b] int32
sampling  `trtspec::confidence_verify_sampling`, the rule of
          `plugins.confidence_verify.reference.verify_sampling_explicit` (verify_sampling with its
          randomness passed in, so a kernel can reproduce it)
    inputs   draft_tokens [b, k] int32, q_probs [b, k, V], p_probs [b, k+1, V] (temperature, top-k
             and top-p already applied), draft_lens [b] int32, uniforms [b, k], u_last [b] float32
both
    outputs  num_accepted [b] int32, tokens [b, k+1] int32 (accepted, recovered/bonus, then -1)

`draft_lens` is where DSpark's confidence schedule gates verification: drafts at or past a row's
length are never accepted, so one fixed-k graph verifies ragged rows.

tree_greedy / tree_sampling  `trtspec::confidence_verify_tree_{greedy,sampling}`, the rules of
          `trtspec.spec.tree_verify` for draft trees with deterministic children (a chain is the
          tree whose parents are 0, 1, …, k − 1)
    inputs   draft_tokens [b, n] int32, parents [b, n] int32 (0 = the root), draft_lens [b] int32
             (nodes per row); greedy: target_logits [b, n+1, V]; sampling: p_probs [b, n+1, V],
             uniforms [b, n], u_last [b] float32
    outputs  num_accepted [b] int32, path [b, n] int32 (accepted nodes, then -1), tokens [b, n+1] int32
"""

from __future__ import annotations

import onnx

from trtspec.export.graph import FLOAT, INT32, PLUGIN_DOMAIN, GraphBuilder
from trtspec.export.plugins import (
    confidence_verify_greedy,
    confidence_verify_sampling,
    confidence_verify_tree_greedy,
    confidence_verify_tree_sampling,
)


def _outputs(g: GraphBuilder, num_accepted: str, tokens: str) -> None:
    g.output(num_accepted, "num_accepted", INT32, ["batch"])
    g.output(tokens, "tokens", INT32, ["batch", "k_plus_1"])


def export_verify_greedy(vocab_size: int) -> onnx.ModelProto:
    g = GraphBuilder("trtspec_verify_greedy")
    draft = g.input("draft_tokens", INT32, ["batch", "k"])
    logits = g.input("target_logits", FLOAT, ["batch", "k_plus_1", vocab_size])
    lens = g.input("draft_lens", INT32, ["batch"])
    _outputs(g, *confidence_verify_greedy(g, draft, logits, lens))
    return g.model("trtspec greedy verification (confidence_verify_greedy plugin)", {PLUGIN_DOMAIN: 1})


def export_verify_sampling(vocab_size: int) -> onnx.ModelProto:
    g = GraphBuilder("trtspec_verify_sampling")
    draft = g.input("draft_tokens", INT32, ["batch", "k"])
    q_probs = g.input("q_probs", FLOAT, ["batch", "k", vocab_size])
    p_probs = g.input("p_probs", FLOAT, ["batch", "k_plus_1", vocab_size])
    lens = g.input("draft_lens", INT32, ["batch"])
    uniforms = g.input("uniforms", FLOAT, ["batch", "k"])
    u_last = g.input("u_last", FLOAT, ["batch"])
    _outputs(g, *confidence_verify_sampling(g, draft, q_probs, p_probs, lens, uniforms, u_last))
    return g.model("trtspec sampling verification (confidence_verify_sampling plugin)", {PLUGIN_DOMAIN: 1})


def _tree_outputs(g: GraphBuilder, num_accepted: str, path: str, tokens: str) -> None:
    g.output(num_accepted, "num_accepted", INT32, ["batch"])
    g.output(path, "path", INT32, ["batch", "nodes"])
    g.output(tokens, "tokens", INT32, ["batch", "nodes_plus_1"])


def _tree_inputs(g: GraphBuilder) -> tuple[str, str, str]:
    """The inputs every tree graph starts with: draft_tokens, parents, draft_lens."""
    return (g.input("draft_tokens", INT32, ["batch", "nodes"]), g.input("parents", INT32, ["batch", "nodes"]),
            g.input("draft_lens", INT32, ["batch"]))


def export_verify_tree_greedy(vocab_size: int) -> onnx.ModelProto:
    g = GraphBuilder("trtspec_verify_tree_greedy")
    draft, parents, lens = _tree_inputs(g)
    logits = g.input("target_logits", FLOAT, ["batch", "nodes_plus_1", vocab_size])
    _tree_outputs(g, *confidence_verify_tree_greedy(g, draft, parents, lens, logits))
    return g.model("trtspec greedy tree verification (confidence_verify_tree_greedy plugin)",
                   {PLUGIN_DOMAIN: 1})


def export_verify_tree_sampling(vocab_size: int) -> onnx.ModelProto:
    g = GraphBuilder("trtspec_verify_tree_sampling")
    draft, parents, lens = _tree_inputs(g)
    p_probs = g.input("p_probs", FLOAT, ["batch", "nodes_plus_1", vocab_size])
    uniforms = g.input("uniforms", FLOAT, ["batch", "nodes"])
    u_last = g.input("u_last", FLOAT, ["batch"])
    _tree_outputs(g, *confidence_verify_tree_sampling(g, draft, parents, lens, p_probs, uniforms, u_last))
    return g.model("trtspec sampling tree verification (confidence_verify_tree_sampling plugin)",
                   {PLUGIN_DOMAIN: 1})
