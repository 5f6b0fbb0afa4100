"""Torch reference of the `confidence_verify` sampling kernel: the verifier's own rule.

`trtspec.spec.verify.verify_sampling` takes its randomness as tensors (`uniforms` [b, k] for the
accept tests, `u_last` [b] for the recovered/bonus token drawn by inverse CDF in float64), so the
kernel, which cannot replay a torch.Generator, must reproduce it token for token. Greedy needs no
randomness: its reference is `trtspec.spec.verify.verify_greedy`.
"""

from __future__ import annotations

from trtspec.spec.verify import draw_uniforms, inverse_cdf, verify_sampling

verify_sampling_explicit = verify_sampling  # the kernel's contract, under the name the kernel tests use

__all__ = ["draw_uniforms", "inverse_cdf", "verify_sampling_explicit"]
