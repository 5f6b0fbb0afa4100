"""Verification over the exported `confidence_verify_*` graphs (engine flavour).

`GraphVerifier` is a `trtspec.spec.verify.Verifier`, so `SpeculativeDecoder` calls it where the
torch flavour calls the torch rules, with the same inputs: greedy verdicts are identical to the
torch rule's, and sampling takes the same randomness (`uniforms` [b, k], `u_last` [b], drawn from
each request's generator by `Verifier.verify`), so its verdicts agree token for token too. Draft
trees go through the `confidence_verify_tree_*` graphs the same way (deterministic children, the
only kind trtspec's drafters propose).
"""

from __future__ import annotations

import numpy as np
import torch

from trtspec.engine.session import GraphSession
from trtspec.spec.tree_verify import TreeVerdict
from trtspec.spec.verify import Verifier, VerifyOutput


def _lens(draft_tokens: torch.Tensor, draft_lens: torch.Tensor | None) -> np.ndarray:
    b, k = draft_tokens.shape
    return np.full((b,), k, np.int32) if draft_lens is None else draft_lens.to(torch.int32).numpy()


def _verdict(out: dict[str, np.ndarray]) -> VerifyOutput:
    return VerifyOutput(num_accepted=torch.from_numpy(out["num_accepted"]).long(),
                        tokens=torch.from_numpy(out["tokens"]).long())


def _tree_feeds(tokens: torch.Tensor, parents: torch.Tensor, sizes: list[int]) -> dict[str, np.ndarray]:
    return {"draft_tokens": tokens.to(torch.int32).numpy(), "parents": parents.to(torch.int32).numpy(),
            "draft_lens": np.asarray(sizes, dtype=np.int32)}


def _tree_verdict(out: dict[str, np.ndarray]) -> TreeVerdict:
    return TreeVerdict(num_accepted=torch.from_numpy(out["num_accepted"]).long(),
                       path=torch.from_numpy(out["path"]).long(),
                       tokens=torch.from_numpy(out["tokens"]).long())


class GraphVerifier(Verifier):
    def __init__(self, greedy: GraphSession, sampling: GraphSession, tree_greedy: GraphSession | None = None,
                 tree_sampling: GraphSession | None = None):
        self.greedy_session, self.sampling_session = greedy, sampling
        self.tree_greedy_session, self.tree_sampling_session = tree_greedy, tree_sampling

    def _tree_session(self, session: GraphSession | None) -> GraphSession:
        if session is None:
            raise RuntimeError("this engine export has no tree verification graphs; export it again "
                               "(`trtspec build --flavour engine`) to verify draft trees")
        return session

    def tree_greedy(self, tokens, parents, sizes, target_logits) -> TreeVerdict:
        feeds = _tree_feeds(tokens, parents, sizes)
        feeds["target_logits"] = target_logits.to(torch.float32).numpy()
        return _tree_verdict(self._tree_session(self.tree_greedy_session).run(feeds))

    def tree_sampling(self, tokens, parents, sizes, p_probs, uniforms, u_last, q_probs=None) -> TreeVerdict:
        if q_probs is not None:
            raise NotImplementedError("the tree sampling graph verifies deterministic children only")
        feeds = _tree_feeds(tokens, parents, sizes)
        feeds.update(p_probs=p_probs.to(torch.float32).numpy(), uniforms=uniforms.to(torch.float32).numpy(),
                     u_last=u_last.to(torch.float32).numpy())
        return _tree_verdict(self._tree_session(self.tree_sampling_session).run(feeds))

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
