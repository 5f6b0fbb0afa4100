"""A small ONNX graph builder: named inputs/outputs, weights as initializers, fresh value names.

The exporters write their graphs with it node by node instead of tracing torch, so every graph
has exactly the inputs, outputs, dynamic axes and `trtspec` plugin nodes that TensorRT's ONNX
parser and onnxruntime are given, and exporting the embedded models takes well under a second.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

OPSET = 18  # ReduceMean takes axes as an input; TensorRT's ONNX parser supports it
IR_VERSION = 10
PLUGIN_DOMAIN = "trtspec"
FLOAT, INT32, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL
FLOAT16 = TensorProto.FLOAT16
# precision of a graph's weights and activations -> (ONNX element type, numpy dtype)
PRECISIONS = {"float32": (FLOAT, np.float32), "float16": (FLOAT16, np.float16)}

Dim = int | str  # a fixed size or the name of a dynamic axis


class GraphBuilder:
    """Accumulates nodes and initializers; `op` returns the output value name(s)."""

    def __init__(self, name: str, precision: str = "float32"):
        """`precision` (float32 | float16) is the dtype of weights, activations and the float
        tensors at the graph's interface; `float_type` is its ONNX element type."""
        self.name = name
        self.float_type, self._np_float = PRECISIONS[precision]
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._count = 0
        self._consts: dict[tuple, str] = {}

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def input(self, name: str, elem_type: int, shape: list[Dim]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, value: str, name: str, elem_type: int, shape: list[Dim]) -> None:
        self.nodes.append(helper.make_node("Identity", [value], [name], name=f"out_{name}"))
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def op(self, op_type: str, *inputs: str, n_out: int = 1, domain: str = "", **attrs) -> str | list[str]:
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        node_name = self.fresh(f"n_{op_type}")
        node = helper.make_node(op_type, list(inputs), outs, name=node_name, domain=domain, **attrs)
        self.nodes.append(node)
        return outs[0] if n_out == 1 else outs

    def weight(self, tensor: torch.Tensor, name: str, full_precision: bool = False) -> str:
        """A weight initializer in the graph's precision (float32 with `full_precision`)."""
        array = tensor.detach().to(torch.float32).cpu().numpy()
        array = array if full_precision else array.astype(self._np_float)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def to_float32(self, x: str) -> str:
        return x if self.float_type == FLOAT else self.op("Cast", x, to=FLOAT)

    def from_float32(self, x: str) -> str:
        return x if self.float_type == FLOAT else self.op("Cast", x, to=self.float_type)

    def const(self, values, dtype=np.int64) -> str:
        """A small constant initializer, shared between identical uses."""
        array = np.asarray(values, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            name = self.fresh("const")
            self.initializers.append(numpy_helper.from_array(array, name))
            self._consts[key] = name
        return self._consts[key]

    def model(self, doc: str, extra_opsets: dict[str, int] | None = None) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid("", OPSET)]
        opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION,
                                  producer_name="trtspec", doc_string=doc)
        return model
