"""TensorRT plugins `trtspec::confidence_verify_greedy` and `trtspec::confidence_verify_sampling`.

greedy inputs: draft_tokens [b, k] int32, target_logits [b, k+1, V] (FP32|FP16|BF16),
draft_lens [b] int32 (DSpark's confidence-scheduled lengths; feed k to verify every draft).
sampling inputs: draft_tokens [b, k] int32, q_probs [b, k, V], p_probs [b, k+1, V] (FP32|FP16|BF16,
already temperature/top-k/top-p processed), draft_lens [b] int32, uniforms [b, k] float32,
u_last [b] float32 (the randomness: deterministic given the seed that drew them).
outputs (both): num_accepted [b] int32, tokens [b, k+1] int32 (accepted, recovered/bonus, -1 pad).

`aot_impl` bakes the Triton kernel's PTX into the engine (ONNX node: op = plugin name,
`plugin_namespace="trtspec"`, `aot=1`); `impl` is the Python-callback path for development.
API as read in NVIDIA/TensorRT@a892d22267d9cd2dedc1a0893e6892ac901f6d3d:
python/packaging/bindings_wheel/tensorrt/plugin/_lib.py (register / impl / aot_impl / autotune
schemas; multiple outputs as Tuple[TensorDesc, ...]), _top_level.py (from_shape_expr), _tensor.py,
_autotune.py; samples/python/quickly_deployable_plugins/qdp_defs.py.
"""


from plugins._trt import (
    as_torch,
    compile_ptx,
    per_row_aot_result,
    row_block,
    triton_type,
    trt,
    trtp,
)
from plugins.confidence_verify.kernel import (
    greedy_aot_signature,
    sampling_aot_signature,
    verify_greedy,
    verify_greedy_kernel,
    verify_sampling,
    verify_sampling_kernel,
)

GREEDY_ID = "trtspec::confidence_verify_greedy"
SAMPLING_ID = "trtspec::confidence_verify_sampling"
BLOCK_V = 1024
FLOATS = "FP32|FP16|BF16"
MAX_K = 63  # tokens per row are stored with one BLOCK_K = next_pow2(k + 1) vector


def _outputs(draft_tokens) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
    b, k = draft_tokens.shape_expr[0], draft_tokens.shape_expr[1]
    return trtp.from_shape_expr((b,), dtype=trt.int32), trtp.from_shape_expr((b, k + 1), dtype=trt.int32)


# -- greedy -------------------------------------------------------------------------------------

@trtp.register(GREEDY_ID)
def _greedy_describe(draft_tokens: trtp.TensorDesc, target_logits: trtp.TensorDesc,
                     draft_lens: trtp.TensorDesc) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
    return _outputs(draft_tokens)


@trtp.autotune(GREEDY_ID)
def _greedy_autotune(draft_tokens, target_logits, draft_lens, outputs) -> list[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination(f"INT32, {FLOATS}, INT32, INT32, INT32")]


@trtp.impl(GREEDY_ID)
def _greedy_impl(draft_tokens: trtp.Tensor, target_logits: trtp.Tensor, draft_lens: trtp.Tensor,
                 outputs: tuple[trtp.Tensor, trtp.Tensor], stream: int) -> None:
    import torch

    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        args = [as_torch(t) for t in (draft_tokens, target_logits, draft_lens)]
        verify_greedy(*args, out=(as_torch(outputs[0]), as_torch(outputs[1])))


@trtp.aot_impl(GREEDY_ID)
def _greedy_aot_impl(draft_tokens: trtp.TensorDesc, target_logits: trtp.TensorDesc,
                     draft_lens: trtp.TensorDesc,
                     outputs: tuple[trtp.TensorDesc, trtp.TensorDesc], tactic: int
                     ) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymExprs]:
    block_k = row_block(draft_tokens.shape_expr[1], MAX_K)
    compiled = compile_ptx(verify_greedy_kernel, greedy_aot_signature(triton_type(target_logits)),
                           dict(HAS_LENS=True, BLOCK_V=BLOCK_V, BLOCK_K=block_k))
    return per_row_aot_result(compiled, draft_tokens, target_logits.shape_expr[2])


# -- sampling -----------------------------------------------------------------------------------

@trtp.register(SAMPLING_ID)
def _sampling_describe(draft_tokens: trtp.TensorDesc, q_probs: trtp.TensorDesc, p_probs: trtp.TensorDesc,
                       draft_lens: trtp.TensorDesc, uniforms: trtp.TensorDesc,
                       u_last: trtp.TensorDesc) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
    return _outputs(draft_tokens)


@trtp.autotune(SAMPLING_ID)
def _sampling_autotune(draft_tokens, q_probs, p_probs, draft_lens, uniforms, u_last,
                       outputs) -> list[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination(f"INT32, {FLOATS}, {FLOATS}, INT32, FP32, FP32, INT32, INT32")]


@trtp.impl(SAMPLING_ID)
def _sampling_impl(draft_tokens: trtp.Tensor, q_probs: trtp.Tensor, p_probs: trtp.Tensor,
                   draft_lens: trtp.Tensor,
                   uniforms: trtp.Tensor, u_last: trtp.Tensor, outputs: tuple[trtp.Tensor, trtp.Tensor],
                   stream: int) -> None:
    import torch

    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        args = [as_torch(t) for t in (draft_tokens, q_probs, p_probs, uniforms, u_last, draft_lens)]
        verify_sampling(*args, out=(as_torch(outputs[0]), as_torch(outputs[1])))


@trtp.aot_impl(SAMPLING_ID)
def _sampling_aot_impl(draft_tokens: trtp.TensorDesc, q_probs: trtp.TensorDesc, p_probs: trtp.TensorDesc,
                       draft_lens: trtp.TensorDesc, uniforms: trtp.TensorDesc, u_last: trtp.TensorDesc,
                       outputs: tuple[trtp.TensorDesc, trtp.TensorDesc], tactic: int
                       ) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymExprs]:
    block_k = row_block(draft_tokens.shape_expr[1], MAX_K)
    compiled = compile_ptx(verify_sampling_kernel, sampling_aot_signature(triton_type(p_probs)),
                           dict(HAS_LENS=True, BLOCK_V=BLOCK_V, BLOCK_K=block_k))
    return per_row_aot_result(compiled, draft_tokens, p_probs.shape_expr[2])


__all__ = ["GREEDY_ID", "SAMPLING_ID"]
