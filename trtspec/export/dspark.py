"""ONNX export of a DSpark drafter (`trtspec.models.dspark`): the DFlash graphs plus its heads.

context graph: DFlash's (`export_dflash_context`; DSpark's backbone is a DFlash drafter).
block graph (one forward per proposal; DSpark's own embed_tokens/lm_head copies):
    inputs   block_ids [b, γ] int64 ([anchor, MASK × (γ−1)]), position_ids, ctx K/V, ctx_lens
    outputs  hidden [b, γ, H] (final-normed h_1..h_γ), base_logits [b, γ, V] (U_k = lm_head(h_k)),
             both in the graph's precision
heads graph (run once per drafted slot, left to right, because x_k feeds slot k+1):
    inputs   base_logits [b, n, V], hidden [b, n, H], prev_tokens [b, n] int64 (x_{k−1})
    outputs  logits [b, n, V] = U_k + W2(W1[x_{k−1}]) (the Markov head),
             confidence_logits [b, n] = proj([h_k ; W1[x_{k−1}]]) (only with a confidence head),
             both float32
"""

from __future__ import annotations

import onnx
import torch

from trtspec.export.dflash import block_hidden
from trtspec.export.graph import FLOAT, INT64, PLUGIN_DOMAIN, GraphBuilder
from trtspec.export.layers import linear
from trtspec.models.dspark import DSparkDraftModel


def export_dspark_block(model: DSparkDraftModel, precision: str = "float32") -> onnx.ModelProto:
    g = GraphBuilder("trtspec_dspark_block", precision)
    hidden = block_hidden(g, model, model.embed_tokens)  # [b, γ, H]
    with torch.no_grad():
        g.output(hidden, "hidden", g.float_type, ["batch", "block", model.config.hidden_size])
        g.output(linear(g, hidden, model.lm_head, "lm_head"), "base_logits", g.float_type,
                 ["batch", "block", model.lm_head.out_features])
    return g.model(f"trtspec DSpark block ({len(model.layers)} layers, γ {model.spec.block_size})",
                   {PLUGIN_DOMAIN: 1})


def export_dspark_heads(model: DSparkDraftModel, precision: str = "float32") -> onnx.ModelProto:
    """DSparkDraftModel.markov_logits and confidence_logits for n slots at once."""
    hidden_size, vocab = model.config.hidden_size, model.lm_head.out_features
    g = GraphBuilder("trtspec_dspark_heads", precision)
    base = g.input("base_logits", g.float_type, ["batch", "n", vocab])
    hidden = g.input("hidden", g.float_type, ["batch", "n", hidden_size])
    prev = g.input("prev_tokens", INT64, ["batch", "n"])
    with torch.no_grad():
        logits, markov_embed = base, None
        if model.markov_head is not None:
            w1 = g.weight(model.markov_head.markov_w1.weight, "markov_head.markov_w1.weight")
            markov_embed = g.op("Gather", w1, prev, axis=0)  # [b, n, r]
            logits = g.op("Add", base, linear(g, markov_embed, model.markov_head.markov_w2,
                                              "markov_head.markov_w2"))
        g.output(g.to_float32(logits), "logits", FLOAT, ["batch", "n", vocab])
        if model.confidence_head is not None:
            features = hidden
            if model.spec.confidence_head_with_markov:
                features = g.op("Concat", hidden, markov_embed, axis=-1)  # [b, n, H + r]
            conf = linear(g, features, model.confidence_head.proj, "confidence_head.proj")  # [b, n, 1]
            conf = g.to_float32(g.op("Squeeze", conf, g.const([-1])))
            g.output(conf, "confidence_logits", FLOAT, ["batch", "n"])
    return g.model("trtspec DSpark Markov and confidence heads")
