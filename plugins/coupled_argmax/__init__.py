"""`coupled_argmax`: the Gumbel-coupled sample of every row in one fused Triton kernel; the torch
reference is `trtspec.spec.coupling`."""

from plugins.coupled_argmax.kernel import coupled_argmax

__all__ = ["coupled_argmax"]
