"""TensorRT: engines built from the exported ONNX graphs, and sessions that run them.

Kept thin on purpose: the graphs, their plugin nodes and the draft–verify loop are proven on CPU
through onnxruntime; this module only parses, builds with one optimization profile, and runs.
TensorRT is imported only when used; without it every entry point fails with one line.

API as read in NVIDIA/TensorRT@a892d22267d9cd2dedc1a0893e6892ac901f6d3d (TensorRT 11.1):
python/src/infer/pyCore.cpp (Builder.create_network, NetworkDefinitionCreationFlag.STRONGLY_TYPED
and PREFER_AOT_PYTHON_PLUGINS, create_builder_config, set_memory_pool_limit(MemoryPoolType.WORKSPACE),
create_optimization_profile / set_shape(input, min, opt, max), add_optimization_profile,
build_serialized_network, Runtime.deserialize_cuda_engine, num_io_tensors / get_tensor_name /
get_tensor_mode / get_tensor_dtype, IExecutionContext.set_input_shape / get_tensor_shape /
set_tensor_address / execute_async_v3(stream_handle)), python/src/parsers/pyOnnx.cpp
(OnnxParser.parse_from_file, num_errors, get_error) and
samples/python/quickly_deployable_plugins/README.md (ONNX nodes reach `tensorrt.plugin` plugins
through op name + `plugin_namespace`, `aot` selects the AOT implementation). TensorRT 11 networks
are strongly typed: precision is the ONNX graph's dtypes (float32 or float16, `target.dtype`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from trtspec.engine.session import GraphSession, register_backend
from trtspec.errors import TrtspecError

log = logging.getLogger(__name__)

Shape = tuple[int, ...]
Profile = dict[str, tuple[Shape, Shape, Shape]]  # input name -> (min, opt, max)


def tensorrt_available() -> bool:
    """TensorRT importable and a CUDA device visible."""
    try:
        import tensorrt  # noqa: F401
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _require():
    try:
        import tensorrt as trt
        import torch
    except ImportError:
        raise TrtspecError("TensorRT is not installed: engines build and run only on a GPU node with "
                           "`pip install tensorrt` (>= 10.9); the ONNX graphs run here on onnxruntime"
                           ) from None
    if not torch.cuda.is_available():
        raise TrtspecError("no CUDA device is visible: TensorRT engines build and run only on a GPU node")
    return trt


def register_plugins() -> None:
    """Register trtspec's `tensorrt.plugin` plugins (kernels compiled to PTX at engine build)."""
    import plugins.confidence_verify.tree_trt_plugin  # noqa: F401
    import plugins.confidence_verify.trt_plugin  # noqa: F401
    import plugins.kv_injection_attention.trt_plugin  # noqa: F401


def build_engine(onnx_path: Path, engine_path: Path, profile: Profile, workspace_gib: float = 4.0) -> Path:
    """Parse `onnx_path`, build a serialized engine for `profile`, write it to `engine_path`."""
    trt = _require()
    register_plugins()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = (1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)) | \
            (1 << int(trt.NetworkDefinitionCreationFlag.PREFER_AOT_PYTHON_PLUGINS))
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise TrtspecError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
    opt_profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in profile.items():
        opt_profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(opt_profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TrtspecError(f"TensorRT failed to build an engine from {onnx_path} (see the log above)")
    engine_path.write_bytes(bytes(serialized))
    return engine_path


class TrtSession(GraphSession):
    """Runs one engine on the current CUDA device; numpy in and out (copies through torch)."""

    backend = "tensorrt"

    def __init__(self, engine_path: Path):
        trt = _require()
        import torch

        register_plugins()
        self._trt, self._torch = trt, torch
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise TrtspecError(f"TensorRT could not load {engine_path}: rebuild it for this GPU and version")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.input_names = [n for n in names if is_input[n]]
        self.output_names = [n for n in names if not is_input[n]]
        self._dtypes = {trt.float32: torch.float32, trt.float16: torch.float16, trt.bfloat16: torch.bfloat16,
                        trt.int32: torch.int32, trt.int64: torch.int64, trt.bool: torch.bool}
        self._stream = torch.cuda.Stream()

    def _address(self, t) -> int:
        # empty tensors still need a valid address
        return t.data_ptr() if t.numel() else self._torch.empty(1, device="cuda").data_ptr()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ValueError(f"engine inputs {missing} were not fed")
        keep = []
        for name in self.input_names:
            t = torch.from_numpy(np.ascontiguousarray(feeds[name])).cuda()
            keep.append(t)
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, self._address(t))
        outs = {}
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            dtype = self._dtypes[self.engine.get_tensor_dtype(name)]
            outs[name] = torch.empty(shape, dtype=dtype, device="cuda")
            self.context.set_tensor_address(name, self._address(outs[name]))
        torch.cuda.current_stream().synchronize()
        if not self.context.execute_async_v3(self._stream.cuda_stream):
            raise TrtspecError("TensorRT execution failed (see the log above)")
        self._stream.synchronize()
        return {name: t.cpu().numpy() for name, t in outs.items()}


@register_backend("tensorrt")
def _open(path: Path) -> TrtSession:
    return TrtSession(path)
