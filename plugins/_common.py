"""What both kernels share: launch checks, block sizes and the TensorRT import guard."""

from __future__ import annotations

import os

import torch
from packaging.version import Version

from trtspec.errors import TrtspecError

TORCH_TO_TRITON = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                   torch.int32: "i32", torch.int64: "i64"}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreter_problem(triton_version: str, numpy_version: str) -> str | None:
    """Why the Triton interpreter cannot run our kernels with these packages, or None.

    Triton 3.6's interpreter turns a loop bound that is a kernel argument or a loaded value into an
    int by `int()` of a one-element array, which numpy 2.4 refuses ("only 0-dimensional arrays can
    be converted to Python scalars"); Triton 3.7 reads it as a scalar. Compiled kernels (CUDA) are
    not affected."""
    if Version(triton_version).release[:2] < (3, 7) and Version(numpy_version).release[:2] >= (2, 4):
        return (f"the Triton interpreter of triton {triton_version} cannot run these kernels under numpy "
                f"{numpy_version} (its loop bounds fail: only 0-dimensional arrays can be converted to "
                "Python scalars); install triton>=3.7 or numpy<2.4 for TRITON_INTERPRET=1, or run on a "
                "CUDA device")
    return None


def check_launchable(*tensors: torch.Tensor) -> None:
    """Triton launches on CUDA tensors, or on CPU tensors when the interpreter is on (and can)."""
    devices = {t.device.type for t in tensors}
    if devices == {"cuda"}:
        return
    if devices == {"cpu"} and interpreting():
        import numpy
        import triton

        problem = interpreter_problem(triton.__version__, numpy.__version__)
        if problem:
            raise TrtspecError(problem)
        return
    if devices == {"cpu"}:
        raise TrtspecError("Triton kernels need CUDA tensors; on a CPU machine set TRITON_INTERPRET=1 "
                           "before importing plugins.* to run them in the Triton interpreter")
    raise TrtspecError(f"tensors on mixed devices {sorted(devices)}; move them to one device")


def next_pow2(n: int, floor: int = 16) -> int:
    """Power-of-two block covering n; tl.dot needs every block dimension >= 16."""
    return max(floor, 1 << max(0, int(n) - 1).bit_length())


def require_tensorrt():
    """Import `tensorrt` and `tensorrt.plugin`, or fail with the one line that says what to do."""
    try:
        import tensorrt
        import tensorrt.plugin as trtp
    except ImportError as exc:
        raise TrtspecError(
            "TensorRT is not installed: the trtspec plugins register only where it is; on the GPU "
            "node run `pip install tensorrt` (TensorRT >= 10.9, whose tensorrt.plugin has aot_impl), "
            "then `import plugins.<name>.trt_plugin`"
        ) from exc
    return tensorrt, trtp
