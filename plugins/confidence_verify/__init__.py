"""`trtspec::confidence_verify`: Triton kernels, torch references; TensorRT glue in trt_plugin."""

from plugins.confidence_verify.kernel import verify_greedy, verify_sampling
from plugins.confidence_verify.reference import draw_uniforms, inverse_cdf, verify_sampling_explicit

__all__ = ["draw_uniforms", "inverse_cdf", "verify_greedy", "verify_sampling", "verify_sampling_explicit"]
