"""ONNX export of a DSpark drafter (`trtspec.models.dspark`): the DFlash graphs plus its heads.

context graph: DFlash's (`export_dflash_context`; DSpark's backbone is a DFlash drafter).
block graph (one forward per proposal; DSpark's own embed_tokens/lm_head copies):
    inputs   block_ids [b, γ] int64 ([anchor, MASK × (γ−1)]), position_ids, ctx K/V, ctx_lens
    outputs  hidden [b, γ, H] (final-normed h_1..h_γ), base_logits [b, γ, V] (U_k = lm_head(h_k)),
             both in the graph's precision
heads graph (run once per drafted slot, left to right, because x_k feeds slot k+1):
    inputs   base_logits [b, n, V], hidden [b, n, H], prev_tokens [b, n] int64 (x_{k−1}),
             markov_state [b, n, r] (s_{k−1}; only for markov_head_type rnn, zeros at slot 1)
    outputs  logits [b, n, V] = U_k + B_k (the Markov head of `trtspec.models.markov`: vanilla,
             gated or rnn), confidence_logits [b, n] = proj([h_k ; W1[x_{k−1}]]) (only with a
             confidence head), both float32; markov_state_out [b, n, r] (s_k; rnn only, in the
             graph's precision)
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
        logits, markov_embed, state_out = base, None, None
        head = model.markov_head
        if head is not None:
            w1 = g.weight(head.markov_w1.weight, "markov_head.markov_w1.weight")
            markov_embed = g.op("Gather", w1, prev, axis=0)  # [b, n, r]
            latent = markov_embed  # what W2 projects: [b, n, r]
            if head.head_type == "gated":
                gate = linear(g, g.op("Concat", hidden, markov_embed, axis=-1), head.gate_proj,
                              "markov_head.gate_proj")
                latent = g.op("Mul", g.op("Sigmoid", gate), markov_embed)
            elif head.head_type == "rnn":
                rank = head.state_size
                state = g.input("markov_state", g.float_type, ["batch", "n", rank])
                joint = linear(g, g.op("Concat", state, markov_embed, hidden, axis=-1), head.joint_proj,
                               "markov_head.joint_proj")  # [b, n, 3r]: gate, candidate, output
                gate, candidate, out = g.op("Split", joint, g.const([rank, rank, rank]), axis=-1, n_out=3)
                keep, renew = g.op("Sigmoid", gate), g.op("Sigmoid", g.op("Neg", gate))  # σ(g), 1 − σ(g)
                state_out = g.op("Add", g.op("Mul", keep, state), g.op("Mul", renew, g.op("Tanh", candidate)))
                latent = g.op("Tanh", out)
            logits = g.op("Add", base, linear(g, latent, head.markov_w2, "markov_head.markov_w2"))
        g.output(g.to_float32(logits), "logits", FLOAT, ["batch", "n", vocab])
        if state_out is not None:
            g.output(state_out, "markov_state_out", g.float_type, ["batch", "n", head.state_size])
        if model.confidence_head is not None:
            features = hidden
            if model.spec.confidence_head_with_markov:
                features = g.op("Concat", hidden, markov_embed, axis=-1)  # [b, n, H + r]
            conf = linear(g, features, model.confidence_head.proj, "confidence_head.proj")  # [b, n, 1]
            conf = g.to_float32(g.op("Squeeze", conf, g.const([-1])))
            g.output(conf, "confidence_logits", FLOAT, ["batch", "n"])
    return g.model("trtspec DSpark Markov and confidence heads")
