"""Torch reference of the sampling verifier with its randomness passed in as tensors.

`trtspec.spec.verify.verify_sampling` draws its own uniforms from a torch.Generator; a GPU kernel
cannot replay that generator, so the kernel (and this reference, which it must match token for
token) takes the randomness as inputs instead:
- `uniforms` [b, k]: u_i for the acceptance test `u_i · q_i(x_i) < p_i(x_i)`, exactly the
  tensor verify_sampling draws first (`torch.rand(b, k, generator=g)`), so the accepted counts
  agree with verify_sampling for the same generator state;
- `u_last` [b]: one uniform per row for the recovered/bonus token, drawn by inverse CDF: the
  first token whose cumulative probability exceeds `u_last · total` (in float64). verify_sampling
  uses torch.multinomial there, which has the same law but not the same draws.
Greedy needs no randomness: its reference is `trtspec.spec.verify.verify_greedy` itself.
"""

from __future__ import annotations

import torch

from trtspec.spec.verify import VerifyOutput, _assemble, _draft_valid


def draw_uniforms(b: int, k: int, generator: torch.Generator,
                  device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(uniforms [b, k], u_last [b]) drawn in verify_sampling's order from `generator`."""
    uniforms = torch.rand(b, k, generator=generator, device=device)
    return uniforms, torch.rand(b, generator=generator, device=device)


def inverse_cdf(dist: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """dist [b, V] unnormalised, u [b] in [0, 1) -> [b] first j with cdf_j > u·total (float64).

    Zero-probability tokens are never chosen; if rounding leaves u·total at or past the end, the
    last token with positive probability is."""
    cdf = dist.double().cumsum(-1)  # [b, V]
    target = u.double() * cdf[:, -1]
    hit = cdf > target[:, None]
    first = torch.where(hit.any(-1), hit.long().argmax(-1), -1)
    positive = torch.arange(dist.shape[-1], device=dist.device).expand_as(dist).masked_fill(dist <= 0, -1)
    return torch.where(first >= 0, first, positive.amax(-1).clamp_min(0))


def verify_sampling_explicit(
    draft_tokens: torch.Tensor,  # [b, k], x_i drawn from q_i
    q_probs: torch.Tensor,  # [b, k, V] processed draft distributions
    p_probs: torch.Tensor,  # [b, k+1, V] processed target distributions
    uniforms: torch.Tensor,  # [b, k] in [0, 1)
    u_last: torch.Tensor,  # [b] in [0, 1)
    draft_lens: torch.Tensor | None = None,  # [b] drafts to consider per row (<= k); None = all
) -> VerifyOutput:
    """verify_sampling's rule with explicit randomness: the contract of the sampling kernel."""
    b, k = draft_tokens.shape
    p_x = p_probs[:, :k].gather(2, draft_tokens[..., None]).squeeze(2).float()  # [b, k]
    q_x = q_probs.gather(2, draft_tokens[..., None]).squeeze(2).float()
    accept = (uniforms.float() * q_x < p_x) & _draft_valid(draft_tokens, draft_lens)
    num_accepted = accept.long().cumprod(-1).sum(-1)  # [b]

    lens = torch.full((b,), k, device=draft_tokens.device) if draft_lens is None else draft_lens
    rejected = num_accepted < lens  # [b]
    idx = num_accepted[:, None, None].expand(b, 1, p_probs.shape[-1])
    p_a = p_probs.gather(1, idx).squeeze(1).float()  # [b, V]
    q_a = q_probs.gather(1, idx.clamp_max(k - 1)).squeeze(1).float() if k else torch.zeros_like(p_a)
    residual = (p_a - q_a).clamp_min(0.0)
    use_residual = rejected & (residual.sum(-1) > 0)  # p == q leaves no residual: draw from p
    dist = torch.where(use_residual[:, None], residual, p_a)
    return _assemble(draft_tokens, num_accepted, inverse_cdf(dist, u_last))
