"""onnxruntime (CPU) sessions over the exported graphs, plugin ops attached as ONNX functions."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from trtspec.engine.cpu_plugins import attach_cpu_plugins
from trtspec.engine.session import GraphSession, register_backend


class OrtSession(GraphSession):
    backend = "onnxruntime"

    def __init__(self, model: onnx.ModelProto, threads: int | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        # one thread unless asked: the draft–verify loop runs small graphs where threads cost more
        options.intra_op_num_threads = threads or int(os.environ.get("TRTSPEC_ORT_THREADS", "1"))
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._session = ort.InferenceSession(attach_cpu_plugins(model).SerializeToString(), options,
                                             providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self._session.get_inputs()]
        self.output_names = [o.name for o in self._session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self._session.run(None, feeds), strict=True))


@register_backend("onnxruntime")
def _open(path: Path) -> OrtSession:
    return OrtSession(onnx.load(str(path)))
