"""TensorRT plugin `trtspec::kv_injection_attention` (quickly deployable Python plugin).

Inputs, in kernel order: q [b, h, B, d], ctx_k, ctx_v [b, kvh, c, d], blk_k, blk_v [b, kvh, B, d]
(float32 | float16 | bfloat16, one dtype for all), ctx_lens [b] int32 (valid context rows; feed c
for a full cache). Output [b, h, B, d], q's dtype. d must be a build-time constant.

- `aot_impl` compiles the Triton kernel to PTX at engine build, so the engine runs without Python
  (trtexec, C++ runtime); the ONNX node needs `plugin_namespace="trtspec"` (or domain "trtspec"
  from TRT 10.10) and the attribute `aot=1`.
- `impl` launches the same kernel from Python (JIT plugins), for development.
- `autotune` advertises the dtypes and three (BLOCK_M, BLOCK_N) tactics, so TensorRT times them.
API as read in NVIDIA/TensorRT@a892d22267d9cd2dedc1a0893e6892ac901f6d3d:
python/packaging/bindings_wheel/tensorrt/plugin/_lib.py (register, impl, aot_impl, autotune and
their schemas: kernel arguments are inputs, then `SymIntExprs`, then outputs), _tensor.py,
_autotune.py, and samples/python/quickly_deployable_plugins/qdp_defs.py (multi-tactic AOT).
Triton >= 3.3 appends two scratch pointers to every kernel; TensorRT does not pass them, which is
harmless only because these kernels never read them (tests/test_plugins.py checks the PTX).
"""


from plugins._trt import (
    SHARED_MEM_LIMIT,
    as_torch,
    compile_ptx,
    launch_params,
    static_dim,
    sym_ints,
    triton_type,
    trt,
    trtp,
)
from plugins.kv_injection_attention.kernel import (
    aot_signature,
    kernel_constexprs,
    kv_injection_attention,
    kv_injection_attention_kernel,
)

PLUGIN_ID = "trtspec::kv_injection_attention"
TACTICS = {1: (64, 64), 2: (64, 32), 3: (16, 64)}  # tactic -> (BLOCK_M, BLOCK_N)
FLOATS = "FP32|FP16|BF16"


@trtp.register(PLUGIN_ID)
def _describe(q: trtp.TensorDesc, ctx_k: trtp.TensorDesc, ctx_v: trtp.TensorDesc, blk_k: trtp.TensorDesc,
              blk_v: trtp.TensorDesc, ctx_lens: trtp.TensorDesc) -> trtp.TensorDesc:
    return q.like()


@trtp.autotune(PLUGIN_ID)
def _autotune(q, ctx_k, ctx_v, blk_k, blk_v, ctx_lens, outputs) -> list[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination(", ".join([FLOATS] * 5 + ["INT32", FLOATS]), "LINEAR", list(TACTICS))]


@trtp.impl(PLUGIN_ID)
def _impl(q: trtp.Tensor, ctx_k: trtp.Tensor, ctx_v: trtp.Tensor, blk_k: trtp.Tensor, blk_v: trtp.Tensor,
          ctx_lens: trtp.Tensor, outputs: tuple[trtp.Tensor], stream: int, tactic: int) -> None:
    import torch

    block_m, block_n = TACTICS.get(tactic, TACTICS[1])
    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        args = [as_torch(t) for t in (q, ctx_k, ctx_v, blk_k, blk_v, ctx_lens)]
        kv_injection_attention(*args, block_m=block_m, block_n=block_n, out=as_torch(outputs[0]))


def _compile(q, block_m: int, block_n: int):
    head_dim = static_dim(q.shape_expr[3], "head_dim (last dimension of q)")
    return compile_ptx(kv_injection_attention_kernel, aot_signature(triton_type(q)),
                       kernel_constexprs(head_dim, block_m, block_n, has_ctx_lens=True))


@trtp.aot_impl(PLUGIN_ID)
def _aot_impl(q: trtp.TensorDesc, ctx_k: trtp.TensorDesc, ctx_v: trtp.TensorDesc, blk_k: trtp.TensorDesc,
              blk_v: trtp.TensorDesc, ctx_lens: trtp.TensorDesc, outputs: tuple[trtp.TensorDesc], tactic: int
              ) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymExprs]:
    block_m, block_n = TACTICS[tactic]
    compiled = _compile(q, block_m, block_n)
    while compiled.metadata.shared > SHARED_MEM_LIMIT and max(block_m, block_n) > 16:
        # float32 tiles outgrow the static limit: shrink the tactic rather than fail the build
        block_n, block_m = (block_n // 2, block_m) if block_n > 16 else (block_n, block_m // 2)
        compiled = _compile(q, block_m, block_n)
    b, h, block, d = (q.shape_expr[i] for i in range(4))
    kvh, c = ctx_k.shape_expr[1], ctx_k.shape_expr[2]
    rows = h * block // kvh  # the G = h / kvh heads of a group times the block length
    params = launch_params(compiled, grid_x=trtp.cdiv(rows, block_m), grid_y=b * kvh)
    extra = sym_ints(h, kvh, c, block, c * d, block * d)
    return compiled.metadata.name, compiled.asm["ptx"], params, extra


__all__ = ["PLUGIN_ID", "TACTICS", "trt"]
