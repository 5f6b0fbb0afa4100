"""The TensorRT side both plugins share: the import guard, dtype names, views and PTX compilation.

Written against `tensorrt.plugin` as read in NVIDIA/TensorRT@a892d22267d9cd2dedc1a0893e6892ac901f6d3d
(python/packaging/bindings_wheel/tensorrt/plugin/_tensor.py: `Tensor.__cuda_array_interface__`
refuses BF16, hence `as_torch`; `KernelLaunchParams`, `SymInt32`, `SymIntExprs`) and its sample
samples/python/quickly_deployable_plugins/qdp_defs.py (`triton.compile(ASTSource(...))` -> PTX).
No `from __future__ import annotations` here or in the trt_plugin modules: tensorrt.plugin reads
the annotations of decorated functions as classes (`issubclass(param.annotation, TensorDesc)`).
"""

import types

import torch

from plugins._common import next_pow2, require_tensorrt

trt, trtp = require_tensorrt()

import triton  # noqa: E402  (after the guard: the error above is the one a user should see)

TRITON_TYPE = {trt.float32: "fp32", trt.float16: "fp16", trt.bfloat16: "bf16",
               trt.int32: "i32", trt.int64: "i64"}
SHARED_MEM_LIMIT = 48 * 1024  # static launch limit; more needs a cuFuncSetAttribute opt-in


def as_torch(t) -> torch.Tensor:
    """Zero-copy torch view of a `trtp.Tensor` (BF16 goes through an int16 view)."""
    if t.dtype != trt.bfloat16:
        return torch.as_tensor(t, device="cuda")
    shim = types.SimpleNamespace(__cuda_array_interface__={
        "shape": tuple(t.shape), "typestr": "<i2", "data": (t.data_ptr, False), "version": 3,
        "strides": tuple(2 * s for s in t.strides)})
    return torch.as_tensor(shim, device="cuda").view(torch.bfloat16)


def triton_type(desc) -> str:
    try:
        return TRITON_TYPE[desc.dtype]
    except KeyError:
        raise TypeError(f"trtspec plugins do not take {desc.dtype} tensors") from None


def static_dim(expr, what: str) -> int:
    if not expr.is_constant:
        raise ValueError(f"{what} must be a build-time constant in the network (got a dynamic dimension)")
    return int(expr.constant_value())


def compile_ptx(kernel, signature: dict, constexprs: dict):
    """Compile a Triton kernel for the current device; returns the `triton.compile` result."""
    return triton.compile(triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs))


def launch_params(compiled, grid_x, grid_y=1):
    params = trtp.KernelLaunchParams()
    params.grid_x = grid_x
    params.grid_y = grid_y
    params.block_x = compiled.metadata.num_warps * 32
    params.shared_mem = compiled.metadata.shared
    return params


def sym_ints(*exprs) -> "trtp.SymIntExprs":
    """int32 kernel scalars, resolved by TensorRT at run time; they sit between inputs and outputs."""
    return trtp.SymIntExprs.from_tuple([trtp.SymInt32(e) for e in exprs])


def row_block(dim, most: int) -> int:
    """BLOCK of a vector holding dim + 1 values per row (tokens, or a tree's path): from the
    dimension when it is a build-time constant, else from the most it may be."""
    return next_pow2(dim.constant_value() + 1) if dim.is_constant else next_pow2(most + 1)


def per_row_aot_result(compiled, draft_tokens, vocab_expr):
    """`aot_impl`'s result for a verify kernel with one program per row and (n, V) scalars."""
    params = launch_params(compiled, grid_x=draft_tokens.shape_expr[0])
    extra = sym_ints(draft_tokens.shape_expr[1], vocab_expr)  # n (or k), V
    return compiled.metadata.name, compiled.asm["ptx"], params, extra
