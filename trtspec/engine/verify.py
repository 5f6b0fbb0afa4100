"""Verification over the exported `confidence_verify_*` graphs (engine flavour).

`GraphVerifier` is a `trtspec.spec.verify.Verifier`, so `SpeculativeDecoder` calls it where the
torch flavour calls the torch rules. Greedy verdicts are identical to the torch rule's. Sampling
draws its randomness from the request's generator first, in verify_sampling's order
(`uniforms` [b, k], then `u_last` [b]), so the accepted counts agree with the torch flavour for
the same generator state; the recovered/bonus token is drawn by inverse CDF instead of
torch.multinomial, which has the same law but not the same draws.
"""

from __future__ import annotations

import numpy as np
import torch

from plugins.confidence_verify.reference import draw_uniforms
from trtspec.engine.session import GraphSession
from trtspec.spec.verify import Verifier, VerifyOutput


def _lens(draft_tokens: torch.Tensor, draft_lens: torch.Tensor | None) -> np.ndarray:
    b, k = draft_tokens.shape
    return np.full((b,), k, np.int32) if draft_lens is None else draft_lens.to(torch.int32).numpy()


def _verdict(out: dict[str, np.ndarray]) -> VerifyOutput:
    return VerifyOutput(num_accepted=torch.from_numpy(out["num_accepted"]).long(),
                        tokens=torch.from_numpy(out["tokens"]).long())


class GraphVerifier(Verifier):
    def __init__(self, greedy: GraphSession, sampling: GraphSession):
        self.greedy_session, self.sampling_session = greedy, sampling

    def greedy(self, draft_tokens, target_logits, draft_lens=None) -> VerifyOutput:
        return _verdict(self.greedy_session.run({
            "draft_tokens": draft_tokens.to(torch.int32).numpy(),
            "target_logits": target_logits.to(torch.float32).numpy(),
            "draft_lens": _lens(draft_tokens, draft_lens),
        }))

    def sampling(self, draft_tokens, q_probs, p_probs, generator, draft_lens=None) -> VerifyOutput:
        b, k = draft_tokens.shape
        uniforms, u_last = draw_uniforms(b, k, generator)
        return _verdict(self.sampling_session.run({
            "draft_tokens": draft_tokens.to(torch.int32).numpy(),
            "q_probs": q_probs.to(torch.float32).numpy(),
            "p_probs": p_probs.to(torch.float32).numpy(),
            "draft_lens": _lens(draft_tokens, draft_lens),
            "uniforms": uniforms.numpy(),
            "u_last": u_last.numpy(),
        }))
