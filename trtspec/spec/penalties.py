"""Logit bias and repetition, frequency and presence penalties: the target law a request asks for.

Speculative decoding stays lossless under them. A penalty is a function of the tokens before the
position it is applied at, and at every position of a step the verifier knows those tokens: the
request's committed ones, then the drafts on the way to that position (a chain: x_1..x_j before
position j + 1; a tree node: its ancestors and itself). So each position's p is the penalized law
the target alone would sample from had it generated that path, and the accept rule runs on it
unchanged.
The drafter's q is left as it is: the rule is exact for any q, and penalties only lower how often
drafts are accepted where they move the target away from what the drafter proposes (drafting under
the same penalties lowered τ further: a small drafter's logits have other margins than the
target's; docs/SAMPLING.md).

Definitions (OpenAI's API reference for presence/frequency and logit_bias; CTRL, Keskar et al. 2019,
as transformers and vLLM implement it, for repetition), applied to the logits in vLLM's order,
before temperature, top-k and top-p:

    logit_bias          logits[t] += bias[t]
    repetition_penalty  for t in prompt ∪ output: logits[t] / r if logits[t] > 0 else logits[t] · r
    frequency_penalty   logits[t] −= f · count(t)              count over the generated tokens only
    presence_penalty    logits[t] −= a · [count(t) > 0]
    bad_words           logits[w_n] = −inf where the generated tokens end with w_1..w_{n−1}
                        (each bad word w a token sequence; one of one token is banned everywhere)
    thinking budget     logits[t] = −inf for every t but the forced one, where the generated tokens
                        are inside the reasoning block with the budget spent (`spec.thinking_budget`)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trtspec.spec.sampling import SamplingParams
from trtspec.spec.thinking_budget import AFTER


class Penalties:
    """One request's penalty state: the ids its prompt holds and how often it generated each."""

    def __init__(self, params: SamplingParams, prompt: Sequence[int], vocab_size: int,
                 device: torch.device | str = "cpu"):
        self.params = params
        self.vocab_size = vocab_size
        self.bias: torch.Tensor | None = None  # [V]
        if params.logit_bias:
            ids = torch.tensor([i for i, _ in params.logit_bias], device=device)
            values = torch.tensor([b for _, b in params.logit_bias], device=device)
            self.bias = torch.zeros(vocab_size, device=device).index_put_((ids,), values)
        self.in_prompt: torch.Tensor | None = None  # [V] bool, only where repetition_penalty needs it
        if params.repetition_penalty != 1.0:
            self.in_prompt = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.in_prompt[torch.tensor(list(prompt), device=device)] = True
        self.counts = torch.zeros(vocab_size, device=device)  # [V] times each id was generated
        # the generated tokens a bad word's start may end with (the longest start's length)
        self.keep = max((len(w) - 1 for w in params.bad_words), default=0)
        self.tail: list[int] = []
        self.budget = params.thinking
        # where the generated tokens stand in the reasoning block
        self.thinking = None if self.budget is None else self.budget.first()

    def extend(self, tokens: Sequence[int]) -> None:
        """Count newly generated tokens."""
        if self.keep:
            self.tail = (self.tail + [int(t) for t in tokens])[-self.keep:]
        if self.budget is not None:
            for token in tokens:
                self.thinking = self.budget.after(self.thinking, int(token))
        if tokens:
            ids = torch.tensor(list(tokens), device=self.counts.device)
            self.counts.index_add_(0, ids, torch.ones(len(ids), device=self.counts.device))

    def path_counts(self, width: int, drafts: torch.Tensor | None = None,
                    parents: Sequence[int] | None = None) -> torch.Tensor:
        """Generated-token counts before each of `width` positions of a step.  drafts [≥ width − 1]:
        the tokens fed after the last committed one (a chain's x_1.., a tree's nodes 1..); position
        0 follows the committed tokens alone, position j also each draft on its path: a chain's
        x_1..x_j, or with `parents` (a tree row's, `DraftTree.row_parents`: -1 for position 0, then
        each node's parent position) node j's ancestors and node j itself -> [width, V]"""
        counts = self.counts.expand(width, self.vocab_size).clone()
        n = width - 1
        if n > 0 and drafts is not None:
            if parents is None:
                on_path = torch.ones(width, n, device=counts.device).tril(-1)  # [width, n]: draft c before j
            else:
                on_path = torch.zeros(width, n, device=counts.device)
                for j in range(1, min(len(parents), width)):
                    on_path[j] = on_path[parents[j]]
                    on_path[j, j - 1] = 1.0
            counts.index_add_(1, drafts[:n].to(counts.device), on_path)
        return counts

    def apply(self, logits: torch.Tensor, drafts: torch.Tensor | None = None,
              parents: Sequence[int] | None = None) -> None:
        """Penalize a step's logits in place.  logits [width, V], position j's predicting the token
        after the committed ones and the drafts on its path (`path_counts`)."""
        p = self.params
        counts = self.path_counts(logits.shape[0], drafts, parents)  # [width, V]
        generated = counts > 0  # [width, V]
        if self.bias is not None:
            logits += self.bias.to(logits.dtype)
        if self.in_prompt is not None:
            seen = self.in_prompt | generated
            r = p.repetition_penalty
            # a penalty near 0 (or huge) overflows a logit to ±inf, and a row holding +inf samples NaN
            # (it failed the step of every request beside it): kept finite, the largest still wins
            big = torch.finfo(logits.dtype).max
            penalized = torch.where(logits > 0, logits / r, logits * r).clamp(-big, big)
            logits.copy_(torch.where(seen, penalized, logits))
        if p.frequency_penalty:
            logits -= p.frequency_penalty * counts
        if p.presence_penalty:
            logits -= p.presence_penalty * generated.to(logits.dtype)
        if p.bad_words:
            self._ban(logits, drafts, parents)
        if self.budget is not None and self.thinking.phase != AFTER:  # past the block nothing is forced
            self._force(logits, drafts, parents)

    @staticmethod
    def _along(width: int, drafts: torch.Tensor | None, parents: Sequence[int] | None, first, after) -> list:
        """A value per position of a step, each the one of its parent position after the draft
        between them: position 0's is `first`, position j's `after(its parent's, draft j)` (a
        chain's parent is j − 1, a tree node's its parent; a tree row's padding gets `first`)."""
        fed = [] if drafts is None else drafts[: width - 1].tolist()
        values = [first]
        for j in range(1, width if drafts is not None else 1):
            if parents is not None and j >= len(parents):  # a tree row's padding: never verified
                values.append(first)
                continue
            values.append(after(values[j - 1 if parents is None else parents[j]], fed[j - 1]))
        return values

    def _force(self, logits: torch.Tensor, drafts: torch.Tensor | None,
               parents: Sequence[int] | None) -> None:
        """Where a position's path is inside the reasoning block with the budget spent: only the
        forced token left.  logits [width, V]"""
        states = self._along(logits.shape[0], drafts, parents, self.thinking, self.budget.after)
        for j, state in enumerate(states):
            token = self.budget.forced(state)
            if token is not None and token < logits.shape[-1]:
                logits[j] = float("-inf")
                logits[j, token] = 0.0

    def _ban(self, logits: torch.Tensor, drafts: torch.Tensor | None, parents: Sequence[int] | None) -> None:
        """Each bad word's last token at the positions whose path ends with the word's other tokens.
        logits [width, V]; drafts and parents as `path_counts` takes them."""
        keep = max(self.keep, 1)
        # position j: the generated tokens before it
        paths = self._along(logits.shape[0], drafts, parents, self.tail, lambda path, t: (path + [t])[-keep:])
        for word in self.params.bad_words:
            start, last = list(word[:-1]), word[-1]
            if last >= logits.shape[-1]:
                continue
            for j, path in enumerate(paths):
                if not start or path[-len(start):] == start:
                    logits[j, last] = float("-inf")


def penalized(logits: torch.Tensor, params: SamplingParams, prompt: Sequence[int],
              generated: Sequence[int]) -> torch.Tensor:
    """The next token's logits after `prompt` + `generated` under `params`' penalties (a copy; the
    same logits when the request has none).  logits [V] -> [V]"""
    if not params.penalized:
        return logits
    state = Penalties(params, prompt, logits.shape[-1], logits.device)
    state.extend(generated)
    out = logits.clone()[None]  # [1, V]
    state.apply(out)
    return out[0]
