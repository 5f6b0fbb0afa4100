"""The draft–verify loop: propose k tokens, score them in ONE target forward, keep a prefix.

    target cache: [prompt ..., committed ...]           (never holds `last` before a cycle)
    cycle:        feed [last, x_1..x_k] -> p_1..p_{k+1}; verify; rewind k - a slots
    emitted:      x_1..x_a + one recovered/bonus token, which becomes the next `last`

With `NoDrafter` (k = 0) each cycle is one plain autoregressive step through the same target
path, so `--drafter none` and speculation share every line that could differ.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from trtspec.models.drafter import Drafter, NoDrafter, Proposal
from trtspec.models.target import TargetModel
from trtspec.spec.metrics import GenerationResult
from trtspec.spec.sampling import SamplingParams, probs_from_logits, sample
from trtspec.spec.verify import Verifier


class SpeculativeDecoder:
    """Runs one request at a time over a target and a drafter."""

    def __init__(self, target: TargetModel, drafter: Drafter | None, eos_id: int | None,
                 verifier: Verifier | None = None):
        self.target = target
        self.drafter = drafter or NoDrafter()
        self.eos_id = eos_id
        self.verifier = verifier or Verifier()

    def _first_token(self, logits: torch.Tensor, sampling: SamplingParams, gen) -> int:
        if sampling.greedy:
            return int(logits.argmax(-1))
        return int(sample(probs_from_logits(logits, sampling), gen))

    def generate(
        self,
        prompt: list[int],
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        on_tokens: Callable[[list[int]], bool | None] | None = None,
    ) -> GenerationResult:
        """Decode up to `max_new_tokens` after `prompt`.

        `on_tokens` (streaming) is called with the ids each step emits, the first token included;
        returning True ends generation after them (stop words, a cancelled request).
        """
        if not prompt:
            raise ValueError("prompt is empty: give at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        sampling = sampling or SamplingParams()
        gen = sampling.generator()
        target, drafter = self.target, self.drafter
        target.reset()
        result = GenerationResult(prompt_len=len(prompt), num_draft_tokens=drafter.num_draft_tokens)
        t0 = time.perf_counter()

        # 1. prefill: the target caches the prompt; its last position gives the first token
        out = target.forward(torch.tensor([prompt]), last_only=True)
        drafter.begin(prompt, out.hidden)
        generated = [self._first_token(out.logits[:, -1], sampling, gen)]
        result.prefill_s = time.perf_counter() - t0
        stopped = on_tokens is not None and bool(on_tokens(list(generated)))

        while not stopped and len(generated) < max_new_tokens and generated[-1] != self.eos_id:
            committed = prompt + generated
            # never draft past the token budget: a cycle emits at most k + 1 tokens
            k = min(drafter.num_draft_tokens, max_new_tokens - len(generated) - 1)

            # 2. draft: x_1..x_k with q_1..q_k
            t_draft = time.perf_counter()
            proposal = drafter.propose(committed, k, sampling, gen) if k else Proposal.empty()
            k = proposal.num_tokens
            result.draft_s += time.perf_counter() - t_draft

            # 3. verify: ONE target forward over [last, x_1..x_k] gives p_1..p_{k+1}
            fed = torch.cat([torch.tensor([[generated[-1]]]), proposal.tokens], dim=1)  # [1, k+1]
            out = target.forward(fed)
            verdict = self.verifier.verify(proposal.tokens, proposal.q_probs, out.logits, sampling, gen)
            a = int(verdict.num_accepted[0])

            # 4. rewind: the cache holds last + k drafts; keep last + the a accepted
            target.rewind(k - a)
            drafter.commit(a, None if out.hidden is None else out.hidden[:, : a + 1])

            emitted = verdict.row(0)
            if self.eos_id in emitted:
                emitted = emitted[: emitted.index(self.eos_id) + 1]
            emitted = emitted[: max_new_tokens - len(generated)]
            generated.extend(emitted)
            result.record_cycle(num_drafted=k, num_accepted=a)
            stopped = on_tokens is not None and bool(on_tokens(emitted))

        result.total_s = time.perf_counter() - t0
        result.token_ids = generated
        result.num_target_calls = target.num_forwards
        return result
