"""A deliberately WRONG verifier, for tests only: proof that `trtspec verify` catches a server whose
speculative sampling is not lossless.

It treats every draft token as twice as likely under q as it is: accept x_i with probability
min(1, p_i(x_i) / (2 q_i(x_i))) and recover from norm(max(0, p − 2q)). Greedy verification is
untouched, so such a server passes the greedy identity check and only the sampling law test
can expose it. Selected by a build config's `test_only.biased_acceptance`; never deploy it.
"""

from __future__ import annotations

import torch

from trtspec.spec.verify import Verifier, VerifyOutput, verify_sampling

Q_SCALE = 2.0


class BiasedVerifier(Verifier):
    def sampling(self, draft_tokens: torch.Tensor, q_probs: torch.Tensor, p_probs: torch.Tensor,
                 uniforms: torch.Tensor, u_last: torch.Tensor,
                 draft_lens: torch.Tensor | None = None) -> VerifyOutput:
        return verify_sampling(draft_tokens, Q_SCALE * q_probs, p_probs, uniforms, u_last, draft_lens)
