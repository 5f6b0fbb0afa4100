"""What both kernels share: launch checks, block sizes and the TensorRT import guard."""

from __future__ import annotations

import os

import torch

from trtspec.errors import TrtspecError

TORCH_TO_TRITON = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                   torch.int32: "i32", torch.int64: "i64"}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_launchable(*tensors: torch.Tensor) -> None:
    """Triton launches on CUDA tensors, or on CPU tensors when the interpreter is on."""
    devices = {t.device.type for t in tensors}
    if devices == {"cuda"} or (devices == {"cpu"} and interpreting()):
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
