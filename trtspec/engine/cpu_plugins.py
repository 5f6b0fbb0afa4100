"""CPU implementations of the `trtspec` plugin ops for onnxruntime, as ONNX functions.

onnxruntime has no kernel for `trtspec::kv_injection_attention` or
`trtspec::confidence_verify_greedy`. Instead of a compiled custom-op library, each op gets a
model-local FunctionProto written in standard ONNX ops, attached to the loaded model just before
the session is created; onnxruntime inlines it. The exported files stay exactly what TensorRT
parses (a function in the file would be inlined by TensorRT too, bypassing the plugin).
The functions follow the torch references: `trtspec.models.dflash.kv_injection_attention`
(+ `ctx_lens` masking as in plugins/kv_injection_attention/reference.py) and
`trtspec.spec.verify.verify_greedy`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtspec.export.graph import OPSET, PLUGIN_DOMAIN
from trtspec.export.plugins import CONFIDENCE_VERIFY_GREEDY, KV_INJECTION_ATTENTION, PLUGIN_ATTRS


class _Body:
    """Nodes of a function body; constants become Constant nodes (functions have no initializers)."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self._n = 0

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        self._n += 1
        out = f"t{self._n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, values, dtype) -> str:
        return self.op("Constant", value=numpy_helper.from_array(np.asarray(values, dtype=dtype)))

    def alias(self, value: str, name: str) -> None:
        self.nodes.append(helper.make_node("Identity", [value], [name]))


def kv_injection_attention_function() -> onnx.FunctionProto:
    """q [b, h, B, d] over K/V = [ctx ; blk] [b, kvh, c+B, d]; context rows >= ctx_lens masked."""
    f = _Body()
    k = f.op("Concat", "ctx_k", "blk_k", axis=2)
    v = f.op("Concat", "ctx_v", "blk_v", axis=2)
    b, kvh = f.op("Shape", "q", start=0, end=1), f.op("Shape", "ctx_k", start=1, end=2)
    d = f.op("Shape", "q", start=3, end=4)
    # the G = h / kvh heads of a group are consecutive in q: [b, kvh, G·B, d]
    qg = f.op("Reshape", "q", f.op("Concat", b, kvh, f.const([-1], np.int64), d, axis=0))
    scale = f.op("Reciprocal", f.op("Sqrt", f.op("Cast", d, to=TensorProto.FLOAT)))
    scores = f.op("Mul", f.op("MatMul", qg, f.op("Transpose", k, perm=[0, 1, 3, 2])), scale)
    c = f.op("Shape", "ctx_k", start=2, end=3)
    total = f.op("Squeeze", f.op("Shape", k, start=2, end=3), f.const([0], np.int64))
    cols = f.op("Range", f.const(0, np.int64), total, f.const(1, np.int64))  # [c+B]
    lens = f.op("Unsqueeze", f.op("Cast", "ctx_lens", to=TensorProto.INT64), f.const([1], np.int64))  # [b, 1]
    valid = f.op("Or", f.op("Less", cols, lens), f.op("GreaterOrEqual", cols, c))  # [b, c+B]
    valid = f.op("Unsqueeze", valid, f.const([1, 2], np.int64))  # [b, 1, 1, c+B]
    scores = f.op("Where", valid, scores, f.const([float("-inf")], np.float32))
    out = f.op("MatMul", f.op("Softmax", scores, axis=-1), v)  # [b, kvh, G·B, d]
    f.alias(f.op("Reshape", out, f.op("Shape", "q")), "out")
    return helper.make_function(PLUGIN_DOMAIN, KV_INJECTION_ATTENTION,
                                ["q", "ctx_k", "ctx_v", "blk_k", "blk_v", "ctx_lens"], ["out"], f.nodes,
                                [helper.make_opsetid("", OPSET)], attributes=list(PLUGIN_ATTRS))


def confidence_verify_greedy_function() -> onnx.FunctionProto:
    """Accept the longest prefix equal to argmax p (within draft_lens), then emit argmax p_{a+1}."""
    f = _Body()
    argmax = f.op("ArgMax", "target_logits", axis=-1, keepdims=0)  # [b, k+1], first max as torch
    argmax = f.op("Cast", argmax, to=TensorProto.INT32)
    b, k = f.op("Shape", "draft_tokens", start=0, end=1), f.op("Shape", "draft_tokens", start=1, end=2)
    zero, one = f.const([0], np.int64), f.const([1], np.int64)
    argmax_k = f.op("Slice", argmax, zero, k, one)  # [b, k]
    cols = f.op("Range", f.const(0, np.int64), f.op("Squeeze", k, zero), f.const(1, np.int64))  # [k]
    lens = f.op("Unsqueeze", f.op("Cast", "draft_lens", to=TensorProto.INT64), one)  # [b, 1]
    match = f.op("And", f.op("Equal", "draft_tokens", argmax_k), f.op("Less", cols, lens))
    # a = index of the first miss, with a sentinel miss at column k (ArgMax returns the first max)
    miss = f.op("Cast", f.op("Not", match), to=TensorProto.INT32)
    b1 = f.op("Concat", b, one, axis=0)
    ones = f.op("ConstantOfShape", b1, value=numpy_helper.from_array(np.array([1], np.int32)))
    first = f.op("ArgMax", f.op("Concat", miss, ones, axis=1), axis=1, keepdims=0)  # [b] int64
    f.alias(f.op("Cast", first, to=TensorProto.INT32), "num_accepted")
    a = f.op("Unsqueeze", first, one)  # [b, 1]
    cols1 = f.op("Range", f.const(0, np.int64), f.op("Add", f.op("Squeeze", k, zero), f.const(1, np.int64)),
                 f.const(1, np.int64))  # [k+1]
    zeros = f.op("ConstantOfShape", b1, value=numpy_helper.from_array(np.array([0], np.int32)))
    drafts = f.op("Concat", "draft_tokens", zeros, axis=1)  # [b, k+1]
    last = f.op("Where", f.op("Equal", cols1, a), argmax, f.const([-1], np.int32))
    f.alias(f.op("Where", f.op("Less", cols1, a), drafts, last), "tokens")
    return helper.make_function(PLUGIN_DOMAIN, CONFIDENCE_VERIFY_GREEDY,
                                ["draft_tokens", "target_logits", "draft_lens"], ["num_accepted", "tokens"],
                                f.nodes, [helper.make_opsetid("", OPSET)], attributes=list(PLUGIN_ATTRS))


CPU_FUNCTIONS = {KV_INJECTION_ATTENTION: kv_injection_attention_function,
                 CONFIDENCE_VERIFY_GREEDY: confidence_verify_greedy_function}


def attach_cpu_plugins(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with a function for every `trtspec` op it uses (and the domain imported)."""
    used = sorted({n.op_type for n in model.graph.node if n.domain == PLUGIN_DOMAIN})
    unknown = [op for op in used if op not in CPU_FUNCTIONS]
    if unknown:
        raise ValueError(f"graph {model.graph.name!r} uses trtspec ops {unknown} that have no CPU "
                         f"implementation; known: {', '.join(CPU_FUNCTIONS)}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {(f.domain, f.name) for f in out.functions}
    out.functions.extend(CPU_FUNCTIONS[op]() for op in used if (PLUGIN_DOMAIN, op) not in have)
    if used and all(o.domain != PLUGIN_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(PLUGIN_DOMAIN, 1))
    return out
