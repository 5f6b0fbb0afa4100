"""ONNX export of greedy verification as one `trtspec::confidence_verify_greedy` node.

    inputs   draft_tokens [b, k] int32, target_logits [b, k+1, V] float32, draft_lens [b] int32
    outputs  num_accepted [b] int32, tokens [b, k+1] int32 (accepted, recovered/bonus, then -1)

The rule is `trtspec.spec.verify.verify_greedy`'s. Sampling verification
(`trtspec::confidence_verify_sampling`) is a plugin too but has no exported graph yet.
"""

from __future__ import annotations

import onnx

from trtspec.export.graph import FLOAT, INT32, PLUGIN_DOMAIN, GraphBuilder
from trtspec.export.plugins import confidence_verify_greedy


def export_verify_greedy(vocab_size: int) -> onnx.ModelProto:
    g = GraphBuilder("trtspec_verify_greedy")
    draft = g.input("draft_tokens", INT32, ["batch", "k"])
    logits = g.input("target_logits", FLOAT, ["batch", "k_plus_1", vocab_size])
    lens = g.input("draft_lens", INT32, ["batch"])
    num_accepted, tokens = confidence_verify_greedy(g, draft, logits, lens)
    g.output(num_accepted, "num_accepted", INT32, ["batch"])
    g.output(tokens, "tokens", INT32, ["batch", "k_plus_1"])
    return g.model("trtspec greedy verification (confidence_verify_greedy plugin)", {PLUGIN_DOMAIN: 1})
