"""Verification over the exported `confidence_verify_*` graphs (engine flavour).

`GraphVerifier` is a `trtspec.spec.verify.Verifier`, so `SpeculativeDecoder` calls it where the
torch flavour calls the torch rules, with the same inputs: greedy verdicts are identical to the
torch rule's, and sampling takes the same randomness (`uniforms` [b, k], `u_last` [b], drawn from
each request's generator by `Verifier.verify`), so its verdicts agree token for token too.
"""

from __future__ import annotations

import numpy as np
import torch

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

    def sampling(self, draft_tokens, q_probs, p_probs, uniforms, u_last, draft_lens=None) -> VerifyOutput:
        return _verdict(self.sampling_session.run({
            "draft_tokens": draft_tokens.to(torch.int32).numpy(),
            "q_probs": q_probs.to(torch.float32).numpy(),
            "p_probs": p_probs.to(torch.float32).numpy(),
            "draft_lens": _lens(draft_tokens, draft_lens),
            "uniforms": uniforms.to(torch.float32).numpy(),
            "u_last": u_last.to(torch.float32).numpy(),
        }))
