"""`trtspec::confidence_verify`: Triton kernels, torch references; TensorRT glue in trt_plugin
(chains) and tree_trt_plugin (draft trees)."""

from plugins.confidence_verify.kernel import verify_greedy, verify_sampling
from plugins.confidence_verify.reference import draw_uniforms, inverse_cdf, verify_sampling_explicit
from plugins.confidence_verify.tree_kernel import verify_tree_greedy, verify_tree_sampling

__all__ = ["draw_uniforms", "inverse_cdf", "verify_greedy", "verify_sampling", "verify_sampling_explicit",
           "verify_tree_greedy", "verify_tree_sampling"]
