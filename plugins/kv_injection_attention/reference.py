"""Torch reference of `trtspec::kv_injection_attention` on the kernel's split-K/V interface.

The attention itself is `trtspec.models.dflash.kv_injection_attention` (the drafter's own code);
this only concatenates context and block K/V and turns per-row context lengths into its mask.
"""

from __future__ import annotations

import torch

from trtspec.models.dflash import kv_injection_attention as dflash_attention


def kv_injection_attention_reference(
    q: torch.Tensor,  # [b, h, B, d]
    ctx_k: torch.Tensor,  # [b, kvh, c, d]
    ctx_v: torch.Tensor,
    blk_k: torch.Tensor,  # [b, kvh, B, d]
    blk_v: torch.Tensor,
    ctx_lens: torch.Tensor | None = None,  # [b]
) -> torch.Tensor:  # [b, h, B, d]
    k = torch.cat([ctx_k, blk_k], dim=2)
    v = torch.cat([ctx_v, blk_v], dim=2)
    mask = None
    if ctx_lens is not None:
        c = ctx_k.shape[2]
        cols = torch.arange(k.shape[2], device=q.device)
        mask = ((cols[None, :] < ctx_lens[:, None]) | (cols[None, :] >= c))[:, None, None, :]
    return dflash_attention(q, k, v, mask)
