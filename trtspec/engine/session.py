"""The graph-session interface the engine flavour runs on, and the registry of its backends.

A session runs one exported graph: named numpy arrays in, named numpy arrays out. Backends:
`onnxruntime` (CPU, `trtspec.engine.ort`) runs the ONNX files with the plugin ops as ONNX
functions; `tensorrt` (GPU, `trtspec.engine.trt`) runs engines built from the same files
with the plugins/ kernels. The engine adapters (`EngineTarget`, `EngineDFlashDrafter`) only see
this interface, so the draft–verify loop is the same over either.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import numpy as np


class GraphSession(ABC):
    """One loaded graph."""

    backend: str
    input_names: list[str]
    output_names: list[str]

    @abstractmethod
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the graph on `feeds` (every input, by name) and return every output, by name."""


SessionFactory = Callable[[Path], GraphSession]
_BACKENDS: dict[str, SessionFactory] = {}


def register_backend(name: str) -> Callable[[SessionFactory], SessionFactory]:
    def wrap(factory: SessionFactory) -> SessionFactory:
        _BACKENDS[name] = factory
        return factory

    return wrap


def open_session(path: Path, backend: str = "onnxruntime") -> GraphSession:
    """Load `path` (an .onnx file for onnxruntime, an .engine file for tensorrt) on `backend`."""
    import trtspec.engine.ort  # noqa: F401  (fills the registry)
    import trtspec.engine.trt  # noqa: F401

    if backend not in _BACKENDS:
        raise ValueError(f"engine backend {backend!r} is unknown; available: {', '.join(sorted(_BACKENDS))}")
    if not Path(path).is_file():
        raise FileNotFoundError(f"graph file {path} does not exist")
    return _BACKENDS[backend](Path(path))
