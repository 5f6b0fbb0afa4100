"""TensorRT plugins `trtspec::confidence_verify_tree_greedy` and `..._tree_sampling`: draft trees.

inputs: draft_tokens [b, n] int32, parents [b, n] int32 (0 = the root), draft_lens [b] int32 (nodes
per row); greedy: target_logits [b, n+1, V]; sampling: p_probs [b, n+1, V] (processed), uniforms
[b, n] float32, u_last [b] float32. outputs: num_accepted [b], path [b, n], tokens [b, n+1], int32.
A chain is the tree whose parents are 0, 1, …, k − 1. Registered as `trt_plugin` registers the
chain ops (same API reading, NVIDIA/TensorRT@a892d22267d9cd2dedc1a0893e6892ac901f6d3d); the kernels
are checked under the Triton interpreter and compiled to sm_90 PTX in tests, this registration has
not run here (TensorRT cannot be installed on these machines).
"""

from plugins._common import next_pow2
from plugins._trt import (
    as_torch,
    compile_ptx,
    per_row_aot_result,
    row_block,
    triton_type,
    trt,
    trtp,
)
from plugins.confidence_verify.tree_kernel import (
    tree_greedy_aot_signature,
    tree_sampling_aot_signature,
    verify_tree_greedy_kernel,
    verify_tree_sampling_kernel,
)

TREE_GREEDY_ID = "trtspec::confidence_verify_tree_greedy"
TREE_SAMPLING_ID = "trtspec::confidence_verify_tree_sampling"
FLOATS = "FP32|FP16|BF16"
MAX_NODES = 255  # the path and tokens are held in one BLOCK_N = next_pow2(n + 1) vector


def _outputs(draft_tokens) -> tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]:
    b, n = draft_tokens.shape_expr[0], draft_tokens.shape_expr[1]
    return (trtp.from_shape_expr((b,), dtype=trt.int32), trtp.from_shape_expr((b, n), dtype=trt.int32),
            trtp.from_shape_expr((b, n + 1), dtype=trt.int32))


def _run(kernel, inputs, outputs, vocab: int, block_v: int, stream: int) -> None:
    import torch

    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        args = [as_torch(t) for t in inputs]
        n = args[0].shape[1]
        kernel[(args[0].shape[0],)](*args, n, vocab, *(as_torch(t) for t in outputs), BLOCK_V=block_v,
                                    BLOCK_N=next_pow2(n + 1))


@trtp.register(TREE_GREEDY_ID)
def _greedy_describe(draft_tokens: trtp.TensorDesc, parents: trtp.TensorDesc, draft_lens: trtp.TensorDesc,
                     target_logits: trtp.TensorDesc
                     ) -> tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]:
    return _outputs(draft_tokens)


@trtp.autotune(TREE_GREEDY_ID)
def _greedy_autotune(draft_tokens, parents, draft_lens, target_logits, outputs
                     ) -> list[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination(f"INT32, INT32, INT32, {FLOATS}, INT32, INT32, INT32")]


@trtp.impl(TREE_GREEDY_ID)
def _greedy_impl(draft_tokens: trtp.Tensor, parents: trtp.Tensor, draft_lens: trtp.Tensor,
                 target_logits: trtp.Tensor, outputs: tuple[trtp.Tensor, trtp.Tensor, trtp.Tensor],
                 stream: int) -> None:
    _run(verify_tree_greedy_kernel, (draft_tokens, parents, draft_lens, target_logits), outputs,
         target_logits.shape[2], 1024, stream)


@trtp.aot_impl(TREE_GREEDY_ID)
def _greedy_aot_impl(draft_tokens: trtp.TensorDesc, parents: trtp.TensorDesc, draft_lens: trtp.TensorDesc,
                     target_logits: trtp.TensorDesc,
                     outputs: tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc], tactic: int
                     ) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymExprs]:
    compiled = compile_ptx(verify_tree_greedy_kernel, tree_greedy_aot_signature(triton_type(target_logits)),
                           dict(BLOCK_V=1024, BLOCK_N=row_block(draft_tokens.shape_expr[1], MAX_NODES)))
    return per_row_aot_result(compiled, draft_tokens, target_logits.shape_expr[2])


@trtp.register(TREE_SAMPLING_ID)
def _sampling_describe(draft_tokens: trtp.TensorDesc, parents: trtp.TensorDesc, draft_lens: trtp.TensorDesc,
                       p_probs: trtp.TensorDesc, uniforms: trtp.TensorDesc, u_last: trtp.TensorDesc
                       ) -> tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]:
    return _outputs(draft_tokens)


@trtp.autotune(TREE_SAMPLING_ID)
def _sampling_autotune(draft_tokens, parents, draft_lens, p_probs, uniforms, u_last, outputs
                       ) -> list[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination(f"INT32, INT32, INT32, {FLOATS}, FP32, FP32, INT32, INT32, INT32")]


def _sampling_block_v(block_n: int) -> int:
    return max(16, 16384 // block_n)  # the [BLOCK_N, BLOCK_V] token comparison stays in registers


@trtp.impl(TREE_SAMPLING_ID)
def _sampling_impl(draft_tokens: trtp.Tensor, parents: trtp.Tensor, draft_lens: trtp.Tensor,
                   p_probs: trtp.Tensor, uniforms: trtp.Tensor, u_last: trtp.Tensor,
                   outputs: tuple[trtp.Tensor, trtp.Tensor, trtp.Tensor], stream: int) -> None:
    n = draft_tokens.shape[1]
    _run(verify_tree_sampling_kernel, (draft_tokens, parents, draft_lens, p_probs, uniforms, u_last), outputs,
         p_probs.shape[2], _sampling_block_v(next_pow2(n + 1)), stream)


@trtp.aot_impl(TREE_SAMPLING_ID)
def _sampling_aot_impl(draft_tokens: trtp.TensorDesc, parents: trtp.TensorDesc, draft_lens: trtp.TensorDesc,
                       p_probs: trtp.TensorDesc, uniforms: trtp.TensorDesc, u_last: trtp.TensorDesc,
                       outputs: tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc], tactic: int
                       ) -> tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymExprs]:
    block_n = row_block(draft_tokens.shape_expr[1], MAX_NODES)
    compiled = compile_ptx(verify_tree_sampling_kernel, tree_sampling_aot_signature(triton_type(p_probs)),
                           dict(BLOCK_V=_sampling_block_v(block_n), BLOCK_N=block_n))
    return per_row_aot_result(compiled, draft_tokens, p_probs.shape_expr[2])


__all__ = ["TREE_GREEDY_ID", "TREE_SAMPLING_ID"]
