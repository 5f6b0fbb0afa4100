"""CPU implementations of the `trtspec` plugin ops for onnxruntime, as ONNX functions.

onnxruntime has no kernel for `trtspec::kv_injection_attention` or the two
`trtspec::confidence_verify_*` ops. Instead of a compiled custom-op library, each op gets a
model-local FunctionProto written in standard ONNX ops, attached to the loaded model just before
the session is created; onnxruntime inlines it. The exported files stay exactly what TensorRT
parses (a function in the file would be inlined by TensorRT too, bypassing the plugin).
The functions follow the torch references: `trtspec.models.dflash.kv_injection_attention`
(+ `ctx_lens` masking as in plugins/kv_injection_attention/reference.py),
`trtspec.spec.verify.verify_greedy` and `plugins.confidence_verify.reference.verify_sampling_explicit`;
the tree ops follow `trtspec.spec.tree_verify` without its walk: which child a node accepts is
decided for all nodes at once (a child is tested only if its earlier siblings were rejected, with
the mass they leave), and the accepted path is the deepest node whose ancestors were all chosen,
read from the ancestor relation (the parent matrix squared to its closure).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtspec.export.graph import OPSET, PLUGIN_DOMAIN
from trtspec.export.plugins import (
    CONFIDENCE_VERIFY_GREEDY,
    CONFIDENCE_VERIFY_SAMPLING,
    CONFIDENCE_VERIFY_TREE_GREEDY,
    CONFIDENCE_VERIFY_TREE_SAMPLING,
    KV_INJECTION_ATTENTION,
    PLUGIN_ATTRS,
)


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

    def i64(self, values) -> str:
        return self.const(values, np.int64)

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
    scale = f.op("CastLike", f.op("Reciprocal", f.op("Sqrt", f.op("Cast", d, to=TensorProto.FLOAT))), "q")
    scores = f.op("Mul", f.op("MatMul", qg, f.op("Transpose", k, perm=[0, 1, 3, 2])), scale)
    c = f.op("Shape", "ctx_k", start=2, end=3)
    total = f.op("Squeeze", f.op("Shape", k, start=2, end=3), f.const([0], np.int64))
    cols = f.op("Range", f.const(0, np.int64), total, f.const(1, np.int64))  # [c+B]
    lens = f.op("Unsqueeze", f.op("Cast", "ctx_lens", to=TensorProto.INT64), f.const([1], np.int64))  # [b, 1]
    valid = f.op("Or", f.op("Less", cols, lens), f.op("GreaterOrEqual", cols, c))  # [b, c+B]
    valid = f.op("Unsqueeze", valid, f.const([1, 2], np.int64))  # [b, 1, 1, c+B]
    scores = f.op("Where", valid, scores, f.op("CastLike", f.const([float("-inf")], np.float32), scores))
    out = f.op("MatMul", f.op("Softmax", scores, axis=-1), v)  # [b, kvh, G·B, d]
    f.alias(f.op("Reshape", out, f.op("Shape", "q")), "out")
    return helper.make_function(PLUGIN_DOMAIN, KV_INJECTION_ATTENTION,
                                ["q", "ctx_k", "ctx_v", "blk_k", "blk_v", "ctx_lens"], ["out"], f.nodes,
                                [helper.make_opsetid("", OPSET)], attributes=list(PLUGIN_ATTRS))


def _accepted_prefix(f: _Body, ok: str) -> str:
    """ok [b, k] bool -> [b] int64: the index of the first False (k when all pass)."""
    miss = f.op("Cast", f.op("Not", ok), to=TensorProto.INT32)
    # a sentinel miss at column k; ArgMax returns the first maximum
    b1 = f.op("Concat", f.op("Shape", ok, start=0, end=1), f.i64([1]), axis=0)
    ones = f.op("ConstantOfShape", b1, value=numpy_helper.from_array(np.array([1], np.int32)))
    return f.op("ArgMax", f.op("Concat", miss, ones, axis=1), axis=1, keepdims=0)


def _within_lens(f: _Body) -> str:
    """[b, k] bool: draft column < draft_lens of its row."""
    k = f.op("Squeeze", f.op("Shape", "draft_tokens", start=1, end=2), f.i64([0]))
    cols = f.op("Range", f.i64(0), k, f.i64(1))  # [k]
    lens = f.op("Unsqueeze", f.op("Cast", "draft_lens", to=TensorProto.INT64), f.i64([1]))  # [b, 1]
    return f.op("Less", cols, lens)


def _emit(f: _Body, a: str, last: str) -> None:
    """num_accepted = a [b]; tokens [b, k+1] = drafts before a, `last` [b] int32 at a, -1 after."""
    f.alias(f.op("Cast", a, to=TensorProto.INT32), "num_accepted")
    one = f.i64([1])
    b1 = f.op("Concat", f.op("Shape", "draft_tokens", start=0, end=1), one, axis=0)
    zeros = f.op("ConstantOfShape", b1, value=numpy_helper.from_array(np.array([0], np.int32)))
    drafts = f.op("Concat", "draft_tokens", zeros, axis=1)  # [b, k+1]
    k1 = f.op("Squeeze", f.op("Shape", drafts, start=1, end=2), f.i64([0]))
    cols = f.op("Range", f.i64(0), k1, f.i64(1))  # [k+1]
    a = f.op("Unsqueeze", a, one)  # [b, 1]
    at_a = f.op("Where", f.op("Equal", cols, a), f.op("Unsqueeze", last, one), f.const([-1], np.int32))
    f.alias(f.op("Where", f.op("Less", cols, a), drafts, at_a), "tokens")


def confidence_verify_greedy_function() -> onnx.FunctionProto:
    """Accept the longest prefix equal to argmax p (within draft_lens), then emit argmax p_{a+1}."""
    f = _Body()
    argmax = f.op("ArgMax", "target_logits", axis=-1, keepdims=0)  # [b, k+1], the first max as torch's
    argmax = f.op("Cast", argmax, to=TensorProto.INT32)
    k = f.op("Shape", "draft_tokens", start=1, end=2)
    argmax_k = f.op("Slice", argmax, f.i64([0]), k, f.i64([1]))  # [b, k]
    a = _accepted_prefix(f, f.op("And", f.op("Equal", "draft_tokens", argmax_k), _within_lens(f)))  # [b]
    last = f.op("GatherElements", argmax, f.op("Unsqueeze", a, f.i64([1])), axis=1)  # [b, 1]
    _emit(f, a, f.op("Squeeze", last, f.i64([1])))
    return helper.make_function(PLUGIN_DOMAIN, CONFIDENCE_VERIFY_GREEDY,
                                ["draft_tokens", "target_logits", "draft_lens"], ["num_accepted", "tokens"],
                                f.nodes, [helper.make_opsetid("", OPSET)], attributes=list(PLUGIN_ATTRS))


def _row_at(f: _Body, probs: str, a: str) -> str:
    """probs [b, n, V], a [b] int64 -> probs[:, a] [b, V]."""
    idx = f.op("Unsqueeze", a, f.i64([1, 2]))  # [b, 1, 1]
    idx = f.op("Expand", idx, f.op("Concat", f.op("Shape", probs, start=0, end=1), f.i64([1]),
                                   f.op("Shape", probs, start=2, end=3), axis=0))  # [b, 1, V]
    return f.op("Squeeze", f.op("GatherElements", probs, idx, axis=1), f.i64([1]))


def _inverse_cdf(f: _Body, dist: str) -> str:
    """dist [b, V] >= 0, u_last [b] -> [b] int32: first j with cdf_j > u·total (float64); when
    rounding finds none, the last j with dist_j > 0 (plugins/confidence_verify/reference.py)."""
    cdf = f.op("CumSum", f.op("Cast", dist, to=TensorProto.DOUBLE), f.i64(1))  # [b, V]
    v = f.op("Shape", dist, start=1, end=2)
    total = f.op("Slice", cdf, f.op("Sub", v, f.i64([1])), v, f.i64([1]))  # [b, 1]
    u = f.op("Unsqueeze", f.op("Cast", "u_last", to=TensorProto.DOUBLE), f.i64([1]))
    hit = f.op("Cast", f.op("Greater", cdf, f.op("Mul", u, total)), to=TensorProto.INT32)  # [b, V]
    first = f.op("ArgMax", hit, axis=1, keepdims=0)  # [b] (0 when no hit)
    any_hit = f.op("Greater", f.op("ReduceMax", hit, f.i64([1]), keepdims=0), f.const(0, np.int32))
    cols = f.op("Range", f.i64(0), f.op("Squeeze", v, f.i64([0])), f.i64(1))
    positive = f.op("Where", f.op("Greater", dist, f.const(0.0, np.float32)), cols, f.i64(-1))
    fallback = f.op("Max", f.op("ReduceMax", positive, f.i64([1]), keepdims=0), f.i64(0))
    return f.op("Cast", f.op("Where", any_hit, first, fallback), to=TensorProto.INT32)


def confidence_verify_sampling_function() -> onnx.FunctionProto:
    """Accept x_i iff u_i·q_i(x_i) < p_i(x_i) (within draft_lens); the token at a is drawn by inverse
    CDF with u_last from norm(max(p_a − q_a, 0)) after a rejection, from p_a otherwise."""
    f = _Body()
    one, two = f.i64([1]), f.i64([2])
    k = f.op("Shape", "draft_tokens", start=1, end=2)
    x = f.op("Unsqueeze", f.op("Cast", "draft_tokens", to=TensorProto.INT64), two)  # [b, k, 1]
    p_k = f.op("Slice", "p_probs", f.i64([0]), k, one, one)  # [b, k, V]
    p_x = f.op("Squeeze", f.op("GatherElements", p_k, x, axis=2), two)  # [b, k]
    q_x = f.op("Squeeze", f.op("GatherElements", "q_probs", x, axis=2), two)
    passes = f.op("Less", f.op("Mul", "uniforms", q_x), p_x)
    within = _within_lens(f)
    a = _accepted_prefix(f, f.op("And", passes, within))  # [b]
    rejected = f.op("Less", a, f.op("Cast", "draft_lens", to=TensorProto.INT64))  # [b]
    # q padded with a zero row so that a == k (no drafts left) indexes something
    q_pad = f.op("Concat", "q_probs", f.op("Mul", f.op("Slice", "p_probs", f.op("Neg", one),
                                                        f.i64([2**62]), one, one),
                                          f.const(0.0, np.float32)), axis=1)  # [b, k+1, V]
    p_a, q_a = _row_at(f, "p_probs", a), _row_at(f, q_pad, a)  # [b, V]
    residual = f.op("Max", f.op("Sub", p_a, q_a), f.const(0.0, np.float32))
    has_mass = f.op("Greater", f.op("ReduceSum", residual, one, keepdims=0), f.const(0.0, np.float32))
    use_residual = f.op("Unsqueeze", f.op("And", rejected, has_mass), one)  # [b, 1]
    _emit(f, a, _inverse_cdf(f, f.op("Where", use_residual, residual, p_a)))
    return helper.make_function(PLUGIN_DOMAIN, CONFIDENCE_VERIFY_SAMPLING,
                                ["draft_tokens", "q_probs", "p_probs", "draft_lens", "uniforms", "u_last"],
                                ["num_accepted", "tokens"], f.nodes, [helper.make_opsetid("", OPSET)],
                                attributes=list(PLUGIN_ATTRS))


MAX_TREE_DEPTH_LOG2 = 8  # the ancestor closure squares 8 times: trees up to 256 deep


class _Tree:
    """The structure of the tree inputs (draft_tokens, parents, draft_lens) as tensors of a body."""

    def __init__(self, f: _Body):
        self.f = f
        one, two = f.i64([1]), f.i64([2])
        self.n = f.op("Shape", "draft_tokens", start=1, end=2)  # [1]
        n_scalar = f.op("Squeeze", self.n, f.i64([0]))
        self.cols = f.op("Range", f.i64(0), n_scalar, f.i64(1))  # [n]
        lens = f.op("Unsqueeze", f.op("Cast", "draft_lens", to=TensorProto.INT64), one)  # [b, 1]
        self.valid = f.op("Less", self.cols, lens)  # [b, n]
        self.par = f.op("Cast", "parents", to=TensorProto.INT64)  # [b, n]
        self.tok = f.op("Cast", "draft_tokens", to=TensorProto.INT64)
        same_parent = f.op("Equal", f.op("Unsqueeze", self.par, two), f.op("Unsqueeze", self.par, one))
        earlier = f.op("Less", f.op("Unsqueeze", self.cols, f.i64([0])), f.op("Unsqueeze", self.cols, one))
        # S[b, i, j]: j is a valid earlier sibling of i
        self.sib = f.op("And", f.op("And", same_parent, earlier), f.op("Unsqueeze", self.valid, one))
        self.sib_f = f.op("Cast", self.sib, to=TensorProto.DOUBLE)

    def count_earlier(self, flags: str) -> str:
        """flags [b, n] bool -> [b, n] bool: some valid earlier sibling is flagged."""
        f = self.f
        x = f.op("Unsqueeze", f.op("Cast", flags, to=TensorProto.DOUBLE), f.i64([2]))  # [b, n, 1]
        count = f.op("Squeeze", f.op("MatMul", self.sib_f, x), f.i64([2]))
        return f.op("Greater", count, f.const(0.0, np.float64))

    def accept_path(self, chosen: str) -> str:
        """chosen [b, n] bool (a node is accepted when its parent is reached) -> best [b] int64, the
        deepest node whose root path was all chosen; sets the accepted count and path."""
        f = self.f
        one, two = f.i64([1]), f.i64([2])
        n1 = f.op("Add", self.n, one)
        b = f.op("Shape", "draft_tokens", start=0, end=1)
        # ancestor-or-self closure R [b, n+1, n+1] of the parent relation
        onehot = f.op("OneHot", self.par, n1, f.const([0.0, 1.0], np.float32), axis=-1)  # [b, n, n+1]
        top = f.op("ConstantOfShape", f.op("Concat", b, one, n1, axis=0),
                   value=numpy_helper.from_array(np.array([0.0], np.float32)))
        eye = f.op("EyeLike", f.op("ConstantOfShape", f.op("Concat", n1, n1, axis=0),
                                   value=numpy_helper.from_array(np.array([0.0], np.float32))))
        reach = f.op("Add", f.op("Concat", top, onehot, axis=1), eye)
        for _ in range(MAX_TREE_DEPTH_LOG2):
            reach = f.op("Min", f.op("MatMul", reach, reach), f.const(1.0, np.float32))
        depth = f.op("Sub", f.op("ReduceSum", reach, two, keepdims=0), f.const(1.0, np.float32))  # [b, n+1]
        chosen_f = f.op("Cast", f.op("And", chosen, self.valid), to=TensorProto.FLOAT)
        root = f.op("ConstantOfShape", f.op("Concat", b, one, axis=0),
                    value=numpy_helper.from_array(np.array([1.0], np.float32)))
        missed = f.op("Sub", f.const(1.0, np.float32), f.op("Concat", root, chosen_f, axis=1))  # [b, n+1]
        bad = f.op("Squeeze", f.op("MatMul", reach, f.op("Unsqueeze", missed, two)), two)  # [b, n+1]
        ok = f.op("Cast", f.op("Equal", bad, f.const(0.0, np.float32)), to=TensorProto.FLOAT)
        best = f.op("ArgMax", f.op("Mul", ok, f.op("Add", depth, f.const(1.0, np.float32))), axis=1,
                    keepdims=0)  # [b]
        best1 = f.op("Unsqueeze", best, one)  # [b, 1]
        self.a = f.op("Squeeze", f.op("Cast", f.op("GatherElements", depth, best1, axis=1),
                                      to=TensorProto.INT64), one)
        # path[b, d] = the node at depth d + 1 on best's root path, -1 past it
        row = f.op("Expand", f.op("Unsqueeze", best1, two), f.op("Concat", b, one, n1, axis=0))
        onpath = f.op("Slice", f.op("Squeeze", f.op("GatherElements", reach, row, axis=1), one), one, n1, one,
                      one)  # [b, n] nodes 1..n
        depth_nodes = f.op("Slice", depth, one, n1, one, one)  # [b, n]
        level = f.op("Cast", f.op("Add", self.cols, one), to=TensorProto.FLOAT)  # [n] 1..n
        at_level = f.op("Equal", f.op("Unsqueeze", depth_nodes, one), f.op("Unsqueeze", level, f.i64([0, 2])))
        # at[b, d, j]: node j is on the path at depth d + 1
        at = f.op("Mul", f.op("Unsqueeze", onpath, one), f.op("Cast", at_level, to=TensorProto.FLOAT))
        node = f.op("Cast", f.op("Squeeze", f.op("MatMul", at, f.op("Unsqueeze", level, one)), two),
                    to=TensorProto.INT64)  # [b, n] the id j of the node at depth d + 1
        has = f.op("Greater", f.op("ReduceMax", at, two, keepdims=0), f.const(0.0, np.float32))
        self.path = f.op("Where", has, node, f.i64(-1))
        return best

    def emit(self, last: str) -> None:
        """Outputs, with last [b] the recovered/bonus token."""
        f = self.f
        one = f.i64([1])
        f.alias(f.op("Cast", self.path, to=TensorProto.INT32), "path")
        f.alias(f.op("Cast", self.a, to=TensorProto.INT32), "num_accepted")
        drafts = f.op("GatherElements", self.tok, f.op("Max", f.op("Sub", self.path, one), f.i64(0)), axis=1)
        b = f.op("Shape", "draft_tokens", start=0, end=1)
        zeros = f.op("ConstantOfShape", f.op("Concat", b, one, axis=0),
                     value=numpy_helper.from_array(np.array([0], np.int64)))
        drafts = f.op("Concat", drafts, zeros, axis=1)  # [b, n+1]
        cols = f.op("Range", f.i64(0), f.op("Squeeze", f.op("Add", self.n, one), f.i64([0])), f.i64(1))
        a = f.op("Unsqueeze", self.a, one)
        last = f.op("Unsqueeze", f.op("Cast", last, to=TensorProto.INT64), one)
        at_a = f.op("Where", f.op("Equal", cols, a), last, f.i64([-1]))
        tokens = f.op("Where", f.op("Less", cols, a), drafts, at_a)
        f.alias(f.op("Cast", tokens, to=TensorProto.INT32), "tokens")


def confidence_verify_tree_greedy_function() -> onnx.FunctionProto:
    """Accept the child carrying argmax p of its parent (the first such), along the deepest path."""
    f = _Body()
    t = _Tree(f)
    argmax = f.op("ArgMax", "target_logits", axis=-1, keepdims=0)  # [b, n+1]
    match = f.op("And", t.valid, f.op("Equal", t.tok, f.op("GatherElements", argmax, t.par, axis=1)))
    best = t.accept_path(f.op("And", match, f.op("Not", t.count_earlier(match))))
    t.emit(f.op("Squeeze", f.op("GatherElements", argmax, f.op("Unsqueeze", best, f.i64([1])), axis=1),
                f.i64([1])))
    return helper.make_function(PLUGIN_DOMAIN, CONFIDENCE_VERIFY_TREE_GREEDY,
                                ["draft_tokens", "parents", "draft_lens", "target_logits"],
                                ["num_accepted", "path", "tokens"], f.nodes, [helper.make_opsetid("", OPSET)],
                                attributes=list(PLUGIN_ATTRS))


def confidence_verify_tree_sampling_function() -> onnx.FunctionProto:
    """Deterministic children: child x accepted iff u · (1 − Σ r(earlier rejected)) < r(x) (float64),
    a repeated token has r(x) = 0; the last token by inverse CDF from p at the last node with its
    children's tokens removed (p itself if that leaves no mass)."""
    f = _Body()
    t = _Tree(f)
    one, two = f.i64([1]), f.i64([2])
    v = f.op("Shape", "p_probs", start=2, end=3)
    flat = f.op("Reshape", "p_probs", f.op("Concat", f.op("Shape", "p_probs", start=0, end=1), f.i64([-1]),
                                           axis=0))  # [b, (n+1)·V]
    p_x = f.op("GatherElements", flat, f.op("Add", f.op("Mul", t.par, v), t.tok), axis=1)  # [b, n]
    same_token = f.op("Equal", f.op("Unsqueeze", t.tok, two), f.op("Unsqueeze", t.tok, one))
    same = f.op("Cast", f.op("And", t.sib, same_token), to=TensorProto.INT32)
    repeat = f.op("Greater", f.op("ReduceMax", same, two, keepdims=0), f.const(0, np.int32))  # [b, n]
    r_x = f.op("Where", f.op("Or", repeat, f.op("Not", t.valid)), f.const(0.0, np.float64),
               f.op("Cast", p_x, to=TensorProto.DOUBLE))
    gone = f.op("Squeeze", f.op("MatMul", t.sib_f, f.op("Unsqueeze", r_x, two)), two)  # [b, n]
    u = f.op("Cast", "uniforms", to=TensorProto.DOUBLE)
    mass = f.op("Sub", f.const(1.0, np.float64), gone)
    accept = f.op("And", t.valid, f.op("Less", f.op("Mul", u, mass), r_x))
    best = t.accept_path(f.op("And", accept, f.op("Not", t.count_earlier(accept))))
    # the last node's children were all rejected: their tokens leave its p
    p_best = _row_at(f, "p_probs", best)  # [b, V]
    kids = f.op("And", t.valid, f.op("Equal", t.par, f.op("Unsqueeze", best, one)))  # [b, n]
    keep = f.op("Where", kids, f.const(0.0, np.float32), f.const(1.0, np.float32))
    keep = f.op("Expand", keep, f.op("Shape", t.tok))
    ones = f.op("ConstantOfShape", f.op("Shape", p_best),
                value=numpy_helper.from_array(np.array([1.0], np.float32)))
    scale = f.op("ScatterElements", ones, t.tok, keep, axis=1, reduction="mul")  # repeats: 0 · 1 · 0 …
    residual = f.op("Mul", p_best, scale)
    has_mass = f.op("Greater", f.op("ReduceSum", residual, one, keepdims=1), f.const(0.0, np.float32))
    t.emit(_inverse_cdf(f, f.op("Where", has_mass, residual, p_best)))
    return helper.make_function(PLUGIN_DOMAIN, CONFIDENCE_VERIFY_TREE_SAMPLING,
                                ["draft_tokens", "parents", "draft_lens", "p_probs", "uniforms", "u_last"],
                                ["num_accepted", "path", "tokens"], f.nodes, [helper.make_opsetid("", OPSET)],
                                attributes=list(PLUGIN_ATTRS))


CPU_FUNCTIONS = {KV_INJECTION_ATTENTION: kv_injection_attention_function,
                 CONFIDENCE_VERIFY_GREEDY: confidence_verify_greedy_function,
                 CONFIDENCE_VERIFY_SAMPLING: confidence_verify_sampling_function,
                 CONFIDENCE_VERIFY_TREE_GREEDY: confidence_verify_tree_greedy_function,
                 CONFIDENCE_VERIFY_TREE_SAMPLING: confidence_verify_tree_sampling_function}


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
