"""The verifier: one rule that decides which draft tokens the target keeps.

Vocabulary (as in vLLM's rejection sampler), for a draft block x_1..x_k with draft
distributions q_i and target distributions p_1..p_{k+1} from ONE target forward:
- accepted: the longest prefix x_1..x_a that passes the test below;
- recovered: when x_{a+1} is rejected, a token drawn from norm(max(0, p_{a+1} − q_{a+1}));
- bonus: when all k drafts are accepted, a token drawn from p_{k+1}.
Every cycle emits a + 1 tokens: the accepted ones plus one recovered or bonus token.

Greedy (temperature 0): x_i is accepted iff x_i == argmax p_i; the extra token is argmax p_{a+1}.
Sampling (Leviathan et al. 2023, Chen et al. 2023): x_i is accepted with probability
min(1, p_i(x_i) / q_i(x_i)); the emitted sequence is then distributed exactly as the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtspec.spec.sampling import SamplingParams, probs_from_logits

PAD = -1


@dataclass(slots=True)
class VerifyOutput:
    num_accepted: torch.Tensor  # [b] accepted draft tokens per row, in [0, k]
    tokens: torch.Tensor  # [b, k+1] accepted tokens then the recovered/bonus token, PAD after

    @property
    def num_emitted(self) -> torch.Tensor:  # [b]
        return self.num_accepted + 1

    def row(self, r: int) -> list[int]:
        return self.tokens[r, : int(self.num_accepted[r]) + 1].tolist()


def _draft_valid(draft_tokens: torch.Tensor, draft_lens: torch.Tensor | None) -> torch.Tensor:
    b, k = draft_tokens.shape
    positions = torch.arange(k, device=draft_tokens.device).expand(b, k)
    if draft_lens is None:
        return torch.ones(b, k, dtype=torch.bool, device=draft_tokens.device)
    return positions < draft_lens[:, None]


def _assemble(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, last: torch.Tensor) -> VerifyOutput:
    b, k = draft_tokens.shape
    tokens = torch.full((b, k + 1), PAD, dtype=torch.long, device=draft_tokens.device)
    keep = torch.arange(k, device=draft_tokens.device)[None, :] < num_accepted[:, None]
    tokens[:, :k] = torch.where(keep, draft_tokens, PAD)
    tokens.scatter_(1, num_accepted[:, None], last[:, None])
    return VerifyOutput(num_accepted=num_accepted, tokens=tokens)


def verify_greedy(
    draft_tokens: torch.Tensor,  # [b, k]
    target_logits: torch.Tensor,  # [b, k+1, V]
    draft_lens: torch.Tensor | None = None,  # [b] drafts to consider per row (<= k); None = all
) -> VerifyOutput:
    """Accept the longest prefix equal to the target's argmax, then emit argmax p_{a+1}."""
    target_argmax = target_logits.argmax(-1)  # [b, k+1]
    k = draft_tokens.shape[1]
    match = (draft_tokens == target_argmax[:, :k]) & _draft_valid(draft_tokens, draft_lens)
    num_accepted = match.long().cumprod(-1).sum(-1)  # [b]
    last = target_argmax.gather(1, num_accepted[:, None]).squeeze(1)
    return _assemble(draft_tokens, num_accepted, last)


def verify_sampling(
    draft_tokens: torch.Tensor,  # [b, k], x_i drawn from q_i
    q_probs: torch.Tensor,  # [b, k, V] processed draft distributions
    p_probs: torch.Tensor,  # [b, k+1, V] processed target distributions
    generator: torch.Generator,
    draft_lens: torch.Tensor | None = None,  # [b]
) -> VerifyOutput:
    """Rejection sampling: accept x_i w.p. min(1, p_i(x_i)/q_i(x_i)); recover or add a bonus."""
    b, k = draft_tokens.shape
    p_x = p_probs[:, :k].gather(2, draft_tokens[..., None]).squeeze(2)  # [b, k]
    q_x = q_probs.gather(2, draft_tokens[..., None]).squeeze(2)  # [b, k]
    u = torch.rand(b, k, generator=generator, device=draft_tokens.device)
    # u < p/q written without the division, so q_x == 0 cannot produce NaN
    accept = (u * q_x < p_x) & _draft_valid(draft_tokens, draft_lens)
    num_accepted = accept.long().cumprod(-1).sum(-1)  # [b]

    # The distribution of the extra token at position a: the residual where a draft was
    # rejected, p itself where the row ran out of drafts (bonus).
    residual = (p_probs[:, :k] - q_probs).clamp_min(0.0)  # [b, k, V]
    lens = torch.full((b,), k, device=draft_tokens.device) if draft_lens is None else draft_lens
    rejected_at_a = num_accepted < lens  # [b]
    idx = num_accepted[:, None, None].expand(b, 1, p_probs.shape[-1])
    residual_a = torch.cat([residual, p_probs[:, k:]], dim=1).gather(1, idx).squeeze(1)  # [b, V]
    p_a = p_probs.gather(1, idx).squeeze(1)  # [b, V]
    # p == q exactly makes the residual vanish; rejection then has probability 0, use p
    residual_ok = residual_a.sum(-1, keepdim=True) > 0
    dist = torch.where(rejected_at_a[:, None] & residual_ok, residual_a, p_a)
    last = torch.multinomial(dist / dist.sum(-1, keepdim=True), 1, generator=generator).squeeze(1)
    return _assemble(draft_tokens, num_accepted, last)


class Verifier:
    """Where a decoder's verification runs: these torch rules by default; the engine flavour
    substitutes its exported `confidence_verify_*` graphs (`trtspec.engine.verify.GraphVerifier`)."""

    def verify(self, draft_tokens: torch.Tensor, q_probs: torch.Tensor | None, target_logits: torch.Tensor,
               sampling: SamplingParams, generator: torch.Generator) -> VerifyOutput:
        """One cycle's verdict for drafts [b, k] (q_probs [b, k, V] when sampling) against the
        target's logits [b, k+1, V] under the request's sampling parameters."""
        if sampling.greedy:
            return self.greedy(draft_tokens, target_logits)
        p_probs = probs_from_logits(target_logits, sampling)  # [b, k+1, V]
        q_probs = q_probs if draft_tokens.shape[1] else p_probs[:, :0]  # [b, k, V]
        return self.sampling(draft_tokens, q_probs, p_probs, generator)

    def greedy(self, draft_tokens: torch.Tensor, target_logits: torch.Tensor,
               draft_lens: torch.Tensor | None = None) -> VerifyOutput:
        return verify_greedy(draft_tokens, target_logits, draft_lens)

    def sampling(self, draft_tokens: torch.Tensor, q_probs: torch.Tensor, p_probs: torch.Tensor,
                 generator: torch.Generator, draft_lens: torch.Tensor | None = None) -> VerifyOutput:
        return verify_sampling(draft_tokens, q_probs, p_probs, generator, draft_lens)
